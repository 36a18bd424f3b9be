"""What a case's rounds look like beyond their median: distinct modes, and where the ranks ran.

On some machines small-message timings have two modes a factor 2-3 apart: faster when the ranks'
threads share a CPU, slower when every hand-off is a cross-CPU wake-up (docs/results.md, "Where the
1 MB modes come from"). A median of such rounds is a statement about placement as much as about the
operation, so the case says so in its extra_info instead of hiding it.

Pure functions over round times (seconds); run in the controller.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

# Two groups count as separate modes when their medians are at least MIN_MODE_RATIO apart, each
# holds at least MIN_MODE_SHARE of the rounds, and a valley separates them: within +-10% of the
# split point there are at most MAX_VALLEY_DENSITY times as many rounds as within +-10% of the
# sparser group's median.
MIN_MODE_RATIO = 1.5
MIN_MODE_SHARE = 0.10
VALLEY_HALF_WIDTH = math.log(1.1)
MAX_VALLEY_DENSITY = 1 / 3
MIN_ROUNDS_FOR_MODES = 20


def _best_split(logs: list[float]) -> int:
    """Index i splitting sorted ``logs`` into [:i] and [i:] with the least within-group squared
    error (exact 1-D two-means)."""
    n = len(logs)
    prefix, prefix_sq = [0.0], [0.0]
    for value in logs:
        prefix.append(prefix[-1] + value)
        prefix_sq.append(prefix_sq[-1] + value * value)

    def sse(a, b):
        count = b - a
        total = prefix[b] - prefix[a]
        return prefix_sq[b] - prefix_sq[a] - total * total / count

    return min(range(1, n), key=lambda i: sse(0, i) + sse(i, n))


def round_modes(times: list[float]) -> list[dict[str, float]] | None:
    """The rounds' two modes (``median_s`` and ``share`` each, fastest first) when the rounds fall
    into two clearly separated groups; None when they look unimodal."""
    values = sorted(t for t in times if t > 0)
    if len(values) < MIN_ROUNDS_FOR_MODES:
        return None
    logs = [math.log(v) for v in values]
    i = _best_split(logs)
    low, high = logs[:i], logs[i:]
    n = len(values)
    if min(len(low), len(high)) < MIN_MODE_SHARE * n:
        return None
    ratio = statistics.median(values[i:]) / statistics.median(values[:i])
    if ratio < MIN_MODE_RATIO:
        return None
    # A valley between them: around the split point the rounds are sparse compared with around
    # each group's own median (a wide single mode is densest where 2-means splits it).
    split = (logs[i - 1] + logs[i]) / 2

    def near(centre):
        return sum(1 for value in logs if abs(value - centre) <= VALLEY_HALF_WIDTH)

    peak = min(near(statistics.median(low)), near(statistics.median(high)))
    if near(split) > MAX_VALLEY_DENSITY * peak:
        return None
    return [{"median_s": statistics.median(values[:i]), "share": round(len(low) / n, 4)},
            {"median_s": statistics.median(values[i:]), "share": round(len(high) / n, 4)}]


def placement_info(round_times: list[float], per_rank_cpus: list[list[int] | None]) -> dict[str, Any]:
    """extra_info on where a single-node pool's ranks ran: the share of recorded rounds in which
    every rank's main thread was on one CPU, and the median round time of each kind of round."""
    if not per_rank_cpus or any(cpus is None for cpus in per_rank_cpus) or len(per_rank_cpus) < 2:
        return {}
    together = [len(set(cpus)) == 1 for cpus in zip(*per_rank_cpus)]
    if len(together) != len(round_times) or not together:
        return {}
    info: dict[str, Any] = {"ranks_shared_cpu_share": round(sum(together) / len(together), 4)}
    same = [t for t, s in zip(round_times, together) if s]
    apart = [t for t, s in zip(round_times, together) if not s]
    if same:
        info["median_s_ranks_shared_cpu"] = statistics.median(same)
    if apart:
        info["median_s_ranks_apart"] = statistics.median(apart)
    return info


def rounds_info(round_times: list[float], per_rank_cpus: list[list[int] | None], nodes: int) -> dict[str, Any]:
    """Everything this module adds to a case's extra_info."""
    info: dict[str, Any] = {}
    modes = round_modes(round_times)
    if modes:
        info["multimodal"] = True
        info["round_modes"] = modes
    if nodes == 1:
        info.update(placement_info(round_times, per_rank_cpus))
    return info


def rank_aggregates(per_rank_times: list[list[float]]) -> dict[str, Any]:
    """extra_info on the ranks' own times (nccl-tests -a): each rank's median round, their
    average, minimum and maximum, and the straggler: the rank that set the round's time (was the
    slowest) most often, the share of rounds it did, and by how much it exceeded the other ranks'
    median in those rounds (median over them, in %). Nothing for a single rank."""
    ranks = [list(times) for times in per_rank_times if times]
    if len(ranks) < 2 or len({len(times) for times in ranks}) != 1:
        return {}
    medians = [statistics.median(times) for times in ranks]
    slowest: list[int] = []
    excess: dict[int, list[float]] = {}
    for round_times in zip(*ranks):
        rank = max(range(len(round_times)), key=round_times.__getitem__)
        slowest.append(rank)
        others = statistics.median(t for r, t in enumerate(round_times) if r != rank)
        if others > 0:
            excess.setdefault(rank, []).append(round_times[rank] / others - 1)
    counts = {rank: slowest.count(rank) for rank in set(slowest)}
    straggler = max(sorted(counts), key=counts.__getitem__)
    return {
        "rank_median_s": medians,
        "rank_median_avg_s": statistics.fmean(medians),
        "rank_median_min_s": min(medians),
        "rank_median_max_s": max(medians),
        "straggler_rank": straggler,
        "straggler_share": round(counts[straggler] / len(slowest), 4),
        "straggler_excess_pct": round(100 * statistics.median(excess.get(straggler, [0.0])), 3),
    }
