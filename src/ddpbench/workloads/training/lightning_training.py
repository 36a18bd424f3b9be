"""``ddpbench.LightningTraining``: a user's own LightningModule, trained by a Lightning ``Trainer``
attached to the pool's process group, one optimizer step per round (docs/design/families.md#your-own-model)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import Workload
from .lightning import PACED_TRAINER_ARGUMENTS, PacedFit, lightning_unavailable_reason
from .own_code import (callable_name, check_factory, check_last_loss_finite, check_positive, check_ranks_agree,
                       check_step_figures, json_value, own_step_metrics, probe_peak_flops, rate_info, seeded_batches, tensors_of)


class _EndlessBatches:
    """An iterable without __len__ that cycles a rank's micro-batches (the Trainer's train data)."""

    def __init__(self, batches: list):
        self.batches = batches

    def __iter__(self):
        while True:
            yield from self.batches


@dataclass(frozen=True)
class LightningTraining(Workload):
    """A LightningModule trained as Lightning trains it, one optimizer step per round: ``module()``
    builds it (its own ``training_step`` and ``configure_optimizers``; the same seed on every rank),
    and its data comes from ``datamodule()`` (a LightningDataModule: Lightning gives each rank its
    shard through a DistributedSampler) or from ``batch(ctx, i)``, this rank's i-th micro-batch
    (``data_batches`` of them, cycled, drawn under a seed per rank and index). A
    ``pytorch_lightning.Trainer(strategy=DDPStrategy(**ddp_options), **trainer_options)`` runs one
    ``fit`` on this rank's device, attached to the pool's process group (rank, world size and the
    group are the pool's), and each round is one optimizer step of ``grad_accum`` micro-batches
    (``accumulate_grad_batches``): Lightning's per-step work is timed, its set-up is not.
    ``trainer_options`` may set anything else (``precision="bf16-mixed"``, ``gradient_clip_val``...).
    Given ``seq_len`` (tokens per sample) the case records tokens/s, given ``flops_per_sample`` its MFU.

    Every field is a value or a module-level callable: the ranks (and an A/B run's baseline, from its
    own code) rebuild the same workload from them; the module, Trainer and data are made in set-up."""

    module: Callable[[], Any]
    datamodule: Callable[[], Any] | None = None
    batch: Callable[[Any, int], Any] | None = None
    grad_accum: int = 1
    ddp_options: dict = field(default_factory=dict, hash=False)  # hashed by the other fields
    trainer_options: dict = field(default_factory=dict, hash=False)  # hashed by the other fields
    data_batches: int = 8
    seq_len: int | None = None
    flops_per_sample: float | None = None
    seed: int = 0
    name: str | None = None

    def __post_init__(self):
        owner = "LightningTraining"
        check_factory(owner, "module", self.module)
        check_factory(owner, "datamodule", self.datamodule, optional=True)
        check_factory(owner, "batch", self.batch, optional=True)
        if (self.datamodule is None) == (self.batch is None):
            raise ValueError("ddpbench.LightningTraining: give its data one way: datamodule=... (a "
                             "LightningDataModule factory) or batch=... (batch(ctx, i) -> a micro-batch)")
        for name in ("grad_accum", "data_batches"):
            check_positive(owner, name, getattr(self, name))
        owned = sorted(set(self.trainer_options) & set(PACED_TRAINER_ARGUMENTS))
        if owned:
            raise ValueError(f"ddpbench.LightningTraining: trainer_options {', '.join(owned)}: the workload "
                             f"sets these (each rank one device of the pool's group, one optimizer step a "
                             f"round); gradient accumulation is grad_accum=, DDP's knobs ddp_options=")
        check_step_figures(owner, self.seq_len, self.flops_per_sample)

    # -- rank side ------------------------------------------------------------------------------

    def skip_reason(self, spec) -> str | None:
        return lightning_unavailable_reason()

    def setup(self, ctx) -> dict[str, Any]:
        started = time.perf_counter()
        loop = _LightningModuleLoop(ctx, self)
        state: dict[str, Any] = {"ctx": ctx, "loop": loop}
        if self.flops_per_sample:
            precision = str(self.trainer_options.get("precision", ""))
            state.update(probe_peak_flops(ctx, precision.startswith("bf16")))
        state["setup_seconds"] = time.perf_counter() - started
        return state

    def run_round(self, state):
        return state["loop"].step()

    def rank_metrics(self, state) -> dict[str, Any]:
        return own_step_metrics(state)

    def check(self, state) -> None:
        """The last loss is finite and every rank ends with rank 0's parameters (DDP)."""
        ctx, loop = state["ctx"], state["loop"]
        who = f"LightningTraining({self.name or callable_name(self.module)}) on rank {ctx.rank}"
        check_last_loss_finite(who, loop.last_loss)
        check_ranks_agree(who, ctx, loop.module.parameters())

    def census_details(self, state) -> dict[str, Any]:
        """DDP's bucket sizes (Lightning's DDP wrapper)."""
        from ...engine.census import ddp_bucket_sizes

        wrapped = state["loop"].wrapped()
        return {"ddp_buckets": ddp_bucket_sizes(wrapped)} if hasattr(wrapped, "reducer") else {}

    def memory_census_targets(self, state) -> list:
        """The module as Lightning trains it (its DDP wrapper, so the buckets are named), the
        optimizers and the pre-built micro-batches."""
        loop = state["loop"]
        return [loop.wrapped(), *loop.optimizers(), *(t for batch in loop.batches for t in tensors_of(batch))]

    def numerics_targets(self, state) -> list:
        """The LightningModule itself (its parameters under their own names) and the optimizers."""
        loop = state["loop"]
        return [loop.module, *loop.optimizers()]

    def teardown(self, state) -> None:
        loop = state.get("loop")
        if loop is not None:
            loop.close()
        state.clear()

    # -- controller side ------------------------------------------------------------------------

    def extra_info(self, world_size: int, median_s: float,
                   rank_metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        info: dict[str, Any] = {"family": "other", "workload": self.name or callable_name(self.module),
                                "wrap": "lightning-ddp", "grad_accum": self.grad_accum,
                                "data": "datamodule" if self.datamodule is not None else "batch"}
        for key in ("ddp_options", "trainer_options"):
            if getattr(self, key):
                info[key] = json_value(getattr(self, key))
        info.update(rate_info(median_s, world_size, rank_metrics or {}, self.seq_len, self.flops_per_sample))
        return info

    def __repr__(self) -> str:
        return f"LightningTraining({self.name or callable_name(self.module)!r})"


class _LightningModuleLoop:
    """The user's LightningModule in a :class:`~.lightning.PacedFit`: its ``on_train_batch_start``
    paces the fit (then runs the module's own), its ``training_step`` is recorded on the way (the
    loss and the batch of each micro-batch)."""

    def __init__(self, ctx, w: LightningTraining):
        reason = lightning_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self.ctx, self.w = ctx, w
        self.module = None
        self.trainer = None
        self.batches = seeded_batches(w.batch, ctx, w.data_batches, w.seed) if w.batch is not None else []
        self.steps = 0
        self.last_loss = None
        self.last_step_batches: list = []
        self._micro_losses: list = []
        self._micro_batches: list = []
        self.paced = PacedFit(ctx, self._run_fit, self._step_ended)

    def _run_fit(self, paced: PacedFit) -> None:
        import pytorch_lightning as pl
        import torch
        from pytorch_lightning.strategies import DDPStrategy

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.w.seed)  # the same initial weights on every rank, as a script seeds them
            module = self.w.module()
        self._pace(module, paced)
        self.module = module
        arguments = {**paced.trainer_arguments(DDPStrategy(**self.w.ddp_options)),
                     "accumulate_grad_batches": self.w.grad_accum, **self.w.trainer_options}
        self.trainer = pl.Trainer(**arguments)
        if self.w.datamodule is not None:
            self.trainer.fit(module, datamodule=self.w.datamodule())
        else:
            self.trainer.fit(module, train_dataloaders=_EndlessBatches(self.batches))

    def _pace(self, module, paced: PacedFit) -> None:
        """The module's own hooks, wrapped on the instance: pacing first, then its own
        ``on_train_batch_start``; its ``training_step``'s loss and batch recorded."""
        own_start, own_step = module.on_train_batch_start, module.training_step

        @functools.wraps(own_start)
        def on_train_batch_start(batch, batch_idx, *args, **kwargs):
            if paced.at_batch_start(module.trainer) == -1:
                return -1
            return own_start(batch, batch_idx, *args, **kwargs)

        @functools.wraps(own_step)
        def training_step(*args, **kwargs):
            output = own_step(*args, **kwargs)
            loss = output.get("loss") if isinstance(output, dict) else output
            if hasattr(loss, "detach"):
                self._micro_losses.append(loss.detach())
            if args:
                self._micro_batches.append(args[0])
            return output

        module.on_train_batch_start = on_train_batch_start
        module.training_step = training_step

    def _step_ended(self) -> None:
        micro, self._micro_losses = self._micro_losses, []
        self.last_loss = sum(micro) / len(micro) if micro else None
        self.last_step_batches, self._micro_batches = self._micro_batches, []
        self.steps += 1

    def wrapped(self):
        """The module as the Trainer's strategy runs it (DDP's wrapper)."""
        model = getattr(getattr(self.trainer, "strategy", None), "model", None)
        return model if model is not None else self.module

    def optimizers(self) -> list:
        return list(getattr(self.trainer, "optimizers", None) or [])

    def step(self):
        self.paced.step()
        return self.last_loss

    def close(self) -> None:
        self.paced.close()
