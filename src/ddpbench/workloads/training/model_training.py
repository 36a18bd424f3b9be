"""``ddpbench.ModelTraining``: a user's own model, trained as they train it (DDP with its knobs,
FSDP2, or a wrapper of their own), one optimizer step per round (docs/design/families.md#your-own-model)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

from .base import TrainingWorkload
from .own_code import (callable_name, check_factory, check_last_loss_finite, check_positive, check_ranks_agree,
                       check_step_figures, json_value, own_step_metrics, probe_peak_flops, rate_info, seeded_batches, tensors_of)

#: The wrappers ``ModelTraining(wrap=...)`` names; a callable ``wrap(model, ctx)`` is the user's own.
WRAPS = ("ddp", "fsdp2", "none")
AUTOCASTS = (None, "bf16")


def cross_entropy(model, batch):
    """The default loss: ``batch`` is ``(inputs, targets)``; cross-entropy of ``model(inputs)``
    against ``targets`` (sequence outputs ``(B, T, C)`` flattened over their positions)."""
    import torch.nn.functional as F

    inputs, targets = batch
    logits = model(inputs)
    if logits.dim() > 2:
        return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
    return F.cross_entropy(logits.float(), targets)


def fsdp2_units(model, blocks: tuple | None) -> list:
    """The modules ``fully_shard`` wraps before the root: every instance of the classes in
    ``blocks``, or, without, every element of the model's ``nn.ModuleList`` s (the blocks of a
    transformer, as torchtitan shards them)."""
    import torch.nn as nn

    if blocks:
        return [m for m in model.modules() if m is not model and isinstance(m, tuple(blocks))]
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


@dataclass(frozen=True)
class ModelTraining(TrainingWorkload):
    """A user's model trained one optimizer step per round: ``model()`` builds it (the same seed on
    every rank), ``batch(ctx, i)`` this rank's i-th micro-batch (``data_batches`` of them, cycled;
    drawn under a seed per rank and index, so random data differs between ranks),
    ``optimizer(parameters)`` its optimizer (``functools.partial(torch.optim.AdamW, lr=1e-3)``),
    ``loss(model, batch)`` the micro-batch's loss (default :func:`cross_entropy`). ``wrap``: "ddp"
    (``DistributedDataParallel(model, **ddp_options)``), "fsdp2" (``fully_shard(unit,
    **fsdp2_options)`` on each of :func:`fsdp2_units`, then the root), "none", or ``wrap(model, ctx)
    -> module`` of the user's own. ``grad_accum`` micro-batches per step, all but the last without
    gradient sync (DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``, a wrapper's own
    ``no_sync`` where it has one); ``autocast="bf16"`` runs forward and loss under ``torch.autocast``;
    ``compile`` calls the wrapped model through ``torch.compile`` (True, or a dict of its arguments:
    ``{"mode": "max-autotune"}``; the case skips with inductor's reason where inductor cannot build).
    Given ``seq_len`` (tokens per sample) the case records tokens/s, given ``flops_per_sample``
    (forward + backward) its MFU.

    Every field is a value or a module-level callable: the ranks (and an A/B run's baseline, from its
    own code) rebuild the same workload from them; the model, data and optimizer are made in set-up."""

    model: Callable[[], Any]
    batch: Callable[[Any, int], Any]
    optimizer: Callable[[Any], Any]
    wrap: str | Callable[[Any, Any], Any] = "ddp"
    ddp_options: dict = field(default_factory=dict, hash=False)  # hashed by the other fields
    fsdp2_options: dict = field(default_factory=dict, hash=False)  # hashed by the other fields
    fsdp2_blocks: tuple | None = None
    loss: Callable[[Any, Any], Any] = cross_entropy
    grad_accum: int = 1
    autocast: str | None = None
    compile: bool | dict = field(default=False, hash=False)
    data_batches: int = 8
    seq_len: int | None = None
    flops_per_sample: float | None = None
    seed: int = 0
    name: str | None = None
    # The compute-only variant (variants()): DDP's buckets and FSDP2's exchanges handed back unreduced.
    compute_only: bool = False

    def __post_init__(self):
        owner = "ModelTraining"
        for role in ("model", "batch", "optimizer", "loss"):
            check_factory(owner, role, getattr(self, role))
        if not isinstance(self.wrap, str):
            check_factory(owner, "wrap", self.wrap)
        elif self.wrap not in WRAPS:
            raise ValueError(f"ddpbench.ModelTraining: wrap={self.wrap!r}; give one of {', '.join(WRAPS)} or a "
                             f"module-level function wrap(model, ctx) -> module")
        if self.ddp_options and self.wrap != "ddp":
            raise ValueError(f"ddpbench.ModelTraining: ddp_options apply to wrap='ddp', not {self.wrap!r}")
        if (self.fsdp2_options or self.fsdp2_blocks) and self.wrap != "fsdp2":
            raise ValueError(f"ddpbench.ModelTraining: fsdp2_options and fsdp2_blocks apply to wrap='fsdp2', "
                             f"not {self.wrap!r}")
        for name in ("grad_accum", "data_batches"):
            check_positive(owner, name, getattr(self, name))
        if self.autocast not in AUTOCASTS:
            raise ValueError(f"ddpbench.ModelTraining: autocast={self.autocast!r}; give None or 'bf16' (fp16 "
                             f"needs a gradient scaler: write that step as a FunctionWorkload)")
        check_step_figures(owner, self.seq_len, self.flops_per_sample)
        if not isinstance(self.compile, (bool, dict)):
            raise ValueError(f"ddpbench.ModelTraining: compile={self.compile!r}; give True, or a dict of "
                             f"torch.compile's arguments")
        if self.compute_only and not self.has_compute_only_form():
            raise ValueError(f"ddpbench.ModelTraining: wrap={self.wrap_name!r} has no compute-only form")

    @property
    def wrap_name(self) -> str:
        return self.wrap if isinstance(self.wrap, str) else callable_name(self.wrap)

    def skip_reason(self, spec) -> str | None:
        """Inductor's reason it cannot build here, for a compiled step that uses it."""
        from .transformer_settings import compile_unavailable_reason

        backend = self.compile.get("backend", "inductor") if isinstance(self.compile, dict) else "inductor"
        return compile_unavailable_reason() if self.compile and backend == "inductor" else None

    def has_compute_only_form(self) -> bool:
        """DDP (a hook returning each bucket unreduced) and FSDP2 (exchanges that exchange nothing)."""
        return self.wrap in ("ddp", "fsdp2") and "comm_hook" not in self.ddp_options

    # -- rank side ------------------------------------------------------------------------------

    def build_loop(self, ctx) -> "_ModelLoop":
        return _ModelLoop(ctx, self)

    def setup(self, ctx) -> dict[str, Any]:
        state = super().setup(ctx)
        if self.flops_per_sample and not self.compute_only:  # MFU's denominator, once per case
            state.update(probe_peak_flops(ctx, self.autocast == "bf16"))
        return state

    def run_round(self, state):
        return state["loop"].step()

    def rank_metrics(self, state) -> dict[str, Any]:
        from .metrics import parameter_bytes

        metrics = own_step_metrics(state)
        metrics.update(parameter_bytes(state["loop"].model))
        return metrics

    def check(self, state) -> None:
        """The last loss is finite; under DDP every rank ends with rank 0's parameters."""
        ctx, loop = state["ctx"], state["loop"]
        who = f"ModelTraining({self.name or callable_name(self.model)}) on rank {ctx.rank}"
        check_last_loss_finite(who, loop.last_loss)
        if self.wrap == "ddp":
            check_ranks_agree(who, ctx, loop.model.parameters())

    def census_details(self, state) -> dict[str, Any]:
        """DDP's bucket sizes under DDP."""
        from ...engine.census import ddp_bucket_sizes

        loop = state["loop"]
        return {"ddp_buckets": ddp_bucket_sizes(loop.wrapped)} if self.wrap == "ddp" else {}

    def memory_census_targets(self, state) -> list:
        loop = state["loop"]
        return [loop.wrapped, loop.optimizer, *(t for batch in loop.batches for t in tensors_of(batch))]

    # -- controller side ------------------------------------------------------------------------

    def extra_info(self, world_size: int, median_s: float,
                   rank_metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        info: dict[str, Any] = {"family": "other", "workload": self.name or callable_name(self.model),
                                "wrap": self.wrap_name, "grad_accum": self.grad_accum,
                                "autocast": self.autocast, "compile": json_value(self.compile)}
        for key in ("ddp_options", "fsdp2_options"):
            if getattr(self, key):
                info[key] = json_value(getattr(self, key))
        info.update(rate_info(median_s, world_size, rank_metrics or {}, self.seq_len, self.flops_per_sample))
        return info

    def __repr__(self) -> str:
        return f"ModelTraining({self.name or callable_name(self.model)!r}, wrap={self.wrap_name!r})"


class _ModelLoop:
    """One rank's model, wrapped as the workload says, its optimizer and micro-batches; ``step()``
    is one optimizer step."""

    def __init__(self, ctx, w: ModelTraining):
        import torch

        from .compute_only import SkippedCollectives

        self.ctx, self.w = ctx, w
        self.skipped = SkippedCollectives() if w.compute_only else None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(w.seed)  # the same initial weights on every rank, as a script seeds them
            model = w.model()
        self.model = model.to(ctx.device)
        self.wrapped = self._wrap(self.model)
        options = w.compile if isinstance(w.compile, dict) else {}
        self.forward = torch.compile(self.wrapped, **options) if w.compile else self.wrapped
        self.optimizer = w.optimizer(self.wrapped.parameters())
        self.batches = seeded_batches(w.batch, ctx, w.data_batches, w.seed)
        self.cursor = 0
        self.steps = 0
        self.last_loss = None  # the last step's mean loss, a tensor (read after the rounds)
        self.last_step_batches: list = []

    def _wrap(self, model):
        w, ctx = self.w, self.ctx
        if w.wrap == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [ctx.device.index] if ctx.device_type == "cuda" else None
            ddp = DistributedDataParallel(model, device_ids=device_ids, **w.ddp_options)
            if self.skipped is not None:
                from .compute_only import register_compute_only_hook

                register_compute_only_hook(ddp, "none", self.skipped)
            return ddp
        if w.wrap == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            units = fsdp2_units(model, w.fsdp2_blocks)
            for unit in units:
                fully_shard(unit, **w.fsdp2_options)
            fully_shard(model, **w.fsdp2_options)
            if self.skipped is not None:
                from .compute_only import unexchange_fsdp2

                unexchange_fsdp2([*units, model], self.skipped)
            return model
        if w.wrap == "none":
            return model
        return w.wrap(model, ctx)

    def _sync(self, last: bool):
        """Gradient sync on the last micro-batch only (FSDP2's switch, or a ``no_sync`` context)."""
        if hasattr(self.wrapped, "set_requires_gradient_sync"):
            self.wrapped.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        if not last and hasattr(self.wrapped, "no_sync"):
            return self.wrapped.no_sync()
        return contextlib.nullcontext()

    def _autocast(self):
        import torch

        if self.w.autocast == "bf16":
            return torch.autocast(self.ctx.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self):
        """One optimizer step of ``grad_accum`` micro-batches, each loss scaled by 1/grad_accum;
        returns the step's mean loss (a tensor: nothing waits for its value here)."""
        accum = self.w.grad_accum
        if self.skipped is not None:
            self.skipped.new_step()
        self.optimizer.zero_grad(set_to_none=True)
        total = None
        batches = []
        for i in range(accum):
            batch = self.batches[self.cursor % len(self.batches)]
            self.cursor += 1
            batches.append(batch)
            with self._sync(i == accum - 1):
                with self._autocast():
                    loss = self.w.loss(self.forward, batch)
                (loss / accum).backward()
            total = loss.detach() if total is None else total + loss.detach()
        self.optimizer.step()
        self.steps += 1
        self.last_loss = total / accum
        self.last_step_batches = batches
        return self.last_loss

    def trained_module(self):
        return self.wrapped

    def close(self) -> None:
        pass
