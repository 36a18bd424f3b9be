"""SyncBatchNorm modules users import: a hand-written fused one (two all-reduces a step, CPU and CUDA)
and a naive one (docs/design/families.md#fusedsyncbatchnorm)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce
from torch.nn.modules.batchnorm import _BatchNorm


# ----------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------


def _check_input(input, num_features: int, who: str) -> None:
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{who}: expected a torch.Tensor input, got {type(input).__name__}")
    if input.dim() < 2:
        raise ValueError(
            f"{who}: expected an (N, C) or (N, C, *) input, got a {input.dim()}-D tensor of shape "
            f"{tuple(input.shape)}"
        )
    if input.shape[1] != num_features:
        raise ValueError(
            f"{who}: input has {input.shape[1]} channels (dim 1 of shape {tuple(input.shape)}) but the "
            f"module was built with num_features={num_features}"
        )


def _stats_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _channel_shape(input) -> list[int]:
    return [1, input.shape[1]] + [1] * (input.dim() - 2)


def _reduce_dims(input) -> list[int]:
    return [0] + list(range(2, input.dim()))


def _group_size(process_group) -> int:
    """World size of the group, or 1 when torch.distributed is not set up (no sync needed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(process_group)


def _too_small(who: str, total: int, local: int) -> ValueError:
    return ValueError(
        f"{who}: expected more than 1 value per channel when training, got {total} over all ranks "
        f"({local} on this rank); batch norm statistics of a single value are undefined"
    )


# ----------------------------------------------------------------------------------------------
# The fused module
# ----------------------------------------------------------------------------------------------


def _local_sums(input, local_count: int):
    """This rank's per-channel [sum x, M2 + n * mean**2] in float64, shape (2, C).

    M2 is the sum of squared deviations about this rank's own mean: a two-pass quantity, accurate
    whatever |mean| / std; only the float64 combine in the caller cancels. On CPU
    ``torch.var_mean``'s Welford reduction is slow (~15x a batch-norm forward), so the statistics
    come from ``torch.batch_norm_update_stats`` (mean m', biased variance v' about m') and a cascade
    ``torch.sum`` (its float32 mean is more accurate than m'): with m = sum / n,
    M2 = n v' - n (m - m')**2, hence M2 + n m**2 = n (v' + m' (2 m - m')).
    """
    dims = _reduce_dims(input)
    if input.device.type == "cpu":
        shifted_mean, shifted_var = torch.batch_norm_update_stats(input, None, None, 0.0)
        stats = torch.stack([input.sum(dim=dims), shifted_mean, shifted_var]).to(torch.float64)
        total, m_shift, v_shift = stats[0], stats[1], stats[2]
        mean = total / local_count
        squares = (mean * 2 - m_shift).mul_(m_shift).add_(v_shift).mul_(local_count)
    else:
        var, mean = torch.var_mean(input, dim=dims, correction=0)
        stats = torch.stack([mean, var]).to(torch.float64)
        mean = stats[0]
        total = mean * local_count
        squares = (mean * mean).add_(stats[1]).mul_(local_count)
    return torch.stack([total, squares])


def _fused_forward_stats(input, process_group, sync: bool, who: str):
    """(mean, biased var) of the global batch in float64 and the global count: ONE all-reduce."""
    channels = input.shape[1]
    local_count = input.numel() // channels
    if local_count > 0:
        sums = _local_sums(input, local_count).view(-1)
    else:
        sums = torch.zeros(2 * channels, dtype=torch.float64, device=input.device)
    packed = torch.cat([sums, sums.new_full((1,), float(local_count))])
    if sync:
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=process_group)
    total = int(round(float(packed[-1])))  # one host sync (torch's SyncBatchNorm has one too)
    if total <= 1:
        raise _too_small(who, total, local_count)
    moments = packed[:-1].view(2, channels) / total  # E[x], E[x^2] as Chan's sum form, float64
    mean = moments[0]
    var = moments[1].sub_(mean * mean).clamp_(min=0.0)
    return mean, var, total


