"""A/B mode's parts, each read as a value without starting a rank or parsing the run's output: the
plan the options ask for, the exit the plan's allowances decide, the budget's share of a case, and
the lines written from a decision made by hand."""

from __future__ import annotations

import pytest

from ddpbench.gates.ab import run_report
from ddpbench.gates.ab.case_runner import CaseRunner
from ddpbench.gates.ab.pairs_loop import ABSettings
from ddpbench.gates.ab.run_plan import ABPlan, plan_from_options
from ddpbench.gates.ab.run_sides import Sides
from ddpbench.gates.ab.session import ABSession
from ddpbench.gates.ab.side_environments import make_side
from ddpbench.gates.exit_decision import ExitDecision
from ddpbench.gates.verdicts import CaseVerdict, GateReport
from ddpbench.gates.verdict_words import Verdict

pytest_plugins = ["pytester"]


def test_the_plan_is_read_from_the_options_alone(pytester):
    config = pytester.parseconfig("--dist-ab-seed", "11", "--dist-ab-threshold", "10%", "--dist-allow-missing",
                                  "--dist-ab-run-budget", "40", "--dist-ab-max-time", "8",
                                  "--dist-accept-memory-change")
    plan = plan_from_options(config)  # no side is made or probed for it
    assert (plan.seed, plan.settings.threshold, plan.allow_missing, plan.fail_on_inconclusive) == (11, 0.1, True, False)
    assert plan.accept_memory_change and not plan.settings.stop_on_memory_regression
    assert plan.settings.stop_on_structural_regression and plan.settings.max_time_s == 8
    budget = plan.new_budget()
    assert (budget.budget_s, budget.max_time_s) == (40, 8)
    assert plan_from_options(pytester.parseconfig("--dist-ab-seed", "1")).new_budget() is None


def test_a_first_stage_past_its_cap_is_a_usage_error_from_the_plan(pytester):
    config = pytester.parseconfig("--dist-ab-block-time", "5", "--dist-ab-max-time", "10")
    with pytest.raises(pytest.UsageError, match="first stage alone"):
        plan_from_options(config)


def _session(**plan) -> ABSession:
    sides = Sides(make_side("baseline", None, None, {}), make_side("candidate", None, None, {}))
    settled = ABPlan(ABSettings(), seed=3, **plan)
    return ABSession(settled, sides, CaseRunner(sides, settled))


def _report(*verdicts: Verdict) -> GateReport:
    return GateReport("ab", [CaseVerdict(f"t{i}", v) for i, v in enumerate(verdicts)], current_label="candidate")


@pytest.mark.parametrize("plan, failing", [
    ({}, [Verdict.REGRESSION, Verdict.MISSING, Verdict.BASELINE_FAILED]),
    ({"allow_missing": True, "allow_baseline_failure": True}, [Verdict.REGRESSION]),
    ({"fail_on_inconclusive": True}, [Verdict.REGRESSION, Verdict.MISSING, Verdict.BASELINE_FAILED,
                                      Verdict.INCONCLUSIVE]),
])
def test_the_run_exits_on_what_the_plan_allows(plan, failing):
    report = _report(Verdict.REGRESSION, Verdict.MISSING, Verdict.BASELINE_FAILED, Verdict.INCONCLUSIVE, Verdict.SAME)
    decision = _session(**plan).exit_decision(report)
    assert decision.failing == failing and decision.status == 1
    allowed = _session(allow_missing=True, allow_baseline_failure=True).exit_decision(
        _report(Verdict.MISSING, Verdict.BASELINE_FAILED, Verdict.INCONCLUSIVE, Verdict.NEW))
    assert allowed.failing == [] and allowed.status == 0


def test_the_last_line_follows_the_decision_it_is_given():
    report = _report(Verdict.SAME, Verdict.INCONCLUSIVE)
    lines = run_report.summary_lines(report, ExitDecision(inconclusive=1, inconclusive_fails=True), 3, [])
    assert lines[-1] == ("ddpbench A/B: exit status 1: 1 inconclusive, 1 same; --dist-fail-on-inconclusive, "
                         "whatever pytest counts as passed", True)
    assert ("ddpbench A/B: block order seed 3 (--dist-ab-seed 3 repeats it)", False) in lines
    passing = run_report.summary_lines(report, ExitDecision(inconclusive=1), 3, [])
    assert passing[-1] == ("ddpbench A/B: exit status 0: no case fails the gate (1 inconclusive, 1 same)", False)


def test_lost_cases_are_the_missing_ones():
    results = [("a", {"verdict": "missing"}, None, None), ("b", {"verdict": "same"}, 0.1, {})]
    assert run_report.lost_cases(results) == [{"name": "a", "ab": {"verdict": "missing"}}]
