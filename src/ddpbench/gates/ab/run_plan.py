"""What an A/B run's options ask for, read and checked once before any rank starts: the settings each
case runs with, the allowances and acceptances its exit is decided under, the heap, the block order's
seed and where profiles go. A value: reading it starts nothing and measures nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .budget import RunBudget
from .heap import DEFAULT_HEAP
from .pairs_loop import ABSettings
from .profiling import DEFAULT_PROFILE
from .schedule import new_seed

OPTION_PREFIX = "--dist-"  # the gate's own options in pytest: --dist- and the words ddpbench compare takes
DEFAULT_MAX_TIME_S = 60.0  # a case's cap for adding pairs without --dist-ab-max-time or a run budget


@dataclass(frozen=True)
class ABPlan:
    """The run's A/B settings, each field from its option."""

    settings: ABSettings
    heap: str = DEFAULT_HEAP  # --dist-ab-heap (ddpbench.gates.ab.heap)
    seed: int = 0  # --dist-ab-seed, or drawn for this run
    allow_missing: bool = False  # --dist-allow-missing
    allow_baseline_failure: bool = False  # --dist-allow-baseline-failure
    fail_on_inconclusive: bool = False  # --dist-fail-on-inconclusive
    accept_structure_change: bool = False  # --dist-accept-structure-change
    accept_memory_change: bool = False  # --dist-accept-memory-change
    memory_tolerance: float | None = None  # --dist-memory-tolerance (None: measured figures not judged)
    accept_numerics_change: bool = False  # --dist-accept-numerics-change
    numerics_tolerance: float | None = None  # --dist-numerics-tolerance (None: the default, none)
    profile: str = DEFAULT_PROFILE  # --dist-ab-profile (ddpbench.gates.ab.profiling)
    profile_root: Path = Path(".benchmarks/ab-profiles")  # this run's folder of traces
    run_budget_s: float | None = None  # --dist-ab-run-budget: each case's cap is its share of what is left
    max_time_given_s: float | None = None  # --dist-ab-max-time as given (with a budget: each case's cap too)

    def new_budget(self) -> RunBudget | None:
        """The run budget's tracker (its clock starts with the first case), or None without one."""
        return RunBudget(self.run_budget_s, self.max_time_given_s) if self.run_budget_s else None


def plan_from_options(config) -> ABPlan:
    """The plan the options ask for; a usage error (exit 2) when a case's first stage alone would
    run past its time cap."""
    max_time = config.getoption("dist_ab_max_time", None)
    run_budget = config.getoption("dist_ab_run_budget", None)
    settings = ABSettings(threshold=config.getoption("dist_ab_threshold"),
                          max_time_s=max_time or (run_budget or DEFAULT_MAX_TIME_S),
                          block_time_s=config.getoption("dist_ab_block_time"),
                          pools_per_side=config.getoption("dist_ab_pools_per_side"),
                          stratify_placement=config.getoption("dist_ab_stratify_cpu_sharing", False),
                          stop_on_structural_regression=not config.getoption("dist_accept_structure_change",
                                                                             False),
                          stop_on_memory_regression=not config.getoption("dist_accept_memory_change", False),
                          stop_on_numerics_regression=not config.getoption("dist_accept_numerics_change",
                                                                           False),
                          numerics_tolerance=config.getoption("dist_numerics_tolerance", None))
    first_stage_blocks = 2 * settings.stage_sizes(settings.pools_per_side)[0]
    if first_stage_blocks * settings.block_time_s > settings.max_time_s:
        option = "--dist-ab-max-time" if max_time or not run_budget else "--dist-ab-run-budget"
        raise pytest.UsageError(
            f"--dist-ab-block-time {settings.block_time_s:g} s: a case's first stage alone (always "
            f"run, {first_stage_blocks} blocks) takes about {first_stage_blocks * settings.block_time_s:g} "
            f"s, past {option} {settings.max_time_s:g} s. Use a shorter block time or a "
            f"longer cap (defaults: 0.1 s and {DEFAULT_MAX_TIME_S:g} s per case)")
    seed = config.getoption("dist_ab_seed")
    seed = new_seed() if seed is None else seed
    return ABPlan(settings, config.getoption("dist_ab_heap", DEFAULT_HEAP), seed=seed,
                  allow_missing=config.getoption("dist_allow_missing"),
                  allow_baseline_failure=config.getoption("dist_allow_baseline_failure", False),
                  fail_on_inconclusive=config.getoption("dist_fail_on_inconclusive"),
                  accept_structure_change=config.getoption("dist_accept_structure_change", False),
                  accept_memory_change=config.getoption("dist_accept_memory_change", False),
                  memory_tolerance=config.getoption("dist_memory_tolerance", None),
                  accept_numerics_change=config.getoption("dist_accept_numerics_change", False),
                  numerics_tolerance=config.getoption("dist_numerics_tolerance", None),
                  profile=config.getoption("dist_ab_profile", DEFAULT_PROFILE),
                  profile_root=_profile_root(config, seed),
                  run_budget_s=run_budget or None, max_time_given_s=max_time)


def refuse_what_ab_cannot_measure(config) -> None:
    """Option combinations A/B mode cannot measure, named with the fix."""
    if config.getoption("dist_controller", None):
        raise pytest.UsageError("A/B mode (--dist-baseline-* / --dist-candidate-env) runs local pools; "
                                "it cannot be combined with --dist-controller")
    if config.getoption("numprocesses", None):
        raise pytest.UsageError("A/B mode interleaves both sides on this machine's cores: run without -n (xdist)")
    if config.getoption("dist_warmup") == 0 and config.getoption("dist_rounds"):
        raise pytest.UsageError(
            "--dist-warmup=0 with --dist-rounds in A/B mode: A/B mode sizes its blocks of rounds "
            "(--dist-ab-block-time) from a timed warm-up round, and fixed rounds skip the one it would "
            "otherwise time. Use --dist-warmup=1 or more (--dist-rounds does not apply to A/B blocks)")


def _profile_root(config, seed: int) -> Path:
    """This run's folder of profiler traces: ``ab-profiles/<time>-seed<seed>`` in pytest-benchmark's
    storage folder (``.benchmarks`` unless --benchmark-storage names another folder)."""
    storage = str(config.getoption("benchmark_storage", None) or "file://./.benchmarks")
    folder = Path(storage.removeprefix("file://")) if storage.startswith("file://") or "://" not in storage \
        else Path(".benchmarks")
    return (Path.cwd() / folder).resolve() / "ab-profiles" / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{seed}"
