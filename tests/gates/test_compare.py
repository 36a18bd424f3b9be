"""ddpbench compare: statistics on synthetic samples, drift calibration, verdicts, outputs and every
bad-input path of the CLI (exit 2 with a message, never a traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.benchjson import bench, run_cli, run_doc, write
from helpers.verdict_text import case_blocks
from ddpbench import cli
from ddpbench.gates import calibration
from ddpbench.gates import stored_run_gate as cmp
from ddpbench.gates import stats
from ddpbench.storage import records
from ddpbench.storage.runs import Case, Run, load_run

ROUNDS = 30
NOISE = 0.05  # lognormal sigma: 5% round-to-round noise


def sample(rng, median, n=ROUNDS, sigma=NOISE):
    return list(median * np.exp(rng.normal(0.0, sigma, n)))


def two_runs(tmp_path, base_cases, cur_cases, base_probe=0.001, cur_probe=0.001, **kw):
    base = write(tmp_path / "base.json", run_doc([bench(n, d, **kw) for n, d in base_cases.items()],
                                                 probe_s=base_probe))
    cur = write(tmp_path / "cur.json", run_doc([bench(n, d, **kw) for n, d in cur_cases.items()],
                                               probe_s=cur_probe))
    return load_run(base), load_run(cur)


# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------


def test_mann_whitney_matches_the_textbook_value():
    # fully separated samples of 10: U = 0, z = (50 - 0.5) / sqrt(175), two-sided p = 1.83e-4
    assert stats.mann_whitney_p(range(1, 11), range(11, 21)) == pytest.approx(1.83e-4, rel=0.02)
    assert stats.mann_whitney_p(range(11, 21), range(1, 11)) == pytest.approx(1.83e-4, rel=0.02)
    assert stats.mann_whitney_p([1.0] * 8, [1.0] * 8) == 1.0  # all ties: no evidence
    assert stats.mann_whitney_p([1, 3, 5, 7], [2, 4, 6, 8]) > 0.5


def test_bootstrap_interval_contains_the_point_ratio_and_is_deterministic():
    rng = np.random.default_rng(1)
    a, b = sample(rng, 1.0), sample(rng, 1.3)
    lo, hi = stats.bootstrap_ratio_ci(a, b)
    assert lo < np.median(b) / np.median(a) < hi
    assert (lo, hi) == stats.bootstrap_ratio_ci(a, b)  # fixed seed: same files, same verdicts


def _trials(shift, trials, threshold=cmp.DEFAULT_THRESHOLD, seed=0, n=ROUNDS, sigma=NOISE):
    """The case verdicts of ``trials`` synthetic comparisons of a ``shift`` x slowdown."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(trials):
        base = Run(Path("b"), {}, {}, None, {
            "c": Case("c", "c", None, {}, {"median": 1.0}, sample(rng, 0.01, n, sigma))})
        cur = Run(Path("c"), {}, {}, None, {
            "c": Case("c", "c", None, {}, {"median": 1.0}, sample(rng, 0.01 * shift, n, sigma))})
        result = cmp.compare_runs(base, cur, threshold=threshold, calibration="never", seed=i)
        cases.append(result.cases[0])
    return cases


def _verdicts(shift, trials, threshold=cmp.DEFAULT_THRESHOLD, seed=0):
    return [case.verdict for case in _trials(shift, trials, threshold, seed)]


def test_a_known_25_percent_slowdown_is_detected_in_every_trial():
    # 30 rounds with 5% noise: the stated power for a 25% shift at the 10% threshold is 100%
    assert _verdicts(1.25, trials=100).count("regression") == 100


def test_no_shift_is_never_flagged_at_the_default_threshold():
    verdicts = _verdicts(1.0, trials=100)
    assert verdicts.count("regression") == 0 and verdicts.count("improvement") == 0


def test_no_shift_false_positive_rate_at_zero_threshold_is_near_the_nominal_5_percent():
    # with threshold 0 only the significance tests guard against noise: both must reject at 95%
    verdicts = _verdicts(1.0, trials=100, threshold=0.0, seed=7)
    assert verdicts.count("regression") + verdicts.count("improvement") <= 0.08 * 100


