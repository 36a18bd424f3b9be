"""Lightning in a rank: a ``Trainer`` attached to the pool's existing process group through the
torchelastic environment variables, running one long ``fit`` that the engine's rounds step through
one optimizer step at a time (:class:`PacedFit`). Both the training family's ``lightning`` loop
(:class:`_LightningLoop`) and the public :class:`~.lightning_training.LightningTraining` use it."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import traceback
from typing import Any, Callable

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
# Trainer arguments that attach it to the rank (PacedFit.trainer_arguments) or make its fit the
# paced one (one endless fit, no validation, nothing written): a workload sets them, never the user.
PACED_TRAINER_ARGUMENTS = ("accelerator", "devices", "num_nodes", "strategy", "max_epochs", "max_steps",
                           "min_epochs", "min_steps", "max_time", "limit_train_batches", "limit_val_batches",
                           "num_sanity_val_steps", "accumulate_grad_batches")


def lightning_unavailable_reason() -> str | None:
    """None if pytorch_lightning imports, else why not (the Lightning cases skip with it)."""
    try:
        import pytorch_lightning  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return (f"pytorch_lightning is not importable ({type(exc).__name__}: {exc}); "
                f"install the extra: pip install 'ddpbench[lightning]'")
    return None


class PacedFit:
    """A Lightning ``Trainer.fit`` running once, on a helper thread of the rank, paced one optimizer
    step per :meth:`step`.

    Why a thread: the engine owns the round loop (barrier -> timer -> run_round), while Lightning
    owns its own loop inside ``Trainer.fit``. Calling ``fit`` once per round would time Lightning's
    whole set-up and teardown (wrapping DDP, broadcasting the parameters, its barriers) in every
    round; instead ``fit`` runs once over endless data. The module's ``on_train_batch_start`` calls
    :meth:`at_batch_start`, which, at the first batch after an optimizer step (``trainer.global_step``
    moved), reports the step as done and blocks until ``step`` asks for the next one. So a round is
    exactly one optimizer step *as Lightning runs it*: its hooks, closures, loss scaling by
    1/accumulate_grad_batches, DDP ``no_sync`` for the accumulation micro-steps, its per-batch
    broadcast of the SIGTERM flag and the fetch of the next batch, plus one thread hand-off (tens
    of microseconds). Lightning's one-off cost (Trainer construction, strategy set-up, DDP wrapping,
    up to the first batch) happens in set-up, untimed. Only one thread runs at a time: the engine's
    thread waits while the trainer's steps, and the trainer's step runs under the dispatch modes of
    the round that asked for it (the collective and memory censuses see it as the round's own).
    :meth:`close` makes the hook set ``trainer.should_stop`` and return -1, so ``fit`` ends normally
    on every rank.

    Attaching to the pool's group: with the torchelastic variables set, Lightning picks
    TorchElasticEnvironment (processes created externally, so no launcher) and, finding the
    default process group initialised, does not create another; MASTER_PORT is never opened.
    Each rank is presented as a node of one device (``num_nodes`` = world size, LOCAL_RANK 0,
    GROUP_RANK = rank) and that device is the rank's own (``devices=[index]`` on CUDA): Lightning
    would otherwise put local rank r on cuda:r, which does not exist when ranks share a GPU (two
    gloo ranks with CUDA tensors on a single-GPU machine) or when the pool maps ranks otherwise.

    Threads: the trainer thread runs with the rank's intra-op thread count, like the other loops.
    OpenMP's count is per OS thread, so the thread sets it; and OMP_NUM_THREADS is set to it while
    the trainer exists, because otherwise Lightning's launcher raises it to cpu_count // world_size
    (see :data:`LIGHTNING_ENV_KEYS`). The first paced step checks the count and fails the case if
    Lightning's set-up changed it anyway (``trainer_num_threads``).

    ``run_fit(paced)`` runs on the trainer thread: it builds the module (whose
    ``on_train_batch_start`` returns ``paced.at_batch_start(trainer)``) and a Trainer with
    ``**paced.trainer_arguments()``, and calls ``fit``. ``on_step_end()`` runs on the trainer
    thread after each optimizer step, before the step is reported done.
    """

    def __init__(self, ctx, run_fit: Callable[["PacedFit"], None], on_step_end: Callable[[], None] | None = None):
        import torch

        self.ctx = ctx
        self._run_fit = run_fit
        self._on_step_end = on_step_end or (lambda: None)
        self._commands: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._num_threads = torch.get_num_threads()  # the rank's setting (1 in the pool)
        self.trainer_num_threads: int | None = None  # seen on the trainer thread at the first step
        self._started = False
        self._step_at: int | None = None  # trainer.global_step when the last step began
        self._round_modes = contextlib.ExitStack()
        self._saved_env = {key: os.environ.get(key) for key in LIGHTNING_ENV_KEYS}
        os.environ.update({
            "RANK": str(ctx.rank), "LOCAL_RANK": "0", "GROUP_RANK": str(ctx.rank),
            "WORLD_SIZE": str(ctx.world_size), "LOCAL_WORLD_SIZE": "1",
            "TORCHELASTIC_RUN_ID": "ddpbench", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": LIGHTNING_UNUSED_MASTER_PORT,
            # Keeps Lightning's launcher from resetting the intra-op thread count (see above).
            "OMP_NUM_THREADS": str(self._num_threads),
        })
        self._thread = threading.Thread(target=self._fit, name="ddpbench-lightning", daemon=True)
        self._thread.start()
        try:
            self._wait("ready")
        except BaseException:
            self._restore_env()
            raise

    def trainer_arguments(self, strategy: Any = "ddp") -> dict[str, Any]:
        """The Trainer arguments that attach it to this rank and make its ``fit`` the paced one:
        this rank's device, one device per node and a node per rank, ``strategy`` (a name or a
        strategy object), one endless fit without validation, checkpoints, logs or progress bars."""
        cuda = self.ctx.device_type == "cuda"
        return {"accelerator": "gpu" if cuda else "cpu", "devices": [self.ctx.device.index] if cuda else 1,
                "num_nodes": self.ctx.world_size, "strategy": strategy,
                "max_epochs": -1, "max_steps": -1, "num_sanity_val_steps": 0, "limit_val_batches": 0,
                "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                "enable_model_summary": False,
                "default_root_dir": os.path.join(os.environ.get("TMPDIR", "/tmp"), "ddpbench-lightning")}

    # -- trainer thread ----------------------------------------------------------------------

    def _fit(self) -> None:
        try:
            import logging

            import torch

            # OpenMP's thread count is per OS thread: a new thread would use every core again.
            torch.set_num_threads(self._num_threads)
            logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)  # no banner per case
            self._run_fit(self)
            outcome = ("ended", None)
        except BaseException:  # noqa: BLE001 - goes back to the engine's thread
            outcome = ("error", traceback.format_exc())
        self._round_modes.close()  # before the engine's thread, which entered them first, wakes
        self._results.put(outcome)

    def at_batch_start(self, trainer) -> int | None:
        """The module's ``on_train_batch_start``: at the first batch after an optimizer step,
        reports the step done and waits for the next command; -1 (with ``trainer.should_stop``)
        ends the fit."""
        if self._started and trainer.global_step == self._step_at:
            return None  # an accumulation micro-batch of the step under way
        self._round_modes.close()  # the step is over: the round's modes leave this thread
        if self._started:
            self._on_step_end()
        else:
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
        command, modes = self._commands.get()
        if command == "stop":
            trainer.should_stop = True
            return -1
        self._step_at = trainer.global_step
        for mode in modes:  # the round's dispatch modes (the censuses), entered here for this step
            self._round_modes.enter_context(mode)
        return None

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

    def step(self) -> None:
        """One optimizer step on the trainer thread, under this thread's dispatch modes."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        self._commands.put(("step", _get_current_dispatch_mode_stack()))
        self._wait("step")

    def close(self) -> None:
        try:
            if self._thread.is_alive():
                self._commands.put(("stop", []))
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


