"""One rank's training loop per implementation (the rank side): ``manual`` (hand-written bucketed
all-reduce), ``ddp`` (DistributedDataParallel), ``dataparallel`` (DataParallel over every GPU of
one process). Lightning's loop is in :mod:`.lightning`."""

from __future__ import annotations

import contextlib

from .base import TrainingLoop
from .models import build_model, loss_fn
from .settings import TrainingSettings


def _seed_model(workload: TrainingSettings, rank: int):
    import torch

    torch.manual_seed(workload.seed * 7919 + 104729 * rank + 1)  # rank-dependent on purpose
    return build_model(workload.model)


def _make_optimizer(workload: TrainingSettings, params):
    import torch

    return torch.optim.SGD(params, lr=workload.lr, momentum=workload.momentum)


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


def reduce_gradients(buckets, world_size: int, skipped=None) -> None:
    """Average gradients over ranks: per bucket, flatten, all_reduce (sum), divide, copy back.
    With ``skipped`` (a compute-only step's SkippedCollectives) the all_reduce is left out and
    recorded there; the rest runs as it is."""
    import torch
    import torch.distributed as dist

    for bucket in buckets:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if skipped is not None:
            skipped.add("all_reduce", flat, world_size)
        else:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(world_size)
        offset = 0
        for p, g in zip(bucket, grads):
            n = g.numel()
            if p.grad is None:
                p.grad = g
            p.grad.copy_(flat[offset:offset + n].view_as(g))
            offset += n


class _ManualLoop(TrainingLoop):
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
        return self.loss_value(loss)

    def _before_optimizer_step(self) -> None:
        # once per optimizer step; a compute-only variant leaves the all_reduce out
        if self.skipped is None:
            reduce_gradients(self.buckets, self.ctx.world_size)
        else:
            reduce_gradients(self.buckets, self.ctx.world_size, skipped=self.skipped)


class _DDPLoop(TrainingLoop):
    def __init__(self, ctx, workload, data):
        from torch.nn.parallel import DistributedDataParallel

        super().__init__(ctx, workload, data)
        model = _seed_model(workload, ctx.rank).to(ctx.device)
        device_ids = [ctx.device.index] if ctx.device_type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=workload.bucket_cap_mb,
                                           gradient_as_bucket_view=getattr(workload, "gradient_as_bucket_view", False))
        if self.skipped is not None:
            from .compute_only import register_compute_only_hook

            register_compute_only_hook(self.ddp, "none", self.skipped)
        self.optimizer = _make_optimizer(workload, self.ddp.parameters())

    def module(self):
        return self.ddp.module

    def trained_module(self):
        return self.ddp

    def ddp_module(self):
        return self.ddp

    def _micro_step(self, x, y, accum: int, last: bool) -> float:
        # DDP all-reduces during the last micro-batch's backward; no_sync() skips the others.
        with contextlib.nullcontext() if last else self.ddp.no_sync():
            loss = loss_fn(self.ddp(x), y)
            (loss / accum).backward()
        return self.loss_value(loss)


class _DataParallelLoop(TrainingLoop):
    """Single process, every visible GPU; the data already holds batch_size x GPUs per micro-batch."""

    def __init__(self, ctx, workload, data):
        import torch

        super().__init__(ctx, workload, data)
        model = _seed_model(workload, 0).to(torch.device("cuda", 0))
        self.dp = torch.nn.DataParallel(model)
        self.optimizer = _make_optimizer(workload, self.dp.parameters())

    def module(self):
        return self.dp.module

    def trained_module(self):
        return self.dp

    def _micro_step(self, x, y, accum: int, last: bool) -> float:
        out = self.dp(x)
        loss = loss_fn(out, y.to(out.device))
        (loss / accum).backward()
        return self.loss_value(loss)


# The loop of each implementation but Lightning (Training.loops; a subclass may swap one).
LOOPS = {"manual": _ManualLoop, "ddp": _DDPLoop, "dataparallel": _DataParallelLoop}