def test_a_slowdown_below_the_threshold_is_significant_but_not_a_regression():
    # 100 rounds with 2% noise: a 5% slowdown is ~14 standard errors of the ratio of medians, so
    # both significance tests reject in every trial; the ratio stays below 1 + threshold (10%).
    cases = _trials(1.05, trials=50, n=100, sigma=0.02)
    for case in cases:
        assert case.ci_low > 1 and case.p_value < 1 - cmp.DEFAULT_CONFIDENCE, case  # significant
        assert 1 < case.ratio < 1 + cmp.DEFAULT_THRESHOLD, case
    assert [case.verdict for case in cases] == ["same"] * 50  # within the threshold: not a regression


def test_improvement_is_reported_symmetrically():
    assert _verdicts(0.75, trials=20).count("improvement") == 20


def test_interval_covers_the_true_ratio_at_about_the_stated_rate():
    rng = np.random.default_rng(3)
    covered = 0
    for i in range(100):
        lo, hi = stats.bootstrap_ratio_ci(sample(rng, 1.0, n=40), sample(rng, 1.2, n=40), seed=i)
        covered += lo <= 1.2 <= hi
    assert covered >= 88


def test_summary_stats_fallback_gives_verdicts_and_says_so(tmp_path):
    rng = np.random.default_rng(0)
    base, cur = two_runs(tmp_path, {"a": sample(rng, 0.01), "b": sample(rng, 0.01)},
                         {"a": sample(rng, 0.013), "b": sample(rng, 0.01)}, include_data=False)
    result = cmp.compare_runs(base, cur)
    assert result.summary_only
    assert any("--benchmark-save-data" in w for w in result.warnings)
    verdicts = {c.name: c for c in result.cases}
    assert verdicts["a"].verdict == "regression" and verdicts["a"].method == "summary-stats"
    assert verdicts["b"].verdict == "same"


# ---------------------------------------------------------------------------------------------
# machine drift calibration
# ---------------------------------------------------------------------------------------------


def test_probe_measures_something_and_is_stored_in_the_expected_shape():
    probe = calibration.run_probe(max_seconds=0.05)
    assert probe["min_s"] > 0 and probe["median_s"] >= probe["min_s"] and probe["repeats"] >= 5
    assert records.probe_of({records.MACHINE_INFO_KEY: probe}) == probe
    assert records.probe_of({}) is None
    assert records.probe_of({records.MACHINE_INFO_KEY: {"error": "x"}}) is None


def test_the_probe_is_read_beside_machine_info_and_inside_it_in_older_runs(tmp_path):
    rng = np.random.default_rng(11)
    older = run_doc([bench("a", sample(rng, 0.01))], probe_s=0.001)  # machine_info, as ddpbench kept it
    newer = run_doc([bench("a", sample(rng, 0.012))], include_probe=False)
    newer[records.CALIBRATION_KEY] = dict(older["machine_info"]["ddpbench_calibration"], min_s=0.0012,
                                              median_s=0.0012 * 1.1)
    base, cur = (load_run(write(tmp_path / name, doc)) for name, doc in (("old.json", older), ("new.json", newer)))
    assert base.calibration["min_s"] == 0.001 and cur.calibration["min_s"] == 0.0012
    result = cmp.compare_runs(base, cur)
    assert result.normalised and result.drift == pytest.approx(1.2)


def _slower_machine_runs(tmp_path, factor, real_slowdown=1.0, cur_probe=None):
    rng = np.random.default_rng(5)
    names = [f"case{i}" for i in range(4)]
    base = {n: sample(rng, 0.01) for n in names}
    cur = {n: sample(rng, 0.01 * factor * (real_slowdown if n == "case0" else 1.0)) for n in names}
    return two_runs(tmp_path, base, cur, base_probe=0.001,
                    cur_probe=0.001 * factor if cur_probe is None else cur_probe)


