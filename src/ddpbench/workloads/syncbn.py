"""The SyncBatchNorm benchmark: :class:`SyncBNCase` (variants ``torch_bn``, ``torch_syncbn``, ``fused``,
``naive``). A round is forward + backward of a (batch_size, hidden_dim) float32 input per rank.
Memory: the engine's memory census (``extra_info["memory"]``: the peak of live tensor bytes in one
untimed round, the input, upstream gradient, parameters and buffers included); on CUDA also
``peak_memory_bytes``, ``torch.cuda.max_memory_allocated`` over the recorded rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from ..nn.syncbn import FusedSyncBatchNorm, NaiveSyncBatchNorm
from .base import Workload

VARIANTS = ("torch_bn", "torch_syncbn", "fused", "naive")
TORCH_SYNCBN_CPU_SKIP_REASON = (
    "torch.nn.SyncBatchNorm rejects CPU tensors (\"SyncBatchNorm expected input tensor to be on GPU\"); "
    "the torch_syncbn variant runs only in the gpu / multi_gpu cases"
)


# ----------------------------------------------------------------------------------------------
# Benchmark descriptors
# ----------------------------------------------------------------------------------------------


#: SyncBNCase.check's tolerance: max |actual - reference| / max |reference|, for float32 inputs
#: (the parity tests in tests/workloads/test_syncbn_module.py hold the variants to 1e-5).
CHECK_RTOL = 1e-4


def reference_batch_norm(x, grad_out, weight, bias, eps: float, xhat_term: bool = True):
    """Training-mode batch norm of an (N, C) batch in float64, written out: (output, input gradient).

    ``grad_in = w * invstd * (dy - mean(dy) - x_hat * mean(dy * x_hat))`` over the N samples (the
    per-channel means are over the batch). ``xhat_term=False`` drops the last term (the gradient
    through the variance): SyncBNCase.check uses it only to name that bug.
    """
    x, dy = x.detach().to(torch.float64), grad_out.detach().to(torch.float64)
    mean = x.mean(0)
    invstd = torch.rsqrt(x.var(0, correction=0) + eps)
    xhat = (x - mean) * invstd
    w = weight.detach().to(torch.float64) if weight is not None else torch.ones_like(mean)
    b = bias.detach().to(torch.float64) if bias is not None else torch.zeros_like(mean)
    dxhat = dy * w
    grad = dxhat - dxhat.mean(0)
    if xhat_term:
        grad = grad - xhat * (dxhat * xhat).mean(0)
    return xhat * w + b, grad * invstd


def _gather_rows(tensor):
    """The (world_size * N, C) concatenation of every rank's (N, C) tensor, in rank order."""
    tensor = tensor.detach().contiguous()
    out = tensor.new_empty((dist.get_world_size() * tensor.shape[0],) + tuple(tensor.shape[1:]))
    dist.all_gather_into_tensor(out, tensor)
    return out


def _rel_err(actual, expected) -> float:
    """max |actual - expected| / max |expected| (NaN counts as infinitely wrong)."""
    err = float((actual - expected).abs().max()) / max(float(expected.abs().max()), 1e-30)
    return err if err == err else float("inf")


def _mismatch(what: str, actual, expected) -> str:
    diff = (actual - expected).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    index = int(diff.argmax())
    sample, channel = divmod(index, actual.shape[1])
    return (f"the {what} is off by up to {_rel_err(actual, expected):.3g} of its largest value "
            f"(tolerance {CHECK_RTOL:g}; sample {sample}, channel {channel}: got "
            f"{float(actual[sample, channel]):.6g}, expected {float(expected[sample, channel]):.6g})")


def build_variant(variant: str, num_features: int, device) -> torch.nn.Module:
    """A fresh batch-norm module of the given benchmark variant on ``device``."""
    if variant == "torch_bn":
        return torch.nn.BatchNorm1d(num_features, device=device)
    if variant == "torch_syncbn":
        if torch.device(device).type == "cpu":
            raise ValueError(TORCH_SYNCBN_CPU_SKIP_REASON)
        return torch.nn.SyncBatchNorm(num_features, device=device)
    if variant == "fused":
        return FusedSyncBatchNorm(num_features, device=device)
    if variant == "naive":
        return NaiveSyncBatchNorm(num_features, device=device)
    raise ValueError(f"unknown SyncBatchNorm variant {variant!r}; expected one of {', '.join(VARIANTS)}")


