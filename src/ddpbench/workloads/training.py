"""Full training loops: hand-written all-reduce vs torch DDP vs PyTorch Lightning (vs DataParallel).

Everything runs inside the pool's rank processes; the timing engine calls the :class:`Training`
workload's hooks and never knows what a round does. A recorded round is **one optimizer step**:
``grad_accum`` micro-batches of ``batch_size`` samples each on every rank, then one update.

Models (no downloads; data is synthetic and deterministic):

* ``mlp``  - 3072 -> 256 -> 100 on CIFAR-100-shaped images (3x32x32, 100 classes);
* ``cnn``  - two 3x3 conv + max-pool stages (16, 32 channels) and a linear head, same data;
* ``lstm`` - character-level: embedding 32, one LSTM layer of 128, next-character head over a
  64-symbol alphabet, sequences of :data:`SEQ_LEN` characters.

Image labels come from a fixed random linear "teacher" (the same on every rank) and characters
from a fixed random Markov chain, so the loss really goes down. Each rank draws *different*
samples (the generator is seeded from ``(seed, rank)``) and models are initialised from a
rank-dependent seed too: every implementation must broadcast rank 0's parameters and reduce
gradients correctly, or the ranks drift apart and :meth:`Training.check` fails the case.

The check (after the timed rounds, untimed) also runs one more optimizer step and compares it with
:func:`reference_step`, a single-process float64 step on every rank's micro-batches of that step,
gathered: the gradient each parameter holds after the step must be the global-batch average and the
parameters must have moved by the SGD-with-momentum update it implies. A reduction that sums without
dividing by the world size, zeroed gradients or a skipped optimizer step keep the ranks equal and
fail here (tests/test_training_parity.py runs each), at world size 1 too.

Implementations:

* ``manual``: broadcast rank 0's parameters and buffers once; per step, forward/backward on each
  micro-batch (loss / grad_accum, gradients summed locally by autograd), then flatten the
  gradients into buckets of at most ``bucket_cap_mb`` (in reverse registration order, like DDP),
  one ``all_reduce`` per bucket, divide by the world size, copy back, optimizer step;
* ``ddp``: :class:`torch.nn.parallel.DistributedDataParallel` with the same bucket cap, the first
  ``grad_accum - 1`` micro-steps inside ``no_sync()``;
* ``lightning``: a ``pytorch_lightning.Trainer(strategy="ddp")`` attached to the rank's existing
  process group through the torchelastic environment variables (see :class:`_LightningLoop` for
  how a round maps onto one long ``Trainer.fit``);
* ``dataparallel``: :class:`torch.nn.DataParallel` over every visible GPU in one process (CUDA
  pools of world size 1 only), global batch = ``batch_size`` x GPU count.

All use SGD with momentum, the same learning rate and ``zero_grad(set_to_none=True)``.

Memory (``peak_memory_bytes``): on CUDA the engine reports ``torch.cuda.max_memory_allocated``
over the recorded rounds. On CPU there is no allocator statistic, so the workload runs its setup
(model, optimizer, DDP/Lightning wrapping) and one extra, untimed optimizer step under
``torch.profiler`` with ``profile_memory=True`` and reports the peak of the running sum of the
allocator's ``[memory]`` events: the most tensor memory this implementation held at once on
top of what existed before setup (the synthetic dataset is built first and is not counted).
Allocations made on threads other than the one that runs the loop (gloo's worker threads) are
not seen; if the profiler saw less than the model's own parameter bytes (kineto can miss events
when it was first initialised on another thread of the process) the key is left out rather than
reported wrong. That extra step is the same for every implementation and is not recorded.
"""

from __future__ import annotations

import contextlib

import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from . import Workload

MODELS = ("mlp", "cnn", "lstm")
IMPLS = ("manual", "ddp", "lightning", "dataparallel")

IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 100
VOCAB = 64
SEQ_LEN = 32  # characters per training sequence (the target is the next character)

# Env vars set while a Lightning trainer is attached to the pool's process group.
LIGHTNING_ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
# OMP_NUM_THREADS is in that list because Lightning's launcher (``_SubprocessScriptLauncher.launch``
# -> ``lightning_fabric.utilities.distributed._set_num_threads_if_needed``), when the variable is
# unset, calls ``torch.set_num_threads(cpu_count // world_size)`` on the thread that runs ``fit``
# and then *writes* OMP_NUM_THREADS into os.environ. In a pool rank (1 intra-op thread) that gave
# the first Lightning case of every rank process 2+ OpenMP threads per op at world size 1 (all
# cores, oversubscribed on a shared machine: ~40x slower steps), while later cases in the same
# process saw the leaked variable and ran with 1. Setting it to the rank's own count makes
# Lightning leave the thread count alone; it is restored when the trainer is closed.
# Lightning reads MASTER_PORT but never opens it: the process group already exists, so its
# _init_dist_connection returns early (checked by tests/test_training_parity.py).
LIGHTNING_UNUSED_MASTER_PORT = "29499"


