"""Rounds: the timing engine that runs a workload inside every rank, and the cross-rank reduction.

A round is: barrier -> start timer -> workload.run_round -> (CUDA: end event + synchronize) ->
stop timer, inside every rank. The round's time is the maximum over ranks (the slowest rank is
what a training step waits for). Warm-up rounds are run but not recorded.

``measure_workload`` is the task the controller sends to every rank; it never knows what the
workload does. ``max_over_ranks`` runs in the controller.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RoundPlan:
    """How many rounds to run. ``rounds == 0`` chooses the count from ``min_time_s``."""

    warmup: int = 2
    rounds: int = 0
    min_time_s: float = 1.0
    min_rounds: int = 5
    max_rounds: int = 1000

    def rounds_for(self, seconds_per_round: float) -> int:
        """The recorded-round count that fills ``min_time_s`` within [min_rounds, max_rounds]."""
        if self.rounds:
            return self.rounds
        wanted = math.ceil(self.min_time_s / max(seconds_per_round, 1e-9))
        return max(self.min_rounds, min(self.max_rounds, wanted))


@dataclass
class RankMeasurement:
    """What one rank sends back: its recorded round times and its own metrics."""

    rank: int
    round_times: list[float]
    metrics: dict[str, Any] = field(default_factory=dict)


def _barrier(ctx) -> None:
    import torch.distributed as dist

    if ctx.backend == "nccl":
        dist.barrier(device_ids=[ctx.device.index])
    else:
        dist.barrier()


def _time_round_cpu(ctx, run_round, state) -> float:
    _barrier(ctx)
    start = time.perf_counter()
    run_round(state)
    return time.perf_counter() - start


def _time_round_cuda(ctx, run_round, state) -> float:
    import torch

    _barrier(ctx)
    torch.cuda.synchronize(ctx.device)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run_round(state)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1000.0


def _agreed_max(ctx, value: float) -> float:
    """The maximum of ``value`` over all ranks (so every rank picks the same round count)."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def measure_workload(ctx, workload, plan: RoundPlan) -> RankMeasurement:
    """Run ``workload`` on this rank: set-up, warm-up, recorded rounds, metrics, check, teardown.

    Pinned pools (ctx.core set) keep the rank on its own core while it measures, unless the
    workload opts out (``pin_to_core = False``: it starts processes that need the other cores).
    """
    pin = ctx.core is not None and workload.pin_to_core
    if pin:
        import os

        from .pool import set_process_affinity

        previous = sorted(os.sched_getaffinity(0))
        set_process_affinity([ctx.core])
    try:
        measurement = _measure(ctx, workload, plan)
    finally:
        if pin:
            set_process_affinity(previous)
    measurement.metrics["pinned_cores"] = pin  # each rank on a core of its own while measuring
    return measurement


def _measure(ctx, workload, plan: RoundPlan) -> RankMeasurement:
    import torch

    on_cuda = ctx.device_type == "cuda"
    time_round = _time_round_cuda if on_cuda else _time_round_cpu
    clock = time.perf_counter
    phase_start = clock()
    state = workload.setup(ctx)
    phases = {"engine_setup_s": clock() - phase_start}
    try:
        # Choosing the round count from min_time needs at least one timed warm-up round.
        warmup = max(plan.warmup, 1 if plan.rounds == 0 else 0)
        phase_start = clock()
        warmup_times = [time_round(ctx, workload.run_round, state) for _ in range(warmup)]
        # The fastest warm-up round estimates a round best: one stall must not cut the count.
        rounds = plan.rounds or plan.rounds_for(_agreed_max(ctx, min(warmup_times)))
        phases["engine_warmup_s"] = clock() - phase_start
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(ctx.device)
        phase_start = clock()
        times = [time_round(ctx, workload.run_round, state) for _ in range(rounds)]
        # The untimed part of the recorded phase: the barriers (and CUDA syncs) between rounds.
        phases["engine_between_rounds_s"] = max(0.0, clock() - phase_start - sum(times))
        metrics: dict[str, Any] = {}
        if on_cuda:
            metrics["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(ctx.device))
        phase_start = clock()
        metrics.update(workload.rank_metrics(state) or {})
        workload.check(state)
        phases["engine_check_s"] = clock() - phase_start
    finally:
        workload.teardown(state)
    # Where a case's untimed seconds go (max over ranks in extra_info); see benchmarks/raw/overhead.py.
    metrics.update({key: round(value, 6) for key, value in phases.items()})
    return RankMeasurement(ctx.rank, times, metrics)


def max_over_ranks(per_rank_times: list[list[float]]) -> list[float]:
    """Round i's time is the slowest rank's time for round i."""
    if not per_rank_times:
        raise ValueError("no rank reported any round times")
    lengths = {len(times) for times in per_rank_times}
    if len(lengths) != 1:
        raise ValueError(f"ranks recorded different numbers of rounds: {sorted(lengths)}")
    return [max(values) for values in zip(*per_rank_times)]


def combine_rank_metrics(per_rank_metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Numbers: the maximum over ranks (peak memory, open fds...); anything else: rank 0's."""
    combined: dict[str, Any] = {}
    for metrics in per_rank_metrics:
        for key, value in metrics.items():
            if key not in combined:
                combined[key] = value
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                combined[key] = max(combined[key], value)
    return combined
