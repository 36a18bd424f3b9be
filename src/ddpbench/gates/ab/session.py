"""A/B mode in a pytest run, as the plugin sees it: one object that hands each of pytest's moments to
the part whose job it is. The options become a plan (run_plan) and two sides (run_sides) before any
rank starts; after collection each side gets the code under test; each case is measured on both
sides (case_runner); at the end the verdicts are decided (verdicts), the exit too (exit_decision),
and the table and the lines around it are written (run_report)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...engine.timing import CaseRounds
from ...options import AB_OPTIONS  # any of these turns A/B mode on
from ..exit_decision import ExitDecision, decide_exit
from ..verdicts import LOST_CASES_KEY, GateReport, VerdictError
from . import run_report
from .case_runner import CaseRunner
from .pairs_loop import ABSettings
from .run_plan import ABPlan, plan_from_options, refuse_what_ab_cannot_measure
from .run_sides import Sides, build_baseline_cases, resolve_code_under_test, sides_from_options


@dataclass
class ABSession:
    """A/B mode's plan, sides and case runner for one pytest run."""

    plan: ABPlan
    sides: Sides
    runner: CaseRunner

    @classmethod
    def from_options(cls, config) -> "ABSession | None":
        """The run's A/B session, or None when no A/B option is given. Each side's interpreter is
        run once now: it must import torch and a ddpbench of this run's rank protocol."""
        if not any(config.getoption(name, None) for name in AB_OPTIONS):
            return None
        refuse_what_ab_cannot_measure(config)
        sides = sides_from_options(config)
        plan = plan_from_options(config)
        return cls(plan, sides, CaseRunner(sides, plan, plan.new_budget()))

    @property
    def settings(self) -> ABSettings:
        return self.plan.settings

    @property
    def candidate(self):
        return self.sides.candidate

    @property
    def results(self) -> list:
        """(case id, extra_info["ab"], candidate median or None, the case's extra_info or None) per
        case measured: the structural verdict is read from the two censuses there when the report
        is made, so it needs no pairs and stands whatever the timing says."""
        return self.runner.results

    # -- before any rank starts, and after collection -------------------------------------------

    def header_lines(self, world_sizes: list[int], cores: int, pin_cores: bool) -> list[str]:
        return run_report.header_lines(self.plan, self.sides, world_sizes, cores, pin_cores)

    def resolve_modules(self, session) -> list[str]:
        """Where each side's ranks import the modules under test from, then the baseline's own
        workloads built by its own code (lines for the terminal); exit 2 when a baseline that
        names other code would import the candidate's, or its cases cannot be built there."""
        resolve_code_under_test(self.sides, session)
        lines = run_report.code_under_test_lines(self.sides)
        if not session.config.getoption("collectonly", False):  # listing the cases builds nothing
            self.runner.baseline_builds = build_baseline_cases(self.sides, session)
            lines += run_report.baseline_build_lines(self.runner.baseline_builds)
        return lines

    def plan_cases(self, session) -> None:
        self.runner.plan_cases(session.items)

    def case_settings(self, case_id: str) -> ABSettings:
        return self.runner.case_settings(case_id)

    # -- each case ------------------------------------------------------------------------------

    def measure(self, pool_for: Callable[[str, Any, int], Any], own_pool, workload, plan, timeout_s: float,
                case_id: str, extra_info: dict) -> CaseRounds:
        return self.runner.measure(pool_for, own_pool, workload, plan, timeout_s, case_id, extra_info)

    # -- the run's end --------------------------------------------------------------------------

    def report(self) -> GateReport:
        return run_report.decided_report(self.results, self.plan, self.sides)

    def exit_decision(self, report: GateReport) -> ExitDecision:
        return decide_exit(report, self.plan.allow_missing, self.plan.fail_on_inconclusive,
                           self.plan.allow_baseline_failure)

    def record_verdicts(self) -> None:
        """Decide every case now, before the run is saved (pytest_sessionfinish). A census that
        cannot be read leaves the summaries as measured: the verdict table names the problem."""
        try:
            self.report()
        except VerdictError:
            pass

    def exit_status(self) -> int:
        return self.exit_decision(self.report()).status

    def summary_lines(self) -> list[tuple[str, bool]]:
        report = self.report()
        return run_report.summary_lines(report, self.exit_decision(report), self.plan.seed, self.runner.profiles)

    def lost_cases(self) -> list[dict]:
        return run_report.lost_cases(self.results)


__all__ = ["AB_OPTIONS", "ABSession", "LOST_CASES_KEY"]