def lightning_unavailable_reason() -> str | None:
    """None if pytorch_lightning imports, else why not (the Lightning cases skip with it)."""
    try:
        import pytorch_lightning  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return (f"pytorch_lightning is not importable ({type(exc).__name__}: {exc}); "
                f"install the extra: pip install 'ddpbench[lightning]'")
    return None


# ----------------------------------------------------------------------------------------------
# Models and data
# ----------------------------------------------------------------------------------------------


def build_model(name: str):
    import torch.nn as nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, NUM_CLASSES))
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 8 * 8, NUM_CLASSES),
        )
    if name == "lstm":
        return CharLSTM()
    raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")


def _char_lstm_class():
    import torch.nn as nn

    class _CharLSTM(nn.Module):
        """Embedding -> LSTM -> per-position logits over the alphabet, shape (B, T, VOCAB)."""

        def __init__(self, embed: int = 32, hidden: int = 128):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, embed)
            self.lstm = nn.LSTM(embed, hidden, batch_first=True)
            self.head = nn.Linear(hidden, VOCAB)

        def forward(self, x):
            out, _ = self.lstm(self.embed(x))
            return self.head(out)

    return _CharLSTM


def CharLSTM():  # noqa: N802 - a factory, so importing this module does not import torch
    return _char_lstm_class()()


def loss_fn(output, target):
    """Cross-entropy for both shapes: (B, C) vs (B,) and (B, T, V) vs (B, T)."""
    import torch.nn.functional as F

    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _generator(*parts: int):
    import torch

    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + int(part)) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


# Training.check's extra step draws its micro-batches (and their teacher) from seed + this.
CHECK_DATA_SEED_OFFSET = 7919


def make_data(model: str, batch_size: int, num_batches: int, seed: int, rank: int):
    """(inputs, targets) of shape (num_batches, batch_size, ...): this rank's micro-batches.

    The labelling rule (teacher / Markov chain) depends on ``seed`` only; the samples depend on
    ``(seed, rank)``, so every rank trains on different data.
    """
    import torch

    shared = _generator(seed, 1)
    own = _generator(seed, 2, rank)
    if model in ("mlp", "cnn"):
        teacher = torch.randn(3 * 32 * 32, NUM_CLASSES, generator=shared)
        x = torch.randn(num_batches, batch_size, *IMAGE_SHAPE, generator=own)
        y = (x.reshape(num_batches, batch_size, -1) @ teacher).argmax(-1)
        return x, y
    if model == "lstm":
        transition = torch.softmax(3.0 * torch.randn(VOCAB, VOCAB, generator=shared), dim=-1)
        count = num_batches * batch_size
        seq = torch.empty(count, SEQ_LEN + 1, dtype=torch.int64)
        seq[:, 0] = torch.randint(0, VOCAB, (count,), generator=own)
        for t in range(SEQ_LEN):
            seq[:, t + 1] = torch.multinomial(transition[seq[:, t]], 1, generator=own).squeeze(1)
        seq = seq.reshape(num_batches, batch_size, SEQ_LEN + 1)
        return seq[..., :-1].contiguous(), seq[..., 1:].contiguous()
    raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")


# ----------------------------------------------------------------------------------------------
# CPU peak memory
# ----------------------------------------------------------------------------------------------


