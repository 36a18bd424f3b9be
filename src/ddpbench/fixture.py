"""The ``dist_benchmark`` fixture's value: :class:`DistBenchmark` runs a workload on every rank of
the case's pool (or, in A/B mode, on both sides' pools) and hands the rounds, the slowest rank's
time per round, to pytest-benchmark as the case's own rounds; :class:`CaseResult` is what a test
gets back."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

import pytest

from .benchmark_internals import recorded_rounds, set_round_timer
from .devices import cpu_count
from .engine.modes import rank_aggregates, rounds_info
from .engine.timing import CaseRounds, RoundPlan, combine_rank_metrics, measure_workload
from .engine.unchanged_parameters import unchanged_parameters
from .pool import PoolSpec, TaskFailed
from .workloads import case_extra_info


@dataclass
class CaseResult:
    """What ``dist_benchmark(...)`` returns to the test."""

    round_times: list[float]  # max over ranks, one per recorded round
    rank_metrics: list[dict[str, Any]]  # per rank, in rank order
    extra_info: dict[str, Any]
    # each rank's own recorded round times, in rank order (round_times is their max per round)
    rank_round_times: list[list[float]] = field(default_factory=list)
    # the variant rounds (Workload.variants), per name ("step": the workload's own interleaved
    # rounds), max over ranks per round; empty when none ran
    variant_times: dict[str, list[float]] = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        return statistics.median(self.round_times)


class _ReplayClock:
    """A timer for pytest-benchmark's fixture that replays round times measured in the ranks.

    pytest-benchmark times a round as ``end = timer(); ... ; start = timer()`` around the target;
    this clock answers 0.0 then the round's duration, so each recorded duration is exactly the
    rank-measured one.
    """

    __module__ = "ddpbench"
    __name__ = "rank_max_round_time"

    def __init__(self, durations: list[float]):
        self._ticks = iter([tick for d in durations for tick in (0.0, d)])

    def __call__(self) -> float:
        return next(self._ticks)

    def exhausted(self) -> bool:
        return next(self._ticks, None) is None


def _noop() -> None:
    return None


def replay_into_pytest_benchmark(benchmark, round_times: list[float]) -> None:
    """Record ``round_times`` as the rounds of a pytest-benchmark fixture.

    pytest-benchmark has no public API for outside timings, so this sets the fixture's timer
    (``_timer``, read by ``pedantic``'s runner) and verifies the result, failing loudly if a
    pytest-benchmark release changes how pedantic uses it.
    """
    if benchmark.disabled:  # --benchmark-disable: run the target once, record nothing
        benchmark.pedantic(_noop, rounds=1, iterations=1)
        return
    clock = _ReplayClock(round_times)
    set_round_timer(benchmark, clock)
    benchmark.pedantic(_noop, rounds=len(round_times), iterations=1, warmup_rounds=0)
    recorded = recorded_rounds(benchmark)
    if recorded != list(round_times) or not clock.exhausted():
        import pytest_benchmark

        raise RuntimeError(
            f"ddpbench could not hand its round times to pytest-benchmark "
            f"{pytest_benchmark.__version__}: the fixture's internals (_timer / pedantic) changed. "
            f"Install the pytest-benchmark version pinned in ddpbench's pyproject.toml."
        )


class DistBenchmark:
    """The ``dist_benchmark`` fixture's value: call it with a workload once per case."""

    def __init__(self, benchmark, pool, spec: PoolSpec, plan: RoundPlan, timeout_s: float,
                 ab=None, pools=None, case_id: str = "", prepare=None, exposed_comm: str | int = "auto"):
        self.benchmark = benchmark
        self.pool = pool
        self.spec = spec
        self.plan = plan
        self.timeout_s = timeout_s
        self.ab = ab  # A/B mode (ddpbench.gates.ab.session.ABSession): both sides, interleaved
        self._pools = pools
        self.case_id = case_id
        self.exposed_comm = exposed_comm  # --dist-exposed-comm: "auto" (the case's call decides) or rounds
        # pytest_ddpbench_prepare_workload, for plugins that wrap a case's workload
        self._prepare = prepare or (lambda workload, spec: None)
        self.extra_info = benchmark.extra_info  # tests may add their own keys

    def _measure(self, workload, plan: RoundPlan, timeout_s: float) -> CaseRounds:
        """The case's own rounds (the candidate's in A/B mode)."""
        if self.ab is None or self.benchmark.disabled:
            return CaseRounds.of(self.pool.run(measure_workload, workload, plan, timeout_s=timeout_s))
        # The candidate's pool 0 is the case's own (self.pool): the registry hands back the same one.
        return self.ab.measure(lambda side, launch, j: self._pools.get(self.spec, launch, j, owner=side),
                               self.pool, workload, plan, timeout_s, self.case_id, self.benchmark.extra_info)

    def _skip_reason(self, workload, plan: RoundPlan) -> str | None:
        reason = workload.skip_reason(self.spec)
        if reason is None and plan.cuda_graphs:
            if self.spec.device != "cuda":
                reason = ("--dist-cuda-graphs captures GPU work, and this case runs on the CPU (gloo's "
                          "ops are synchronous there)")
            elif not getattr(workload, "cuda_graph_safe", False):
                reason = (f"--dist-cuda-graphs: {type(workload).__name__}'s rounds do more than GPU work, "
                          f"which a CUDA graph cannot capture")
        return reason

    def _plan(self, rounds: int | None, warmup: int | None, variant_rounds: int | None = None) -> RoundPlan:
        plan = self.plan
        if variant_rounds is not None and (isinstance(variant_rounds, bool) or not isinstance(variant_rounds, int)
                                           or variant_rounds < 0):
            raise ValueError(f"dist_benchmark(variant_rounds={variant_rounds!r}): give a whole number of rounds, "
                             f"0 or more")
        chosen = (variant_rounds or 0) if self.exposed_comm == "auto" else self.exposed_comm
        plan = dataclasses.replace(plan, variant_rounds=chosen)
        if plan.ops_per_round is None:  # the default: auto for CUDA cases, 1 on the CPU
            plan = dataclasses.replace(plan, ops_per_round="auto" if self.spec.device == "cuda" else 1)
        if self.benchmark.disabled:
            return RoundPlan(warmup=0, rounds=1, census=plan.census, memory_census=plan.memory_census,
                             numerics_steps=plan.numerics_steps)
        if rounds is not None or warmup is not None:
            plan = dataclasses.replace(plan, warmup=plan.warmup if warmup is None else warmup,
                                       rounds=plan.rounds if rounds is None else rounds)
        if self.ab is not None and plan.warmup == 0 and plan.rounds:
            raise ValueError("dist_benchmark(..., warmup=0) with fixed rounds in A/B mode: A/B mode sizes "
                             "its blocks from a timed warm-up round; pass warmup=1 or more")
        return plan

    def __call__(self, workload, *, rounds: int | None = None, warmup: int | None = None,
                 timeout_s: float | None = None, variant_rounds: int | None = None) -> CaseResult:
        """Measure ``workload``: ``rounds`` / ``warmup`` override --dist-rounds / --dist-warmup,
        ``timeout_s`` --dist-timeout for this case's tasks; ``variant_rounds``: rounds of each of
        the workload's variants after its own (``Workload.variants``), unless --dist-exposed-comm
        names a count or off. Their times go to extra_info ``variant_round_times``."""
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"dist_benchmark(timeout_s={timeout_s!r}): give a number of seconds above 0")
        workload = self._prepare(workload, self.spec) or workload
        plan = self._plan(rounds, warmup, variant_rounds)
        reason = self._skip_reason(workload, plan)
        if reason:
            pytest.skip(reason)
        if workload.group is not None and self.benchmark.group is None:
            self.benchmark.group = workload.group
        try:
            rounds_ = self._measure(workload, plan, self.timeout_s if timeout_s is None else timeout_s)
        except TaskFailed as exc:  # a rank refused how the workload uses it: a usage error, exit 2
            if exc.refusal() is None:
                raise
            pytest.exit(exc.refusal(), returncode=pytest.ExitCode.USAGE_ERROR)
        median_s = statistics.median(rounds_.round_times)
        info = self.benchmark.extra_info
        info.update({
            "backend": self.spec.backend,
            "world_size": self.spec.world_size,
            "device": self.spec.device,
            "nodes": self.pool.nodes,
        })
        info.update(getattr(self.pool, "extra_info", None) or {})  # torchrun pools: socket_ifname...
        if self.spec.world_size > cpu_count():
            info["ranks_outnumber_cores"] = True
        rank_metrics = combine_rank_metrics(rounds_.rank_metrics)
        info.update(rank_metrics)
        if getattr(workload, "updates_parameters", True):  # a training step that trains nothing is said
            unchanged = unchanged_parameters(rank_metrics.get("numerics"))
            if unchanged:
                info["parameters_unchanged"] = unchanged
        info.update(rounds_info(rounds_.round_times, rounds_.rank_cpus, self.pool.nodes))
        info.update(rank_aggregates(rounds_.rank_round_times))
        info.update(case_extra_info(workload, self.spec.world_size, median_s, rank_metrics))
        variant_times = dict(rounds_.variant_times or {})
        if variant_times:
            info["variant_round_times"] = variant_times
        replay_into_pytest_benchmark(self.benchmark, rounds_.round_times)
        return CaseResult(rounds_.round_times, rounds_.rank_metrics, dict(info), rounds_.rank_round_times,
                          variant_times)
