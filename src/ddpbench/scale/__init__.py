"""``ddpbench census``: the collective census of one training step at world sizes no machine here has,
by simulation (docs/design/census-and-memory.md#the-census-at-scale)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..workloads.training.transformer import TransformerTraining

# Copies of the whole fp32 model a simulated rank needs for the collective census (real tensors,
# one short sequence), read off its resident memory (a pre-flight, not an account): DDP holds
# parameters, gradients, bucket buffers and AdamW's two moments whole, plus the allocator's slack;
# FSDP2 builds the whole model before sharding it and holds 4 shards (parameters, gradients, two
# moments), each padded to ceil(rows / N) rows a parameter.
_DDP_WHOLE_COPIES = 7
_FSDP2_WHOLE_COPIES = 4
_FSDP2_SHARDED_COPIES = 4
# FSDP2 buffers of one parameter group while it is gathered, each N x ceil(rows / N) rows a
# parameter (the padding grows with N): the all-gather output, the unsharded parameters copied out
# of it, their gradients and the reduce-scatter input; two groups at once (the next one prefetched).
_FSDP2_GATHERED_COPIES = 4
_FSDP2_GROUPS_AT_ONCE = 2

@dataclass
class ScaleCensus:
    """The census of one workload's step at each world size, simulated."""

    workload: TransformerTraining
    warmup_steps: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per world size, ascending
    device_bytes: int | None = None  # --device-memory: a rank's peak is held against it


def fsdp2_padded_bytes(workload: TransformerTraining, world_size: int) -> tuple[int, int]:
    """(rank 0's sharded bytes, the largest parameter group's gathered bytes) of ``workload``'s
    fp32 parameters under FSDP2 at ``world_size``, padding included: FSDP2 pads each parameter's
    first dimension to a multiple of N rows, so a group's gathered buffers hold
    ``N * ceil(rows / N)`` rows a parameter, which grows with N (a 1-row LayerNorm weight gathers N
    rows)."""
    import torch

    from ..workloads.training.gpt import build_gpt

    with torch.device("meta"):
        model = build_gpt(workload.config)

    def padded(params) -> tuple[int, int]:
        shard = gathered = 0
        for p in params:
            rows = p.shape[0] if p.dim() else 1
            per_row = p.numel() // rows if rows else 0
            chunk = -(-rows // world_size)
            shard += chunk * per_row * 4
            gathered += world_size * chunk * per_row * 4
        return shard, gathered

    groups = [list(block.parameters()) for block in model.blocks]
    in_blocks = {id(p) for group in groups for p in group}
    groups.append([p for p in model.parameters() if id(p) not in in_blocks])  # the root's own
    sizes = [padded(group) for group in groups]
    return sum(shard for shard, _ in sizes), max(gathered for _, gathered in sizes)


def memory_needed_bytes(workload: TransformerTraining, world_size: int, memory: bool = True) -> int:
    """About how much memory this process needs to simulate ``workload`` at ``world_size``: the
    collective census's rank on real tensors (FSDP2's padding included), or, for DDP, the memory
    census's on the workload's own batch when that is more (FSDP2's memory census runs on fake
    tensors, which hold no memory)."""
    whole = workload.config.parameter_count * 4
    if workload.impl == "ddp":
        if not memory:
            return whole * _DDP_WHOLE_COPIES
        from .memory import ddp_memory_census_needs

        return max(whole * _DDP_WHOLE_COPIES, ddp_memory_census_needs(workload))
    sharded, gathered = fsdp2_padded_bytes(workload, world_size)
    return (whole * _FSDP2_WHOLE_COPIES + sharded * _FSDP2_SHARDED_COPIES
            + gathered * _FSDP2_GATHERED_COPIES * _FSDP2_GROUPS_AT_ONCE)


def census_at_scale(workload: TransformerTraining, world_sizes: list[int], warmup_steps: int,
                    progress: Callable[[int], None] | None = None, memory: bool = True,
                    device_bytes: int | None = None) -> ScaleCensus:
    """Simulate ``workload``'s step at each world size (ascending), in this process: the collective
    census and (``memory``) the per-rank peak memory, held against ``device_bytes`` when given. A
    DDP rank's memory does not depend on N: simulated once, at the smallest world size."""
    from .memory import fits, simulate_memory
    from .step import simulate

    result = ScaleCensus(workload, warmup_steps, device_bytes=device_bytes)
    ddp_memory = None
    for world_size in sorted(world_sizes):
        if progress is not None:
            progress(world_size)
        row = {"world_size": world_size, **simulate(workload, world_size, warmup_steps)}
        if memory:
            if workload.impl == "ddp":
                if ddp_memory is None:
                    ddp_memory = dict(simulate_memory(workload, world_size, warmup_steps),
                                      simulated_at_world_size=world_size)
                row["memory"] = dict(ddp_memory)
            else:
                row["memory"] = simulate_memory(workload, world_size, warmup_steps)
            verdict = fits(row["memory"]["peak_bytes"], device_bytes)
            if verdict is not None:
                row["memory"]["device"] = verdict
        result.rows.append(row)
    return result


__all__ = ["ScaleCensus", "census_at_scale", "fsdp2_padded_bytes", "memory_needed_bytes"]