class _CpuMemoryProbe:
    """Peak of the running sum of torch.profiler's ``[memory]`` events between start and stop."""

    def __init__(self):
        import torch

        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                            profile_memory=True, record_shapes=False)
        self.peak_bytes: int | None = None

    def start(self):
        self._prof.__enter__()
        return self

    def stop(self, floor_bytes: int = 0) -> int | None:
        """The peak, or None when it is below ``floor_bytes`` (tensors known to have been allocated
        under the probe): the profiler then missed events, which happens when kineto was first
        initialised on another thread of the process, and no number beats a wrong one."""
        self._prof.__exit__(None, None, None)
        events = [(e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                  if e.name() == "[memory]"]
        events.sort(key=lambda item: item[0])
        live = peak = 0
        for _, nbytes in events:
            live += nbytes
            peak = max(peak, live)
        self.peak_bytes = int(peak) if peak >= floor_bytes else None
        return self.peak_bytes


# ----------------------------------------------------------------------------------------------
# The loops (rank side)
# ----------------------------------------------------------------------------------------------


def _seed_model(workload: "Training", rank: int):
    import torch

    torch.manual_seed(workload.seed * 7919 + 104729 * rank + 1)  # rank-dependent on purpose
    return build_model(workload.model)


def _make_optimizer(workload: "Training", params):
    import torch

    return torch.optim.SGD(params, lr=workload.lr, momentum=workload.momentum)


def _parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def flat_parameters(model) -> Any:
    import torch

    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


class _Loop:
    """One rank's training loop; ``step()`` is one optimizer step over ``grad_accum`` micro-batches."""

    def __init__(self, ctx, workload: "Training", data):
        self.ctx = ctx
        self.w = workload
        self.inputs, self.targets = data
        self.cursor = 0
        self.losses: list[float] = []
        # The (inputs, targets) micro-batches of the last finished optimizer step (Training.check).
        self.last_step_batches: list = []
        self.optimizer = None  # the torch optimizer (Training.check reads its momentum buffers)

    def next_batch(self):
        i = self.cursor % self.inputs.shape[0]
        self.cursor += 1
        return self.inputs[i], self.targets[i]

    @contextlib.contextmanager
    def training_on(self, inputs, targets):
        """Take micro-batches from ``inputs`` / ``targets`` (shaped as the loop's data) until the
        block ends, then go back to the loop's own data where it left off (Training.check)."""
        saved = self.inputs, self.targets, self.cursor
        self.inputs, self.targets, self.cursor = inputs, targets, 0
        try:
            yield
        finally:
            self.inputs, self.targets, self.cursor = saved

    def module(self):
        raise NotImplementedError

    def step(self) -> float:
        """One optimizer step: ``grad_accum`` micro-batches, each loss scaled by 1/grad_accum,
        then ``_before_optimizer_step`` (where a loop reduces gradients itself) and the step."""
        accum = self.w.grad_accum
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        batches = []
        for i in range(accum):
            x, y = self.next_batch()
            batches.append((x, y))
            total += self._micro_step(x, y, accum, last=i == accum - 1)
        self._before_optimizer_step()
        self.optimizer.step()
        self.losses.append(total / accum)
        self.last_step_batches = batches
        return self.losses[-1]

    def _micro_step(self, x, y, accum: int, last: bool) -> float:
        """Forward and backward of one micro-batch; returns its (unscaled) loss."""
        raise NotImplementedError

    def _before_optimizer_step(self) -> None:
        pass

    def close(self) -> None:
        pass


def _broadcast_from_rank0(tensors) -> None:
    import torch
    import torch.distributed as dist

    tensors = list(tensors)
    if not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    dist.broadcast(flat, src=0)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def make_buckets(params, cap_bytes: int) -> list[list]:
    """Group parameters (reverse registration order, as DDP does) into buckets of <= cap_bytes.

    A parameter larger than the cap gets a bucket of its own.
    """
    buckets: list[list] = []
    current: list = []
    size = 0
    for p in reversed([p for p in params if p.requires_grad]):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def reduce_gradients(buckets, world_size: int) -> None:
    """Average gradients over ranks: per bucket, flatten, all_reduce (sum), divide, copy back."""
    import torch
    import torch.distributed as dist

    for bucket in buckets:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(world_size)
        offset = 0
        for p, g in zip(bucket, grads):
            n = g.numel()
            if p.grad is None:
                p.grad = g
            p.grad.copy_(flat[offset:offset + n].view_as(g))
            offset += n


class _ManualLoop(_Loop):
    def __init__(self, ctx, workload, data):
        super().__init__(ctx, workload, data)
        self.model = _seed_model(workload, ctx.rank).to(ctx.device)
        _broadcast_from_rank0(list(self.model.parameters()) + list(self.model.buffers()))
        self.buckets = make_buckets(self.model.parameters(), int(workload.bucket_cap_mb * 1024 * 1024))
        self.optimizer = _make_optimizer(workload, self.model.parameters())

    def module(self):
        return self.model

    def _micro_step(self, x, y, accum: int, last: bool) -> float:
        loss = loss_fn(self.model(x), y)
        (loss / accum).backward()  # gradients add up locally across micro-batches
        return float(loss.detach())

    def _before_optimizer_step(self) -> None:
        reduce_gradients(self.buckets, self.ctx.world_size)  # once per optimizer step


class _DDPLoop(_Loop):
    def __init__(self, ctx, workload, data):
        from torch.nn.parallel import DistributedDataParallel

        super().__init__(ctx, workload, data)
        model = _seed_model(workload, ctx.rank).to(ctx.device)
        device_ids = [ctx.device.index] if ctx.device_type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=workload.bucket_cap_mb)
        self.optimizer = _make_optimizer(workload, self.ddp.parameters())

    def module(self):
        return self.ddp.module

    def _micro_step(self, x, y, accum: int, last: bool) -> float:
        # DDP all-reduces during the last micro-batch's backward; no_sync() skips the others.
        with contextlib.nullcontext() if last else self.ddp.no_sync():
            loss = loss_fn(self.ddp(x), y)
            (loss / accum).backward()
        return float(loss.detach())


class _DataParallelLoop(_Loop):
    """Single process, every visible GPU; the data already holds batch_size x GPUs per micro-batch."""

    def __init__(self, ctx, workload, data):
        import torch

        super().__init__(ctx, workload, data)
        model = _seed_model(workload, 0).to(torch.device("cuda", 0))
        self.dp = torch.nn.DataParallel(model)
        self.optimizer = _make_optimizer(workload, self.dp.parameters())

    def module(self):
        return self.dp.module

    def _micro_step(self, x, y, accum: int, last: bool) -> float:
        out = self.dp(x)
        loss = loss_fn(out, y.to(out.device))
        (loss / accum).backward()
        return float(loss.detach())