@dataclass(frozen=True)
class SyncBNCase(Workload):
    """One benchmark case: forward + backward of a (batch_size, hidden_dim) float32 batch per rank.

    ``batch_size`` is per rank (the global batch is batch_size * world_size). The input and the
    upstream gradient are made in ``setup``; each round drops the previous gradients, runs the
    module forward in training mode and back-propagates the fixed upstream gradient.
    """

    variant: str
    batch_size: int
    hidden_dim: int
    # Forward and backward only: no optimizer step moves the layer's parameters.
    updates_parameters: ClassVar[bool] = False

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown SyncBatchNorm variant {self.variant!r}; expected one of "
                             f"{', '.join(VARIANTS)}")
        for name in ("batch_size", "hidden_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.batch_size < 2 and self.variant == "torch_bn":
            raise ValueError("torch_bn needs batch_size >= 2 (local statistics of one sample are undefined)")

    @property
    def group(self) -> str:  # type: ignore[override]
        return f"syncbn-bs{self.batch_size}-h{self.hidden_dim}"

    def setup(self, ctx) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(1000 + ctx.rank)
        shape = (self.batch_size, self.hidden_dim)
        x = torch.randn(shape, generator=generator).to(ctx.device).requires_grad_()
        grad_out = torch.randn(shape, generator=generator).to(ctx.device)
        module = build_variant(self.variant, self.hidden_dim, ctx.device).train()
        return {"ctx": ctx, "x": x, "grad_out": grad_out, "module": module}

    @staticmethod
    def _drop_grads(state) -> None:
        state["x"].grad = None
        state["module"].zero_grad(set_to_none=True)

    def run_round(self, state) -> None:
        self._drop_grads(state)
        out = state["module"](state["x"])
        out.backward(state["grad_out"])

    def check(self, state) -> None:
        """One more forward + backward (untimed) against :func:`reference_batch_norm`: a float64
        batch norm of the batch the variant must normalise over (the all-gathered global batch for
        the synced variants, this rank's own for torch_bn). This rank's rows of the output and of
        the input gradient must match within :data:`CHECK_RTOL` of their largest value."""
        ctx, module, x, grad_out = state["ctx"], state["module"], state["x"], state["grad_out"]
        self._drop_grads(state)
        out = module(x)
        out.backward(grad_out)
        synced = self.variant != "torch_bn" and ctx.world_size > 1
        own_x, own_dy = x.detach(), grad_out
        weight, bias, eps = getattr(module, "weight", None), getattr(module, "bias", None), module.eps
        if synced:
            all_x, all_dy = _gather_rows(own_x), _gather_rows(own_dy)
            rows = slice(ctx.rank * self.batch_size, (ctx.rank + 1) * self.batch_size)
        else:
            all_x, all_dy, rows = own_x, own_dy, slice(None)
        ref_out, ref_grad = reference_batch_norm(all_x, all_dy, weight, bias, eps)
        ref_out, ref_grad = ref_out[rows], ref_grad[rows]
        if x.grad is None:  # after the gathers: every rank issues the same collectives
            raise AssertionError(f"{self.variant} on rank {ctx.rank}: backward left no input gradient")
        out, grad = out.detach().to(torch.float64), x.grad.to(torch.float64)
        batch = (f"the all-gathered global batch of {all_x.shape[0]} samples" if synced
                 else f"this rank's batch of {all_x.shape[0]} samples")
        problems = []
        if _rel_err(out, ref_out) > CHECK_RTOL:
            problems.append(_mismatch("output", out, ref_out) + self._diagnose_output(
                out, own_x, own_dy, weight, bias, eps, synced))
        if _rel_err(grad, ref_grad) > CHECK_RTOL:
            problems.append(_mismatch("input gradient", grad, ref_grad) + self._diagnose_grad(
                grad, ref_grad, own_x, own_dy, all_x, all_dy, rows, weight, bias, eps, synced))
        if problems:
            raise AssertionError(
                f"{self.variant} on rank {ctx.rank} differs from a float64 batch norm over {batch}: "
                + "; ".join(problems))

    @staticmethod
    def _diagnose_output(out, own_x, own_dy, weight, bias, eps, synced) -> str:
        if synced:
            local_out, _ = reference_batch_norm(own_x, own_dy, weight, bias, eps)
            if _rel_err(out, local_out) <= CHECK_RTOL:
                return (f"; it matches a batch norm over this rank's own {own_x.shape[0]} samples: "
                        f"the statistics were not synchronised across ranks")
        return ""

    @staticmethod
    def _diagnose_grad(grad, ref_grad, own_x, own_dy, all_x, all_dy, rows, weight, bias, eps,
                       synced) -> str:
        if synced:
            _, local_grad = reference_batch_norm(own_x, own_dy, weight, bias, eps)
            if _rel_err(grad, local_grad) <= CHECK_RTOL:
                return (f"; it matches the gradient of a batch norm over this rank's own "
                        f"{own_x.shape[0]} samples: the backward's sums were not synchronised")
        _, no_xhat = reference_batch_norm(all_x, all_dy, weight, bias, eps, xhat_term=False)
        if _rel_err(grad, no_xhat[rows]) <= CHECK_RTOL:
            return ("; it matches the gradient without the x_hat * mean(dy * x_hat) term: the "
                    "gradient through the variance is missing")
        scale = float((grad * ref_grad).sum() / (ref_grad * ref_grad).sum().clamp(min=1e-300))
        if _rel_err(grad, ref_grad * scale) <= CHECK_RTOL:
            return f"; it is {scale:.4g} x the reference: the gradient has the wrong scale"
        return ""

    def teardown(self, state) -> None:
        state.clear()

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        info: dict[str, Any] = {
            "family": "syncbn",  # its section of the report: ddpbench/report/syncbn.py
            "variant": self.variant,
            "batch_size": self.batch_size,
            "hidden_dim": self.hidden_dim,
            "global_batch_size": self.batch_size * world_size,
        }
        if self.variant == "torch_syncbn" and world_size == 1:
            # torch.nn.SyncBatchNorm skips synchronisation at world size 1 and runs F.batch_norm.
            info["torch_syncbn_falls_back_to_batchnorm"] = True
        return info