def test_uniformly_slower_machine_is_normalised_and_reported(tmp_path):
    base, cur = _slower_machine_runs(tmp_path, 1.2)
    raw = cmp.compare_runs(base, cur, calibration="never")
    assert raw.count("regression") == 4  # pytest-benchmark's one-number gate would flag all of these
    result = cmp.compare_runs(base, cur)
    assert result.normalised and result.drift == pytest.approx(1.2)
    assert result.count("regression") == 0 and result.count("same") == 4
    assert any("1.200" in n and "slower" in n for n in result.notes)
    assert all(c.ratio == pytest.approx(1.0, abs=0.06) for c in result.cases)
    assert all(c.calibrated and c.calibration_factor == pytest.approx(1.2) for c in result.cases)


def test_drift_corrects_only_cpu_cases_of_this_machine_cuda_and_multinode_stay_raw(tmp_path):
    # The CPU probe ran 1.2x slower; the CPU case slowed with the machine, the GPU and the two-node
    # cases did not move at all. Dividing those by the CPU's drift would invent a 1.2x improvement.
    rng = np.random.default_rng(9)
    infos = {"cpu": {"device": "cpu", "nodes": 1}, "gpu": {"device": "cuda", "nodes": 1},
             "nodes2": {"device": "cpu", "nodes": 2}}
    base = [bench(n, sample(rng, 0.01), extra_info=i) for n, i in infos.items()]
    cur = [bench(n, sample(rng, 0.01 * (1.2 if n == "cpu" else 1.0)), extra_info=i) for n, i in infos.items()]
    b = write(tmp_path / "b.json", run_doc(base, probe_s=0.001))
    c = write(tmp_path / "c.json", run_doc(cur, probe_s=0.0012))
    result = cmp.compare_runs(load_run(b), load_run(c))
    assert result.normalised
    cases = {case.name: case for case in result.cases}
    assert cases["cpu"].calibrated and cases["cpu"].ratio == pytest.approx(1.0, abs=0.06)
    for raw in ("gpu", "nodes2"):
        assert not cases[raw].calibrated and cases[raw].ratio == pytest.approx(1.0, abs=0.06)
        assert cases[raw].verdict != "improvement"
    assert any("2 CUDA or multi-node case(s) are compared raw" in n for n in result.notes)
    rows = case_blocks(cmp.format_text(result), infos)
    assert "calibration ÷1.200" in rows["cpu"]
    assert "calibration raw" in rows["gpu"] and "calibration raw" in rows["nodes2"]


def test_real_regression_on_a_slower_machine_is_still_caught(tmp_path):
    base, cur = _slower_machine_runs(tmp_path, 1.2, real_slowdown=1.25)
    result = cmp.compare_runs(base, cur)
    assert [c.name for c in result.regressions] == ["case0"]


# The scenario: a 1.35x slowdown measured while the probe ran 1.6x the baseline's time.
# Divided by the probe it read 0.84, an improvement, exit 0.
def _scenario(tmp_path, slowdown=1.35, probe=1.6, n=30):
    rng = np.random.default_rng(21)
    b = write(tmp_path / "b.json", run_doc([bench("test_all_reduce[gloo-2p-1MB]", sample(rng, 0.01, n=n),
                                                  extra_info={"device": "cpu", "nodes": 1})], probe_s=0.001))
    c = write(tmp_path / "c.json", run_doc([bench("test_all_reduce[gloo-2p-1MB]", sample(rng, 0.01 * slowdown, n=n),
                                                  extra_info={"device": "cpu", "nodes": 1})], probe_s=0.001 * probe))
    return str(b), str(c)


