"""A gate's exit is decided apart from its words (gates/exit_decision.py): the decision names what
fails the run, whatever the options are spelled; the lines only say it."""

from ddpbench.gates.exit_decision import ExitDecision, decide_exit, exit_lines
from ddpbench.gates.verdict_words import Verdict
from ddpbench.gates.verdicts import CaseVerdict, GateReport


def _report(*verdicts: Verdict) -> GateReport:
    return GateReport("gate", [CaseVerdict(f"t{i}", v, fullname=f"t.py::t{i}") for i, v in enumerate(verdicts)],
                      current_label="candidate")


def test_the_decision_names_what_fails_and_each_allowance_lets_its_own_cause_through():
    report = _report(Verdict.REGRESSION, Verdict.MISSING, Verdict.BASELINE_FAILED, Verdict.INCONCLUSIVE,
                     Verdict.SAME)
    strict = decide_exit(report, fail_on_inconclusive=True)
    assert strict.failing == [Verdict.REGRESSION, Verdict.MISSING, Verdict.BASELINE_FAILED, Verdict.INCONCLUSIVE]
    assert strict.status == 1 and strict.missing == ("t.py::t1",) and strict.baseline_failed == ("t.py::t2",)
    lenient = decide_exit(report, allow_missing=True, allow_baseline_failure=True)
    assert lenient.failing == [Verdict.REGRESSION] and lenient.status == 1
    assert decide_exit(_report(Verdict.MISSING, Verdict.INCONCLUSIVE), allow_missing=True).status == 0
    assert decide_exit(_report(Verdict.BASELINE_FAILED), allow_baseline_failure=True).failing == []
    assert ExitDecision().status == 0 and exit_lines(ExitDecision()) == []


def test_the_words_follow_the_decision_in_each_spelling():
    report = _report(Verdict.MISSING, Verdict.INCONCLUSIVE)
    decision = decide_exit(report, fail_on_inconclusive=True)
    for prefix in ("--", "--dist-"):  # ddpbench compare's spelling, then the plugin's
        lines = exit_lines(decision, prefix, "candidate")
        assert lines == [f"1 case(s) the baseline has were lost by the candidate run (t.py::t0): crashed, hung or "
                         f"removed. Exit status 1 ({prefix}allow-missing accepts them)",
                         f"1 inconclusive case(s): exit status 1 ({prefix}fail-on-inconclusive)"]
    allowed = exit_lines(decide_exit(report, allow_missing=True), "--")
    assert allowed == ["1 case(s) the baseline has were lost by the candidate run (t.py::t0): crashed, hung or removed; "
                       "allowed by --allow-missing",
                       "1 inconclusive case(s): not a failure (--fail-on-inconclusive makes them one)"]


def test_the_report_holds_verdicts_and_leaves_the_exit_to_the_decision():
    # A report says what each case is; the exit is a value decided from it (decide_exit) and the
    # words are written from that value (exit_lines): the report neither decides nor writes it.
    import ast
    import inspect

    from ddpbench.gates import verdicts

    imported = {node.module for node in ast.walk(ast.parse(inspect.getsource(verdicts)))
                if isinstance(node, ast.ImportFrom)}
    assert "exit_decision" not in imported and not hasattr(verdicts.GateReport, "gate_status")
