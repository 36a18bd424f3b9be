"""The training workload: one optimizer step per round, with its check against the reference step."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import TrainingLoop, TrainingWorkload, check_finite_losses
from .lightning import _LightningLoop, lightning_unavailable_reason
from .loops import LOOPS
from .models import CHECK_DATA_SEED_OFFSET, IMPLS, MODELS, SEQ_LEN, flat_parameters, make_data
from .step_check import StepComparison, _full_float32, _gather_cat, check_rtol, max_pool_routing, reference_step


# The implementations with a compute-only variant (Training.variants).
COMPUTE_ONLY_IMPLS = ("manual", "ddp")


@dataclass(frozen=True)
class Training(TrainingWorkload):
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
    # DDP only: the gradients are views into DDP's bucket buffers instead of a copy beside them
    # (DistributedDataParallel(gradient_as_bucket_view=True)): one gradient-sized buffer less.
    gradient_as_bucket_view: bool = False
    # The compute-only variant (variants()): the gradient exchange hands its data back unreduced.
    compute_only: bool = False
    # The loop of each implementation but Lightning's (a subclass may swap one in).
    loops: ClassVar[dict] = LOOPS

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
        if self.gradient_as_bucket_view and self.impl != "ddp":
            raise ValueError(f"gradient_as_bucket_view applies to impl 'ddp' (DDP's bucket buffers), not "
                             f"{self.impl!r}")
        if self.compute_only and self.impl not in COMPUTE_ONLY_IMPLS:
            raise ValueError(f"compute_only: impl {self.impl!r} has no compute-only form; those that do: "
                             f"{', '.join(COMPUTE_ONLY_IMPLS)}")

    @property
    def group(self) -> str:  # type: ignore[override]
        return f"training-{self.model}"

    @property
    def samples_per_step_per_rank(self) -> int:
        return self.batch_size * self.grad_accum

    @property
    def single_process(self) -> bool:
        return self.impl == "dataparallel"

    def has_compute_only_form(self) -> bool:
        """``manual``: its all_reduce left out; ``ddp``: a hook returning each bucket unreduced;
        none for Lightning and DataParallel."""
        return self.impl in COMPUTE_ONLY_IMPLS

    def build_loop(self, ctx) -> TrainingLoop:
        import torch

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
        if self.impl == "lightning":
            return _LightningLoop(ctx, self, data)
        return self.loops[self.impl](ctx, self, data)

    def check(self, state) -> None:
        """The losses are finite, every rank holds rank 0's parameters, and one more optimizer step
        (untimed, on fresh micro-batches the loop has not trained on) matches
        :func:`reference_step`: a single-process step in float64 on the gathered micro-batches of
        that step from every rank. The gradient the implementation left on each
        parameter must be the reference's (the average over the global batch) and the parameters
        must have moved from their start by the reference's SGD update, each within
        :func:`check_rtol` of its size."""
        ctx, loop = state["ctx"], state["loop"]
        who = f"{self.impl}/{self.model} on rank {ctx.rank}"
        distributed = not self.single_process and ctx.world_size > 1
        check_finite_losses(who, loop.losses)
        if distributed:
            _check_ranks_agree(who, ctx, loop.module())
        step = self._checked_step(ctx, loop)
        if not step.batches:
            raise AssertionError(f"{who}: the optimizer step recorded no micro-batches")
        comparison = step.compare_with(self._reference(ctx, step, distributed), check_rtol(ctx.device_type),
                                       ctx.world_size if distributed else 1)
        problems = [] if len(step.batches) == self.grad_accum else [
            f"the step ran {len(step.batches)} micro-batches on this rank, expected grad_accum = {self.grad_accum}"]
        problems += comparison.problems()
        if problems:
            raise AssertionError(
                f"{who}: one optimizer step differs from a single-process float64 step on the "
                f"{step.samples(distributed)} gathered samples of that step: " + "; ".join(problems))

    def _checked_step(self, ctx, loop) -> "CheckedStep":
        """One more optimizer step, on micro-batches the loop has never seen, labelled by another
        teacher: after hundreds of timed steps a model fits its own few batches so closely that
        float32 rounding alone puts its tiny gradient percents off the float64 reference (that
        would test rounding, not the reduction); fresh batches give O(1) losses and gradients."""
        model = loop.module()
        step = CheckedStep.before(model, loop.optimizer)
        fresh = make_data(self.model, loop.inputs.shape[1], self.grad_accum, self.seed + CHECK_DATA_SEED_OFFSET,
                          ctx.rank)
        # DataParallel's replicas run the pooling on several threads: no single routing to follow.
        routing = max_pool_routing(model) if self.impl != "dataparallel" else contextlib.nullcontext([])
        with loop.training_on(*(t.to(loop.inputs.device) for t in fresh)), _full_float32(ctx.device_type), \
                routing as routes:
            loop.step()
        step.after(loop.last_step_batches, routes)
        return step

    def _reference(self, ctx, step: "CheckedStep", distributed: bool):
        """(gradient, update) of the reference step on the global batch: computed on rank 0 (or
        the only process) and broadcast, so every rank compares with the same numbers."""
        import torch
        import torch.distributed as dist

        inputs, targets, routes = step.global_batch(distributed)
        total = sum(step.sizes)
        if not distributed or ctx.rank == 0:
            grad_ref, update_ref = reference_step(self, step.start_state, inputs, targets, step.momentum, routes)
            packed = torch.cat([grad_ref, update_ref]).to(inputs.device)
        else:
            packed = torch.empty(2 * total, dtype=torch.float64, device=inputs.device)
        if distributed:
            dist.broadcast(packed, src=0)
        return packed.cpu().split(total)

    def census_details(self, state) -> dict[str, Any]:
        """DDP's bucket sizes where the loop trains with DDP (the manual loop's buckets are its
        own all_reduce calls, which the census counts; Lightning's Trainer steps on its thread
        under the round's dispatch modes, so the census counts its step as the round's own)."""
        from ...engine.census import ddp_bucket_sizes

        ddp = state["loop"].ddp_module()
        return {"ddp_buckets": ddp_bucket_sizes(ddp)} if ddp is not None else {}

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        info: dict[str, Any] = {
            "family": "training",  # its section of the report: ddpbench/report/training.py
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


def _check_ranks_agree(who: str, ctx, model) -> None:
    """Every rank holds rank 0's parameters; every rank reaches the same verdict (a rank that
    raised alone would leave the others waiting in the reference step's collectives)."""
    import torch
    import torch.distributed as dist

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


