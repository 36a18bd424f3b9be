"""The timing engine inside every rank (:class:`RankSession`, :func:`measure_workload`: set-up,
warm-up, recorded rounds, the stopping rule, ops per round, finish) and the cross-rank reduction in
the controller (:class:`CaseRounds`, :func:`max_over_ranks`). The rule itself:
docs/design/engine.md#timing-rule; a round's mechanics: :mod:`.rounds`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from ..pool.base import TaskError
from .census import combine_census, dynamo_snapshot, take_census_round
from .compiled_frames import CompiledFrameEntries, EntryHistory, check_rounds, frames_compiled, round_entries
from .memory import HandedCollectives, combine_memory, measured_cuda, take_memory_census_round
from .numerics import BAND_REPLAYS as NUMERICS_BAND_REPLAYS
from .numerics import REPLAYS as NUMERICS_REPLAYS
from .numerics import combine_numerics, replay_once, take_numerics
from .phases import PhaseClock
from .rounds import (ThreadCpuReader, agreed_max, capture_cuda_graph, pinned_to, refuse_uncapturable, repeated, replay,
                     time_round_cpu, time_round_cuda)
from .variants import STEP as STEP  # the workload's own name among the variant rounds
from .variants import interleave_variants, variants_of


# The stopping rule's first look at the rounds, and how much the count grows between looks.
PRECISION_FIRST_LOOK = 20
PRECISION_GROWTH = 1.5
# ops_per_round="auto": the round's fixed cost may be at most this share of it; the count stays a
# power of two up to AUTO_MAX_OPS and a round at most AUTO_MAX_ROUND_S; each count is timed this
# many rounds (the median of their cross-rank maxima).
AUTO_OVERHEAD_SHARE = 0.01
# ...and a round lasts at least this long, as nccl-tests' 100 ops between two events do: a fit of
# short rounds reads a fixed cost of tens of microseconds as zero when the rounds jitter by as much
# (on an H100 it then chose 1 op at 1 MB in one run and 8 in the next, per-op times 1.6x apart).
AUTO_MIN_ROUND_S = 1e-3
AUTO_MAX_OPS = 1024
AUTO_MAX_ROUND_S = 1.0
AUTO_PROBE_ROUNDS = 5
# z for the 95% distribution-free interval of the median (order statistics).
_Z95 = 1.959964


# The fewest rounds a pool records when a case's rounds are split across pools: a pool's median
# needs two rounds for its own spread (ddpbench.gates.stats.MIN_VALUES).
MIN_ROUNDS_PER_POOL = 3


@dataclass(frozen=True)
class RoundPlan:
    """How many rounds to run.

    ``rounds > 0``: exactly that many. ``rounds == 0``: as many as fill ``min_time_s`` (within
    [min_rounds, max_rounds]), stopping earlier once the median is known to ``precision``: the 95%
    interval of the median (order statistics, no distribution assumed) lies within +-precision of
    it. ``precision == 0`` turns the early stop off.
    """

    warmup: int = 2
    rounds: int = 0
    min_time_s: float = 1.0
    min_rounds: int = 5
    max_rounds: int = 1000
    precision: float = 0.01
    # Ops each round launches back to back: a count, or "auto" (choose_ops_per_round).
    ops_per_round: int | str = 1
    # Capture each round's ops in a CUDA graph once and replay it (CUDA cases only).
    cuda_graphs: bool = False
    # After warm-up, one more untimed round under the collective census (ddpbench.engine.census).
    census: bool = True
    # After warm-up, one untimed step under the memory census (ddpbench.engine.memory).
    memory_census: bool = True
    # Steps of the numerics replay (ddpbench.engine.numerics): on a state of its own, set up and torn
    # down around it, after the recorded rounds (A/B: before the blocks); 0: none.
    numerics_steps: int = 3
    # Perturbed replays that measure the numerics band (ddpbench.engine.numerics.BAND_REPLAYS); 0:
    # none (A/B: only the baseline's first pool needs the band the verdict judges against).
    numerics_band_replays: int = NUMERICS_BAND_REPLAYS
    # Plain replays (ddpbench.engine.numerics.REPLAYS: two, whose difference tells whether the step
    # is deterministic). A/B mode asks the candidate for one, and for the second only where the
    # first differs from the baseline's (gates/ab/pairs_loop.py); an engine that predates the field
    # takes two.
    numerics_replays: int = NUMERICS_REPLAYS
    # After the recorded rounds, this many rounds of each of the workload's variants
    # (Workload.variants), interleaved with as many more rounds of the workload itself; 0: none.
    variant_rounds: int = 0
    # Fresh pools of ranks a case is measured in, its rounds split across them (not multiplied), so a
    # saved run holds the spread between pools that the stored gate's interval needs
    # (docs/design/gates.md#run-to-run-variance). Read by the controller (DistBenchmark), not ranks.
    pools: int = 1

    def share(self, pools: int, index: int) -> "RoundPlan":
        """This plan for pool ``index`` of ``pools`` a case's rounds are split across: its share of
        the rounds (they add up to ``rounds``), or of the recorded time, with the rounds' bounds and
        the stop rule's precision widened by sqrt(pools), so the case's median over all pools is
        known as precisely as one pool's was; the exact measurements (the censuses, the numerics
        replay, the variant rounds) in the first pool only."""
        if pools <= 1:
            return self
        rounds = self.rounds // pools + (index < self.rounds % pools) if self.rounds else 0
        plan = dataclasses.replace(self, rounds=rounds, min_time_s=self.min_time_s / pools,
                                   min_rounds=max(MIN_ROUNDS_PER_POOL, math.ceil(self.min_rounds / pools)),
                                   max_rounds=max(MIN_ROUNDS_PER_POOL, math.ceil(self.max_rounds / pools)),
                                   precision=self.precision * math.sqrt(pools), pools=1)
        if index == 0:
            return plan
        return dataclasses.replace(plan, census=False, memory_census=False, numerics_steps=0, variant_rounds=0)

    def rounds_for(self, seconds_per_round: float) -> int:
        """The recorded-round count that fills ``min_time_s`` within [min_rounds, max_rounds]."""
        if self.rounds:
            return self.rounds
        wanted = math.ceil(self.min_time_s / max(seconds_per_round, 1e-9))
        return max(self.min_rounds, min(self.max_rounds, wanted))


def median_interval(values: list[float]) -> tuple[float, float]:
    """The 95% distribution-free interval of the median: order statistics j and k around n/2."""
    return _median_interval_of_sorted(sorted(values))


def _median_interval_of_sorted(ordered: list[float]) -> tuple[float, float]:
    n = len(ordered)
    half = _Z95 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half) - 1)
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[low], ordered[high]


def median_is_precise(values: list[float], precision: float) -> bool:
    """Whether the median's 95% interval lies within +-precision of the median."""
    if precision <= 0 or len(values) < PRECISION_FIRST_LOOK:
        return False
    ordered = sorted(values)
    low, high = _median_interval_of_sorted(ordered)
    median = statistics.median(ordered)
    return median > 0 and (median - low) <= precision * median and (high - median) <= precision * median