def test_a_probe_outside_the_band_never_turns_a_slowdown_into_an_improvement(tmp_path, capsys):
    b, c = _scenario(tmp_path)
    for mode in ("auto", "always"):
        result = cmp.compare_runs(load_run(b), load_run(c), calibration=mode)
        [case] = result.cases
        assert case.verdict == "inconclusive" and not case.calibrated
        assert case.reason == "calibration 1.60x, outside 0.80-1.25"
        assert case.ratio == pytest.approx(1.35, abs=0.05)  # the raw ratio is shown, not a corrected one
        assert any("outside the 0.80-1.25" in w for w in result.warnings)
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 0 and "inconclusive (calibration 1.60x, outside 0.80-1.25)" in out and "improvement" not in out
    assert run_cli(capsys, "compare", b, c, "--fail-on-inconclusive")[0] == 1
    # --calibration never: the raw verdict, and a warning that the machine changed
    rc, out, _ = run_cli(capsys, "compare", b, c, "--calibration", "never")
    assert rc == 1 and "regression" in out and "compared raw (--calibration never)" in " ".join(out.split())


def test_a_correction_within_the_band_never_flips_a_verdict(tmp_path, capsys):
    # 1.12x measured (significantly slower: a raw regression at 10%) with a 1.24x probe: divided,
    # 0.90, which alone would read as an improvement.
    b, c = _scenario(tmp_path, slowdown=1.12, probe=1.24, n=60)
    raw = cmp.compare_runs(load_run(b), load_run(c), calibration="never")
    assert raw.cases[0].verdict == "regression"
    [case] = cmp.compare_runs(load_run(b), load_run(c)).cases
    assert case.calibrated and case.calibration_factor == pytest.approx(1.24)
    assert case.ratio < 1 / 1.1 and case.ci_high < 1  # what the correction alone would call an improvement
    assert case.verdict == "inconclusive" and case.reason.startswith("measured slower (raw 1.1")
    assert case.details["raw_ratio"] == pytest.approx(1.12, abs=0.03) and case.details["raw_ci"][0] > 1
    # and a measured speed-up never becomes a regression
    b, c = _scenario(tmp_path / "faster", slowdown=0.89, probe=0.8, n=60)
    [case] = cmp.compare_runs(load_run(b), load_run(c)).cases
    assert case.ratio > 1.1 and case.verdict == "inconclusive" and case.reason.startswith("measured faster")


def test_the_correction_is_a_column_in_text_markdown_and_json(tmp_path, capsys):
    base, cur = _slower_machine_runs(tmp_path, 1.2)
    b, c = str(base.path), str(cur.path)
    rc, out, _ = run_cli(capsys, "compare", b, c)
    # The text form: a short row per case; the correction on the figures line under it.
    header = next(line for line in out.splitlines() if line.startswith("case"))
    assert header.split() == ["case", "ratio", "[95%", "interval]", "verdict"]
    assert sum("; calibration ÷1.200" in line for line in out.splitlines()) == 4
    rc, out, _ = run_cli(capsys, "compare", b, c, "--markdown")
    assert "| calibration |" in out and out.count("| ÷1.200 |") == 4
    rc, out, _ = run_cli(capsys, "compare", b, c, "--json")
    cases = json.loads(out)["cases"]
    assert all(case["calibrated"] and case["calibration_factor"] == pytest.approx(1.2) for case in cases)
    assert all(case["details"]["raw_ratio"] > 1.1 for case in cases)
    rc, out, _ = run_cli(capsys, "compare", b, c, "--calibration", "never")
    rows = case_blocks(out, {f"case{i}" for i in range(4)})
    assert len(rows) == 4 and all("calibration raw" in row for row in rows.values()) and "÷1.200" not in out


def test_probe_noise_within_tolerance_is_not_normalised(tmp_path):
    base, cur = _slower_machine_runs(tmp_path, 1.0, cur_probe=0.00104)
    result = cmp.compare_runs(base, cur)
    assert not result.normalised and result.drift == pytest.approx(1.04)
    assert any("not normalised" in n for n in result.notes)
    forced = cmp.compare_runs(base, cur, calibration="always")
    assert forced.normalised


