"""``ddpbench census``: the collective census of one training step at world sizes no machine here
has, by simulation (one process standing for rank 0 of N on torch's fake process group).

For each world size: every collective one rank issues in one optimizer step of the transformer
family (kind, dtype, count, payload bytes; :mod:`ddpbench.engine.census`'s record) and the
training state that rank holds (parameters, gradients, optimizer state; FSDP2's shards shrink
with N). Counts and bytes only: no timing, no overlap (docs/design.md, "The census at scale").

Modules: :mod:`.fakepg` (the simulated world), :mod:`.step` (one step's census on any rank, real
or simulated), :mod:`.output` (table, JSON, chart), :mod:`.command` (the command line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..workloads.training.transformer import TransformerTraining

# Copies of the whole fp32 model a simulated rank needs, read off its resident memory (a
# pre-flight, not an account): DDP holds parameters, gradients, bucket buffers and AdamW's two
# moments whole, plus the allocator's slack; FSDP2 builds the whole model before sharding it and
# gathers groups while a step runs, and holds 4 shards (parameters, gradients, two moments).
_DDP_WHOLE_COPIES = 7
_FSDP2_WHOLE_COPIES = 4
_FSDP2_SHARDED_COPIES = 4


@dataclass
class ScaleCensus:
    """The census of one workload's step at each world size, simulated."""

    workload: TransformerTraining
    warmup_steps: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per world size, ascending


def memory_needed_bytes(workload: TransformerTraining, world_size: int) -> int:
    """About how much memory one simulated rank of ``workload`` at ``world_size`` needs (the
    short simulated batch adds little)."""
    whole = workload.config.parameter_count * 4
    if workload.impl == "ddp":
        return whole * _DDP_WHOLE_COPIES
    return whole * _FSDP2_WHOLE_COPIES + whole * _FSDP2_SHARDED_COPIES // world_size


def census_at_scale(workload: TransformerTraining, world_sizes: list[int], warmup_steps: int,
                    progress: Callable[[int], None] | None = None) -> ScaleCensus:
    """Simulate ``workload``'s step at each world size (ascending), in this process."""
    from .step import simulate

    result = ScaleCensus(workload, warmup_steps)
    for world_size in sorted(world_sizes):
        if progress is not None:
            progress(world_size)
        result.rows.append({"world_size": world_size, **simulate(workload, world_size, warmup_steps)})
    return result


__all__ = ["ScaleCensus", "census_at_scale", "memory_needed_bytes"]