def rounds_until_precise(timed_round: Callable[[], float], rounds: int, first_look: int | None, precision: float,
                         agree: Callable[[list[float]], list[float]] = list) -> list[float]:
    """The stopping rule: up to ``rounds`` calls of ``timed_round``; with ``first_look``, fewer once
    the median of ``agree(times)`` (the cross-rank maxima: every rank takes the same decision) is
    known to ``precision``, looked at after ``first_look`` rounds, then at PRECISION_GROWTH times as
    many each time."""
    times: list[float] = []
    look = rounds if first_look is None else first_look
    while len(times) < rounds:
        for _ in range(min(look, rounds) - len(times)):
            times.append(timed_round())
        if len(times) >= rounds or median_is_precise(agree(times), precision):
            break
        look = math.ceil(len(times) * PRECISION_GROWTH)
    return times


@dataclass
class RankMeasurement:
    """What one rank sends back: its recorded round times and its own metrics.

    ``round_cpus``: the CPU this rank's main thread was on at the end of each recorded round (read
    after the timer stopped; None where the platform cannot tell). The controller uses it to say
    whether ranks shared a CPU, which moves small-message timings on some machines.
    """

    rank: int
    round_times: list[float]
    metrics: dict[str, Any] = field(default_factory=dict)
    round_cpus: list[int] | None = None
    # Per name (the workload's own interleaved rounds under STEP, each variant under its name):
    # this rank's times of the variant rounds (RankSession.time_variants); empty when none ran.
    variant_times: dict[str, list[float]] = field(default_factory=dict)


