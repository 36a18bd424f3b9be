"""The gates on thin or broken input: one round (or pair) per side is `inconclusive`, never `same`;
a case the A/B baseline failed is its own verdict that fails the gate unless allowed; a saved A/B
verdict whose fields do not hold what they should is a named error (exit 2), never a traceback."""

from __future__ import annotations

import json

import pytest

from helpers.benchjson import bench, run_doc, write
from ddpbench import cli
from ddpbench.gates import stats, verdicts
from ddpbench.gates.exit_decision import decide_exit, exit_lines
from ddpbench.gates.verdict_words import Verdict
from ddpbench.gates.stored_run_gate import compare_runs
from ddpbench.storage.runs import load_run


def test_one_pair_per_side_or_per_pool_pair_is_inconclusive_never_same():
    one = stats.analyse_pairs([1.0e-3], [1.01e-3], threshold=0.05)
    assert one.verdict == "inconclusive" and one.to_dict()["ratio_ci"] is None  # JSON has no inf
    each_one = stats.analyse_pairs([1.0e-3, 1.0e-3], [1.01e-3, 1.01e-3], threshold=0.05, pool_pair_of=[0, 1])
    assert each_one.verdict == "inconclusive"
    enough = stats.analyse_pairs([1.0e-3] * 4, [1.01e-3, 1.0e-3, 1.01e-3, 1.0e-3], threshold=0.05)
    assert enough.to_dict()["ratio_ci"] is not None  # two or more pairs bound the interval


def _run(tmp_path, name, rounds, include_data=True):
    return load_run(write(tmp_path / f"{name}.json", run_doc([bench("test_x", rounds, include_data=include_data)])))


@pytest.mark.parametrize("include_data", [True, False], ids=["raw-rounds", "summary-stats"])
def test_one_round_per_side_in_stored_runs_is_inconclusive_and_its_interval_unbounded(tmp_path, include_data):
    base, cur = _run(tmp_path, "base", [1.0e-3], include_data), _run(tmp_path, "cur", [1.01e-3], include_data)
    report = compare_runs(base, cur, threshold=0.05, calibration="never")
    (case,) = report.cases
    assert case.verdict == "inconclusive"
    assert "1.010 [0.000, inf]" in verdicts.format_text(report)
    doc = json.loads(verdicts.format_json(report))  # strict JSON: no Infinity
    assert doc["cases"][0]["ci_high"] is None and doc["cases"][0]["verdict"] == "inconclusive"


def test_a_case_the_baseline_failed_fails_the_gate_unless_allowed():
    cases = [verdicts.CaseVerdict("test_a", "baseline-failed", reason="baseline pool 0 failed"),
             verdicts.CaseVerdict("test_b", "same", ratio=1.0, ci_low=0.99, ci_high=1.01)]
    report = verdicts.ab_report(cases)
    decision = decide_exit(report)
    lines = exit_lines(decision, "--dist-", report.current_label)
    assert decision.failing == [Verdict.BASELINE_FAILED] and ("1 case(s) failed on the baseline side (test_a): nothing to compare the candidate "
                            "with, and a broken baseline is not a new case. Exit status 1 "
                            "(--dist-allow-baseline-failure accepts them)") in " ".join(" ".join(lines).split())
    decision = decide_exit(report, allow_baseline_failure=True)
    lines = exit_lines(decision, "--dist-", report.current_label)
    assert decision.status == 0 and "allowed by --dist-allow-baseline-failure" in " ".join(" ".join(lines).split())
    assert "baseline-failed (baseline pool 0 failed)  <<" in verdicts.format_text(report)
    assert "❌ **baseline-failed** (baseline pool 0 failed)" in verdicts.format_markdown(report)
    assert report.sorted_cases()[0].name == "test_a"  # before improvements and the rest


AB = {"verdict": "same", "ratio": 1.0, "ratio_ci": [0.98, 1.02], "p_value": 0.5, "pairs": 12, "threshold": 0.05,
      "ratio_per_pool_pair": [1.0, 1.0], "ratio_of_block_minima": 1.0, "wall_s": 1.5,
      "baseline": {"median_s": 0.001}, "candidate": {"median_s": 0.001},
      "sides": {"baseline": {"python": "/base/python", "torch_version": "2.0"},
                "candidate": {"python": "/cand/python", "torch_version": "2.0"}}}


def _ab_run(tmp_path, **changes):
    ab = dict(AB, **changes)
    return write(tmp_path / "ab.json", run_doc([bench("test_step[gloo-2p]", [0.001, 0.001, 0.0011], {"ab": ab})]))


@pytest.mark.parametrize("changes,message", [
    ({"verdict": "better"}, "ab.verdict is 'better', not one of regression, missing, baseline-failed, improvement, "
                            "inconclusive, not-slower, same, new"),
    ({"ratio": "fast"}, "ab.ratio is 'fast', expected a positive number"),
    ({"ratio": 0}, "ab.ratio is 0, expected a positive number"),
    ({"p_value": None, "ratio_ci": [1.1]}, "ab.ratio_ci is [1.1], expected [low, high] numbers or null"),
    ({"ratio_per_pool_pair": ["x"]}, "ab.ratio_per_pool_pair is ['x'], expected a list of numbers"),
    ({"baseline": {"median_s": 0}}, "ab.baseline.median_s is 0, expected a time above 0 s (a round cannot take no time)"),
    ({"candidate": "fast"}, "ab.candidate is 'fast', expected the side's figures (an object)"),
    ({"sides": {"baseline": "python"}}, "ab.sides is {'baseline': 'python'}, expected each side's description"),
    ({"profile": {"top_ops": ["not an op"]}}, "ab.profile cannot be read (AttributeError"),
])
def test_a_saved_ab_verdict_that_is_malformed_is_a_named_error(tmp_path, capsys, changes, message):
    rc = cli.main(["compare", str(_ab_run(tmp_path, **changes))])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err, (rc, out, err)
    assert err.startswith(f"ddpbench compare: error: {tmp_path / 'ab.json'}: ")
    assert "test_step[gloo-2p]: extra_info " + message in err and "damaged or was edited" in err


def test_a_well_formed_ab_verdict_reads_back(tmp_path, capsys):
    assert cli.main(["compare", str(_ab_run(tmp_path))]) == 0
    assert "test_step[gloo-2p]" in capsys.readouterr().out
    assert cli.main(["compare", str(_ab_run(tmp_path, verdict="baseline-failed", reason="baseline pool 0 failed",
                                          ratio=None, ratio_ci=None))]) == 1
    assert cli.main(["compare", str(_ab_run(tmp_path, verdict="baseline-failed")), "--allow-baseline-failure"]) == 0


def test_a_zero_median_in_a_stored_run_is_a_named_error_for_compare_too(tmp_path, capsys):
    base = run_doc([bench("test_x", [0.001, 0.002, 0.003])])
    base["benchmarks"][0]["stats"].update(median=0.0)
    del base["benchmarks"][0]["stats"]["data"]
    write(tmp_path / "base.json", base)
    write(tmp_path / "cur.json", run_doc([bench("test_x", [0.001, 0.002, 0.003])]))
    rc = cli.main(["compare", str(tmp_path / "base.json"), str(tmp_path / "cur.json"), "--allow-summary-stats"])
    err = capsys.readouterr().err
    assert rc == 2 and "test_x: its median round time is 0 s, and a round cannot take no time" in err
    assert "Traceback" not in err
