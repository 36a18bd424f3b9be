"""The gates' words: `not-slower` (a slowdown of the threshold or more ruled out, whether faster
left open) in both gates' tables, markdown, JSON and exit status, an inconclusive case's
resolution (the slowdown it still rules out), and every place that lists the verdict words."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

import ddpbench
from helpers.benchjson import bench, run_doc, write
from ddpbench import bisect
from ddpbench.gates import stats, verdicts
from ddpbench.gates.exit_decision import decide_exit, exit_lines
from ddpbench.gates.verdict_words import Verdict
from ddpbench.gates.stored_run_gate import compare_runs
from ddpbench.storage.runs import load_run

SRC = pathlib.Path(ddpbench.__file__).parent


def _case(name, verdict, low, high, reason=None):
    ratio = (low * high) ** 0.5
    return verdicts.CaseVerdict(name, verdict, baseline_median_s=1e-3, current_median_s=ratio * 1e-3, ratio=ratio,
                                ci_low=low, ci_high=high, p_value=0.2, reason=reason)


def _report():
    return verdicts.GateReport("gate", [
        _case("test_open", "inconclusive", 0.97, 1.087),
        _case("test_safe", "not-slower", 0.90, 1.03),
        _case("test_flat", "same", 0.98, 1.02),
        _case("test_unbounded", "inconclusive", 0.0, float("inf")),
        _case("test_unlike", "inconclusive", 0.97, 1.2, reason="unlike: torch"),
    ], threshold=0.05)


def _row(text, name):
    return next(line for line in text.splitlines() if name in line)


def test_an_inconclusive_case_states_the_slowdown_it_rules_out_in_text_markdown_and_json():
    report = _report()
    text, markdown = verdicts.format_text(report), verdicts.format_markdown(report)
    assert _row(text, "test_open").endswith("inconclusive (rules out >= 8.7% slower)")
    assert _row(markdown, "test_open").endswith("| ⚠️ inconclusive (rules out >= 8.7% slower) |")
    # Decided cases, an unbounded interval and figures made incomparable (a reason) rule nothing out.
    for name in ("test_safe", "test_flat", "test_unbounded", "test_unlike"):
        assert "rules out" not in _row(text, name) and "rules out" not in _row(markdown, name)
    assert _row(text, "test_unlike").endswith("inconclusive (unlike: torch)")
    cases = {case["name"]: case for case in json.loads(verdicts.format_json(report))["cases"]}
    assert cases["test_open"]["rules_out_slowdown"] == pytest.approx(0.087)
    assert all(cases[name]["rules_out_slowdown"] is None for name in cases if name != "test_open")


def test_the_resolution_is_rounded_so_it_never_claims_more_than_the_interval():
    for high, shown in ((1.087, "8.7"), (1.0861, "8.7"), (1.0869, "8.7"), (1.08701, "8.8"), (1.0, "0.0")):
        case = _case("test_x", "inconclusive", 0.9, high)
        assert f"rules out >= {shown}% slower" in verdicts.format_text(verdicts.GateReport("g", [case]))


def test_not_slower_passes_the_gate_as_same_does_and_reads_as_decided():
    report = _report()
    assert decide_exit(report).status == 0
    strict = decide_exit(report, fail_on_inconclusive=True)
    assert strict.status == 1 and strict.inconclusive == 3  # the three inconclusive cases, not test_safe
    assert "3 inconclusive case(s)" in exit_lines(strict)[0]
    safe = verdicts.GateReport("gate", [_case("test_safe", "not-slower", 0.90, 1.03)], threshold=0.05)
    safe_decision = decide_exit(safe, fail_on_inconclusive=True)
    assert safe_decision.failing == [] and safe_decision.inconclusive == 0 and exit_lines(safe_decision) == []
    assert "1 not-slower" in safe.summary()
    assert _row(verdicts.format_markdown(safe), "test_safe").endswith("| ✅ not-slower |")
    # Rows: after the inconclusive ones, before same.
    assert [c.name for c in report.sorted_cases()] == ["test_open", "test_unbounded", "test_unlike", "test_safe",
                                                       "test_flat"]


def test_a_saved_ab_case_reads_back_not_slower_and_its_resolution():
    ab = {"verdict": "not-slower", "ratio": 0.95, "ratio_ci": [0.9, 1.01], "pairs": 12, "threshold": 0.05}
    assert verdicts.ab_verdict("test_x", ab, 1e-3).verdict == "not-slower"
    open_case = verdicts.ab_verdict("test_y", dict(ab, verdict="inconclusive", ratio_ci=[0.9, 1.12]), 1e-3)
    assert open_case.rules_out_slowdown == pytest.approx(0.12)
    with pytest.raises(verdicts.VerdictError, match="not one of"):
        verdicts.ab_verdict("test_z", dict(ab, verdict="not slower"), 1e-3)  # the word is hyphenated


def test_the_stored_run_gate_says_not_slower_too(tmp_path):
    # 10% faster rounds, spread +-20%: the interval ends below 1.05 and starts below 1/1.05, while
    # the ratio (0.937) is short of an improvement: not-slower. The same rounds without the speed-up
    # are inconclusive (a negative control), and say what they rule out.
    import random

    def run(name, rounds):
        return load_run(write(tmp_path / f"{name}.json", run_doc([bench("test_x", rounds)])))

    base_rng, cur_rng = random.Random(1), random.Random(2)
    base = [1e-3 * base_rng.uniform(0.8, 1.2) for _ in range(40)]
    cur = [1e-3 * cur_rng.uniform(0.8, 1.2) for _ in range(40)]
    # read on the rounds' own interval: the run-to-run component (tests/gates/test_run_to_run.py) is
    # not what this test is about
    (faster,) = compare_runs(run("base", base), run("faster", [t * 0.9 for t in cur]), threshold=0.05,
                             calibration="never", run_to_run="off").cases
    assert faster.verdict == "not-slower" and faster.ci_high < 1.05 and faster.ci_low < 1 / 1.05
    (unchanged,) = compare_runs(run("base", base), run("slower", cur), threshold=0.05,
                                calibration="never", run_to_run="off").cases
    assert unchanged.verdict == "inconclusive"
    assert unchanged.rules_out_slowdown == pytest.approx(unchanged.ci_high - 1)


def test_every_place_that_lists_the_verdict_words_knows_each_one():
    timing = set(stats.VERDICTS)
    assert timing <= set(verdicts.VERDICTS)
    # bisect reads every timing verdict as good, bad or inconclusive (then it runs again).
    assert timing <= set(bisect.GOOD_VERDICTS) | set(bisect.BAD_VERDICTS) | {"inconclusive"}
    assert "not-slower" in bisect.GOOD_VERDICTS


def test_the_verdict_type_carries_each_word_its_exit_meaning_and_its_display():
    # A member is its word: saved runs, JSON and printed text hold the word, and read back as the member.
    for verdict in Verdict:
        assert Verdict(verdict.value) is verdict and f"{verdict}" == str(verdict) == verdict.value
        assert json.dumps({verdict: [verdict]}) == f'{{"{verdict.value}": ["{verdict.value}"]}}'
    assert [v for v in verdicts.VERDICTS if v.fails] == ["regression", "missing", "baseline-failed"]
    # The table flags and the markdown shows each case verdict as the type says.
    report = verdicts.GateReport("gate", [verdicts.CaseVerdict(f"test_{v}", v) for v in verdicts.VERDICTS])
    text, markdown = verdicts.format_text(report), verdicts.format_markdown(report)
    for verdict in verdicts.VERDICTS:
        assert _row(text, f"test_{verdict} ").endswith(f"{verdict}  <<" if verdict.fails else f"  {verdict}")
        assert _row(markdown, f"`test_{verdict}`").endswith(f"| {verdict.markdown} |")
    # The history page's stylesheet colours a verdict's point with the colour the type names, and
    # leaves the others plain.
    css = (SRC / "history" / "page.css").read_text()
    rules = {selector.strip(): body for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)
             for selector in selectors.split(",")}
    for verdict in Verdict:
        if verdict.page_colour:
            assert f"var(--{verdict.page_colour})" in rules[f".pt.{verdict}"], verdict
        else:
            assert f".pt.{verdict}" not in rules, verdict