def choose_ops_per_round(round_time, share: float = AUTO_OVERHEAD_SHARE, max_ops: int = AUTO_MAX_OPS,
                         max_round_s: float = AUTO_MAX_ROUND_S,
                         min_round_s: float = AUTO_MIN_ROUND_S) -> tuple[int, float, float]:
    """(ops per round, fixed cost s, per-op time s) so that the round's fixed cost is at most
    ``share`` of the round and the round lasts at least ``min_round_s``. ``round_time(k)`` is the
    time of a round of k ops back to back.

    Rounds of 1, 2, 4, ... ops fit ``T(k) = fixed + k * per_op`` (the slope between the last two
    counts); the count is the smallest power of two with ``fixed <= share * T(k)`` and
    ``T(k) >= min_round_s``, searched no further than needed, at most ``max_ops`` and
    ``max_round_s`` of work per round."""
    previous_k, previous_t = 1, round_time(1)
    k = 2
    while True:
        t = round_time(k)
        per_op = max((t - previous_t) / (k - previous_k), t * 1e-9)
        fixed = max(t - k * per_op, 0.0)
        need = math.ceil(fixed * (1 - share) / (share * per_op)) if fixed > 0 else 1
        need = max(need, math.ceil((min_round_s - fixed) / per_op))
        if need <= k or k >= max_ops or t >= max_round_s:
            break
        previous_k, previous_t = k, t
        k *= 2
    fits = max(1, int(max_round_s // per_op))
    chosen = 1 << max(0, math.ceil(math.log2(max(need, 1))))
    return max(1, min(chosen, max_ops, 1 << int(math.log2(fits)))), fixed, per_op


class RankSession:
    """One workload on one rank: set-up, warm-up, blocks of recorded rounds, finish.

    :func:`measure_workload` runs all of it in one task; A/B mode (:mod:`ddpbench.gates.ab`) runs the
    steps as separate tasks, so that blocks of two sides' rounds can alternate while each side's
    state stays alive in its ranks. The engine never knows what the workload does. The session
    coordinates; a round's mechanics (timers, CUDA graphs, pinning) are in :mod:`.rounds`, the census
    rounds in :mod:`.census` and :mod:`.memory`, the variant rounds in :mod:`.variants`, and where
    the untimed seconds go in a :class:`~.phases.PhaseClock`.
    """

    def __init__(self, ctx, workload, plan: RoundPlan):
        self.ctx, self.workload, self.plan = ctx, workload, plan
        self.on_cuda = ctx.device_type == "cuda"
        self._time_round = time_round_cuda if self.on_cuda else time_round_cpu
        self._agree = agreed_max  # every rank's element-wise max (the stopping rule's input)
        # The core this rank stays on while it measures (workloads with processes of their own opt
        # out through pin_to_core = False); None: wherever the OS puts it.
        self.core = ctx.core if ctx.core is not None and workload.pin_to_core else None
        self.clock = PhaseClock("setup", "warmup", "between_rounds", "check")
        self.state = None
        self._set_up = False
        self._peak_reset = False
        self.round_estimate_s = 0.0  # a whole round's time (all its ops), for sizing rounds
        self.ops_per_round = plan.ops_per_round if isinstance(plan.ops_per_round, int) else 1
        self.fixed_cost_s: float | None = None  # what "auto" measured
        self._graph = None
        self.census: dict[str, Any] | None = None  # the census round's record (plan.census)
        self.memory_census: dict[str, Any] | None = None  # the memory census's record (plan.memory_census)
        self.numerics: dict[str, Any] | None = None  # the numerics replay's record (plan.numerics_steps)
        self._numerics_first_run = None  # a lone replay's run, kept for replay_numerics_again
        self._dynamo_at_start = None
        self._compiled_entries = EntryHistory()  # the rounds' compiled-frame entries so far (check_rounds)
        self.variant_times: dict[str, list[float]] = {}
        if plan.cuda_graphs:
            refuse_uncapturable(workload, self.on_cuda)

    def _round(self) -> float:
        """One timed round of this session's ops; returns the time per op."""
        if self._graph is not None:
            return self._time_round(self.ctx, replay, self._graph) / self.ops_per_round
        return self._time_round(self.ctx, repeated(self.workload.run_round, self.ops_per_round),
                                self.state) / self.ops_per_round

    def _choose_ops_per_round(self) -> None:
        """``ops_per_round="auto"``: the count at which the round's fixed cost is at most
        AUTO_OVERHEAD_SHARE of it (every rank takes the same decision: agreed maxima)."""

        def round_time(k: int) -> float:
            run = repeated(self.workload.run_round, k)
            times = [self._time_round(self.ctx, run, self.state) for _ in range(AUTO_PROBE_ROUNDS)]
            return statistics.median(self._agree(self.ctx, times))

        self.ops_per_round, self.fixed_cost_s, _ = choose_ops_per_round(round_time)

    def _capture(self) -> None:
        self._graph = capture_cuda_graph(self.ctx, self.workload.run_round, self.state, self.ops_per_round)

    def _build(self, warmup: int) -> list[float]:
        """Set the workload up and run ``warmup`` unrecorded rounds; returns their per-op times."""
        if self.plan.census and self._dynamo_at_start is None:
            self._dynamo_at_start = dynamo_snapshot() or {"frames": 0, "graph_breaks": 0}
        with self.clock.phase("setup"):
            self.state = self.workload.setup(self.ctx)
            self._set_up = True
            self._graph = None
        with self.clock.phase("warmup"), CompiledFrameEntries() as entries:
            times = []
            for _ in range(warmup):
                compiled = frames_compiled()
                times.append(self._round())
                self._compiled_entries.add([round_entries(entries.take(), compiled, frames_compiled())])
        return times

    def start(self) -> None:
        """Set-up, warm-up, (with "auto") the ops per round and the censuses; leaves the fastest
        warm-up round (max over ranks, all its ops) as the estimate."""
        with pinned_to(self.core):
            # Choosing the round count or the ops per round needs at least one timed warm-up round.
            auto = self.plan.ops_per_round == "auto"
            warmup = max(self.plan.warmup, 1 if self.plan.rounds == 0 else 0)
            times = self._build(max(warmup, 1 if auto else 0))
            if auto:
                with self.clock.phase("warmup"):
                    self._choose_ops_per_round()
                if self.plan.census or self.plan.memory_census:
                    # A fresh state, warmed up as a pool given the chosen count is: every pool (an A/B
                    # run's other pools time the count the first one chose) takes its censuses after
                    # the same steps, not after the search's extra ones.
                    with self.clock.phase("setup"):
                        self.close()
                    times = self._build(warmup)
                else:
                    with self.clock.phase("warmup"):
                        times = [self._round() for _ in range(max(1, min(self.plan.warmup, 3)))]
            # The census round's collectives run on aliases the memory census then settles: what a
            # backend's thread drops late of that round is not counted as the program's (memory.py).
            handed = HandedCollectives() if self.plan.census and self.plan.memory_census else None
            try:
                if self.plan.census:  # before any capture: a graph's replay dispatches no collective
                    with self.clock.phase("census"):
                        self.census = take_census_round(self.workload, self.state,
                                                        ops_per_round=self.ops_per_round,
                                                        count_kernel_launches=self.on_cuda,
                                                        dynamo_at_start=self._dynamo_at_start, handed=handed)
                if self.plan.memory_census:  # likewise: a graph's replay allocates nothing the tracker sees
                    with self.clock.phase("memory_census"):
                        self.memory_census = take_memory_census_round(self.workload, self.state, self.ctx,
                                                                      self.census, handed)
            finally:
                if handed is not None:
                    handed.release()
            with self.clock.phase("warmup"):
                if self.plan.cuda_graphs:
                    self._capture()
                    times = [self._round() for _ in range(max(1, min(self.plan.warmup, 3)))]
                if times:
                    # The fastest warm-up round estimates a round best: one stall must not cut the count.
                    self.round_estimate_s = self._agree(self.ctx, [min(times)])[0] * self.ops_per_round

    def refresh(self, warmup: int = 1) -> None:
        """Tear the workload's state down and build it anew (untimed), then ``warmup`` unrecorded
        rounds: A/B mode does this before every block, so that what one set-up happened to get
        (where its buffers landed, which side set up first) varies from block to block instead of
        biasing a whole side."""
        with pinned_to(self.core):
            with self.clock.phase("setup"):
                self.close()
            self._build(warmup)
            if self.plan.cuda_graphs:
                self._capture()

    def replay_numerics(self, rebuild: bool = False) -> None:
        """The numerics replays (:func:`.numerics.take_numerics`), untimed, on states of their own:
        the session's state is torn down first (never two alive at once), and with ``rebuild`` set
        up and warmed up anew after, as a :meth:`refresh` does (A/B mode, before its blocks)."""
        if (not self.plan.numerics_steps or self.numerics is not None
                or not getattr(self.workload, "numerics_replay", True)):  # duck-typed workloads lack it
            return
        replays = max(1, int(getattr(self.plan, "numerics_replays", NUMERICS_REPLAYS) or NUMERICS_REPLAYS))
        first_run: list = []

        def replay(workload, ctx, steps, **options):  # keeps the first plain replay, should a second be asked for
            run = replay_once(workload, ctx, steps, **options)
            if options.get("perturbation") is None:
                first_run[:] = first_run or [run]
            return run

        self._take_numerics(replays, replay)
        self._numerics_first_run = first_run[0] if first_run and replays < NUMERICS_REPLAYS else None
        if rebuild:
            self.refresh(max(1, self.plan.warmup))

    def replay_numerics_again(self, rebuild: bool = False) -> None:
        """The second replay, after :meth:`replay_numerics` took one (``plan.numerics_replays`` 1):
        the record becomes the one two replays give (their band, ``not_reproducible``); the state
        is torn down first and, with ``rebuild``, built and warmed up anew."""
        first = self._numerics_first_run
        if first is None:
            return
        self._numerics_first_run = None
        runs = iter([first])

        def replay(workload, ctx, steps, **options):  # the first replay as it was taken, then new ones
            return next(runs, None) or replay_once(workload, ctx, steps, **options)

        self._take_numerics(NUMERICS_REPLAYS, replay)
        if rebuild:
            self.refresh(max(1, self.plan.warmup))

    def _take_numerics(self, replays: int, replay) -> None:
        """The session's state torn down, then the numerics record of ``replays`` plain replays (and
        the plan's band) taken through ``replay``, pinned as the rounds are."""
        with pinned_to(self.core):
            with self.clock.phase("setup"):
                self.close()
            with self.clock.phase("numerics"):
                self.numerics = take_numerics(self.workload, self.ctx, self.plan.numerics_steps, replays,
                                              getattr(self.plan, "numerics_band_replays", 0), replay)

    def record(self, rounds: int, stop_when_precise: bool = False) -> tuple[list[float], list | None]:
        """Up to ``rounds`` recorded rounds; with ``stop_when_precise``, fewer once the median of
        the cross-rank maxima is known to the plan's precision (all ranks take the same decision).
        Returns the times per op and this rank's CPU after each round (None where unknown)."""
        with contextlib.closing(ThreadCpuReader()) as cpu, pinned_to(self.core):
            if self.on_cuda and not self._peak_reset:  # peak memory over all recorded rounds
                import torch

                torch.cuda.reset_peak_memory_stats(self.ctx.device)
                self._peak_reset = True
            cpus: list = []
            entered: list[int | None] = []  # compiled frames each round entered (check_rounds)

            def timed_round() -> float:
                elapsed = self._round()
                cpus.append(cpu.read())
                count = entries.take()
                entered.append(count if self._graph is None else None)  # a graph's replay enters no frame
                return elapsed

            first_look = max(PRECISION_FIRST_LOOK, self.plan.min_rounds) if stop_when_precise else None
            compiled_before = frames_compiled()
            with self.clock.phase("between_rounds") as phase, CompiledFrameEntries() as entries:
                times = rounds_until_precise(timed_round, rounds, first_look, self.plan.precision,
                                             lambda values: self._agree(self.ctx, values))
                # The phase is the untimed part: barriers, CUDA syncs, the stopping rule.
                phase.discount(sum(times) * self.ops_per_round)
            check_rounds(entered, compiled_before, frames_compiled(), self._compiled_entries)
        return times, (cpus if None not in cpus else None)

    def time_variants(self, rounds: int) -> dict[str, list[float]]:
        """``rounds`` rounds of each of the workload's variants and as many more of the workload
        itself (:func:`.variants.interleave_variants`); the times are per op, as the recorded
        rounds'. None of it joins the recorded rounds."""
        variants = variants_of(self.workload, rounds)
        if not variants:
            return {}
        with pinned_to(self.core), self.clock.phase("variants") as phase:
            times, timed = interleave_variants(self.ctx, (self.workload.run_round, self.state), variants, rounds,
                                               self.ops_per_round, self._time_round)
            phase.discount(timed)  # the phase is the variants' set-up, warm-up and teardown
        self.variant_times = times
        return times

    def finish(self, check: bool = True, variant_rounds: int = 0) -> dict[str, Any]:
        """Metrics, the variant rounds (``variant_rounds``, :meth:`time_variants`: after the
        metrics, so that a variant's memory is not the case's), the workload's check (untimed),
        teardown; returns this rank's metrics."""
        metrics: dict[str, Any] = {}
        peaks: tuple[int, int] | None = None  # CUDA: the allocator's peaks over the recorded rounds
        try:
            with pinned_to(self.core):  # the rank's own metrics and check see the placement the rounds had
                if self.on_cuda:
                    import torch

                    peaks = (int(torch.cuda.max_memory_allocated(self.ctx.device)),
                             int(torch.cuda.max_memory_reserved(self.ctx.device)))
                    metrics["peak_memory_bytes"] = peaks[0]
                with self.clock.phase("check"):
                    metrics.update(self.workload.rank_metrics(self.state) or {})
                    self.time_variants(variant_rounds)  # a phase of its own, not the check's
                    if check:  # a check may report what it measured while checking (e.g. its peak memory)
                        metrics.update(check_outcome(self.workload, self.workload.check(self.state), self.ctx.rank))
        finally:
            self.close()
        self.replay_numerics()  # after everything timed, on a state of its own
        # Where a case's untimed seconds go (max over ranks in extra_info); see docs/results.md, "Harness overhead per case".
        metrics.update(self.clock.metrics())
        metrics.update(self._engine_metrics(peaks))
        return metrics

    def _engine_metrics(self, peaks: tuple[int, int] | None) -> dict[str, Any]:
        """What the engine itself reports beside the workload's metrics: placement, ops per round,
        the census records, what "auto" measured, CUDA graph mode."""
        metrics: dict[str, Any] = {"pinned_cores": self.core is not None,  # each rank on a core of its own
                                   "ops_per_round": self.ops_per_round}
        if self.census is not None:
            metrics["census"] = self.census
        if self.memory_census is not None:  # the allocator's peaks over the recorded rounds beside it
            measured = peaks is not None and self._peak_reset
            metrics["memory"] = measured_cuda(self.memory_census, *peaks) if measured else self.memory_census
        if self.numerics is not None:
            metrics["numerics"] = self.numerics
        if self.fixed_cost_s is not None:
            metrics["round_fixed_cost_s"] = self.fixed_cost_s
        if self.plan.cuda_graphs:
            metrics["cuda_graphs"] = True
        return metrics

    def close(self) -> None:
        self._graph = None
        if self._set_up:
            self._set_up = False
            self.workload.teardown(self.state)


class CheckFailed(TaskError, AssertionError):
    """A workload's check returned False: its result was wrong."""


def check_outcome(workload, result, rank: int) -> dict[str, Any]:
    """What a workload's ``check`` returned, as this rank's metrics. None or True: passed, nothing
    measured; a dict: passed, numbers it measured; False (or a one-value bool array or tensor that
    is False): the result was wrong, and the case fails, since a check written as ``return ok``
    must not pass silently; anything else is a mistake, named."""
    if result is None or isinstance(result, dict):
        return result or {}
    name = getattr(workload.check, "__qualname__", f"{type(workload).__name__}.check")
    value = result
    if not isinstance(value, bool) and callable(getattr(value, "item", None)):
        try:
            value = value.item()  # numpy.bool_, a 0-d bool tensor
        except (ValueError, RuntimeError):
            pass
    if value is True:
        return {}
    if value is False:
        raise CheckFailed(f"{name}() returned False on rank {rank}: the workload computed a wrong "
                             f"result. (A check fails by raising, e.g. assert with a message, or by "
                             f"returning False; it passes returning None or True.)")
    raise TypeError(f"{name}() returned {type(result).__name__} {result!r:.80}: a check returns None or "
                    f"True (passed), False (a wrong result), or a dict of numbers it measured")


def measure_workload(ctx, workload, plan: RoundPlan) -> RankMeasurement:
    """Run ``workload`` on this rank: set-up, warm-up, recorded rounds, metrics, check, teardown.

    Pinned pools (ctx.core set) keep the rank on its own core while it measures, unless the
    workload opts out (``pin_to_core = False``: it starts processes that need the other cores).
    """
    session = RankSession(ctx, workload, plan)
    try:
        session.start()
        rounds = plan.rounds or plan.rounds_for(session.round_estimate_s)
        times, cpus = session.record(rounds, stop_when_precise=plan.rounds == 0 and plan.precision > 0)
    except BaseException:
        session.close()
        raise
    metrics = session.finish(variant_rounds=plan.variant_rounds)
    return RankMeasurement(ctx.rank, times, metrics, cpus, session.variant_times)


class CaseRounds(NamedTuple):
    """A case's rounds as the controller keeps them: per round the max over ranks, and per rank its
    metrics, its CPU after each round and its own round times."""

    round_times: list[float]
    rank_metrics: list[dict[str, Any]]
    rank_cpus: list[list[int] | None]
    rank_round_times: list[list[float]]
    # Per name, each variant round's time, max over ranks (RankSession.time_variants); None: none ran.
    variant_times: dict[str, list[float]] | None = None

    def then(self, other: "CaseRounds") -> "CaseRounds":
        """These rounds followed by ``other``'s (the same case in another pool): the metrics,
        censuses and variant rounds stay these (the first pool's; the others measure none)."""
        return CaseRounds(self.round_times + other.round_times, self.rank_metrics,
                          [None if a is None or b is None else a + b for a, b in zip(self.rank_cpus, other.rank_cpus)],
                          [a + b for a, b in zip(self.rank_round_times, other.rank_round_times)], self.variant_times)

    @classmethod
    def of(cls, measurements: list[RankMeasurement]) -> "CaseRounds":
        names = measurements[0].variant_times.keys() if measurements else ()
        variants = {name: max_over_ranks([m.variant_times[name] for m in measurements]) for name in names}
        return cls(max_over_ranks([m.round_times for m in measurements]), [m.metrics for m in measurements],
                   [m.round_cpus for m in measurements], [list(m.round_times) for m in measurements],
                   variants or None)


def max_over_ranks(per_rank_times: list[list[float]]) -> list[float]:
    """Round i's time is the slowest rank's time for round i."""
    if not per_rank_times:
        raise ValueError("no rank reported any round times")
    lengths = {len(times) for times in per_rank_times}
    if len(lengths) != 1:
        raise ValueError(f"ranks recorded different numbers of rounds: {sorted(lengths)}")
    return [max(values) for values in zip(*per_rank_times)]


def combine_rank_metrics(per_rank_metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Numbers: the maximum over ranks (peak memory, open fds...); the census and the memory census:
    every rank's record, rank 0's whole and the others' differences
    (:func:`ddpbench.engine.census.combine_census`, :func:`ddpbench.engine.memory.combine_memory`);
    the numerics: every rank's digests (:func:`ddpbench.engine.numerics.combine_numerics`); anything
    else: rank 0's."""
    combined: dict[str, Any] = {}
    if any("census" in metrics for metrics in per_rank_metrics):
        combined["census"] = combine_census([metrics.get("census") for metrics in per_rank_metrics])
    if any("memory" in metrics for metrics in per_rank_metrics):
        combined["memory"] = combine_memory([metrics.get("memory") for metrics in per_rank_metrics])
    if any("numerics" in metrics for metrics in per_rank_metrics):
        combined["numerics"] = combine_numerics([metrics.get("numerics") for metrics in per_rank_metrics])
    for metrics in per_rank_metrics:
        for key, value in metrics.items():
            if key in ("census", "memory", "numerics"):
                continue
            if key not in combined:
                combined[key] = value
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                combined[key] = max(combined[key], value)
    return combined