@dataclass
class CheckedStep:
    """The check's optimizer step as this rank saw it: the model before it (parameters, state,
    momentum buffers), then its micro-batches and the max-pooling routes it took."""

    params: list
    names: list[str]
    start_state: dict
    start: list
    momentum: list
    batches: list = field(default_factory=list)
    routes: list = field(default_factory=list)

    @classmethod
    def before(cls, model, optimizer) -> "CheckedStep":
        params = [p for p in model.parameters() if p.requires_grad]
        state = optimizer.state if optimizer is not None else {}
        momentum = [state.get(p, {}).get("momentum_buffer") for p in params]
        return cls(params, [name for name, p in model.named_parameters() if p.requires_grad],
                   {k: v.detach().clone() for k, v in model.state_dict().items()},
                   [p.detach().clone() for p in params], [None if m is None else m.detach().clone() for m in momentum])

    def after(self, batches: list, routes: list) -> None:
        self.batches, self.routes = batches, routes

    @property
    def sizes(self) -> list[int]:
        return [p.numel() for p in self.params]

    def global_batch(self, distributed: bool):
        """(inputs, targets, pooling routes or None) of the step over every rank, in rank order."""
        import torch

        inputs = torch.cat([x for x, _ in self.batches])
        targets = torch.cat([y for _, y in self.batches])
        routes = [torch.cat(calls) for calls in self.routes if calls]
        if distributed:
            inputs, targets = _gather_cat(inputs), _gather_cat(targets)
            routes = [_gather_cat(indices) for indices in routes]
        return inputs, targets, routes if len(routes) == len(self.routes) else None

    def samples(self, distributed: bool) -> int:
        per_rank = sum(x.shape[0] for x, _ in self.batches)
        if not distributed:
            return per_rank
        import torch.distributed as dist

        return per_rank * dist.get_world_size()

    def compare_with(self, reference, rtol: float, world_size: int) -> StepComparison:
        import torch

        grad_ref, update_ref = reference
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                           .to("cpu", torch.float64) for p in self.params])
        moved = torch.cat([(p.detach() - s0).reshape(-1).to("cpu", torch.float64)
                           for p, s0 in zip(self.params, self.start)])
        # A parameter is stored in float32: its new value is off the exact one by up to half an ulp.
        rounding = [torch.finfo(s0.dtype).eps * float(s0.norm()) for s0 in self.start]
        return StepComparison(self.names, self.sizes, grads, grad_ref, moved, update_ref, rounding, rtol, world_size)