def test_unsteady_probe_is_not_trusted_and_overload_is_a_warning(tmp_path):
    rng = np.random.default_rng(8)
    docs = []
    for name, probe_s, median_factor, load in (("b", 0.001, 1.1, 0.5), ("c", 0.00085, 1.8, 9.0)):
        doc = run_doc([bench("a", sample(rng, 0.01))], probe_s=probe_s)
        doc["machine_info"]["ddpbench_calibration"].update(
            median_s=probe_s * median_factor, loadavg_1m=load, cpu_count=2)
        docs.append(load_run(write(tmp_path / f"{name}.json", doc)))
    result = cmp.compare_runs(*docs)
    assert not result.normalised and result.drift == pytest.approx(0.85)
    assert any("unsteady" in n and "1.80 in c.json" in n for n in result.notes)
    assert any("overloaded" in w and "c.json (load 9.0 on 2 CPUs)" in w for w in result.warnings)
    assert not any("b.json (" in w for w in result.warnings)
    assert cmp.compare_runs(*docs, calibration="always").normalised


def test_missing_probe_and_another_hostname_are_notes_not_crashes_another_cpu_is_refused(tmp_path):
    rng = np.random.default_rng(2)
    elsewhere = dict(run_doc([]).get("machine_info"), node="elsewhere")  # a hosted runner's new name
    b = write(tmp_path / "b.json", run_doc([bench("a", sample(rng, 0.01))], include_probe=False))
    c = write(tmp_path / "c.json", run_doc([bench("a", sample(rng, 0.01))], machine=elsewhere))
    result = cmp.compare_runs(load_run(b), load_run(c))
    assert not result.normalised and result.drift is None
    assert any("no calibration in b.json" in n for n in result.notes)
    assert not any("elsewhere" in line for line in result.warnings + result.notes)
    assert result.cases[0].verdict == "same"
    other_cpu = dict(elsewhere, cpu={"brand_raw": "Other CPU"})
    c = write(tmp_path / "c.json", run_doc([bench("a", sample(rng, 0.01))], machine=other_cpu))
    with pytest.raises(cmp.CompareError, match="cpu_model 'Test CPU' -> 'Other CPU'.*--allow-different cpu_model"):
        cmp.compare_runs(load_run(b), load_run(c))
    result = cmp.compare_runs(load_run(b), load_run(c), allow_different={"cpu_model"})
    assert any("compared although cpu_model" in w for w in result.warnings)


# ---------------------------------------------------------------------------------------------
# the CLI: verdicts, exit codes, outputs
# ---------------------------------------------------------------------------------------------


def _files(tmp_path, shift=1.0, include_data=True, extra_case=None, drop_case=None):
    rng = np.random.default_rng(11)
    names = ["test_all_reduce[gloo-2p-1MB]", "test_broadcast[gloo-2p-1MB]"]
    base = {n: sample(rng, 0.002) for n in names}
    cur = {n: sample(rng, 0.002 * (shift if "all_reduce" in n else 1.0)) for n in names}
    if extra_case:
        cur[extra_case] = sample(rng, 0.001)
    if drop_case:
        cur.pop(drop_case)
    b = write(tmp_path / "base.json", run_doc([bench(n, d, include_data=include_data) for n, d in base.items()]))
    c = write(tmp_path / "cur.json", run_doc([bench(n, d, include_data=include_data) for n, d in cur.items()]))
    return str(b), str(c)


def test_cli_exit_1_on_regression_and_0_without(tmp_path, capsys):
    b, c = _files(tmp_path, shift=1.5)
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 1
    line = next(l for l in out.splitlines() if "all_reduce" in l)
    assert "regression" in line and "<<" in line
    b, c = _files(tmp_path / "same", shift=1.0)
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 0 and "2 same" in out


