"""The Lightning implementation: a ``pytorch_lightning.Trainer(strategy="ddp")`` attached to the
rank's existing process group through the torchelastic environment variables, one long ``fit``
that the engine's rounds step through."""

from __future__ import annotations

import os
import queue
import threading
import traceback

from .base import TrainingLoop
from .loops import _make_optimizer, _seed_model
from .models import loss_fn

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
# _init_dist_connection returns early (checked by tests/workloads/training/test_training_parity.py).
LIGHTNING_UNUSED_MASTER_PORT = "29499"


def lightning_unavailable_reason() -> str | None:
    """None if pytorch_lightning imports, else why not (the Lightning cases skip with it)."""
    try:
        import pytorch_lightning  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return (f"pytorch_lightning is not importable ({type(exc).__name__}: {exc}); "
                f"install the extra: pip install 'ddpbench[lightning]'")
    return None


class _EndlessBatches:
    """An iterable without __len__ that cycles this rank's micro-batches (Lightning's train data)."""

    def __init__(self, loop: TrainingLoop):
        self.loop = loop

    def __iter__(self):
        while True:
            yield self.loop.next_batch()


class _LightningLoop(TrainingLoop):
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

    def __init__(self, ctx, workload, data):
        super().__init__(ctx, workload, data)
        self._commands: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
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
        self.model = None  # built on the trainer thread
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
            loop._micro_losses.append(loop.loss_value(loss))
            loop._micro_batches.append((x, y))
            return loss

        def on_train_batch_start(self, batch, batch_idx):
            return loop._at_batch_start(batch_idx)

        def configure_optimizers(self):
            loop.optimizer = _make_optimizer(loop.w, self.parameters())
            return loop.optimizer

    return _BenchModule()
