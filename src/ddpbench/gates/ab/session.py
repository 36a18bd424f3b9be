"""A/B mode in a pytest run: the sides and settings the options ask for (checked before any rank
starts, and after collection where each side gets the code under test), each case measured on
both sides, and the run's verdict table and exit status. The plugin only wires pytest's hooks to
these."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from ...engine.timing import CaseRounds, measure_workload
from ...options import AB_OPTIONS  # any of these turns A/B mode on
from ..exit_decision import decide_exit
from ..verdict_words import Verdict
from ..verdicts import LOST_CASES_KEY, VerdictError, ab_report, ab_verdicts, format_text, record_decision
from .budget import RunBudget
from .heap import DEFAULT_HEAP, heap_env
from .pairs_loop import ABSettings, SideFailed, run_case
from .profiling import (DEFAULT_PROFILE, MIN_PROFILED_ROUNDS, CaseProfile, case_folder, profile_case, profiled_plan,
                        should_profile)
from .schedule import new_seed
from .side_environments import (ImportIsolationError, SameCodeError, Side, SideError, check_import_isolation,
                                check_modules_differ, engine_lines, local_facts, make_side, module_lines,
                                modules_under_test, parse_env_assignments, probe, resolve_modules, with_import_guard)

OPTION_PREFIX = "--dist-ab-"  # how the gate's own options are spelled in pytest
DEFAULT_MAX_TIME_S = 60.0  # a case's cap for adding pairs without --dist-ab-max-time or a run budget


@dataclass
class ABSession:
    """A/B mode's sides and settings for one pytest run; verdicts collect in ``results`` as
    (case id, extra_info["ab"], candidate median or None, the case's extra_info or None): the
    structural verdict is read from the two censuses there when the report is made, so it needs
    no pairs and stands whatever the timing says."""

    baseline: Side
    candidate: Side
    settings: ABSettings
    heap: str = DEFAULT_HEAP  # --dist-ab-heap (ddpbench.gates.ab.heap)
    seed: int = 0  # --dist-ab-seed, or drawn for this run
    allow_missing: bool = False  # --dist-ab-allow-missing
    allow_baseline_failure: bool = False  # --dist-ab-allow-baseline-failure
    fail_on_inconclusive: bool = False  # --dist-ab-fail-on-inconclusive
    accept_structure_change: bool = False  # --dist-ab-accept-structure-change
    accept_memory_change: bool = False  # --dist-ab-accept-memory-change
    memory_tolerance: float | None = None  # --dist-ab-memory-tolerance (None: measured figures not judged)
    accept_numerics_change: bool = False  # --dist-ab-accept-numerics-change
    numerics_tolerance: float | None = None  # --dist-ab-numerics-tolerance (None: the default, none)
    profile: str = DEFAULT_PROFILE  # --dist-ab-profile (ddpbench.gates.ab.profiling)
    profile_root: Path = Path(".benchmarks/ab-profiles")  # this run's folder of traces
    budget: RunBudget | None = None  # --dist-ab-run-budget: each case's cap is its share of what is left
    results: list = field(default_factory=list)
    profiles: list[CaseProfile] = field(default_factory=list)

    # -- before any rank starts -----------------------------------------------------------------

    @classmethod
    def from_options(cls, config) -> "ABSession | None":
        """The run's A/B session, or None when no A/B option is given. Each side's interpreter is
        run once now: it must import torch and a ddpbench of this run's rank protocol."""
        if not any(config.getoption(name, None) for name in AB_OPTIONS):
            return None
        _refuse_what_ab_cannot_measure(config)
        heap = config.getoption("dist_ab_heap", DEFAULT_HEAP)
        common = heap_env(heap)
        try:
            baseline = make_side("baseline", config.getoption("dist_baseline_python"),
                                 config.getoption("dist_baseline_path"),
                                 parse_env_assignments(config.getoption("dist_baseline_env"), "--dist-baseline-env"),
                                 common)
            candidate = make_side("candidate", None, None,
                                  parse_env_assignments(config.getoption("dist_candidate_env"),
                                                        "--dist-candidate-env"), common)
            baseline = with_import_guard(baseline, _import_guard_folder())
            ours = local_facts()
            baseline = probe(baseline, ours["rank_protocol"])
            candidate = (probe(candidate, ours["rank_protocol"]) if candidate.env
                         else dataclasses.replace(candidate, facts=ours))
        except ImportIsolationError as exc:
            refuse_mixed_environments(exc)
        except SideError as exc:
            raise pytest.UsageError(f"ddpbench A/B: {exc}") from None
        max_time = config.getoption("dist_ab_max_time", None)
        run_budget = config.getoption("dist_ab_run_budget", None)
        settings = ABSettings(threshold=config.getoption("dist_ab_threshold"),
                              max_time_s=max_time or (run_budget or DEFAULT_MAX_TIME_S),
                              block_time_s=config.getoption("dist_ab_block_time"),
                              pools_per_side=config.getoption("dist_ab_pools_per_side"),
                              stratify_placement=config.getoption("dist_ab_stratify_placement", False),
                              stop_on_structural_regression=not config.getoption("dist_ab_accept_structure_change",
                                                                                 False),
                              stop_on_memory_regression=not config.getoption("dist_ab_accept_memory_change", False),
                              stop_on_numerics_regression=not config.getoption("dist_ab_accept_numerics_change",
                                                                               False),
                              numerics_tolerance=config.getoption("dist_ab_numerics_tolerance", None))
        first_stage_blocks = 2 * settings.stage_sizes(settings.pools_per_side)[0]
        if first_stage_blocks * settings.block_time_s > settings.max_time_s:
            option = "--dist-ab-max-time" if max_time or not run_budget else "--dist-ab-run-budget"
            raise pytest.UsageError(
                f"--dist-ab-block-time {settings.block_time_s:g} s: a case's first stage alone (always "
                f"run, {first_stage_blocks} blocks) takes about {first_stage_blocks * settings.block_time_s:g} "
                f"s, past {option} {settings.max_time_s:g} s. Use a shorter block time or a "
                f"longer cap (defaults: 0.1 s and {DEFAULT_MAX_TIME_S:g} s per case)")
        budget = RunBudget(run_budget, max_time) if run_budget else None
        seed = config.getoption("dist_ab_seed")
        seed = new_seed() if seed is None else seed
        return cls(baseline, candidate, settings, heap, seed=seed,
                   allow_missing=config.getoption("dist_ab_allow_missing"),
                   allow_baseline_failure=config.getoption("dist_ab_allow_baseline_failure", False),
                   fail_on_inconclusive=config.getoption("dist_ab_fail_on_inconclusive"),
                   accept_structure_change=config.getoption("dist_ab_accept_structure_change", False),
                   accept_memory_change=config.getoption("dist_ab_accept_memory_change", False),
                   memory_tolerance=config.getoption("dist_ab_memory_tolerance", None),
                   accept_numerics_change=config.getoption("dist_ab_accept_numerics_change", False),
                   numerics_tolerance=config.getoption("dist_ab_numerics_tolerance", None),
                   profile=config.getoption("dist_ab_profile", DEFAULT_PROFILE),
                   profile_root=_profile_root(config, seed), budget=budget)

    def sides(self) -> dict:
        return {"baseline": self.baseline.describe(), "candidate": self.candidate.describe()}

    def header_lines(self, world_sizes: list[int], cores: int, pin_cores: bool) -> list[str]:
        s = self.settings
        common = ", ".join(f"{k}={v}" for k, v in self.baseline.common_env) or "glibc's defaults"
        if self.budget is None:
            more = f"more up to {s.max_time_s:g} s per case"
        else:
            more = (f"more within a run budget of {self.budget.budget_s:g} s (each case: its share of what is "
                    f"left" + (f", at most {self.budget.max_time_s:g} s)" if self.budget.max_time_s else ")"))
        lines = [f"threshold {s.threshold * 100:g}%, blocks of ~{s.block_time_s:g} s, {s.first_pairs} pairs "
                 f"first, {more}, {s.pools_per_side} pool(s) per side, ranks "
                 f"{'pinned one core each' if pin_cores else 'placed by the OS'} (--dist-pin-cores)",
                 f"heap {self.heap}, both sides' ranks: {common} (--dist-ab-heap)",
                 f"block order seed {self.seed} (--dist-ab-seed {self.seed} repeats it)",
                 f"baseline  = {self.baseline.short()}",
                 f"candidate = {self.candidate.short()}",
                 *engine_lines(self.baseline, self.candidate)]
        alive = 2 * s.pools_per_side * max(world_sizes)
        if alive > cores:
            lines.append(f"both sides' pools are alive at once ({alive} rank processes on {cores} cores); "
                         f"only the pool measuring a block is busy")
        return [f"ddpbench A/B: {line}" for line in lines]

    # -- after collection -------------------------------------------------------------------------

    def resolve_modules(self, session) -> list[str]:
        """Where each side's ranks import the modules under test from (lines for the terminal);
        a usage error when a baseline that names other code would import the candidate's."""
        test_modules = {item.module for item in session.items if getattr(item, "module", None) is not None}
        project = {str(session.config.rootpath)} | {os.path.dirname(m.__file__) for m in test_modules
                                                     if getattr(m, "__file__", None)}
        names = set(modules_under_test(test_modules, project))
        if self.baseline.launch.foreign_interpreter:
            # Another environment may differ from the candidate's by torch alone (does upgrading
            # torch slow our step?): torch counts then, and the header shows both sides' torch.
            names.add("torch")
        names = sorted(names)
        try:
            self.baseline = resolve_modules(self.baseline, names)
            self.candidate = resolve_modules(self.candidate, names)
            check_modules_differ(self.baseline, self.candidate)
        except (ImportIsolationError, SameCodeError) as exc:
            refuse_mixed_environments(exc)
        except SideError as exc:
            raise pytest.UsageError(f"ddpbench A/B: {exc}") from None
        lines = module_lines(self.baseline, self.candidate)
        if not lines:
            return []
        return (["ddpbench A/B: where each side's ranks import the code under test from:"]
                + [f"ddpbench A/B: {line}" for line in lines])

    def plan_cases(self, session) -> None:
        """The run's A/B cases (the collected tests that use dist_benchmark), for the run budget's
        shares; a case skipped later counts until then, so earlier shares are cautious."""
        if self.budget is not None:
            self.budget.planned = [item.nodeid for item in session.items
                                   if "dist_benchmark" in getattr(item, "fixturenames", ())]

    def case_settings(self, case_id: str) -> ABSettings:
        """The settings a case runs with: the run's, its time cap its share of the run budget and
        what it may borrow past it if nearly decided then (gates/ab/budget.py)."""
        if self.budget is None:
            return self.settings
        cap = self.budget.cap_for(case_id)
        return dataclasses.replace(self.settings, max_time_s=cap, borrow_time_s=self.budget.borrow_for(case_id))

    # -- each case --------------------------------------------------------------------------------

    def measure(self, pool_for: Callable[[str, Any, int], Any], own_pool, workload, plan, timeout_s: float,
                case_id: str, extra_info: dict) -> CaseRounds:
        """The case on both sides, interleaved; returns the candidate's rounds (the case's own) and
        puts the verdict's figures in ``extra_info["ab"]``. ``pool_for(side, launch, index)``
        gives a side's pools: each side owns its own, even when both sides launch alike (A/A)."""
        pools = {name: [pool_for(name, side.launch, j) for j in range(self.settings.pools_per_side)]
                 for name, side in (("baseline", self.baseline), ("candidate", self.candidate))}
        try:
            outcome = run_case(pools, workload, plan, self.case_settings(case_id), timeout_s, case_id, self.seed)
        except SideFailed as failure:
            self.check_import_isolation()  # a failure of ranks that ran the wrong code says nothing
            if failure.side == "candidate":
                self._lost(case_id, failure)
            return self._alone(own_pool, workload, plan, timeout_s, case_id, extra_info, failure)
        finally:
            if self.budget is not None:
                self.budget.finish(case_id)
        self.check_import_isolation()  # before the verdict is kept: none from a baseline that ran the wrong code
        summary = outcome.summary(self.sides())
        summary["heap"] = self.heap
        if self.budget is not None:
            summary["run_budget_s"] = self.budget.budget_s
        summary["pool_pids"] = {name: [p.pids for p in side_pools] for name, side_pools in pools.items()}
        extra_info["ab"] = summary
        self.results.append((case_id, summary, statistics.median(outcome.candidate.round_times), extra_info))
        if should_profile(self.profile, summary["verdict"]):  # the verdict and rounds are final here
            profile = profile_case({name: side_pools[0] for name, side_pools in pools.items()}, workload,
                                   profiled_plan(plan, outcome.candidate_metrics),
                                   max(MIN_PROFILED_ROUNDS, outcome.rounds_per_block),
                                   case_folder(self.profile_root, case_id), case_id, summary["verdict"], timeout_s)
            summary["profile"] = profile.to_dict()
            self.profiles.append(profile)
        candidate = outcome.candidate
        return CaseRounds(candidate.round_times, outcome.candidate_metrics, candidate.rank_cpus,
                          candidate.rank_round_times)

    def check_import_isolation(self) -> None:
        """Ends the run with exit 2 when the baseline's ranks imported anything from inside the
        candidate's environment (their import guard's log; see ddpbench.pool.rank_launch)."""
        try:
            check_import_isolation(self.baseline)
        except ImportIsolationError as exc:
            refuse_mixed_environments(exc)

    def _lost(self, case_id: str, failure: SideFailed) -> None:
        """The candidate lost a case the baseline ran (crashed, hung): a verdict of its own that
        fails the run, or skips the case with --dist-ab-allow-missing."""
        summary = {"verdict": Verdict.MISSING, "reason": f"candidate pool {failure.pool} failed",
                   "error": str(failure), "seed": self.seed, "sides": self.sides()}
        self.results.append((case_id, summary, None, None))
        message = f"ddpbench A/B: the candidate lost this case (the baseline ran it): {failure}"
        if self.allow_missing:
            pytest.skip(f"{message.splitlines()[0]} (allowed by --dist-ab-allow-missing)")
        pytest.fail(message, pytrace=False)

    def _alone(self, own_pool, workload, plan, timeout_s, case_id, extra_info, failure) -> CaseRounds:
        """The baseline side failed this case: nothing to compare with, so the candidate is
        measured alone. The verdict is ``new`` when the baseline lacks the case's code (its ranks
        cannot import what the case names), else ``baseline-failed``, which fails the run unless
        --dist-ab-allow-baseline-failure: a baseline that crashes, hangs or computes a wrong result
        must not let every change pass as new."""
        lacks = baseline_lacks_case(failure.error)
        summary = {"verdict": Verdict.NEW if lacks else Verdict.BASELINE_FAILED,
                   "reason": (f"baseline pool {failure.pool} lacks its code" if lacks
                              else f"baseline pool {failure.pool} failed"),
                   "error": str(failure), "seed": self.seed, "sides": self.sides()}
        extra_info["ab"] = summary
        rounds = CaseRounds.of(own_pool.run(measure_workload, workload, plan, timeout_s=timeout_s))
        self.results.append((case_id, summary, statistics.median(rounds.round_times), extra_info))
        return rounds

    # -- the run's end ----------------------------------------------------------------------------

    def report(self):
        """The run's verdicts, each case's decided verdict written back into its extra_info["ab"]
        (record_decision): the run file says what the gate decided and exited on."""
        cases = ab_verdicts(self.results, self.accept_structure_change, self.accept_memory_change,
                            self.memory_tolerance, self.accept_numerics_change, self.numerics_tolerance)
        for (_, summary, _, _), case in zip(self.results, cases):
            record_decision(summary, case)
        return ab_report(cases, self.sides())

    def record_verdicts(self) -> None:
        """Decide every case now, before the run is saved (pytest_sessionfinish). A census that
        cannot be read leaves the summaries as measured: the verdict table names the problem."""
        try:
            self.report()
        except VerdictError:
            pass

    def exit_status(self) -> int:
        return decide_exit(self.report(), self.allow_missing, self.fail_on_inconclusive,
                           self.allow_baseline_failure).status

    def summary_lines(self) -> list[tuple[str, bool]]:
        """(line, whether it reports a failure) of the verdict table and the gate's outcome; the
        last line says the run's exit status and why (pytest's own count of passed tests beneath
        it does not: a case that ran to the end passes as a test whatever its verdict)."""
        report = self.report()
        lines = [(line, line.endswith("<<")) for line in format_text(report).splitlines()]
        status, outcome = report.gate_status(self.allow_missing, self.fail_on_inconclusive, OPTION_PREFIX,
                                             self.allow_baseline_failure)
        for profile in self.profiles:
            lines += [(f"ddpbench A/B: {line}", False) for line in profile.lines()]
        lines.append((f"ddpbench A/B: block order seed {self.seed} (--dist-ab-seed {self.seed} repeats it)", False))
        lines += [(f"ddpbench A/B: {line}", "exit status 1" in line) for line in outcome]
        lines.append((exit_line(status, report), bool(status)))
        return lines

    def lost_cases(self) -> list[dict]:
        """The cases the candidate lost, for the run's JSON (they have no benchmark entry)."""
        return [{"name": name, "ab": summary} for name, summary, _, _ in self.results
                if summary.get("verdict") == Verdict.MISSING]


def exit_line(status: int, report) -> str:
    """The run's last ddpbench line: the gate's exit status and the verdicts behind it (pytest's own
    count beneath it passes every case that ran, whatever its verdict)."""
    counts = ", ".join(f"{n} {verdict}" for verdict, n in report.counts().items() if n) or "no cases"
    if not status:
        return f"ddpbench A/B: exit status 0: no case fails the gate ({counts})"
    failing = [c.fullname or c.name for c in report.sorted_cases() if c.verdict.fails]
    shown = ", ".join(failing[:3]) + (" ..." if len(failing) > 3 else "")
    why = f"{counts} ({shown})" if failing else f"{counts}; --dist-ab-fail-on-inconclusive"
    return f"ddpbench A/B: exit status 1: {why}, whatever pytest's count of passed tests says"


def baseline_lacks_case(error: BaseException) -> bool:
    """Whether a baseline's failure says it lacks the case (every failing rank could not import
    what the task names: a case the baseline does not have), not that it ran it and failed."""
    from ...pool import TaskFailed
    from ...pool.picklecheck import LOAD_FAILURE_PREFIX

    return (isinstance(error, TaskFailed) and bool(error.errors) and not error.dead and not error.stuck
            and all(text.startswith(LOAD_FAILURE_PREFIX) for text in error.errors.values()))


def refuse_mixed_environments(error: ImportIsolationError | SameCodeError) -> None:
    """Stop the run with exit 2 (bad input): no verdict, no saved results (an interrupted run saves
    none), the message naming both sides and the fix."""
    pytest.exit(f"ddpbench A/B: {error}", returncode=error.EXIT_STATUS)


def _import_guard_folder() -> str:
    """A folder of this run's own for the baseline ranks' import-guard log, removed at exit."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="ddpbench-ab-imports-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _profile_root(config, seed: int) -> Path:
    """This run's folder of profiler traces: ``ab-profiles/<time>-seed<seed>`` in pytest-benchmark's
    storage folder (``.benchmarks`` unless --benchmark-storage names another folder)."""
    storage = str(config.getoption("benchmark_storage", None) or "file://./.benchmarks")
    folder = Path(storage.removeprefix("file://")) if storage.startswith("file://") or "://" not in storage \
        else Path(".benchmarks")
    return (Path.cwd() / folder).resolve() / "ab-profiles" / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{seed}"


def _refuse_what_ab_cannot_measure(config) -> None:
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


__all__ = ["AB_OPTIONS", "ABSession", "LOST_CASES_KEY"]