def test_cli_new_and_missing_cases(tmp_path, capsys):
    b, c = _files(tmp_path, extra_case="test_new[x]", drop_case="test_broadcast[gloo-2p-1MB]")
    rc, out, err = run_cli(capsys, "compare", b, c, "--json")
    # A case the baseline has and the candidate lost (crashed, hung, removed) fails the gate.
    assert rc == 1
    assert ("1 case(s) the baseline has were lost by the candidate run (benchmarks/test_x.py::test_broadcast[gloo-2p-1MB]): "
            "crashed, hung or removed") in err
    doc = json.loads(out)
    verdicts = {case["name"]: case["verdict"] for case in doc["cases"]}
    assert verdicts == {"test_all_reduce[gloo-2p-1MB]": "same", "test_new[x]": "new",
                        "test_broadcast[gloo-2p-1MB]": "missing"}
    assert doc["counts"]["new"] == 1 and doc["counts"]["missing"] == 1 and doc["threshold"] == 0.1
    rc, out, _ = run_cli(capsys, "compare", b, c, "--allow-missing")
    assert rc == 0 and "allowed by --allow-missing" in " ".join(out.split())  # exit lines wrap at 160 columns
    # A new case alone is not a failure.
    b, c = _files(tmp_path / "new", extra_case="test_new[x]")
    assert run_cli(capsys, "compare", b, c)[0] == 0


def test_inconclusive_cases_are_counted_and_fail_only_when_asked(tmp_path, capsys):
    rng = np.random.default_rng(5)
    # 8 noisy rounds a side: the interval is far wider than the 10% threshold either way.
    noisy = [bench("test_noisy[gloo-2p-1MB]", sample(rng, 0.002, n=8, sigma=0.3))]
    b = write(tmp_path / "b.json", run_doc(noisy))
    c = write(tmp_path / "c.json", run_doc([bench("test_noisy[gloo-2p-1MB]", sample(rng, 0.002, n=8, sigma=0.3))]))
    rc, out, _ = run_cli(capsys, "compare", str(b), str(c))
    assert rc == 0 and "1 inconclusive" in out and "--fail-on-inconclusive makes them one" in out
    rc, out, _ = run_cli(capsys, "compare", str(b), str(c), "--fail-on-inconclusive")
    assert rc == 1 and "exit status 1 (--fail-on-inconclusive)" in out


def test_cli_markdown_and_threshold(tmp_path, capsys):
    b, c = _files(tmp_path, shift=1.2)
    rc, out, _ = run_cli(capsys, "compare", b, c, "--markdown")
    assert rc == 1
    assert out.startswith("### ddpbench compare: regressions found")
    assert "| case | baseline median (ms) |" in out and "**regression**" in out
    rc, out, _ = run_cli(capsys, "compare", b, c, "--markdown", "--threshold", "30%")
    assert rc == 0 and "no regression" in out


