"""Deliberately broken workloads: the negative controls of every workload's check.

Each class here is a real workload with one bug planted, of the kind its check exists to catch;
tests run them on rank pools and expect the case to fail with a message naming the bug. They live
in a plain module (not a test file) so the ranks can import them: the pool forwards the
controller's sys.path, which holds tests/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ddpbench.workloads.collectives import Collective
from ddpbench.workloads.datasets import DatasetEpoch
from ddpbench.workloads.syncbn import SyncBNCase
from ddpbench.workloads.training import Training
from ddpbench.workloads.training.loops import _ManualLoop, reduce_gradients
from ddpbench.workloads.training.transformer import COMM_HOOKS, TransformerTraining, _TransformerLoop

# ----------------------------------------------------------------------------------------------
# Collectives
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrongShardReduceScatter(Collective):
    """reduce_scatter that sums correctly but hands every rank the next rank's shard."""

    def _run_op(self, state):
        import torch.distributed as dist

        ctx = state["ctx"]
        chunk = state["count"] // ctx.world_size
        total = state["input"].clone()
        dist.all_reduce(total)
        other = (ctx.rank + 1) % ctx.world_size
        state["output"].copy_(total[other * chunk:(other + 1) * chunk])


@dataclass(frozen=True)
class NoOpCollective(Collective):
    """An op that issues no collective and writes nothing (every rank alike, so nothing hangs)."""

    def _run_op(self, state):
        pass


@dataclass(frozen=True)
class WrongReduction(Collective):
    """all_reduce / reduce_scatter that reduces by ``actually`` whatever the case asks for."""

    actually: str = "max"

    def _run_op(self, state):
        asked = state["reduce_op"]
        state["reduce_op"] = self.actually
        try:
            super()._run_op(state)
        finally:
            state["reduce_op"] = asked


@dataclass(frozen=True)
class DroppedRankOne(Collective):
    """all_reduce that leaves rank 1's data out: rank 1 sends the reduction's identity (zeros for
    sum and avg, the type's lowest value for max, its highest for min)."""

    def _run_op(self, state):
        import torch

        if state["ctx"].rank == 1:
            data = state["input"]
            limits = torch.finfo(data.dtype) if data.is_floating_point() else torch.iinfo(data.dtype)
            data.fill_({"max": limits.min, "min": limits.max}.get(state["reduce_op"], 0))
        super()._run_op(state)


@dataclass(frozen=True)
class AveragedOverTooMany(Collective):
    """avg that divides the sum by n + 1 (a slightly wrong world size): within no type's rounding."""

    def _run_op(self, state):
        state["reduce_op"] = "sum"
        try:
            super()._run_op(state)
        finally:
            state["reduce_op"] = "avg"
        state["output"].div_(state["ctx"].world_size + 1)