class _EndlessBatches:
    """An iterable without __len__ that cycles this rank's micro-batches (Lightning's train data)."""

    def __init__(self, loop: _Loop):
        self.loop = loop

    def __iter__(self):
        while True:
            yield self.loop.next_batch()


class _LightningLoop(_Loop):
    """A Lightning Trainer running one long ``fit`` on a helper thread, paced step by step.

    Why a thread: the engine owns the round loop (barrier -> timer -> run_round), while Lightning
    owns its own loop inside ``Trainer.fit``. Calling ``fit`` once per round would time Lightning's
    whole set-up and teardown (wrapping DDP, callbacks, hooks) in every round; instead ``fit``
    runs once, on a thread of the rank process, over an endless iterable of micro-batches. The
    LightningModule's ``on_train_batch_start`` hook, at the first micro-batch of every optimizer
    step, reports the previous step as done and blocks until ``run_round`` asks for the next one.
    So a recorded round is exactly one optimizer step *as Lightning runs it*, including its
    per-step overhead (hooks, closures, its loss scaling by 1/accumulate_grad_batches, DDP
    ``no_sync`` for the accumulation micro-steps, result bookkeeping), plus one thread hand-off
    (tens of microseconds). Lightning's one-off cost (Trainer construction, strategy set-up, DDP
    wrapping, the first step) happens in ``setup`` and is reported as ``setup_seconds``, not timed.
    Only one thread issues collectives at a time: the engine's barriers run while the trainer
    thread is blocked. Teardown makes the hook return -1 (Lightning: "skip the rest of the
    epoch"), so ``fit`` ends normally on every rank.

    Attaching to the pool's group: with the torchelastic variables set, Lightning picks
    TorchElasticEnvironment (processes created externally, so no launcher) and, finding the
    default process group initialised, does not create another; MASTER_PORT is never opened.
    Each rank is presented as a node of one device (``num_nodes`` = world size, LOCAL_RANK 0,
    GROUP_RANK = rank) and that device is the rank's own (``devices=[index]`` on CUDA): Lightning
    would otherwise put local rank r on cuda:r, which does not exist when ranks share a GPU (two
    gloo ranks with CUDA tensors on a single-GPU machine) or when the pool maps ranks otherwise.

    Threads: the trainer thread runs with the rank's intra-op thread count, like the other loops.
    OpenMP's count is per OS thread, so ``_fit`` sets it; and OMP_NUM_THREADS is set to it while
    the trainer exists, because otherwise Lightning's launcher raises it to cpu_count // world_size
    (see :data:`LIGHTNING_ENV_KEYS`). The first paced step checks the count and fails the case if
    Lightning's set-up changed it anyway (``trainer_num_threads``).
    """

    def __init__(self, ctx, workload, data, memory_probe: bool):
        super().__init__(ctx, workload, data)
        self._commands: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._free_steps = 1 if memory_probe else 0  # the untimed memory step runs without waiting
        self.peak_memory_bytes: int | None = None
        self._probe = None
        self._micro_losses: list[float] = []
        self._micro_batches: list = []
        import torch

        self._num_threads = torch.get_num_threads()  # the rank's setting (1 in the pool)
        self.trainer_num_threads: int | None = None  # seen on the trainer thread at the first step
        self._saved_env = {key: os.environ.get(key) for key in LIGHTNING_ENV_KEYS}
        os.environ.update({
            "RANK": str(ctx.rank), "LOCAL_RANK": "0", "GROUP_RANK": str(ctx.rank),
            "WORLD_SIZE": str(ctx.world_size), "LOCAL_WORLD_SIZE": "1",
            "TORCHELASTIC_RUN_ID": "ddpbench", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": LIGHTNING_UNUSED_MASTER_PORT,
            # Keeps Lightning's launcher from resetting the intra-op thread count (see above).
            "OMP_NUM_THREADS": str(self._num_threads),
        })
        self.model = None  # built on the trainer thread, inside the memory probe
        self._thread = threading.Thread(target=self._fit, name="ddpbench-lightning", daemon=True)
        self._thread.start()
        try:
            self._wait("ready")
        except BaseException:
            self._restore_env()
            raise

    # -- trainer thread ----------------------------------------------------------------------

    def _fit(self) -> None:
        try:
            import logging

            import pytorch_lightning as pl
            import torch

            # OpenMP's thread count is per OS thread: a new thread would use every core again.
            torch.set_num_threads(self._num_threads)
            logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)  # no banner per case
            if self._free_steps and self.ctx.device_type != "cuda":
                self._probe = _CpuMemoryProbe().start()
            self.model = _seed_model(self.w, self.ctx.rank).to(self.ctx.device)
            module = _make_lightning_module(pl, self)
            trainer = pl.Trainer(
                accelerator="gpu" if self.ctx.device_type == "cuda" else "cpu",
                devices=[self.ctx.device.index] if self.ctx.device_type == "cuda" else 1,
                num_nodes=self.ctx.world_size, strategy="ddp",
                max_epochs=1, max_steps=-1, accumulate_grad_batches=self.w.grad_accum,
                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, use_distributed_sampler=False,
                num_sanity_val_steps=0, limit_val_batches=0,
                default_root_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "ddpbench-lightning"),
            )
            trainer.fit(module, train_dataloaders=_EndlessBatches(self))
            self._results.put(("ended", None))
        except BaseException:  # noqa: BLE001 - goes back to the engine's thread
            self._results.put(("error", traceback.format_exc()))

    def _at_batch_start(self, batch_idx: int) -> int | None:
        """Called by the LightningModule at every micro-batch; blocks at optimizer-step boundaries."""
        if batch_idx % self.w.grad_accum:
            return None
        if batch_idx:  # a full optimizer step has just finished
            micro, self._micro_losses = self._micro_losses, []
            self.losses.append(sum(micro) / len(micro))
            self.last_step_batches, self._micro_batches = self._micro_batches, []
        if self._free_steps:
            self._free_steps -= 1
            return None
        if self._probe is not None:
            self.peak_memory_bytes = self._probe.stop(floor_bytes=_parameter_bytes(self.model))
            self._probe = None
        if not self._started:
            import torch

            # What the timed steps will run with (Lightning has finished its set-up by now); it
            # must be the rank's count, as for the other implementations.
            self.trainer_num_threads = torch.get_num_threads()
            if self.trainer_num_threads != self._num_threads:
                raise RuntimeError(
                    f"the Lightning trainer thread runs with {self.trainer_num_threads} intra-op "
                    f"threads, the rank with {self._num_threads}: something in Lightning's set-up "
                    f"changed it, and the steps would not be comparable with the other loops")
        self._results.put(("step" if self._started else "ready", None))
        self._started = True
        command = self._commands.get()
        return -1 if command == "stop" else None

    _started = False

    # -- engine thread -----------------------------------------------------------------------

    def _wait(self, expected: str) -> None:
        while True:
            try:
                kind, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the Lightning trainer thread exited without reporting") from None
                continue
            if kind == expected:
                return
            if kind == "error":
                raise RuntimeError(f"Lightning training failed on rank {self.ctx.rank}:\n{payload}")
            raise RuntimeError(f"Lightning's fit ended early on rank {self.ctx.rank} "
                               f"(expected {expected!r}, got {kind!r})")

    def module(self):
        return self.model

    def step(self) -> float:
        self._commands.put("step")
        self._wait("step")
        return self.losses[-1]

    def close(self) -> None:
        try:
            if self._thread.is_alive():
                self._commands.put("stop")
                self._wait("ended")
                self._thread.join()
        finally:
            self._restore_env()

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _make_lightning_module(pl, loop: _LightningLoop):
    class _BenchModule(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = loop.model

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = loss_fn(self.model(x), y)
            loop._micro_losses.append(float(loss.detach()))
            loop._micro_batches.append((x, y))
            return loss

        def on_train_batch_start(self, batch, batch_idx):
            return loop._at_batch_start(batch_idx)

        def configure_optimizers(self):
            loop.optimizer = _make_optimizer(loop.w, self.parameters())
            return loop.optimizer

    return _BenchModule()


# ----------------------------------------------------------------------------------------------
# The check's reference step
# ----------------------------------------------------------------------------------------------


def check_rtol(device_type: str) -> float:
    """Training.check's tolerance, relative to each parameter's gradient / update norm. The loops
    run in float32 (CPU: ~1e-6 off the float64 reference); on CUDA the checked step runs with TF32
    off (:func:`_full_float32`), and cuDNN / cuBLAS may still sum in other orders and pick other
    algorithms, hence the looser bound there."""
    return 1e-2 if device_type == "cuda" else 1e-3


@contextlib.contextmanager
def _full_float32(device_type: str):
    """TF32 off for cuDNN convolutions and cuBLAS matmuls while the checked step runs on CUDA
    (cuDNN's default is on; its 10-bit mantissa would leave the check comparing TF32 rounding).
    The timed rounds keep the defaults a user's loop runs with."""
    if device_type != "cuda":
        yield
        return
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def max_pool_routing(model):
    """While active, records which element of each window every ``nn.MaxPool2d`` of ``model``
    picks, per forward call; yields one list of index tensors per pooling layer (in module order).

    The float64 reference must route the gradient through the same elements as the float32 step:
    where two values of a window are within float32 rounding of each other, float64 can pick the
    other one and send that window's gradient elsewhere (cnn, CPU: 0.6% off on the first
    convolution's weight after one particular number of training steps)."""
    import torch.nn as nn
    import torch.nn.functional as F

    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    routes: list[list] = [[] for _ in pools]

    def recorder(k, pool):
        def hook(module, args, output):
            _, indices = F.max_pool2d(args[0].detach(), pool.kernel_size, pool.stride, pool.padding,
                                      pool.dilation, pool.ceil_mode, return_indices=True)
            routes[k].append(indices)
        return hook

    handles = [pool.register_forward_hook(recorder(k, pool)) for k, pool in enumerate(pools)]
    try:
        yield routes
    finally:
        for handle in handles:
            handle.remove()


class _RoutedMaxPool:
    """A max-pooling layer that takes the elements ``indices`` name (from max_pool_routing)."""

    def __new__(cls, indices):
        import torch.nn as nn

        class RoutedMaxPool(nn.Module):
            def __init__(self):
                super().__init__()
                self.indices = indices

            def forward(self, x):
                picked = x.flatten(2).gather(2, self.indices.flatten(2).to(x.device))
                return picked.view(self.indices.shape)

        return RoutedMaxPool()


def reference_step(workload: "Training", state_dict, inputs, targets, momentum, pool_routes=None):
    """One single-process SGD step in float64 from ``state_dict`` on the global batch
    (``inputs``, ``targets``: every rank's micro-batches of the step, concatenated).

    Returns (gradient, parameter update) flattened in parameter order: the gradient of the mean
    loss over the global batch (what the average over ranks of the average over equal-sized
    micro-batches must equal) and ``-lr * (momentum * buffer + gradient)`` (torch's SGD with
    momentum; the buffers are the implementation's from before the step, None where it had none).
    ``pool_routes``: per max-pooling layer, the indices the implementation's step picked for the
    whole global batch; the reference pools the same elements.
    """
    import torch
    import torch.nn as nn

    model = build_model(workload.model).to(torch.float64)
    model.load_state_dict({k: v.to(torch.float64) if v.is_floating_point() else v
                           for k, v in state_dict.items()})
    if pool_routes:
        parents = [(parent, name) for parent in model.modules()
                   for name, child in parent.named_children() if isinstance(child, nn.MaxPool2d)]
        for (parent, name), indices in zip(parents, pool_routes):
            setattr(parent, name, _RoutedMaxPool(indices))
    model.to(inputs.device)
    x = inputs.to(torch.float64) if inputs.is_floating_point() else inputs
    loss_fn(model(x), targets).backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grad = torch.cat([p.grad.reshape(-1) for p in params]).cpu()
    steps = []
    for p, buf in zip(params, momentum):
        g = p.grad.reshape(-1).cpu()
        if buf is not None and workload.momentum:
            g = buf.reshape(-1).to("cpu", torch.float64) * workload.momentum + g
        steps.append(g * -workload.lr)
    return grad, torch.cat(steps)


def _gather_cat(tensor):
    """Every rank's ``tensor`` (same shape on each), concatenated along dim 0 in rank order."""
    import torch
    import torch.distributed as dist

    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts)


