"""Deliberately broken workloads: the negative controls of every workload's check.

Each class here is a real workload with one bug planted, of the kind its check exists to catch;
tests run them on rank pools and expect the case to fail with a message naming the bug. They live
in a plain module (not a test file) so the ranks can import them: the pool forwards the
controller's sys.path, which holds tests/.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpbench.workloads.collectives import Collective

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