@dataclass(frozen=True)
class InPlaceGatherWithoutOwnChunk(Collective):
    """In-place all_gather that gathers from a scratch copy and never writes the rank's own chunk
    of the output (as if in place meant "the others' chunks")."""

    def _run_op(self, state):
        import torch.distributed as dist

        start = state["ctx"].rank * (state["count"] // state["ctx"].world_size)
        length = state["count"] // state["ctx"].world_size
        gathered = state["output"].clone()
        dist.all_gather_into_tensor(gathered, state["input"].clone())
        keep = state["output"][start:start + length].clone()
        state["output"].copy_(gathered)
        state["output"][start:start + length] = keep.fill_(float("nan") if keep.is_floating_point() else -1)


# ----------------------------------------------------------------------------------------------
# SyncBatchNorm
# ----------------------------------------------------------------------------------------------


class _BrokenSyncBNCase:
    """Mixin: a SyncBNCase("fused", ...) whose module is replaced by ``broken_module(hidden_dim)``."""

    def setup(self, ctx):
        state = super().setup(ctx)
        state["module"] = self.broken_module(self.hidden_dim).to(ctx.device).train()
        return state


def _unsynced_fused(hidden_dim):
    """The fused module with its all-reduces switched off: each rank normalises by its own batch."""
    from ddpbench.nn.syncbn import FusedSyncBatchNorm, FusedSyncBatchNormFunction

    class UnsyncedFused(FusedSyncBatchNorm):
        def _training_forward(self, input, track, factor):
            return FusedSyncBatchNormFunction.apply(
                input, self.weight, self.bias, self.running_mean if track else None,
                self.running_var if track else None, factor, self.eps, None, False, "UnsyncedFused")

    return UnsyncedFused(hidden_dim)


def _grad_scaled_fused(hidden_dim, scale=2.0):
    """The fused module with an input gradient ``scale`` times too large (e.g. divided by the local
    count where the global one belongs): the output is right."""
    import torch

    from ddpbench.nn.syncbn import FusedSyncBatchNorm

    class ScaleGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad * scale

    class GradScaledFused(FusedSyncBatchNorm):
        def forward(self, input):
            return super().forward(ScaleGrad.apply(input))

    return GradScaledFused(hidden_dim)


def _no_xhat_term_bn(hidden_dim):
    """A synced batch norm whose variance is detached from autograd: the backward loses the
    x_hat * mean(dy * x_hat) term (the gradient through the variance). The output is right."""
    import torch
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_reduce

    class NoXhatTermBN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.eps = 1e-5
            self.weight = torch.nn.Parameter(torch.ones(hidden_dim))
            self.bias = torch.nn.Parameter(torch.zeros(hidden_dim))

        def forward(self, x):
            total = x.shape[0] * dist.get_world_size()
            mean = all_reduce(x.sum(0)) / total
            with torch.no_grad():
                var = ((x - mean) ** 2).sum(0)
                dist.all_reduce(var)
                var /= total
            return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias

    return NoXhatTermBN()


@dataclass(frozen=True)
class UnsyncedSyncBN(_BrokenSyncBNCase, SyncBNCase):
    broken_module = staticmethod(_unsynced_fused)


@dataclass(frozen=True)
class GradScaledSyncBN(_BrokenSyncBNCase, SyncBNCase):
    broken_module = staticmethod(_grad_scaled_fused)


@dataclass(frozen=True)
class NoXhatTermSyncBN(_BrokenSyncBNCase, SyncBNCase):
    broken_module = staticmethod(_no_xhat_term_bn)


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


class _MissingDivideLoop(_ManualLoop):
    """All-reduces the gradients but forgets to divide by the world size (sum, not average)."""

    def _before_optimizer_step(self):
        reduce_gradients(self.buckets, 1)


class _ZeroedGradsLoop(_ManualLoop):
    """Reduces correctly, then zeroes the gradients before the optimizer step (momentum still moves)."""

    def _before_optimizer_step(self):
        super()._before_optimizer_step()
        for p in self.model.parameters():
            p.grad.zero_()


class _SkippedStepLoop(_ManualLoop):
    """Computes and reduces the gradients but never steps the optimizer."""

    def __init__(self, ctx, workload, data):
        super().__init__(ctx, workload, data)
        self.optimizer.step = lambda *args, **kwargs: None


@dataclass(frozen=True)
class MissingDivideTraining(Training):
    loops = {**Training.loops, "manual": _MissingDivideLoop}


@dataclass(frozen=True)
class ZeroedGradsTraining(Training):
    loops = {**Training.loops, "manual": _ZeroedGradsLoop}


@dataclass(frozen=True)
class SkippedStepTraining(Training):
    loops = {**Training.loops, "manual": _SkippedStepLoop}


# ----------------------------------------------------------------------------------------------
# Datasets: corrupted copies of a built dataset (the handover and DatasetEpoch stay the real ones;
# the check compares against the checksums of the dataset as built)
# ----------------------------------------------------------------------------------------------


def swapped_samples(samples, i=0, j=1):
    """A list layout with samples ``i`` and ``j`` exchanged (count, total sum and shapes unchanged)."""
    samples = list(samples)
    samples[i], samples[j] = samples[j], samples[i]
    return samples


def moved_boundaries(packed):
    """A packed layout whose data is one element off its offsets (every sample starts one element
    early: shapes, element count and total sum unchanged)."""
    import torch

    from ddpbench.data.packed import PackedTensorDataset

    data = torch.cat([packed.data[1:], packed.data[:1]])
    return PackedTensorDataset(data, packed.offsets, packed.shapes, packed.ndims)


def transposed_shapes(packed):
    """A packed layout of 3 x H x W samples that records them as 3 x W x H (same elements)."""
    from ddpbench.data.packed import PackedTensorDataset

    shapes = packed.shapes.clone()
    shapes[:, [1, 2]] = shapes[:, [2, 1]]
    return PackedTensorDataset(packed.data, packed.offsets, shapes, packed.ndims)


def transposed_data(samples):
    """A list layout whose samples hold their elements transposed (H <-> W) under the original shape."""
    return [t.transpose(1, 2).contiguous().view(t.shape) for t in samples]


def swapped_rows(stacked, i=0, j=1):
    """A stacked layout with rows ``i`` and ``j`` exchanged (shape and total sum unchanged)."""
    out = stacked.clone()
    out[[i, j]] = out[[j, i]]
    return out


@dataclass(frozen=True)
class UnshardedEpoch(DatasetEpoch):
    """Asks for DistributedSampler shards but its loaders iterate the whole dataset on every rank."""

    def _loader(self, ctx, data, collate_fn, persistent):
        from torch.utils.data import DataLoader

        return DataLoader(data, batch_size=self.batch_size, shuffle=True, collate_fn=collate_fn,
                          num_workers=self.num_workers, persistent_workers=persistent,
                          multiprocessing_context=self.worker_start if self.num_workers else None)


# ----------------------------------------------------------------------------------------------
# Transformer training (DDP communication hooks with a planted bug)
# ----------------------------------------------------------------------------------------------


def _summing_hook(state, bucket):
    """All-reduce (sum) every bucket and forget to divide by the world size."""
    import torch.distributed as dist

    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _dropping_first_bucket_hook(state, bucket):
    """Average every bucket but the first, which each rank keeps as its own local gradient."""
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    if bucket.index() == 0:
        fut = torch.futures.Future()
        fut.set_result(buffer)
        return fut
    buffer.div_(dist.get_world_size())
    fut = dist.all_reduce(buffer, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _register(hook):
    def register(ddp, ctx):
        ddp.register_comm_hook(None, hook)
    return register


@dataclass(frozen=True)
class SummingHookTransformer(TransformerTraining):
    comm_hooks: ClassVar[dict] = {**COMM_HOOKS, "none": _register(_summing_hook)}


@dataclass(frozen=True)
class DroppedBucketTransformer(TransformerTraining):
    comm_hooks: ClassVar[dict] = {**COMM_HOOKS, "none": _register(_dropping_first_bucket_hook)}


class _SummingFSDPLoop(_TransformerLoop):
    """FSDP2 whose reduce-scatter sums: gradient divide factor 1 on every sharded module (and plain
    sum reductions, since the divide factor alone asks gloo for PREMUL_SUM, which it lacks)."""

    def __init__(self, ctx, workload, inputs, targets):
        from torch.distributed.fsdp import FSDPModule

        super().__init__(ctx, workload, inputs, targets)
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM


@dataclass(frozen=True)
class SummingFSDPTransformer(TransformerTraining):
    loop_class: ClassVar[Any] = _SummingFSDPLoop