class _EndlessBatches:
    """An iterable without __len__ that cycles this rank's micro-batches (Lightning's train data)."""

    def __init__(self, loop: TrainingLoop):
        self.loop = loop

    def __iter__(self):
        while True:
            yield self.loop.next_batch()


class _LightningLoop(TrainingLoop):
    """The training family's ``lightning`` implementation: its model in a LightningModule whose
    ``training_step`` is the other loops' micro-step, trained by a :class:`PacedFit`."""

    def __init__(self, ctx, workload, data):
        super().__init__(ctx, workload, data)
        self._micro_losses: list[float] = []
        self._micro_batches: list = []
        self.model = None  # built on the trainer thread
        self.trainer = None
        self.paced = PacedFit(ctx, self._run_fit, self._step_ended)

    @property
    def trainer_num_threads(self) -> int | None:
        return self.paced.trainer_num_threads

    def _run_fit(self, paced: PacedFit) -> None:
        import pytorch_lightning as pl

        self.model = _seed_model(self.w, self.ctx.rank).to(self.ctx.device)
        self.trainer = trainer = pl.Trainer(**paced.trainer_arguments(), accumulate_grad_batches=self.w.grad_accum,
                                            use_distributed_sampler=False)
        trainer.fit(_make_lightning_module(pl, self, paced), train_dataloaders=_EndlessBatches(self))

    def _step_ended(self) -> None:
        micro, self._micro_losses = self._micro_losses, []
        self.losses.append(sum(micro) / len(micro))
        self.last_step_batches, self._micro_batches = self._micro_batches, []

    def module(self):
        return self.model

    def trained_module(self):
        """Lightning's DDP wrapper once the fit has set up (so the memory census names its buckets)."""
        return self.ddp_module() or self.model

    def ddp_module(self):
        return getattr(getattr(self.trainer, "strategy", None), "model", None)

    def step(self) -> float:
        self.paced.step()
        return self.losses[-1]

    def close(self) -> None:
        self.paced.close()


def _make_lightning_module(pl, loop: _LightningLoop, paced: PacedFit):
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
            return paced.at_batch_start(self.trainer)

        def configure_optimizers(self):
            loop.optimizer = _make_optimizer(loop.w, self.parameters())
            return loop.optimizer

    return _BenchModule()
