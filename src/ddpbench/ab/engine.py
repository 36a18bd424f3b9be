"""One A/B case: both sides' pools alive, warm-up on each, then blocks of rounds in a balanced
random order (ddpbench.ab.schedule), paired statistics (ddpbench.ab.stats) after every stage, and
more pairs while the answer is unclear, up to a time cap.

The engine knows sides only as two pools; it never knows what the workload does.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from ..modes import placement_info
from ..timing import max_over_ranks
from . import schedule, stats, tasks


@dataclass(frozen=True)
class ABSettings:
    threshold: float = 0.05  # smallest slowdown that counts
    max_time_s: float = 60.0  # per case, for adding pairs (the first stage always runs)
    block_time_s: float = 0.1  # recorded seconds aimed for per block
    first_pairs: int = 10
    more_pairs: int = 10  # added per stage while inconclusive
    max_pairs: int = 80
    min_block_rounds: int = 3
    max_block_rounds: int = 1000
    # Set each side's workload up anew before each of its blocks (after the first): what one
    # set-up gets (buffer placement, set-up order) then varies between pairs instead of biasing a
    # side for the whole case, which identical sides showed on the dev machine (docs/results.md).
    fresh_state_per_block: bool = True
    alpha: float = stats.DEFAULT_ALPHA
    confidence: float = stats.DEFAULT_CONFIDENCE


@dataclass
class SideRounds:
    """One side's rounds over the case: every block's round times (max over ranks)."""

    blocks: list[list[float]] = field(default_factory=list)
    cpus: list[list[list[int] | None]] = field(default_factory=list)  # per block, per rank

    @property
    def round_times(self) -> list[float]:
        return [t for b in self.blocks for t in b]

    @property
    def block_medians(self) -> list[float]:
        return [statistics.median(b) for b in self.blocks]

    @property
    def rank_cpus(self) -> list[list[int] | None]:
        """Per rank, its CPU after each round over all blocks (None where a block could not tell)."""
        ranks = len(self.cpus[0]) if self.cpus else 0
        return [None if any(block[r] is None for block in self.cpus)
                else [c for block in self.cpus for c in block[r]] for r in range(ranks)]


@dataclass
class ABOutcome:
    result: stats.PairedResult
    baseline: SideRounds
    candidate: SideRounds
    candidate_metrics: list[dict[str, Any]]
    rounds_per_block: int
    order: str  # e.g. "AB BA BA AB ..." (A = baseline)
    stages: int
    wall_s: float
    threshold: float
    alpha: float
    fresh_state: bool

    def summary(self, sides: dict[str, dict]) -> dict[str, Any]:
        """``extra_info["ab"]``."""

        def side(rounds: SideRounds, raw: bool) -> dict[str, Any]:
            times = rounds.round_times
            q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
            out = {"median_s": statistics.median(times), "iqr_s": q[2] - q[0], "rounds": len(times)}
            share = placement_info(times, rounds.rank_cpus).get("ranks_shared_cpu_share")
            if share is not None:
                out["ranks_shared_cpu_share"] = share
            if raw:
                out["round_times"] = times
            return out

        info = self.result.to_dict()
        info.update({
            "blocks": 2 * self.result.pairs,
            "rounds_per_block": self.rounds_per_block,
            "stages": self.stages,
            "order": self.order,
            "wall_s": round(self.wall_s, 3),
            "threshold": self.threshold,
            "fresh_state_per_block": self.fresh_state,
            "alpha": self.alpha,
            "baseline": side(self.baseline, raw=True),
            "candidate": side(self.candidate, raw=False),  # its rounds are the case's own
            "sides": sides,
        })
        return info


def _block_rounds(estimate_s: float, settings: ABSettings) -> int:
    wanted = math.ceil(settings.block_time_s / max(estimate_s, 1e-9))
    return max(settings.min_block_rounds, min(settings.max_block_rounds, wanted))


def run_case(pools: dict[str, Any], workload, plan, settings: ABSettings, timeout_s: float,
             case_id: str) -> ABOutcome:
    """Measure ``workload`` on both pools (keys "baseline" and "candidate"), interleaved."""
    started = time.monotonic()
    key = f"ddpbench-ab:{case_id}"
    live: list[str] = []
    try:
        estimates = []
        for name in (schedule.BASELINE, schedule.CANDIDATE):
            live.append(name)
            estimates.append(max(pools[name].run(tasks.start, key, workload, plan, timeout_s=timeout_s)))
        rounds = _block_rounds(max(estimates), settings)
        sides = {schedule.BASELINE: SideRounds(), schedule.CANDIDATE: SideRounds()}
        rng = schedule.case_rng(case_id)
        orders: list[tuple[str, str]] = []
        stage_pairs = settings.first_pairs
        stages = 0
        while True:
            stage_started = time.monotonic()
            stage = schedule.balanced_pairs(stage_pairs, rng)
            for pair in stage:
                for name in pair:
                    fresh = settings.fresh_state_per_block and bool(sides[name].blocks)
                    per_rank = pools[name].run(tasks.block, key, rounds, fresh, timeout_s=timeout_s)
                    sides[name].blocks.append(max_over_ranks([times for times, _ in per_rank]))
                    sides[name].cpus.append([cpus for _, cpus in per_rank])
            orders += stage
            stages += 1
            seconds_per_pair = (time.monotonic() - stage_started) / len(stage)
            result = stats.analyse_pairs(sides[schedule.BASELINE].block_medians,
                                         sides[schedule.CANDIDATE].block_medians, settings.threshold,
                                         settings.alpha, settings.confidence)
            if result.verdict != "inconclusive":
                break
            # Escalate while the next stage still ends inside the per-case time cap.
            pairs_left = settings.max_pairs - len(orders)
            stage_pairs = min(settings.more_pairs, pairs_left - pairs_left % 2)
            remaining = settings.max_time_s - (time.monotonic() - started)
            if stage_pairs <= 0 or stage_pairs * seconds_per_pair > remaining:
                break
        metrics = {}
        for name in (schedule.BASELINE, schedule.CANDIDATE):
            live.remove(name)
            metrics[name] = pools[name].run(tasks.finish, key, timeout_s=timeout_s)
    except BaseException:
        for name in live:  # free the other side's state; a torn-down pool has nothing left
            if pools[name].alive:
                try:
                    pools[name].run(tasks.stop, key, timeout_s=timeout_s)
                except Exception:
                    pass
        raise
    order = " ".join("AB" if first == schedule.BASELINE else "BA" for first, _ in orders)
    return ABOutcome(result, sides[schedule.BASELINE], sides[schedule.CANDIDATE],
                     metrics[schedule.CANDIDATE], rounds, order, stages, time.monotonic() - started,
                     settings.threshold, settings.alpha, settings.fresh_state_per_block)