class FusedSyncBatchNormFunction(torch.autograd.Function):
    """Forward and backward of :class:`FusedSyncBatchNorm` in training mode (one all-reduce each)."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, momentum_factor, eps,
                process_group, sync, who):
        mean64, var64, total = _fused_forward_stats(input, process_group, sync, who)
        stats = torch.stack([mean64, var64]).to(_stats_dtype(input.dtype))
        mean, var = stats[0], stats[1]
        if running_mean is not None:
            running_mean.lerp_(mean64.to(running_mean.dtype), momentum_factor)
        if running_var is not None:
            running_var.lerp_((var64 * (total / (total - 1))).to(running_var.dtype), momentum_factor)
        # Inference-form batch norm with the global statistics: one fused elementwise kernel.
        output = F.batch_norm(input, mean, var, weight, bias, False, 0.0, eps)
        ctx.save_for_backward(input, weight, mean, var)
        ctx.eps, ctx.total, ctx.process_group, ctx.sync = eps, total, process_group, sync
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, var = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        w = weight if weight is not None else torch.ones_like(mean)
        if input.numel() > 0:
            # Eval-mode backward with (mean, var) as the "running" statistics gives
            # grad_out * w * invstd, sum(grad_out * (x - mean)) * invstd and sum(grad_out). The
            # CUDA kernel asserts that save_mean / save_invstd are defined even in eval mode (its
            # own eval-mode forward returns empty ones), so pass empty tensors there.
            saved = mean.new_empty(0) if input.is_cuda else None
            grad_input, sum_dy_xmu_invstd, sum_dy = torch.ops.aten.native_batch_norm_backward(
                grad_output.contiguous(), input, w, mean, var, saved, saved, False, ctx.eps,
                [need_input, True, True])
        else:
            grad_input = torch.zeros_like(input) if need_input else None
            sum_dy_xmu_invstd, sum_dy = torch.zeros_like(w), torch.zeros_like(w)  # two tensors: no aliased grads
        # Always communicate, even if this rank needs no input gradient: every rank must issue
        # the same collectives. The local sums are this rank's weight / bias gradients.
        packed = torch.stack([sum_dy, sum_dy_xmu_invstd]).to(mean.dtype)
        if ctx.sync:
            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=ctx.process_group)
        if need_input and input.numel() > 0:
            # grad_in = scale * (dy - mean_dy - (x - mean) * invstd * mean_dy_xmu_invstd), with
            # scale = w * invstd; the kernel above gave scale * dy, the rest is per-channel affine
            # in x: grad_in += x * k_x + k_0, in place.
            invstd = torch.rsqrt(var + ctx.eps)
            coef = packed.mul_(w.to(mean.dtype) * invstd / ctx.total)  # scale * [mean_dy, mean_dy_xmu_invstd]
            k_x = coef[1].mul_(invstd).neg_()
            k_0 = torch.addcmul(coef[0], mean, k_x).neg_()
            shape = _channel_shape(input)
            grad_input.addcmul_(input, k_x.to(input.dtype).view(shape)).add_(k_0.to(input.dtype).view(shape))
        return (grad_input if need_input else None,
                sum_dy_xmu_invstd if weight is not None and need_weight else None,
                sum_dy if need_bias else None,
                None, None, None, None, None, None, None)


class _SyncBatchNormBase(_BatchNorm):
    """Common constructor, input checks and running-statistics bookkeeping."""

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training:
            return self._local_batch_norm(input)  # eval: running statistics, no communication
        track = self._tracks()
        return self._training_forward(input, track, self._momentum_factor() if track else 0.0)

    def _training_forward(self, input, track: bool, factor: float):
        raise NotImplementedError

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, process_group=None,
                 device=None, dtype=None):
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features <= 0:
            raise ValueError(f"num_features must be a positive int, got {num_features!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be None or in [0, 1], got {momentum!r}")
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input):
        _check_input(input, self.num_features, type(self).__name__)

    def _tracks(self) -> bool:
        return self.training and self.track_running_stats and self.running_mean is not None

    def _momentum_factor(self) -> float:
        """torch's rule: count the batch, then momentum, or the cumulative average 1/n if None."""
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def _local_batch_norm(self, input):
        """No communication: eval mode (running stats, or local batch stats without them)."""
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                            self.running_mean is None, 0.0, self.eps)


class FusedSyncBatchNorm(_SyncBatchNormBase):
    """SyncBatchNorm with one fused all-reduce per forward and one per backward.

    Works for (N, C) and (N, C, *) inputs on CPU (gloo) and CUDA (NCCL); ranks may hold different
    batch sizes, including zero. See the module docstring for the numerics and semantics.
    """

    def _training_forward(self, input, track: bool, factor: float):
        running_mean, running_var = (self.running_mean, self.running_var) if track else (None, None)
        if _group_size(self.process_group) == 1:
            # One rank has nothing to synchronise: plain batch norm, as torch.nn.SyncBatchNorm
            # falls back to (the fused path's small kernels and host sync would only cost time).
            local_count = input.numel() // input.shape[1]
            if local_count <= 1:
                raise _too_small(type(self).__name__, local_count, local_count)
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, True, factor, self.eps)
        return FusedSyncBatchNormFunction.apply(
            input, self.weight, self.bias, running_mean, running_var,
            factor, self.eps, self.process_group, True, type(self).__name__)


class NaiveSyncBatchNorm(_SyncBatchNormBase):
    """The straightforward SyncBatchNorm: one all-reduce per statistic, autograd for the rest.

    Forward: all-reduce the count, the sum and the sum of squares separately (E[x^2] - E[x]^2 in
    the input dtype: unsound when |mean| >> std); backward: autograd through the differentiable
    all-reduces (two more) with every intermediate kept. The benchmark's baseline.
    """

    def _training_forward(self, input, track: bool, factor: float):
        sync = _group_size(self.process_group) > 1
        channels = input.shape[1]
        dims = _reduce_dims(input)
        local_count = input.numel() // channels
        count = torch.tensor([float(local_count)], dtype=torch.float64, device=input.device)
        total_sum = input.sum(dim=dims)
        total_sq = (input * input).sum(dim=dims)
        if sync:
            dist.all_reduce(count, group=self.process_group)
            total_sum = differentiable_all_reduce(total_sum, group=self.process_group)
            total_sq = differentiable_all_reduce(total_sq, group=self.process_group)
        total = int(round(float(count)))
        if total <= 1:
            raise _too_small(type(self).__name__, total, local_count)
        mean = total_sum / total
        var = total_sq / total - mean * mean
        if track:
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach() * factor)
                self.running_var.mul_(1 - factor).add_(var.detach() * (total / (total - 1) * factor))
        shape = _channel_shape(input)
        output = (input - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            output = output * self.weight.view(shape) + self.bias.view(shape)
        return output
