"""One A/B case: both sides' pools alive (``pools_per_side`` independent pools each), warm-up on
each, then blocks of rounds in a balanced random order (ddpbench.gates.ab.schedule), paired statistics
(ddpbench.gates.stats) after every stage, and more pairs while the answer is unclear, up to a time cap
(the case's share of a run budget, ddpbench.gates.ab.budget, when the run has one).

This loop knows sides only as lists of pools; it never knows what the workload does.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from ...engine.census import combine_census
from ...engine.memory import combine_memory
from ...engine.numerics import across_processes, combine_numerics, mark_not_reproducible, numerics_band_plan
from ...engine.modes import placement_info
from ...engine.timing import max_over_ranks
from ...storage.records import RecordError
from . import schedule
from .. import stats
from ..memory import compare_memory
from ..numerics import compare_numerics
from ..structure import compare_census
from ..verdict_words import Verdict
from . import placement_strata
from . import tasks


@dataclass(frozen=True)
class ABSettings:
    threshold: float = 0.05  # smallest slowdown that counts
    max_time_s: float = 60.0  # this case's cap for adding pairs (the first stage always runs)
    # Seconds past max_time_s that the case may borrow (from a run budget: gates/ab/budget.py) when
    # its cap ends while it is nearly decided (stats.projected_stop_bound within 1 + threshold at
    # the next look). Looks on borrowed time are tested at EXTRA_LOOK_LEVEL, as extra looks: they
    # can end the case only as same or not-slower, so the false-regression rate and the power stay
    # those of the looks within the cap (docs/design/ab.md#the-run-budget).
    borrow_time_s: float = 0.0
    block_time_s: float = 0.1  # recorded seconds aimed for per block
    # Independent pools of ranks per side; pair k runs on baseline pool j and candidate pool j for
    # one j. Two or more let the verdict tell a pool's own lasting offset from a change.
    pools_per_side: int = 2
    first_pairs: int = 12  # over all pool pairs (each gets an even share, at least 2)
    more_pairs: int = 12  # added per stage while inconclusive
    max_pairs: int = 96  # the planned looks' pairs: the levels spread alpha over these looks
    # After the planned looks, a case still inconclusive takes *extra looks* while its time cap
    # allows: ``extra_pairs`` more pairs each, up to ``max_extended_pairs`` in all. An extra look is
    # tested at level 0 (EXTRA_LOOK_LEVEL: the planned looks spent all of alpha), so it can end the
    # case only as ``same`` or ``not-slower``, never ``regression``: the false-regression rate stays
    # the planned looks' (docs/design/ab.md#extra-looks).
    extra_pairs: int = 48
    max_extended_pairs: int = 288
    min_block_rounds: int = 3
    max_block_rounds: int = 1000
    # Set each side's workload up anew before each of its blocks (after the first): what one
    # set-up gets (buffer placement, set-up order) then varies between pairs instead of biasing a
    # side for the whole case.
    fresh_state_per_block: bool = True
    # The case's overall significance level. The pairs are analysed after every stage, and each
    # look is another chance for noise to pass, so look k tests at the k-th of
    # stats.sequential_levels(alpha, the most looks the case can take): the case as a whole keeps
    # alpha, early looks on few pairs need overwhelming evidence, the last tests near alpha. A case
    # the time cap ends early tests its last look at stats.level_for_last_look: what is left of alpha.
    alpha: float = stats.DEFAULT_ALPHA
    confidence: float = stats.DEFAULT_CONFIDENCE
    # With two or more pool pairs, every pool pair's own ratio must be over 1 + this share of the
    # threshold for a regression (stats.decide_paired).
    pool_pair_share: float = stats.POOL_PAIR_SHARE
    # Summarise both blocks of a pair at the pair's own mix of placements (rounds where the ranks
    # shared a CPU, rounds where they did not: gates/ab/placement_strata.py) instead of by their plain means.
    # Off: it hides a change in how often the ranks share a CPU, and no recorded run has shown yet
    # that it narrows the intervals (docs/design/ab.md#cpu-sharing-strata).
    stratify_placement: bool = False
    # A case whose two censuses, taken at set-up, already show a structural regression stops after
    # its first look: that verdict stands whatever the timing says (docs/design/gates.md#the-structural-verdict),
    # so more pairs would only spend the run's time; the first look still gives the
    # timing's ratio. Off when the gate accepts structural changes (--dist-accept-structure-change).
    stop_on_structural_regression: bool = True
    # Likewise a case whose two memory censuses at set-up show a memory regression (exact too, so
    # decided there). Off when the gate accepts memory changes (--dist-accept-memory-change).
    stop_on_memory_regression: bool = True
    # Likewise a case whose two numerics replays at set-up show a change (exact too). Off when the
    # gate accepts numerics changes (--dist-accept-numerics-change).
    stop_on_numerics_regression: bool = True
    numerics_tolerance: float | None = None  # --dist-numerics-tolerance, as the stop reads the replays

    def stage_sizes(self, pool_pairs: int) -> list[int]:
        """The pairs each stage adds, first to last, if every stage is run."""
        first = _per_pool_pair(self.first_pairs, pool_pairs) * pool_pairs
        more = _per_pool_pair(self.more_pairs, pool_pairs) * pool_pairs
        sizes = [first]
        while sum(sizes) + more <= self.max_pairs:
            sizes.append(more)
        return sizes

    def extra_stage_sizes(self, pool_pairs: int) -> list[int]:
        """The pairs each extra look adds, after the planned stages (empty when
        ``max_extended_pairs`` leaves no room for one)."""
        total = sum(self.stage_sizes(pool_pairs))
        size = _per_pool_pair(self.extra_pairs, pool_pairs) * pool_pairs
        sizes = []
        while total + size <= self.max_extended_pairs:
            sizes.append(size)
            total += size
        return sizes

    def alpha_per_look(self, pool_pairs: int) -> tuple[float, ...]:
        """The significance level of each planned look (after each stage), first to last."""
        return stats.sequential_levels(self.alpha, len(self.stage_sizes(pool_pairs)))

    def stop_level_per_look(self, pool_pairs: int) -> tuple[float, ...]:
        """The level of each look, planned and extra, first to last, at which its pairs must rule
        out a slowdown of the threshold for it to end the case as same or not-slower: together
        the looks spend the interval's one-sided miss, (1 - confidence) / 2, so a case slower by
        exactly the threshold reads same or not-slower at most that often however many looks it
        takes (stats.stop_levels; docs/design/ab.md#the-looks-levels)."""
        sizes = self.stage_sizes(pool_pairs) + self.extra_stage_sizes(pool_pairs)
        return stats.stop_levels((1.0 - self.confidence) / 2, tuple(itertools.accumulate(sizes)))


# An extra look's level: no alpha is left after the planned looks, so it cannot reject.
EXTRA_LOOK_LEVEL = 0.0


# How a block of rounds becomes the one number a pair compares (SideRounds.block_means), and what
# extra_info["ab"]["block_summary"] says when --dist-ab-stratify-cpu-sharing applied (gates/ab/placement_strata.py).
BLOCK_SUMMARY = "mean"
STRATIFIED_BLOCK_SUMMARY = "mean per placement, at the pair's mix of placements"


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
        """Each block's mean round: what the pairs compare. Where a block's rounds fall into two
        modes the median jumps between them as their shares cross one half, while the mean follows
        the shares smoothly and is what a job's total time is made of (figures: docs/results.md,
        "Measurements behind the A/B settings")."""
        return [statistics.fmean(b) for b in self.blocks]

    @property
    def block_minima(self) -> list[float]:
        """Each block's fastest round: a change must move these too (stats' module docstring)."""
        return [min(b) for b in self.blocks]

    @property
    def block_placements(self) -> list[list[bool] | None]:
        """Per block, per round: whether every rank ran on one CPU after it (None: not known)."""
        return [placement_strata.block_placement(block) for block in self.cpus]

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
    """What one A/B case measured: the verdict, both sides' rounds, and how they were taken."""

    result: stats.PairedResult
    baseline: SideRounds
    candidate: SideRounds
    candidate_metrics: list[dict[str, Any]]  # the candidate's first pool's ranks: the case's own
    rounds_per_block: int
    pairs: list[tuple[str, str, int]]  # per pair: (first side, second side, pool pair), in run order
    pools_per_side: int
    levels_applied: tuple[float, ...]  # the level each look taken was tested at, first to last
    settings: ABSettings
    wall_s: float
    seed: int = 0  # the run's seed of the block order (--dist-ab-seed repeats it)
    baseline_metrics: list[dict[str, Any]] = field(default_factory=list)  # the baseline's first pool's ranks
    stratified: bool = False  # the pairs were summarised by placement (settings.stratify_placement, known)
    # The structural regression that ended the case after its first look
    # (settings.stop_on_structural_regression), as the line naming it; None when it did not.
    stopped_by_structure: str | None = None
    # Likewise the memory regression that ended it (settings.stop_on_memory_regression).
    stopped_by_memory: str | None = None
    # Likewise the numerics change that ended it (settings.stop_on_numerics_regression).
    stopped_by_numerics: str | None = None
    # The stop level of each look taken (settings.stop_level_per_look), first to last.
    stop_levels_applied: tuple[float, ...] = ()
    borrowed_looks: int = 0  # looks taken on borrowed time (settings.borrow_time_s), the last ones

    @property
    def order(self) -> str:
        """e.g. "AB BA BA AB ..." (A = baseline)."""
        return " ".join("AB" if first == schedule.BASELINE else "BA" for first, _, _ in self.pairs)

    def summary(self, sides: dict[str, dict]) -> dict[str, Any]:
        """``extra_info["ab"]``."""
        settings = self.settings
        planned_looks = len(settings.stage_sizes(self.pools_per_side))
        info = self.result.to_dict()
        info.update({
            "blocks": 2 * self.result.pairs,
            "rounds_per_block": self.rounds_per_block,
            "block_summary": STRATIFIED_BLOCK_SUMMARY if self.stratified else BLOCK_SUMMARY,
            "stages": len(self.levels_applied),
            "order": self.order,
            "pools_per_side": self.pools_per_side,
            "pool_pair_of_pair": [j for _, _, j in self.pairs],
            "wall_s": round(self.wall_s, 3),
            "time_cap_s": round(settings.max_time_s, 3),
            "borrow_time_s": round(settings.borrow_time_s, 3),
            "borrowed_looks": self.borrowed_looks,
            "threshold": settings.threshold,
            "pool_pair_threshold": settings.pool_pair_share * settings.threshold,
            "fresh_state_per_block": settings.fresh_state_per_block,
            "seed": self.seed,
            "alpha": settings.alpha,
            "alpha_per_look": list(self.levels_applied),
            "alpha_at_last_look": self.levels_applied[-1],
            "stop_level_per_look": list(self.stop_levels_applied),
            "planned_looks": planned_looks,
            "extra_looks": max(0, len(self.levels_applied) - planned_looks),
            "baseline": _side_summary(self.baseline, raw=True),
            "candidate": _side_summary(self.candidate, raw=False),  # its rounds are the case's own
            "sides": sides,
        })
        # The baseline side's own census (its engine's count of its code's collectives); a
        # baseline whose engine predates the census has none.
        census = combine_census([m.get("census") for m in self.baseline_metrics])
        if census is not None:
            info["census_baseline"] = census
        memory = combine_memory([m.get("memory") for m in self.baseline_metrics])
        if memory is not None:
            info["memory_baseline"] = memory
        numerics = combine_numerics([m.get("numerics") for m in self.baseline_metrics])
        if numerics is not None:
            info["numerics_baseline"] = numerics
        if settings.stratify_placement:
            info["stratify_placement"] = True  # asked for; block_summary says whether it applied
        if self.stopped_by_structure is not None:
            info["stopped_by_structure"] = self.stopped_by_structure
        if self.stopped_by_memory is not None:
            info["stopped_by_memory"] = self.stopped_by_memory
        if self.stopped_by_numerics is not None:
            info["stopped_by_numerics"] = self.stopped_by_numerics
        return info


def _side_summary(rounds: SideRounds, raw: bool) -> dict[str, Any]:
    times = rounds.round_times
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    out = {"median_s": statistics.median(times), "iqr_s": q[2] - q[0], "rounds": len(times)}
    share = placement_info(times, rounds.rank_cpus).get("ranks_shared_cpu_share")
    if share is not None:
        out["ranks_shared_cpu_share"] = share
    placement = placement_strata.placement_text(rounds.block_placements)
    if placement is not None:  # round by round, for replays stratified by placement
        out["shared_cpu_rounds"] = placement
    if raw:
        out["round_times"] = times
    return out


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


class _Case:
    """One case's run over both sides' pools: start, stages of pairs, finish; stop on failure."""

    def __init__(self, pools: dict[str, list], settings: ABSettings, timeout_s: float, case_id: str):
        self.pools, self.settings, self.timeout_s = pools, settings, timeout_s
        self.key = f"ddpbench-ab:{case_id}"
        self.pool_pairs = min(len(pools[name]) for name in _SIDES)
        self.live: list[Any] = []  # pools holding this case's state
        self.sides = {name: SideRounds() for name in _SIDES}
        self.pairs: list[tuple[str, str, int]] = []
        self.stratified = False  # whether the last look summarised the pairs by placement
        self.censuses: dict[str, Any] = {}  # per side, its first pool's census at set-up (None: none)
        self.memories: dict[str, Any] = {}  # per side, its first pool's memory census at set-up (None: none)
        self.numerics: dict[str, Any] = {}  # per side, its first pool's numerics replay at set-up (None: none)

    def _run(self, name: str, j: int, fn, *args):
        return _on(name, j, self.pools[name][j], fn, *args, timeout_s=self.timeout_s)

    @staticmethod
    def _sides_differ(replays: dict[str, list]) -> bool:
        """Whether both sides' first pools replayed the numerics and their digests differ."""
        firsts = [replays[name][0] if replays[name] else None for name in _SIDES]
        return all(r is not None for r in firsts) and firsts[0].get("digests") != firsts[1].get("digests")

    def start(self, workloads: dict[str, Any], plan) -> int:
        """Set each side's own workload up on its pools and warm it up; returns the rounds per block."""
        estimates = []
        replays: dict[str, list] = {name: [] for name in _SIDES}  # per side, each pool's numerics replay
        for j in range(self.pool_pairs):
            for name in _SIDES:
                self.live.append(self.pools[name][j])
                replies = self._run(name, j, tasks.start, self.key, workloads[name],
                                    pool_plan(plan, name, j, sides_differ=self._sides_differ(replays)))
                estimates.append(max(reply["estimate_s"] for reply in replies))
                if j == 0 and name == schedule.CANDIDATE and lone_replay_differs(self.numerics, replies):
                    again = self._run(name, j, tasks.numerics_again, self.key)
                    replies = [dict(reply, numerics=more["numerics"]) for reply, more in zip(replies, again)]
                if j == 0:  # a baseline whose engine predates the census replies without one
                    self.censuses[name] = combine_census([reply.get("census") for reply in replies])
                    self.memories[name] = combine_memory([reply.get("memory") for reply in replies])
                    self.numerics[name] = combine_numerics([reply.get("numerics") for reply in replies])
                replays[name].append(combine_numerics([reply.get("numerics") for reply in replies]))
                # Every pool times the ops per round the first one chose ("auto" chooses once).
                plan = dataclasses.replace(plan, ops_per_round=replies[0]["ops_per_round"])
        # The first pool's replay, marked where another pool's (another process's) differs from it.
        self.numerics = {name: across_processes(replays[name]) for name in _SIDES}
        if not all(math.isfinite(e) and e > 0 for e in estimates):
            raise ValueError(
                f"ddpbench A/B: the warm-up gave no round time to size the blocks by (estimates "
                f"{estimates}); A/B mode needs at least one timed warm-up round: use --dist-warmup 1 "
                f"or more (or dist_benchmark(..., warmup=1))")
        return _block_rounds(max(estimates), self.settings)

    def run_pairs(self, pairs: list[tuple[str, str, int]], rounds: int) -> None:
        """One block of ``rounds`` on each side of every pair, in the order given."""
        for first, second, j in pairs:
            for name in (first, second):
                side = self.sides[name]
                fresh = self.settings.fresh_state_per_block and j in side.pools
                per_rank = self._run(name, j, tasks.block, self.key, rounds, fresh)
                side.blocks.append(max_over_ranks([times for times, _ in per_rank]))
                side.rank_blocks.append([list(times) for times, _ in per_rank])
                side.cpus.append([cpus for _, cpus in per_rank])
                side.pools.append(j)
        self.pairs += pairs

    def analyse(self, level: float, stop_level: float) -> stats.PairedResult:
        base, cand, common = self._summaries()
        return stats.analyse_pairs(base, cand, self.settings.threshold, level, self.settings.confidence,
                                   stop_level=stop_level, **common)

    def may_decide(self, level: float, stop_level: float) -> bool:
        """Whether :meth:`analyse` could give a decided verdict now (stats.may_decide: no bootstrap)."""
        base, cand, common = self._summaries()
        return stats.may_decide(base, cand, self.settings.threshold, level, stop_level=stop_level, **common)

    def nearly_decided(self, stop_level: float, next_pairs: int, next_stop_level: float) -> bool:
        """Whether the look at ``next_pairs`` pairs is forecast to end the case as same or
        not-slower (stats.projected_stop_bound within 1 + threshold): what earns borrowed time."""
        base, cand, _ = self._summaries()
        logs = [math.log(c) - math.log(b) for b, c in zip(base, cand)]
        return stats.projected_stop_bound(logs, stop_level, next_pairs, next_stop_level) <= 1.0 + self.settings.threshold

    def _summaries(self) -> tuple[list[float], list[float], dict[str, Any]]:
        """Both sides' block summaries, and the pool pairs, share and minima that go with them."""
        baseline, candidate = self.sides[schedule.BASELINE], self.sides[schedule.CANDIDATE]
        base_summaries, cand_summaries = baseline.block_means, candidate.block_means
        stratified = None
        if self.settings.stratify_placement:
            stratified = placement_strata.stratified_summaries(baseline.blocks, candidate.blocks,
                                                               baseline.block_placements, candidate.block_placements)
        self.stratified = stratified is not None
        if stratified is not None:
            base_summaries, cand_summaries = stratified
        return base_summaries, cand_summaries, {
            "pool_pair_of": [j for _, _, j in self.pairs], "pool_pair_share": self.settings.pool_pair_share,
            "baseline_minima": baseline.block_minima, "candidate_minima": candidate.block_minima}

    def finish(self) -> dict[str, list[dict[str, Any]]]:
        """End the case on every pool; returns each side's first pool's per-rank metrics."""
        metrics: dict[str, list[dict[str, Any]]] = {name: [] for name in _SIDES}
        for j in range(self.pool_pairs):
            for name in _SIDES:
                self.live.remove(self.pools[name][j])
                ranks = self._run(name, j, tasks.finish, self.key)
                if j == 0:  # what the two-process check found goes into the saved record
                    metrics[name] = mark_not_reproducible(ranks, self.numerics.get(name))
        return metrics

    def stop(self) -> None:
        """Free the case's state on the pools still holding it (a torn-down pool has none left)."""
        for pool in self.live:
            if pool.alive:
                try:
                    pool.run(tasks.stop, self.key, timeout_s=self.timeout_s)
                except Exception:
                    pass


_SIDES = (schedule.BASELINE, schedule.CANDIDATE)


def pool_plan(plan, side: str, j: int, sides_differ: bool = False):
    """The plan pool ``j`` of ``side`` starts the case with. The exact answers (censuses, numerics)
    are taken on each side's first pool: the baseline's replays twice and measures the band
    (numerics_band_plan: the verdict judges against the baseline's), the candidate's replays once,
    and a second time only where that replay differs from the baseline's
    (:func:`lone_replay_differs`). A later pool takes no census, and replays the numerics (once,
    plain) only where the two sides' first replays differ (``sides_differ``): whether each side
    replays alike in two processes (engine.numerics.across_processes) is what tells a per-process
    salt from a change, and where the sides agree two processes already replayed alike."""
    if j > 0:
        plan = dataclasses.replace(plan, census=False, memory_census=False)
        if not sides_differ or not plan.numerics_steps:
            return dataclasses.replace(plan, numerics_steps=0)
        return numerics_band_plan(plan, side, j)
    if not plan.numerics_steps:
        return plan
    if side == schedule.CANDIDATE:
        plan = dataclasses.replace(plan, numerics_replays=1)
    return numerics_band_plan(plan, side, j)


def lone_replay_differs(numerics: dict[str, Any], replies: list[dict]) -> bool:
    """Whether the candidate's first pool, which replayed the numerics once (its ranks' ``replies``
    to tasks.start say ``replays: 1``; an engine that predates the choice replays twice), must replay
    a second time: its digests differ from the baseline's (``numerics``: per side, the combined
    record so far), so the verdict reads its band and whether it reproduces itself."""
    records = [reply.get("numerics") for reply in replies]
    if not records or any(r is None or r.get("replays") != 1 for r in records):
        return False
    baseline = numerics.get(schedule.BASELINE)
    if baseline is None:  # nothing to compare with: the verdict is not counted whatever the replays
        return False
    candidate = combine_numerics(records)
    return candidate is None or candidate.get("digests") != baseline.get("digests")


def run_case(pools: dict[str, list], workload, plan, settings: ABSettings, timeout_s: float,
             case_id: str, seed: int = 0, baseline_workload=None) -> ABOutcome:
    """Measure ``workload`` on the candidate's pools and ``baseline_workload`` (the baseline's own,
    built by its code: gates/ab/baseline_workloads.py; None: the same object) on the baseline's
    (``pools``: keys "baseline" and "candidate", each a list of
    ``settings.pools_per_side`` pools), interleaved, in the block order ``seed`` draws for this
    case. Stages of pairs run until the verdict is clear or the next stage would pass the time cap;
    look k is tested at the k-th of ``settings.alpha_per_look`` and a last look at what is left of
    alpha, and may end as same or not-slower only at the k-th of ``settings.stop_level_per_look``. A case still inconclusive after its planned looks takes extra looks while the cap
    allows (``settings.extra_stage_sizes``, each at EXTRA_LOOK_LEVEL). The candidate's first pool
    is the case's own: its metrics and check results are the case's. A task failing on either side
    raises :class:`SideFailed`."""
    started = time.monotonic()
    case = _Case(pools, settings, timeout_s, case_id)
    try:
        rounds = case.start({schedule.BASELINE: workload if baseline_workload is None else baseline_workload,
                             schedule.CANDIDATE: workload}, plan)
        stopped_by_structure = (_structural_regression(case.censuses) if settings.stop_on_structural_regression
                                else None)
        stopped_by_memory = _memory_regression(case.memories) if settings.stop_on_memory_regression else None
        stopped_by_numerics = (_numerics_regression(case.numerics, settings.numerics_tolerance)
                               if settings.stop_on_numerics_regression else None)
        rng = schedule.case_rng(case_id, seed)
        stage_sizes = settings.stage_sizes(case.pool_pairs)
        every_stage = stage_sizes + settings.extra_stage_sizes(case.pool_pairs)
        levels = settings.alpha_per_look(case.pool_pairs)
        stop_levels = settings.stop_level_per_look(case.pool_pairs)
        applied: list[float] = []
        borrowed = 0  # looks taken on borrowed time
        while True:
            stage_started = time.monotonic()
            stage = schedule.pairs_over_pools(every_stage[len(applied)] // case.pool_pairs, case.pool_pairs, rng)
            case.run_pairs(stage, rounds)
            looks = len(applied) + 1
            seconds_per_pair = (time.monotonic() - stage_started) / len(stage)
            remaining = settings.max_time_s - (time.monotonic() - started)
            next_fits = looks < len(every_stage) and every_stage[looks] * seconds_per_pair <= remaining
            next_fits_borrowed = (looks < len(every_stage)
                                  and every_stage[looks] * seconds_per_pair <= remaining + settings.borrow_time_s)
            cap_ends_planned = False
            if borrowed or looks > len(stage_sizes):
                applied.append(EXTRA_LOOK_LEVEL)
            elif looks < len(stage_sizes) and next_fits:
                applied.append(levels[looks - 1])
            else:  # the last planned look: as planned, or the cap ends the planned looks here
                cap_ends_planned = looks < len(stage_sizes)
                applied.append(stats.level_for_last_look(settings.alpha, len(stage_sizes), looks))
            # A cap that ends the planned looks early leaves no time for an extra look either.
            # A structural, memory or numerics regression decided the case at set-up: its first look is enough.
            exact_stop = stopped_by_structure or stopped_by_memory or stopped_by_numerics
            last = cap_ends_planned or not next_fits or exact_stop
            # A look that cannot decide and is not the last needs no interval: its bootstrap (seconds
            # at a few hundred pairs) would change nothing, so the pairs go on at once.
            if not last and not case.may_decide(applied[-1], stop_levels[looks - 1]):
                continue
            result = case.analyse(applied[-1], stop_levels[looks - 1])
            # Every decided verdict ends the case, not-slower too: stopping without a regression
            # can only take chances to reject away, never add one (docs/design/ab.md#the-looks-levels).
            if result.verdict != Verdict.INCONCLUSIVE:
                break
            if last:
                # The cap ends the case here unless it is nearly decided and the next look fits the
                # time it may borrow: then the pairs go on, each later look at EXTRA_LOOK_LEVEL.
                if not (next_fits_borrowed and not exact_stop
                        and case.nearly_decided(stop_levels[looks - 1], len(case.pairs) + every_stage[looks],
                                                stop_levels[looks])):
                    break
                borrowed += 1
        metrics = case.finish()
    except BaseException:
        case.stop()
        raise
    return ABOutcome(result=result, baseline=case.sides[schedule.BASELINE],
                     candidate=case.sides[schedule.CANDIDATE], candidate_metrics=metrics[schedule.CANDIDATE],
                     baseline_metrics=metrics[schedule.BASELINE],
                     rounds_per_block=rounds, pairs=case.pairs, pools_per_side=case.pool_pairs,
                     levels_applied=tuple(applied), settings=settings,
                     wall_s=time.monotonic() - started, seed=seed, stratified=case.stratified,
                     stopped_by_structure=stopped_by_structure, stopped_by_memory=stopped_by_memory,
                     stopped_by_numerics=stopped_by_numerics,
                     stop_levels_applied=stop_levels[:len(applied)], borrowed_looks=borrowed)


def _structural_regression(censuses: dict[str, Any]) -> str | None:
    """The line naming a structural regression of the candidate's census against the baseline's
    (``gates.structure``), or None: no regression, or nothing to compare (a side without a census,
    one that cannot be read: the report judges those when the case is done)."""
    try:
        verdict = compare_census(censuses.get(schedule.BASELINE), censuses.get(schedule.CANDIDATE), "candidate")
    except RecordError:
        return None
    return (verdict.line or verdict.verdict) if verdict.verdict is Verdict.REGRESSION else None


def _memory_regression(memories: dict[str, Any]) -> str | None:
    """The line naming a memory regression of the candidate's memory census against the
    baseline's (``gates.memory``), or None, as :func:`_structural_regression`."""
    try:
        verdict = compare_memory(memories.get(schedule.BASELINE), memories.get(schedule.CANDIDATE), "candidate")
    except RecordError:
        return None
    return (verdict.line or verdict.verdict) if verdict.verdict is Verdict.REGRESSION else None


def _numerics_regression(numerics: dict[str, Any], tolerance: float | None) -> str | None:
    """The line naming a numerics change of the candidate's replay against the baseline's
    (``gates.numerics``), or None, as :func:`_structural_regression`."""
    try:
        verdict = compare_numerics(numerics.get(schedule.BASELINE), numerics.get(schedule.CANDIDATE), "candidate",
                                   tolerance=tolerance)
    except RecordError:
        return None
    return (verdict.line or verdict.verdict) if verdict.verdict is Verdict.REGRESSION else None
