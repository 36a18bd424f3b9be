"""One process standing for rank 0 of N: torch's fake process group, with the one fix DDP needs.

torch's ``fake`` backend (:mod:`torch.testing._internal.distributed.fake_pg`) completes every
collective at once without talking to anyone, so one process can build and step a model as rank 0
of a 1024-rank job. The collectives still go through torch.distributed's Python API, the
``ProcessGroup`` and the c10d dispatcher ops, as gloo's and NCCL's do; only the backend at the
bottom is a stand-in, so whatever counts collectives above it sees what a real rank issues.

The fix: a fake collective's ``Work`` carries a future whose value is None, and DDP reads the
reduced bucket out of that value (``expected the hook result is either a Tensor or a TensorList
found None`` in its reducer). While the group is up, an asynchronous ``dist.all_reduce`` returns a
``Work`` whose future holds the tensor (the collective itself has run, through the fake backend),
and DDP's built-in all-reduce is replaced by torch's own Python twin of it
(:func:`~torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook`: one all_reduce
of each bucket's buffer, as the reducer's C++ hook issues), see :mod:`.step`.
"""

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
