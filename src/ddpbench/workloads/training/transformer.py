"""The transformer training workload: a GPT-style decoder trained with DDP or FSDP2, each knob a
parameter (its knobs by section: transformer_settings.py); a round is one optimizer step (docs/design/families.md#transformers)."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from .base import TrainingLoop, TrainingWorkload, check_finite_losses
from .gpt import build_gpt, make_tokens
from .metrics import (datasheet_peak_flops, gpt_flops_per_sequence, measure_peak_flops, mfu_info,
                      parameter_bytes, peak_memory, tokens_per_second)
from .models import CHECK_DATA_SEED_OFFSET
from .step_check import _full_float32, _gather_cat
from .transformer_settings import CompileSettings, DDPSettings, FSDPSettings, StepSettings
# Names importers of this module read (scale/, the planted bugs of tests/broken_workloads.py).
from .transformer_settings import COMM_HOOKS as COMM_HOOKS
from .transformer_settings import PRECISIONS as PRECISIONS
from .transformer_settings import TRANSFORMER_IMPLS as TRANSFORMER_IMPLS
from .transformer_settings import compile_unavailable_reason as compile_unavailable_reason

POWERSGD_CHECK_STEPS = 12
# Unit roundoff of the dtype a hook sends gradients in (its own bound on the reduced gradient).
_HOOK_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}


def gradient_rtol(precision: str, comm_hook: str, device_type: str) -> tuple[float, float]:
    """The check's tolerances, relative to the reference's norm: (each parameter's gradient, the
    whole gradient). fp32: 1e-3 for both on the CPU (1e-2 CUDA), as the existing training check.
    bf16: 0.25 per parameter and 5e-2 for the whole gradient (1e-1 CUDA): FSDP2's bf16 parameters
    run every op, LayerNorm included, in bf16, and the small LayerNorm-bias gradients of early
    blocks come out ~0.1 off after 6 blocks (cpu-large), while the large weights that carry the
    norm stay ~1e-2 off. A compressing hook adds 8 units of its dtype's roundoff to both (each
    rank's gradient and the sum are rounded once). A reduction that sums, or a bucket left
    unreduced, is off by O(1)."""
    cuda = device_type == "cuda"
    hook = 8 * _HOOK_ROUNDOFF.get(comm_hook, 0.0)
    if precision == "bf16":
        return 0.25 + hook, (1e-1 if cuda else 5e-2) + hook
    base = 1e-2 if cuda else 1e-3
    return base + hook, base + hook


# The sections are listed last-first: a dataclass takes its bases' fields from the last base to the
# first, so the knobs keep their documented order (step, compile, DDP, FSDP2, then the fields below).
@dataclass(frozen=True)
class TransformerTraining(TrainingWorkload, FSDPSettings, DDPSettings, CompileSettings, StepSettings):
    """One transformer training configuration; a round is one optimizer step. The knobs are those
    of its sections (:mod:`.transformer_settings`), each passed flat."""

    seed: int = 0
    lr: float = 1e-3
    data_batches: int = 4  # distinct micro-batches per rank, cycled
    measure_peak: bool = True  # the matmul probe in set-up (peak_flops_measured)
    # The compute-only variant (variants()): every exchange hands its data back unreduced (.compute_only).
    compute_only: bool = False
    # The rank's loop class (None: _TransformerLoop); a subclass may swap one in (planted bugs).
    loop_class: ClassVar[Any] = None

    def __post_init__(self):
        self.check_step_settings()
        for name in ("grad_accum", "data_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.check_ddp_settings()
        if self.impl == "fsdp2" and self.ddp_knobs_set():
            raise ValueError(f"{', '.join(self.ddp_knobs_set())}: DDP knobs, not FSDP2's")
        if self.impl == "ddp" and self.fsdp_knobs_set():
            raise ValueError(f"{', '.join(self.fsdp_knobs_set())} is an FSDP2 knob, not DDP's")
        if self.compute_only and self.comm_hook == "powersgd":
            raise ValueError("compute_only: PowerSGD's exchanges are interleaved with its own low-rank compute, "
                             "so it has no compute-only form")

    @property
    def group(self) -> str:  # type: ignore[override]
        return f"transformer-{self.size}"

    @property
    def id_parts(self) -> list[str]:
        """A readable part per knob that differs from its default, e.g. ``ddp-cap1-gbv-static``."""
        parts = [self.size, self.impl]
        if self.precision != "fp32":
            parts.append(self.precision)
        if self.bucket_cap_mb != 25.0:
            parts.append(f"cap{self.bucket_cap_mb:g}")
        parts += [label for flag, label in ((self.gradient_as_bucket_view, "gbv"), (self.static_graph, "static"),
                                            (self.find_unused_parameters, "unused"),
                                            (not self.reshard_after_forward, "noreshard"),
                                            (self.activation_checkpointing, "ckpt"), (self.compile, "compiled"))
                  if flag]
        if self.comm_hook != "none":
            parts.append(f"hook-{self.comm_hook}")
        if self.grad_accum != 1:
            parts.append(f"accum{self.grad_accum}")
        if self.batch_size:
            parts.append(f"b{self.batch_size}")
        if self.compute_only:
            parts.append("compute-only")
        return parts

    @property
    def case_id(self) -> str:
        return "-".join(self.id_parts)

    def skip_reason(self, spec) -> str | None:
        return self.ddp_skip_reason(spec, self.grad_accum) or self.compile_skip_reason()

    def has_compute_only_form(self) -> bool:
        """None for PowerSGD, whose exchanges are interleaved with its own compute."""
        return self.comm_hook != "powersgd"

    def compute_only_variant(self) -> "TransformerTraining":
        return dataclasses.replace(self, compute_only=True, measure_peak=False)

    # -- rank side ------------------------------------------------------------------------------

    def build_loop(self, ctx) -> TrainingLoop:
        inputs, targets = self.training_data(ctx)
        return (self.loop_class or _TransformerLoop)(ctx, self, inputs.to(ctx.device), targets.to(ctx.device))

    def setup(self, ctx) -> dict[str, Any]:
        import torch

        state = super().setup(ctx)
        if self.measure_peak:
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
            state["peak_flops_measured"] = measure_peak_flops(ctx.device, dtype)
            state["peak_flops_datasheet"] = datasheet_peak_flops(ctx.device, dtype)
        return state

    def training_data(self, ctx):
        """(inputs, targets): this rank's ``data_batches`` micro-batches (:func:`.gpt.make_tokens`)."""
        return make_tokens(self.config, self.micro_batch, self.data_batches, self.seed, ctx.rank)

    def rank_metrics(self, state) -> dict[str, Any]:
        ctx, loop = state["ctx"], state["loop"]
        metrics = super().rank_metrics(state)
        metrics.update(parameter_bytes(loop.model))
        metrics.update(peak_memory(ctx.device))
        for key in ("peak_flops_measured", "peak_flops_datasheet"):
            if state.get(key):
                metrics[key] = state[key]
        return metrics

    def check(self, state) -> None:
        ctx, loop = state["ctx"], state["loop"]
        who = f"transformer {self.case_id} on rank {ctx.rank}"
        check_finite_losses(who, loop.losses)
        if self.comm_hook == "powersgd":
            _check_ranks_agree(who, ctx, loop)
            _check_loss_goes_down(who, self, ctx, loop)
            return
        names, start = loop.full_parameters()
        fresh = make_tokens(self.config, self.micro_batch, self.grad_accum, self.seed + CHECK_DATA_SEED_OFFSET,
                            ctx.rank)
        with loop.training_on(*(t.to(ctx.device) for t in fresh)), _full_float32(ctx.device_type):
            loop.step()
        grads = loop.full_gradients()
        inputs = _gather_cat(fresh[0].reshape(-1, self.config.seq_len).to(ctx.device))
        targets = _gather_cat(fresh[1].reshape(-1, self.config.seq_len).to(ctx.device))
        reference = _reference_gradients(self.config, start, inputs, targets, ctx)
        rtol, whole_rtol = gradient_rtol(self.precision, self.comm_hook, ctx.device_type)
        problems = compare_gradients(names, grads, reference, rtol, ctx.world_size, whole_rtol)
        _raise_everywhere(who, ctx, problems)
        if problems:
            raise AssertionError(f"{who}: the averaged gradients of one optimizer step differ from a "
                                 f"single-process float64 step on the {inputs.shape[0]} gathered sequences "
                                 f"of that step: " + "; ".join(problems))
        if self.impl == "ddp":
            _check_ranks_agree(who, ctx, loop)

    def census_details(self, state) -> dict[str, Any]:
        """DDP's bucket sizes (the census's all_reduce calls are these buckets, at the comm hook's
        dtype); FSDP2 has no buckets. PowerSGD's census is marked incomplete: its hook issues its
        later all_reduces from future callbacks, which may run on the backend's own threads, where
        the census does not see them (on gloo the count varied between runs)."""
        from ...engine.census import ddp_bucket_sizes

        ddp = state["loop"].ddp_module()
        if ddp is None:
            return {}
        details = {"ddp_buckets": ddp_bucket_sizes(ddp)}
        if self.comm_hook == "powersgd":
            details["incomplete"] = ("PowerSGD issues all_reduces from future callbacks on the backend's "
                                     "threads, which the census does not see")
        return details

    # -- controller side ------------------------------------------------------------------------

    def extra_info(self, world_size: int, median_s: float,
                   rank_metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        sequences = self.micro_batch * self.grad_accum * world_size
        tokens = sequences * self.config.seq_len
        flops = gpt_flops_per_sequence(self.size) * sequences
        info: dict[str, Any] = {"family": "transformer",  # its report section: ddpbench/report/transformer.py
                                "impl": self.impl, "model": f"gpt-{self.size}", "size": self.size,
                                "precision": self.precision, "grad_accum": self.grad_accum,
                                "batch_size": self.micro_batch, "seq_len": self.config.seq_len,
                                "compile": self.compile, "activation_checkpointing": self.activation_checkpointing}
        info.update(self.ddp_info() if self.impl == "ddp" else self.fsdp_info())
        info["tokens_per_step"] = tokens
        info["tokens_per_second"] = round(tokens_per_second(tokens, median_s), 3)
        info["samples_per_second"] = round(sequences / median_s, 3)
        info["model_flops_per_step"] = flops
        info["achieved_flops_per_second"] = flops / median_s
        info.update(mfu_info(flops / median_s, world_size, rank_metrics or {}))
        return info


class _TransformerLoop(TrainingLoop):
    """One rank's GPT, wrapped by DDP or sharded by FSDP2 (the workload's sections say how), AdamW
    and the rank's token batches; ``step()`` is one optimizer step (:meth:`TrainingLoop.step`)."""

    def __init__(self, ctx, w: TransformerTraining, inputs, targets):
        import torch

        super().__init__(ctx, w, (inputs, targets))
        torch.manual_seed(w.seed * 7919 + 104729 * ctx.rank + 1)  # rank-dependent: DDP must broadcast
        self.model = build_gpt(w.config, w.activation_checkpointing)
        if ctx.device != torch.device("cpu"):  # (on the CPU a no-op that FakeTensorMode refuses)
            self.model = self.model.to(ctx.device)
        self.hook_state = None  # the DDP comm hook's state (PowerSGD's)
        if w.impl == "ddp":
            self.wrapped, self.hook_state = w.wrap_ddp(self.model, ctx, self.skipped)
        else:
            self.wrapped = w.shard_fsdp2(self.model, w.precision, self.fsdp_mesh(), self.skipped)
        self.forward = torch.compile(self.wrapped) if w.compile else self.wrapped
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=w.lr)

    def fsdp_mesh(self):
        """The DeviceMesh FSDP2 shards over (None: fully_shard's default, the whole world); the
        simulation under FakeTensorMode hands one built before the mode (ddpbench.scale.memory)."""
        return None

    def module(self):
        return self.model

    def trained_module(self):
        return self.wrapped

    def ddp_module(self):
        return self.wrapped if self.w.impl == "ddp" else None

    def _autocast(self):
        import torch

        if self.w.precision == "bf16" and self.w.impl == "ddp":
            return torch.autocast(self.ctx.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _sync(self, last: bool):
        """Gradient sync on the last micro-batch only: DDP's ``no_sync()`` before it, FSDP2's
        ``set_requires_gradient_sync``."""
        if self.w.impl == "ddp":
            return contextlib.nullcontext() if last else self.wrapped.no_sync()
        self.wrapped.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def _micro_step(self, x, y, accum: int, last: bool) -> float:
        import torch.nn.functional as F

        with self._sync(last):
            with self._autocast():
                logits = self.forward(x)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            (loss / accum).backward()
        return self.loss_value(loss)

    def full_parameters(self):
        """(names, float64 CPU copies of the whole parameters), tied ones once (collective for FSDP2)."""
        import torch

        names, values = [], []
        for name, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            names.append(name)
            values.append(full.detach().to("cpu", torch.float64).clone())
        return names, values

    def full_gradients(self) -> list:
        import torch

        grads = []
        for p in self.model.parameters():
            g = p.grad
            if g is None:
                grads.append(torch.zeros(p.shape, dtype=torch.float64))
                continue
            full = g.full_tensor() if hasattr(g, "full_tensor") else g
            grads.append(full.detach().to("cpu", torch.float64))
        return grads


def _reference_gradients(cfg, start, inputs, targets, ctx) -> list:
    """Rank 0's single-process float64 gradient of the mean loss over the global batch, broadcast;
    computed on rank 0's device (GPT-2's float64 logits alone are gigabytes: a GPU does it in
    seconds, a CPU in minutes)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    sizes = [t.numel() for t in start]
    if ctx.rank == 0:
        model = build_gpt(cfg).to(device=ctx.device, dtype=torch.float64)
        with torch.no_grad():
            for p, value in zip(model.parameters(), start):
                p.copy_(value)
        logits = model(inputs)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        del logits
        packed = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    else:
        packed = torch.empty(sum(sizes), dtype=torch.float64, device=ctx.device)
    dist.broadcast(packed, src=0)
    return [part.view(value.shape) for part, value in zip(packed.cpu().split(sizes), start)]


def compare_gradients(names, grads, reference, rtol: float, world_size: int,
                      whole_rtol: float | None = None) -> list[str]:
    """Per parameter, |grad - reference| / |reference| within ``rtol``, and the same over the whole
    gradient within ``whole_rtol`` (default ``rtol``); the worst parameter named, and a hint when
    the whole gradient is a multiple (the world size: a sum without the division)."""
    import torch

    flat_g = torch.cat([g.reshape(-1) for g in grads])
    flat_r = torch.cat([r.reshape(-1) for r in reference])
    whole_rtol = rtol if whole_rtol is None else whole_rtol
    whole = float((flat_g - flat_r).norm()) / max(float(flat_r.norm()), 1e-300)
    wrong = []
    for name, g, r in zip(names, grads, reference):
        err = float((g - r).norm()) / max(float(r.norm()), 1e-300)
        if not err <= rtol:
            wrong.append((err, name))
    if not wrong and whole <= whole_rtol:
        return []
    if not wrong:
        return [f"the whole gradient is off by {whole:.3g} of its norm (tolerance {whole_rtol:g}); every "
                f"parameter is within {rtol:g}"]
    scale = float((flat_g * flat_r).sum()) / max(float((flat_r * flat_r).sum()), 1e-300)
    hint = ""
    if float((flat_g - scale * flat_r).norm()) <= 0.1 * float(flat_g.norm()) and abs(scale - 1) > 0.1:
        hint = f"; the gradient is {scale:.3g} x the reference's"
        if world_size > 1 and abs(scale - world_size) <= 0.05 * world_size:
            hint += f" (= the world size: a reduction that sums over the {world_size} ranks without dividing)"
    err, name = max(wrong)
    return [f"{len(wrong)} of {len(names)} parameters off (worst {name}: off by {err:.3g} of its norm, "
            f"tolerance {rtol:g}; the whole gradient: {whole:.3g})" + hint]


def _raise_everywhere(who: str, ctx, problems: list[str]) -> None:
    """Every rank learns whether any rank found a problem (one rank raising alone would leave the
    others waiting in the next collective); the ranks that found none raise too, naming it."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if problems else 0.0], device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if float(flag) and not problems:
        raise AssertionError(f"{who}: another rank's averaged gradients differ from the float64 reference")


def _check_ranks_agree(who: str, ctx, loop) -> None:
    import torch
    import torch.distributed as dist

    mine = torch.cat([p.detach().reshape(-1) for p in loop.model.parameters()]).to(torch.float64)
    reference = mine.clone()
    dist.broadcast(reference, src=0)
    worst = (mine - reference).abs().max().reshape(1)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if float(worst) > 1e-6:
        raise AssertionError(f"{who}: the ranks' parameters differ from rank 0's (max |diff| {float(worst):.3g}); "
                             f"the gradient reduction is broken")


def _check_loss_goes_down(who: str, w: TransformerTraining, ctx, loop) -> None:
    """PowerSGD's bound: with error feedback on, POWERSGD_CHECK_STEPS more steps on one fixed set
    of fresh micro-batches must lower its loss (the mean of the last 3) by 2% or more."""
    if loop.hook_state is not None and not getattr(loop.hook_state, "use_error_feedback", True):
        raise AssertionError(f"{who}: PowerSGD runs without error feedback")
    fresh = make_tokens(w.config, w.micro_batch, w.grad_accum, w.seed + CHECK_DATA_SEED_OFFSET, ctx.rank)
    losses = []
    for _ in range(POWERSGD_CHECK_STEPS):
        with loop.training_on(*(t.to(ctx.device) for t in fresh)):
            losses.append(loop.step())
    last = sum(losses[-3:]) / 3
    if not last <= 0.98 * losses[0]:
        raise AssertionError(f"{who}: the loss did not go down by 2% over {POWERSGD_CHECK_STEPS} steps on one "
                             f"batch ({losses[0]:.4g} -> mean of the last 3 {last:.4g})")