def _compare_step(grads, grad_ref, moved, update_ref, sizes, names, rounding, rtol,
                  world_size) -> list[str]:
    """What is wrong with one step (empty when nothing): per parameter, the gradient and the
    update against the reference's, relative to the reference's norm (the update: plus
    ``rounding``, the parameter's own storage rounding, which a small update can be near)."""
    problems = []
    gnorm = float(grad_ref.norm())
    if float(grads.norm()) == 0.0 and gnorm > 0:
        problems.append(f"every gradient is zero after the step (the reference's norm is {gnorm:.3g})")
    else:
        wrong = []
        for name, g, r in zip(names, grads.split(sizes), grad_ref.split(sizes)):
            err = float((g - r).norm()) / max(float(r.norm()), 1e-12 * gnorm, 1e-300)
            if not err <= rtol:
                wrong.append((err, name))
        if wrong:
            scale = float((grads * grad_ref).sum()) / max(gnorm * gnorm, 1e-300)
            hint = ""
            if float((grads - grad_ref * scale).norm()) <= rtol * gnorm * max(abs(scale), 1.0):
                hint = f"; the gradient is {scale:.4g} x the reference's"
                if world_size > 1 and abs(scale - world_size) <= rtol * world_size:
                    hint += (f" (= the world size: a reduction that sums over the {world_size} "
                             f"ranks without dividing by the world size)")
            worst = max(wrong)
            problems.append(f"the reduced gradient differs in {len(wrong)} of {len(sizes)} parameters "
                            f"(worst {worst[1]}: off by {worst[0]:.3g} of its norm, tolerance {rtol:g})"
                            + hint)
    unorm = float(update_ref.norm())
    if float(moved.norm()) == 0.0 and unorm > 0:
        problems.append(f"the parameters did not move in the optimizer step (the reference moves "
                        f"them by a norm of {unorm:.3g}): the step was skipped or had nothing to apply")
    else:
        wrong = []
        for name, m, u, floor in zip(names, moved.split(sizes), update_ref.split(sizes), rounding):
            size = max(float(u.norm()), 1e-12 * unorm, 1e-300)
            err = float((m - u).norm()) / size
            if not err <= rtol + floor / size:
                wrong.append((err, name))
        if wrong:
            worst = max(wrong)
            problems.append(f"the parameters moved differently from the reference's SGD update in "
                            f"{len(wrong)} of {len(sizes)} parameters (worst {worst[1]}: off by "
                            f"{worst[0]:.3g} of the update's norm, tolerance {rtol:g})")
    return problems


