"""One A/B case: both sides' pools alive (``pools_per_side`` independent pools each), warm-up on
each, then blocks of rounds in a balanced random order (ddpbench.gates.ab.schedule), paired statistics
(ddpbench.gates.stats) after every stage, and more pairs while the answer is unclear, up to a time cap.

The engine knows sides only as lists of pools; it never knows what the workload does.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from ...engine.modes import placement_info
from ...engine.timing import max_over_ranks
from . import schedule
from .. import stats
from . import tasks


@dataclass(frozen=True)
class ABSettings:
    threshold: float = 0.05  # smallest slowdown that counts
    max_time_s: float = 60.0  # per case, for adding pairs (the first stage always runs)
    block_time_s: float = 0.1  # recorded seconds aimed for per block
    # Independent pools of ranks per side; pair k runs on baseline pool j and candidate pool j for
    # one j. Two or more let the verdict tell a pool's own lasting offset from a change.
    pools_per_side: int = 2
    first_pairs: int = 12  # over all pool pairs (each gets an even share, at least 2)
    more_pairs: int = 12  # added per stage while inconclusive
    max_pairs: int = 96
    min_block_rounds: int = 3
    max_block_rounds: int = 1000
    # Set each side's workload up anew before each of its blocks (after the first): what one
    # set-up gets (buffer placement, set-up order) then varies between pairs instead of biasing a
    # side for the whole case, which identical sides showed on the dev machine (docs/results.md).
    fresh_state_per_block: bool = True
    # The case's overall significance level. The pairs are analysed after every stage, and each
    # look is another chance for noise to pass, so look k tests at the k-th of
    # stats.sequential_levels(alpha, the most looks the case can take): the case as a whole keeps
    # alpha, early looks on few pairs need overwhelming evidence, the last tests near alpha. A case
    # the time cap ends early tests its last look at stats.level_for_last_look: what is left of alpha.
    alpha: float = stats.DEFAULT_ALPHA
    confidence: float = stats.DEFAULT_CONFIDENCE
    # With two or more pool pairs, every pool pair's own ratio must be over 1 + this share of the
    # threshold for a regression (stats.decide; the measured trade-off: stats' module docstring).
    pool_pair_share: float = stats.POOL_PAIR_SHARE

    def stage_sizes(self, pool_pairs: int) -> list[int]:
        """The pairs each stage adds, first to last, if every stage is run."""
        first = _per_pool_pair(self.first_pairs, pool_pairs) * pool_pairs
        more = _per_pool_pair(self.more_pairs, pool_pairs) * pool_pairs
        sizes = [first]
        while sum(sizes) + more <= self.max_pairs:
            sizes.append(more)
        return sizes

    def alpha_per_look(self, pool_pairs: int) -> tuple[float, ...]:
        """The significance level of each look (after each stage), first to last."""
        return stats.sequential_levels(self.alpha, len(self.stage_sizes(pool_pairs)))


# How a block of rounds becomes the one number a pair compares (SideRounds.block_means).
BLOCK_SUMMARY = "mean"


@dataclass
class SideRounds:
    """One side's rounds over the case: every block's round times (max over ranks)."""

    blocks: list[list[float]] = field(default_factory=list)
    cpus: list[list[list[int] | None]] = field(default_factory=list)  # per block, per rank
    pools: list[int] = field(default_factory=list)  # per block, which of the side's pools ran it
    rank_blocks: list[list[list[float]]] = field(default_factory=list)  # per block, per rank: its own times

    @property
    def round_times(self) -> list[float]:
        return [t for b in self.blocks for t in b]

    @property
    def block_means(self) -> list[float]:
        """Each block's mean round: what the pairs compare. At 1 MB on the dev machine a block's
        rounds fall into two modes (~1 and ~3 ms) in shares that move from block to block; the
        median jumps from one mode to the other as a share crosses one half (block medians up to 6x
        apart on identical sides), the mean follows the shares smoothly and is what a job's total
        time is made of. Measured against medians on the dev machine (docs/results.md): fewer false
        verdicts under load and more power at 1 MB; at 10 and 100 MB, where a block holds 3-10
        rounds, the mean takes a preempted round in full (quiet 10% power at 10 MB: 8 of 10)."""
        return [statistics.fmean(b) for b in self.blocks]

    @property
    def block_minima(self) -> list[float]:
        """Each block's fastest round: a change must move these too (stats' module docstring)."""
        return [min(b) for b in self.blocks]

    @property
    def rank_round_times(self) -> list[list[float]]:
        """Per rank, its own round times over all blocks (round_times is their max per round)."""
        ranks = len(self.rank_blocks[0]) if self.rank_blocks else 0
        return [[t for block in self.rank_blocks for t in block[r]] for r in range(ranks)]

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
    pool_pairs: list[int]  # per pair, the pool pair it ran on
    pools_per_side: int
    stages: int
    wall_s: float
    threshold: float
    pool_pair_threshold: float  # what every pool pair's own ratio must be over (with 2+ pool pairs)
    alpha: float
    alpha_per_look: tuple[float, ...]  # the level each look taken was tested at, first to last
    fresh_state: bool
    seed: int = 0  # the run's seed of the block order (--dist-ab-seed repeats it)

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
            "block_summary": BLOCK_SUMMARY,
            "stages": self.stages,
            "order": self.order,
            "pools_per_side": self.pools_per_side,
            "pool_pair_of_pair": self.pool_pairs,
            "wall_s": round(self.wall_s, 3),
            "threshold": self.threshold,
            "pool_pair_threshold": self.pool_pair_threshold,
            "fresh_state_per_block": self.fresh_state,
            "seed": self.seed,
            "alpha": self.alpha,
            "alpha_per_look": list(self.alpha_per_look),
            "alpha_at_last_look": self.alpha_per_look[-1],
            "baseline": side(self.baseline, raw=True),
            "candidate": side(self.candidate, raw=False),  # its rounds are the case's own
            "sides": sides,
        })
        return info


def _block_rounds(estimate_s: float, settings: ABSettings) -> int:
    wanted = math.ceil(settings.block_time_s / max(estimate_s, 1e-9))
    return max(settings.min_block_rounds, min(settings.max_block_rounds, wanted))


def _per_pool_pair(pairs: int, pool_pairs: int) -> int:
    """An even share of ``pairs`` for each pool pair, at least 2."""
    share = max(2, math.ceil(pairs / pool_pairs))
    return share + share % 2


class SideFailed(Exception):
    """A task failed on one side's pool: ``side`` ("baseline" / "candidate") and ``pool`` say
    where; the message is the pool's own, which names the side, pool and ranks."""

    def __init__(self, side: str, pool: int, error: BaseException):
        super().__init__(str(error))
        self.side, self.pool, self.error = side, pool, error