def test_cli_defaults_to_the_two_newest_saved_runs(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(4)
    machine_dir = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    for number, median in (("0001", 0.002), ("0002", 0.002), ("0003", 0.004)):
        write(machine_dir / f"{number}_run.json", run_doc([bench("case", sample(rng, median))]))
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_cli(capsys, "compare")
    assert rc == 1 and "0002_run.json" in out and "0003_run.json" in out
    rc, out, _ = run_cli(capsys, "compare", "1", "2")  # saved-run numbers
    assert rc == 0 and "0001_run.json" in out


def test_cli_chart_is_a_valid_png(tmp_path, capsys):
    mpimg = pytest.importorskip("matplotlib.image")
    b, c = _files(tmp_path, shift=1.5)
    rc, _, err = run_cli(capsys, "compare", b, c, "--chart", str(tmp_path / "ratios.png"))
    assert rc == 1 and "ratios.png" in err
    image = mpimg.imread(tmp_path / "ratios.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


# ---------------------------------------------------------------------------------------------
# bad input: exit 2 with a clear message
# ---------------------------------------------------------------------------------------------


def _bad(capsys, *argv):
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2
    assert err.startswith("ddpbench compare: error: ")
    return err


def test_missing_baseline_file(tmp_path, capsys):
    _, c = _files(tmp_path)
    assert "no such file" in _bad(capsys, "compare", str(tmp_path / "nope.json"), c)


def test_empty_file(tmp_path, capsys):
    _, c = _files(tmp_path)
    (tmp_path / "empty.json").write_text("")
    assert "empty" in _bad(capsys, "compare", str(tmp_path / "empty.json"), c)


def test_corrupt_json(tmp_path, capsys):
    b, _ = _files(tmp_path)
    (tmp_path / "bad.json").write_text(open(b).read()[:200])
    assert "not valid JSON" in _bad(capsys, "compare", b, str(tmp_path / "bad.json"))


@pytest.mark.parametrize("doc, message", [
    ({"hello": 1}, "not a pytest-benchmark result"),
    ([1, 2], "not a pytest-benchmark result"),
    ({"benchmarks": []}, "holds no benchmarks"),
    ({"benchmarks": [{"name": "x", "stats": {}}]}, "no stats.median"),
    ({"benchmarks": [{"name": "x", "stats": {"median": 1.0, "data": ["a"]}}]}, "not a list of round times"),
])
def test_json_that_is_not_a_usable_run(tmp_path, capsys, doc, message):
    b, _ = _files(tmp_path)
    write(tmp_path / "odd.json", doc)
    assert message in _bad(capsys, "compare", b, str(tmp_path / "odd.json"))


def test_no_saved_runs_and_a_single_saved_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "no saved run" in _bad(capsys, "compare")
    write(tmp_path / ".benchmarks" / "m" / "0001_x.json", run_doc([bench("a", [0.1, 0.2])]))
    err = _bad(capsys, "compare")
    assert "only one saved run" in err and "--benchmark-save-data" in err
    assert "no saved run matching '7'" in _bad(capsys, "compare", "7", "1")


def test_same_file_twice(tmp_path, capsys):
    b, _ = _files(tmp_path)
    assert "same file" in _bad(capsys, "compare", b, b)


def test_runs_without_raw_data_exit_2_unless_summary_stats_are_allowed(tmp_path, capsys):
    b, c = _files(tmp_path, shift=1.5, include_data=False)
    rc, out, err = run_cli(capsys, "compare", b, c)
    assert rc == 2
    assert "summary stats" in out and "--benchmark-save-data" in err and "--allow-summary-stats" in err
    rc, out, _ = run_cli(capsys, "compare", b, c, "--allow-summary-stats")
    assert rc == 1 and "regression" in out


def test_bad_option_values_are_usage_errors(tmp_path, capsys):
    b, c = _files(tmp_path)
    for argv in (["--threshold", "ten"], ["--confidence", "2"], ["--calibration", "maybe"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["compare", b, c, *argv])
        assert exc.value.code == 2
        assert "Traceback" not in capsys.readouterr().err


def test_console_script_is_installed():
    import shutil
    import sys

    script = os.path.join(os.path.dirname(sys.executable), "ddpbench")
    assert os.path.exists(script) or shutil.which("ddpbench")


PLAIN_BENCHMARK = """
def test_x(benchmark):
    benchmark(sum, range(100))
"""


def test_a_truncated_newest_saved_run_is_reported_not_read(pytester):
    from pytest_benchmark.utils import get_machine_id

    pytester.makepyfile(test_plain=PLAIN_BENCHMARK)
    for _ in range(2):
        assert pytester.runpytest_subprocess("--benchmark-autosave", "-p", "no:cacheprovider").ret == 0
    runs = sorted((pytester.path / ".benchmarks" / get_machine_id()).glob("*.json"))
    newest = runs[-1]
    newest.write_text(newest.read_text()[:300])  # a save cut short
    # pytest-benchmark alone would warn and compare against the older run: a usage error instead.
    result = pytester.runpytest_subprocess("--benchmark-compare", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--benchmark-compare: the newest saved run cannot be read: *{newest.name}: "
                                 f"not valid JSON*truncated by an interrupted save*compare against an "
                                 f"older run without saying so*"])
    # Naming a readable run still works.
    assert pytester.runpytest_subprocess("--benchmark-compare=0001", "-p", "no:cacheprovider").ret == 0
    # ddpbench compare and report name the file and the fix; nothing is rewritten.
    for command in (["compare"], ["report", "--no-chart"]):
        out = subprocess.run([sys.executable, "-m", "ddpbench.cli", *command], cwd=pytester.path,
                             capture_output=True, text=True)
        assert out.returncode == 2 and newest.name in out.stderr and "Delete or restore it" in out.stderr
    assert len(newest.read_text()) == 300
