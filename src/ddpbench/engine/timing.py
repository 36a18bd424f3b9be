"""Rounds: the timing engine that runs a workload inside every rank, and the cross-rank reduction.

A round is: barrier -> start timer -> workload.run_round, ``ops_per_round`` times back to back ->
(CUDA: end event + synchronize) -> stop timer, inside every rank; it records the time per op
(elapsed / ops_per_round). The round's time is the maximum over ranks (the slowest rank is what a
training step waits for). Warm-up rounds are run but not recorded.

Ops per round (RoundPlan.ops_per_round): one by default on the CPU, where gloo's collectives are
synchronous (the op is done when the call returns, so there is no launch to hide and one op per
round measures what a plain script measures); ``"auto"`` (the default for CUDA cases) grows the
count until the round's fixed cost — timer, launch latency, the barrier's exit skew — is at most
:data:`AUTO_OVERHEAD_SHARE` of the round (:func:`choose_ops_per_round`), as nccl-tests times many
iterations back to back and torch.utils.benchmark's blocked_autorange grows its block. With
``cuda_graphs`` the round's ops are captured once into a CUDA graph and each round replays it
between the events (nccl-tests -G).

Variant rounds (``RoundPlan.variant_rounds``, :meth:`RankSession.time_variants`): after the
recorded rounds, the workload's variants (``Workload.variants``, e.g. its compute-only step) and
the workload itself take turns, round by round, by the same rule; they are reported apart and never
join the case's rounds.

``measure_workload`` is the task the controller sends to every rank; it never knows what the
workload does. ``max_over_ranks`` runs in the controller.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..pool.base import TaskError


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
# The census counts at least this many ops, each apart: a step whose collectives differ between
# steps (one every other step) shows as such instead of as whichever phase one op happened to be.
CENSUS_MIN_OPS = 2
# z for the 95% distribution-free interval of the median (order statistics).
_Z95 = 1.959964
# The name of the workload's own rounds among the variant rounds (RankSession.time_variants).
STEP = "step"


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
    # After the recorded rounds, this many rounds of each of the workload's variants
    # (Workload.variants), interleaved with as many more rounds of the workload itself; 0: none.
    variant_rounds: int = 0

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


class ThreadCpuReader:
    """Reads the CPU the opening thread last ran on (Linux /proc): the file is opened once and each
    read is one pread, so sampling it after every round costs a single system call. Where /proc
    cannot tell, every read returns None."""

    def __init__(self):
        try:
            self._fd: int | None = os.open("/proc/thread-self/stat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> int | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 1024, 0).rsplit(b")", 1)[1].split()[36])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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


def _repeated(run_round, ops: int):
    """``run_round`` ``ops`` times back to back, as one call (one timed region)."""
    if ops == 1:
        return run_round

    def ops_back_to_back(state):
        for _ in range(ops):
            run_round(state)

    return ops_back_to_back


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


def _agreed_max(ctx, values: list[float]) -> list[float]:
    """Element-wise maximum of ``values`` over all ranks (every rank gets the same list)."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