def _on(side: str, j: int, pool, fn, *args, timeout_s: float):
    """``pool.run(fn, *args)``, a failure raised as SideFailed naming the side and pool."""
    from ...pool import PoolError

    try:
        return pool.run(fn, *args, timeout_s=timeout_s)
    except PoolError as exc:
        raise SideFailed(side, j, exc) from exc


def run_case(pools: dict[str, list], workload, plan, settings: ABSettings, timeout_s: float,
             case_id: str, seed: int = 0) -> ABOutcome:
    """Measure ``workload`` on both sides' pools (keys "baseline" and "candidate", each a list of
    ``settings.pools_per_side`` pools), interleaved, in the block order ``seed`` draws for this
    case. The candidate's first pool is the case's own: its metrics and check results are the
    case's. A task failing on either side raises :class:`SideFailed`."""
    started = time.monotonic()
    key = f"ddpbench-ab:{case_id}"
    names = (schedule.BASELINE, schedule.CANDIDATE)
    pool_pairs = min(len(pools[name]) for name in names)
    live: list[Any] = []
    try:
        estimates = []
        for j in range(pool_pairs):
            for name in names:
                live.append(pools[name][j])
                replies = _on(name, j, pools[name][j], tasks.start, key, workload, plan, timeout_s=timeout_s)
                estimates.append(max(reply["estimate_s"] for reply in replies))
                # Every pool times the ops per round the first one chose ("auto" chooses once).
                plan = dataclasses.replace(plan, ops_per_round=replies[0]["ops_per_round"])
        if not all(math.isfinite(e) and e > 0 for e in estimates):
            raise ValueError(
                f"ddpbench A/B: the warm-up gave no round time to size the blocks by (estimates "
                f"{estimates}); A/B mode needs at least one timed warm-up round: use --dist-warmup 1 "
                f"or more (or dist_benchmark(..., warmup=1))")
        rounds = _block_rounds(max(estimates), settings)
        sides = {name: SideRounds() for name in names}
        rng = schedule.case_rng(case_id, seed)
        orders: list[tuple[str, str, int]] = []
        stage_sizes = settings.stage_sizes(pool_pairs)
        levels = settings.alpha_per_look(pool_pairs)
        applied: list[float] = []  # the level each look taken was tested at
        stages = 0
        while True:
            stage_started = time.monotonic()
            stage = schedule.pairs_over_pools(stage_sizes[stages] // pool_pairs, pool_pairs, rng)
            for first, second, j in stage:
                for name in (first, second):
                    side = sides[name]
                    fresh = settings.fresh_state_per_block and j in side.pools
                    per_rank = _on(name, j, pools[name][j], tasks.block, key, rounds, fresh, timeout_s=timeout_s)
                    side.blocks.append(max_over_ranks([times for times, _ in per_rank]))
                    side.rank_blocks.append([list(times) for times, _ in per_rank])
                    side.cpus.append([cpus for _, cpus in per_rank])
                    side.pools.append(j)
            orders += stage
            stages += 1
            seconds_per_pair = (time.monotonic() - stage_started) / len(stage)
            # Escalate while the next stage still ends inside the per-case time cap. A look with no
            # stage after it is the last and spends what is left of alpha.
            remaining = settings.max_time_s - (time.monotonic() - started)
            last_look = stages == len(stage_sizes) or stage_sizes[stages] * seconds_per_pair > remaining
            level = stats.level_for_last_look(settings.alpha, len(stage_sizes), stages) if last_look \
                else levels[stages - 1]
            applied.append(level)
            result = stats.analyse_pairs(sides[schedule.BASELINE].block_means,
                                         sides[schedule.CANDIDATE].block_means, settings.threshold,
                                         level, settings.confidence, pool_pair_of=[j for _, _, j in orders],
                                         pool_pair_share=settings.pool_pair_share,
                                         baseline_minima=sides[schedule.BASELINE].block_minima,
                                         candidate_minima=sides[schedule.CANDIDATE].block_minima)
            if result.verdict != "inconclusive" or last_look:
                break
        metrics = []
        for j in range(pool_pairs):
            for name in names:
                live.remove(pools[name][j])
                ranks = _on(name, j, pools[name][j], tasks.finish, key, timeout_s=timeout_s)
                if name == schedule.CANDIDATE and j == 0:
                    metrics = ranks
    except BaseException:
        for pool in live:  # free the other pools' state; a torn-down pool has nothing left
            if pool.alive:
                try:
                    pool.run(tasks.stop, key, timeout_s=timeout_s)
                except Exception:
                    pass
        raise
    order = " ".join("AB" if first == schedule.BASELINE else "BA" for first, _, _ in orders)
    return ABOutcome(result, sides[schedule.BASELINE], sides[schedule.CANDIDATE], metrics, rounds, order,
                     [j for _, _, j in orders], pool_pairs, stages, time.monotonic() - started,
                     settings.threshold, settings.pool_pair_share * settings.threshold, settings.alpha,
                     tuple(applied), settings.fresh_state_per_block, seed)