# ----------------------------------------------------------------------------------------------
# The workload descriptor
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Training(Workload):
    """One training configuration; a round is one optimizer step."""

    model: str
    impl: str
    batch_size: int = 32  # per rank and micro-batch (dataparallel: per GPU)
    grad_accum: int = 1
    seed: int = 0
    lr: float = 0.05
    momentum: float = 0.9
    data_batches: int = 8  # distinct micro-batches per rank, cycled
    bucket_cap_mb: float = 25.0
    measure_memory: bool = True  # CPU: one extra untimed step under the memory profiler

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; expected one of {', '.join(MODELS)}")
        if self.impl not in IMPLS:
            raise ValueError(f"unknown training implementation {self.impl!r}; expected one of {', '.join(IMPLS)}")
        for name in ("batch_size", "grad_accum", "data_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if not self.bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {self.bucket_cap_mb!r}")

    @property
    def group(self) -> str:  # type: ignore[override]
        return f"training-{self.model}"

    @property
    def samples_per_step_per_rank(self) -> int:
        return self.batch_size * self.grad_accum

    def setup(self, ctx) -> dict[str, Any]:
        import torch

        started = time.perf_counter()
        batch = self.batch_size
        if self.impl == "dataparallel":
            if ctx.device_type != "cuda" or ctx.world_size != 1:
                raise ValueError("impl 'dataparallel' runs in a single process over every visible GPU: "
                                 "it needs a CUDA pool of world size 1")
            batch *= torch.cuda.device_count()
        elif self.impl == "lightning":
            reason = lightning_unavailable_reason()
            if reason:
                raise RuntimeError(reason)
        inputs, targets = make_data(self.model, batch, self.data_batches, self.seed, ctx.rank)
        device = torch.device("cuda", 0) if self.impl == "dataparallel" else ctx.device
        data = (inputs.to(device), targets.to(device))
        on_cpu = ctx.device_type != "cuda"
        state: dict[str, Any] = {"ctx": ctx, "peak_memory_bytes": None}
        if self.impl == "lightning":
            loop = _LightningLoop(ctx, self, data, memory_probe=self.measure_memory)
            state["peak_memory_bytes"] = loop.peak_memory_bytes
        else:
            probe = _CpuMemoryProbe().start() if (self.measure_memory and on_cpu) else None
            loop = None
            try:
                loop = self._loop_class()(ctx, self, data)
                if self.measure_memory:
                    loop.step()  # the untimed memory step (same for every impl)
            finally:
                if probe is not None:
                    floor = _parameter_bytes(loop.module()) if loop is not None else 0
                    state["peak_memory_bytes"] = probe.stop(floor_bytes=floor)
        state["loop"] = loop
        state["setup_seconds"] = time.perf_counter() - started
        return state

    def _loop_class(self):
        """The loop of ``impl`` (all but Lightning; tests plant bugs in subclasses through this)."""
        return {"manual": _ManualLoop, "ddp": _DDPLoop, "dataparallel": _DataParallelLoop}[self.impl]

    def run_round(self, state) -> None:
        state["loop"].step()

    def rank_metrics(self, state) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        ctx, loop = state["ctx"], state["loop"]
        # final_loss: the last step's loss averaged over ranks (each rank saw different data).
        last = torch.tensor([loop.losses[-1] if loop.losses else float("nan")], dtype=torch.float64,
                            device=ctx.device)
        if self.impl != "dataparallel":
            dist.all_reduce(last, op=dist.ReduceOp.SUM)
            last /= ctx.world_size
        metrics: dict[str, Any] = {
            "final_loss": float(last.item()),
            "optimizer_steps": len(loop.losses),
            "setup_seconds": round(state["setup_seconds"], 4),
        }
        if state["peak_memory_bytes"] is not None:  # CPU; on CUDA the engine reports it
            metrics["peak_memory_bytes"] = state["peak_memory_bytes"]
        return metrics

    def check(self, state) -> None:
        """The losses are finite, every rank holds rank 0's parameters, and one more optimizer step
        (untimed, on fresh micro-batches the loop has not trained on) matches
        :func:`reference_step`: a single-process step in float64 on the gathered micro-batches of
        that step from every rank. The gradient the implementation left on each
        parameter must be the reference's (the average over the global batch) and the parameters
        must have moved from their start by the reference's SGD update, each within
        :func:`check_rtol` of its size."""
        import math

        import torch
        import torch.distributed as dist

        ctx, loop = state["ctx"], state["loop"]
        who = f"{self.impl}/{self.model} on rank {ctx.rank}"
        bad = [loss for loss in loop.losses if not math.isfinite(loss)]
        if bad:
            raise AssertionError(f"{who}: non-finite loss {bad[0]}")
        distributed = self.impl != "dataparallel" and ctx.world_size > 1
        model = loop.module()
        if distributed:
            # Every rank reaches the same verdict (a rank that raised alone would leave the others
            # waiting in the reference step's collectives).
            mine = flat_parameters(model).to(ctx.device)
            reference = mine.clone()
            dist.broadcast(reference, src=0)
            off = (mine - reference).abs() - 1e-5 * reference.abs()
            worst = torch.stack([off.max(), (mine - reference).abs().max()]).to(torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            if float(worst[0]) > 1e-6:
                diff = float((mine - reference).abs().max())
                raise AssertionError(
                    f"{who}: the ranks' parameters differ from rank 0's after training (max |diff| "
                    f"{float(worst[1]):.3g} over all ranks, {diff:.3g} on this rank); the gradient "
                    f"reduction is broken")

        params = [p for p in model.parameters() if p.requires_grad]
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        start_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        start = [p.detach().clone() for p in params]
        optimizer_state = loop.optimizer.state if loop.optimizer is not None else {}
        momentum = [optimizer_state.get(p, {}).get("momentum_buffer") for p in params]
        momentum = [None if m is None else m.detach().clone() for m in momentum]
        # The checked step trains on micro-batches the loop has never seen, labelled by another
        # teacher. After hundreds of timed steps a model fits its own few batches to a loss of
        # ~1e-4, where the gradient is so small that float32 rounding alone put it 2-8% off the
        # float64 reference (cnn, 200 steps, on CPU and on an H100): that tested rounding, not the
        # reduction. Fresh batches give O(1) losses and gradients.
        fresh = make_data(self.model, loop.inputs.shape[1], self.grad_accum, self.seed + CHECK_DATA_SEED_OFFSET,
                          ctx.rank)
        # DataParallel's replicas run the pooling on several threads: no single routing to follow.
        routing = max_pool_routing(model) if self.impl != "dataparallel" else contextlib.nullcontext([])
        with loop.training_on(*(t.to(loop.inputs.device) for t in fresh)), _full_float32(ctx.device_type), \
                routing as routes:
            loop.step()
        batches = loop.last_step_batches
        if not batches:
            raise AssertionError(f"{who}: the optimizer step recorded no micro-batches")
        inputs = torch.cat([x for x, _ in batches])
        targets = torch.cat([y for _, y in batches])
        pool_routes = [torch.cat(calls) for calls in routes if calls]
        if distributed:
            inputs, targets = _gather_cat(inputs), _gather_cat(targets)
            pool_routes = [_gather_cat(indices) for indices in pool_routes]
        sizes = [p.numel() for p in params]
        if not distributed or ctx.rank == 0:
            grad_ref, update_ref = reference_step(self, start_state, inputs, targets, momentum,
                                                  pool_routes if len(pool_routes) == len(routes) else None)
            packed = torch.cat([grad_ref, update_ref]).to(inputs.device)
        else:
            packed = torch.empty(2 * sum(sizes), dtype=torch.float64, device=inputs.device)
        if distributed:
            dist.broadcast(packed, src=0)
        grad_ref, update_ref = packed.cpu().split(sum(sizes))
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                           .to("cpu", torch.float64) for p in params])
        moved = torch.cat([(p.detach() - s0).reshape(-1).to("cpu", torch.float64)
                           for p, s0 in zip(params, start)])
        # A parameter is stored in float32: its new value is off the exact one by up to half an ulp.
        rounding = [torch.finfo(s0.dtype).eps * float(s0.norm()) for s0 in start]
        samples = inputs.shape[0]
        problems = [] if len(batches) == self.grad_accum else [
            f"the step ran {len(batches)} micro-batches on this rank, expected grad_accum = {self.grad_accum}"]
        problems += _compare_step(grads, grad_ref, moved, update_ref, sizes, names, rounding,
                                 check_rtol(ctx.device_type), ctx.world_size if distributed else 1)
        if problems:
            raise AssertionError(
                f"{who}: one optimizer step differs from a single-process float64 step on the "
                f"{samples} gathered samples of that step: " + "; ".join(problems))

    def teardown(self, state) -> None:
        loop = state.get("loop")
        if loop is not None:
            loop.close()
        state.clear()

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        info: dict[str, Any] = {
            "impl": self.impl,
            "model": self.model,
            "grad_accum": self.grad_accum,
            "batch_size": self.batch_size,
        }
        replicas = world_size
        if self.impl == "dataparallel":
            try:
                import torch

                replicas = max(1, torch.cuda.device_count())
            except Exception:  # pragma: no cover - no torch/CUDA in the controller
                replicas = 1
        samples = self.samples_per_step_per_rank * replicas
        info["samples_per_second"] = round(samples / median_s, 3)
        if self.model == "lstm":
            info["characters_per_second"] = round(samples * SEQ_LEN / median_s, 1)
        return info


def train_steps(ctx, workload: Training, steps: int) -> dict[str, Any]:
    """Pool task: set up ``workload`` on this rank, run ``steps`` optimizer steps, return the
    per-step losses (after set-up) and the flattened final parameters. Used by the parity tests."""
    state = workload.setup(ctx)
    try:
        losses = [state["loop"].step() for _ in range(steps)]
        return {"losses": losses, "params": flat_parameters(state["loop"].module())}
    finally:
        workload.teardown(state)