class RankSession:
    """One workload on one rank: set-up, warm-up, blocks of recorded rounds, finish.

    :func:`measure_workload` runs all of it in one task; A/B mode (:mod:`ddpbench.gates.ab`) runs the
    steps as separate tasks, so that blocks of two sides' rounds can alternate while each side's
    state stays alive in its ranks. The engine never knows what the workload does.
    """

    def __init__(self, ctx, workload, plan: RoundPlan):
        self.ctx, self.workload, self.plan = ctx, workload, plan
        self.on_cuda = ctx.device_type == "cuda"
        self._time_round = _time_round_cuda if self.on_cuda else _time_round_cpu
        self._agree = _agreed_max  # every rank's element-wise max (the stopping rule's input)
        self.pin_cores = ctx.core is not None and workload.pin_to_core
        self.phases: dict[str, float] = {"engine_setup_s": 0.0, "engine_warmup_s": 0.0,
                                         "engine_between_rounds_s": 0.0, "engine_check_s": 0.0}
        self.state = None
        self._set_up = False
        self._peak_reset = False
        self.round_estimate_s = 0.0  # a whole round's time (all its ops), for sizing rounds
        self.ops_per_round = plan.ops_per_round if isinstance(plan.ops_per_round, int) else 1
        self.fixed_cost_s: float | None = None  # what "auto" measured
        self._graph = None
        self.census: dict[str, Any] | None = None  # the census round's record (plan.census)
        self.memory_census: dict[str, Any] | None = None  # the memory census's record (plan.memory_census)
        self._dynamo_at_start = None
        self.variant_times: dict[str, list[float]] = {}
        if plan.cuda_graphs and not self.on_cuda:
            raise ValueError("CUDA graph mode captures GPU work; this case runs on the CPU")
        if plan.cuda_graphs and not getattr(workload, "cuda_graph_safe", False):
            raise ValueError(f"{type(workload).__name__} cannot be captured in a CUDA graph (its rounds "
                             f"do more than GPU work); run it without --dist-cuda-graphs")

    def _round(self) -> float:
        """One timed round of this session's ops; returns the time per op."""
        if self._graph is not None:
            return self._time_round(self.ctx, _replay, self._graph) / self.ops_per_round
        return self._time_round(self.ctx, _repeated(self.workload.run_round, self.ops_per_round),
                                self.state) / self.ops_per_round

    def _choose_ops_per_round(self) -> None:
        """``ops_per_round="auto"``: the count at which the round's fixed cost is at most
        AUTO_OVERHEAD_SHARE of it (every rank takes the same decision: agreed maxima)."""
        import statistics as st

        def round_time(k: int) -> float:
            run = _repeated(self.workload.run_round, k)
            times = [self._time_round(self.ctx, run, self.state) for _ in range(AUTO_PROBE_ROUNDS)]
            return st.median(self._agree(self.ctx, times))

        self.ops_per_round, self.fixed_cost_s, _ = choose_ops_per_round(round_time)

    def _capture(self) -> None:
        """Capture ops_per_round ops into a CUDA graph (warmed up on a side stream first, as CUDA
        graph capture requires)."""
        import torch

        stream = torch.cuda.Stream(self.ctx.device)
        stream.wait_stream(torch.cuda.current_stream(self.ctx.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.workload.run_round(self.state)
        torch.cuda.current_stream(self.ctx.device).wait_stream(stream)
        torch.cuda.synchronize(self.ctx.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _repeated(self.workload.run_round, self.ops_per_round)(self.state)
        torch.cuda.synchronize(self.ctx.device)
        self._graph = graph

    @contextlib.contextmanager
    def _on_own_core(self):
        """Rank r stays on its core while it measures (workloads with processes of their own opt
        out through pin_to_core = False); the previous affinity comes back afterwards."""
        if not self.pin_cores:
            yield
            return
        from ..pool.pinning import set_process_affinity

        previous = sorted(os.sched_getaffinity(0))
        set_process_affinity([self.ctx.core])
        try:
            yield
        finally:
            set_process_affinity(previous)

    def _take_census(self) -> None:
        """One untimed round of ``ops_per_round`` ops, and at least two, under the collective
        census, on every rank (each rank counts what it issues), each op's collectives kept apart:
        a step whose collectives differ from one step to the next (one every other step) is marked
        ``varies_between_steps`` and left unjudged, whatever phase the round began in. The
        workload's ``census_details`` adds what only it knows (DDP's buckets)."""
        from .census import take_census

        phase_start = time.perf_counter()
        record = take_census(lambda: self.workload.run_round(self.state), ops_per_round=self.ops_per_round,
                             ops_counted=max(self.ops_per_round, CENSUS_MIN_OPS),
                             count_kernel_launches=self.on_cuda, dynamo_at_start=self._dynamo_at_start)
        census_details = getattr(self.workload, "census_details", None)  # optional: duck-typed workloads lack it
        details = (census_details(self.state) if census_details is not None else None) or {}
        if details.get("ddp_buckets") is not None:
            record["ddp_buckets"] = [int(b) for b in details["ddp_buckets"]]
        if details.get("incomplete"):  # why part of the step escapes the count: the gates do not judge it
            record["incomplete"] = "; ".join(filter(None, [str(details["incomplete"]), record.get("incomplete")]))
        self.census = record
        self.phases["engine_census_s"] = time.perf_counter() - phase_start

    def _take_memory_census(self) -> None:
        """One untimed step (one ``run_round``, whatever ``ops_per_round``) under the memory census,
        on every rank: what the workload's ``memory_census_targets`` names (its modules,
        optimizers, tensors) counts from the start, every tensor the step makes as it is made."""
        from .memory import discover_targets, take_memory_census

        phase_start = time.perf_counter()
        targets_of = getattr(self.workload, "memory_census_targets", None)  # duck-typed workloads lack it
        targets = list(targets_of(self.state) if targets_of is not None else discover_targets(self.state))
        incomplete = (self.census or {}).get("incomplete")
        try:
            self.memory_census = take_memory_census(lambda: self.workload.run_round(self.state), targets,
                                                    device=getattr(self.ctx, "device", None),
                                                    incomplete=incomplete)
        except Exception as exc:
            raise RuntimeError(f"the memory census of {type(self.workload).__name__}'s step failed on rank "
                               f"{self.ctx.rank}: {type(exc).__name__}: {exc} (--dist-memory-census=off "
                               f"runs the case without it)") from exc
        census_details = getattr(self.workload, "census_details", None)
        if self.census is None and census_details is not None:  # steps on threads the tracker cannot see
            incomplete = (census_details(self.state) or {}).get("incomplete")
            if incomplete:
                self.memory_census["incomplete"] = str(incomplete)
        self.phases["engine_memory_census_s"] = time.perf_counter() - phase_start

    def _build(self, warmup: int) -> list[float]:
        """Set the workload up and run ``warmup`` unrecorded rounds; returns their per-op times."""
        clock = time.perf_counter
        if self.plan.census and self._dynamo_at_start is None:
            from .census import dynamo_snapshot

            self._dynamo_at_start = dynamo_snapshot() or {"frames": 0, "graph_breaks": 0}
        phase_start = clock()
        self.state = self.workload.setup(self.ctx)
        self._set_up = True
        self._graph = None
        self.phases["engine_setup_s"] += clock() - phase_start
        phase_start = clock()
        times = [self._round() for _ in range(warmup)]
        self.phases["engine_warmup_s"] += clock() - phase_start
        return times

    def start(self) -> None:
        """Set-up, warm-up and (with "auto") the ops per round; leaves the fastest warm-up round
        (max over ranks, all its ops) as the estimate."""
        with self._on_own_core():
            # Choosing the round count or the ops per round needs at least one timed warm-up round.
            auto = self.plan.ops_per_round == "auto"
            times = self._build(max(self.plan.warmup, 1 if self.plan.rounds == 0 or auto else 0))
            phase_start = time.perf_counter()
            if auto:
                self._choose_ops_per_round()
                times = [self._round() for _ in range(max(1, min(self.plan.warmup, 3)))]
            self.phases["engine_warmup_s"] += time.perf_counter() - phase_start
            if self.plan.census:  # before any capture: a graph's replay dispatches no collective
                self._take_census()
            if self.plan.memory_census:  # likewise: a graph's replay allocates nothing the tracker sees
                self._take_memory_census()
            phase_start = time.perf_counter()
            if self.plan.cuda_graphs:
                self._capture()
                times = [self._round() for _ in range(max(1, min(self.plan.warmup, 3)))]
            if times:
                # The fastest warm-up round estimates a round best: one stall must not cut the count.
                self.round_estimate_s = self._agree(self.ctx, [min(times)])[0] * self.ops_per_round
            self.phases["engine_warmup_s"] += time.perf_counter() - phase_start

    def refresh(self, warmup: int = 1) -> None:
        """Tear the workload's state down and build it anew (untimed), then ``warmup`` unrecorded
        rounds: A/B mode does this before every block, so that what one set-up happened to get
        (where its buffers landed, which side set up first) varies from block to block instead of
        biasing a whole side."""
        with self._on_own_core():
            phase_start = time.perf_counter()
            self.close()
            self.phases["engine_setup_s"] += time.perf_counter() - phase_start
            self._build(warmup)
            if self.plan.cuda_graphs:
                self._capture()

    def record(self, rounds: int, stop_when_precise: bool = False) -> tuple[list[float], list]:
        """Up to ``rounds`` recorded rounds; with ``stop_when_precise``, fewer once the median of
        the cross-rank maxima is known to the plan's precision (all ranks take the same decision)."""
        import torch

        cpu = ThreadCpuReader()
        try:
            with self._on_own_core():
                if self.on_cuda and not self._peak_reset:  # peak memory over all recorded rounds
                    torch.cuda.reset_peak_memory_stats(self.ctx.device)
                    self._peak_reset = True
                times: list[float] = []
                cpus: list = []
                look = max(PRECISION_FIRST_LOOK, self.plan.min_rounds) if stop_when_precise else rounds
                phase_start = time.perf_counter()
                while len(times) < rounds:
                    for _ in range(min(look, rounds) - len(times)):
                        times.append(self._round())
                        cpus.append(cpu.read())
                    if len(times) >= rounds:
                        break
                    if median_is_precise(self._agree(self.ctx, times), self.plan.precision):
                        break
                    look = math.ceil(len(times) * PRECISION_GROWTH)
                # The untimed part of the recorded phase: barriers, CUDA syncs, the stopping rule.
                timed = sum(times) * self.ops_per_round
                self.phases["engine_between_rounds_s"] += max(0.0, time.perf_counter() - phase_start - timed)
                return times, (cpus if None not in cpus else None)
        finally:
            cpu.close()

    def time_variants(self, rounds: int) -> dict[str, list[float]]:
        """``rounds`` rounds of each of the workload's variants (``Workload.variants``) and as many
        more of the workload itself (under :data:`STEP`), interleaved: round group i runs each of
        them once, the order rotated by one from group to group, so that drift and "who runs
        first" hit all alike. Each variant is set up (and warmed up one round) first and torn down
        after; the times are per op, as the recorded rounds'. None of it joins the recorded rounds."""
        variants = dict(self.workload.variants() or {}) if rounds > 0 else {}
        if not variants:
            return {}
        if STEP in variants:
            raise ValueError(f"{type(self.workload).__name__}.variants() names a variant {STEP!r}: that name "
                             f"is the workload's own rounds; rename the variant")
        clock = time.perf_counter
        states: dict[str, Any] = {}
        times: dict[str, list[float]] = {STEP: [], **{name: [] for name in variants}}
        with self._on_own_core():
            phase_start = clock()
            timed = 0.0
            try:
                for name, variant in variants.items():
                    states[name] = variant.setup(self.ctx)
                runs = {STEP: (self.workload.run_round, self.state),
                        **{name: (variant.run_round, states[name]) for name, variant in variants.items()}}
                names = list(runs)
                for name in names[1:]:  # one warm-up round each (the workload itself is warm)
                    self._time_round(self.ctx, _repeated(runs[name][0], self.ops_per_round), runs[name][1])
                for i in range(rounds):
                    for name in names[i % len(names):] + names[:i % len(names)]:
                        run, state = runs[name]
                        elapsed = self._time_round(self.ctx, _repeated(run, self.ops_per_round), state)
                        times[name].append(elapsed / self.ops_per_round)
                        timed += elapsed
            finally:
                for name, state in states.items():
                    variants[name].teardown(state)
            # The variants' set-up, warm-up and teardown (their timed rounds are not the engine's).
            self.phases["engine_variants_s"] = clock() - phase_start - timed
        self.variant_times = times
        return times

    def finish(self, check: bool = True, variant_rounds: int = 0) -> dict[str, Any]:
        """Metrics, the variant rounds (``variant_rounds``, :meth:`time_variants`: after the
        metrics, so that a variant's memory is not the case's), the workload's check (untimed),
        teardown; returns this rank's metrics."""
        import torch

        metrics: dict[str, Any] = {}
        measured: tuple[int, int] | None = None  # CUDA: the allocator's peaks over the recorded rounds
        try:
            with self._on_own_core():  # the rank's own metrics and check see the placement the rounds had
                if self.on_cuda:
                    measured = (int(torch.cuda.max_memory_allocated(self.ctx.device)),
                                int(torch.cuda.max_memory_reserved(self.ctx.device)))
                    metrics["peak_memory_bytes"] = measured[0]
                phase_start = time.perf_counter()
                metrics.update(self.workload.rank_metrics(self.state) or {})
                variants_start = time.perf_counter()
                self.time_variants(variant_rounds)
                phase_start += time.perf_counter() - variants_start  # not the check's time
                if check:  # a check may report what it measured while checking (e.g. its peak memory)
                    metrics.update(check_outcome(self.workload, self.workload.check(self.state), self.ctx.rank))
                self.phases["engine_check_s"] = time.perf_counter() - phase_start
        finally:
            self.close()
        # Where a case's untimed seconds go (max over ranks in extra_info); see docs/results.md, "Harness overhead per case".
        metrics.update({key: round(value, 6) for key, value in self.phases.items()})
        metrics["pinned_cores"] = self.pin_cores  # each rank on a core of its own while measuring
        metrics["ops_per_round"] = self.ops_per_round
        if self.census is not None:
            metrics["census"] = self.census
        if self.memory_census is not None:
            metrics["memory"] = self.memory_census
            if measured is not None and self._peak_reset:  # the allocator's peaks over the recorded rounds beside it
                from .memory import measured_cuda

                metrics["memory"] = measured_cuda(self.memory_census, *measured)
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


def _replay(graph) -> None:
    graph.replay()


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
    """Numbers: the maximum over ranks (peak memory, open fds...); the census: rank 0's, marked
    ``ranks_disagree`` where ranks counted other collectives; the memory census: rank 0's with every
    rank's peak (:func:`ddpbench.engine.memory.combine_memory`); anything else: rank 0's."""
    from .census import combine_census

    combined: dict[str, Any] = {}
    if any("census" in metrics for metrics in per_rank_metrics):
        combined["census"] = combine_census([metrics.get("census") for metrics in per_rank_metrics])
    if any("memory" in metrics for metrics in per_rank_metrics):
        from .memory import combine_memory

        combined["memory"] = combine_memory([metrics.get("memory") for metrics in per_rank_metrics])
    for metrics in per_rank_metrics:
        for key, value in metrics.items():
            if key in ("census", "memory"):
                continue
            if key not in combined:
                combined[key] = value
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                combined[key] = max(combined[key], value)
    return combined
