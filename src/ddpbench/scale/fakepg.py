"""One process standing for rank 0 of N: torch's fake process group, with the one fix DDP needs
(docs/design/census-and-memory.md#one-process-as-rank-0-of-n)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def simulated_world(world_size: int):
    """The default process group as rank 0 of ``world_size`` (the fake backend) for the block;
    destroyed after it. Nothing else may hold a default group in this process meanwhile."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise RuntimeError("a process group is already up in this process; the simulation needs its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        with _async_all_reduce_carries_its_tensor():
            yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _async_all_reduce_carries_its_tensor():
    """``dist.all_reduce(..., async_op=True)`` returns a Work whose future holds ``[tensor]``, as
    gloo's and NCCL's do (DDP's hooks chain on that value); the call itself is torch's own."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _create_work_from_future

    original = dist.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        work = original(tensor, op=op, group=group, async_op=async_op)
        if not async_op or work is None:
            return work
        future = torch.futures.Future()
        future.set_result([tensor])
        return _create_work_from_future(future)

    dist.all_reduce = all_reduce
    try:
        yield
    finally:
        dist.all_reduce = original
