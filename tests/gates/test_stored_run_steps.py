"""The stored-run gate's steps, each a value read without the report's text: the drift plan (whether
and how the CPU cases are corrected), the settings check, one case's comparison and the facts that
kept a case from it."""

from __future__ import annotations

import pytest

from helpers.benchjson import bench, run_doc, write
from ddpbench.gates import stored_run_gate as gate
from ddpbench.gates.verdict_words import Verdict
from ddpbench.storage.runs import load_run

STEADY = [0.010, 0.0101, 0.0099, 0.0100, 0.0102, 0.0098] * 4


def _runs(tmp_path, cur_probe=0.001, base_info=None, cur_info=None, factor=1.0):
    base = write(tmp_path / "b.json", run_doc([bench("t", STEADY, base_info)], probe_s=0.001))
    cur = write(tmp_path / "c.json", run_doc([bench("t", [t * factor for t in STEADY], cur_info)],
                                             probe_s=cur_probe))
    return load_run(base), load_run(cur)


def test_a_drift_past_the_tolerance_is_planned_as_a_correction_by_the_probe_ratio(tmp_path):
    base, cur = _runs(tmp_path, cur_probe=0.0012)
    plan = gate.plan_drift(base, cur, "auto")
    assert plan.drift == pytest.approx(1.2) and plan.normalised
    assert plan.correction.factor == pytest.approx(1.2) and plan.correction.refused is None
    assert plan.warnings == () and len(plan.notes) == 1
    never = gate.plan_drift(base, cur, "never")
    assert never.drift == pytest.approx(1.2) and not never.normalised and never.correction == gate.Correction()


def test_a_drift_within_the_tolerance_or_outside_the_band_is_not_corrected(tmp_path):
    base, cur = _runs(tmp_path, cur_probe=0.00105)
    within = gate.plan_drift(base, cur, "auto")
    assert not within.normalised and within.correction == gate.Correction()
    assert gate.plan_drift(base, cur, "always").normalised  # asked for: divided even so
    base, cur = _runs(tmp_path, cur_probe=0.002)  # 2x: past the band a probe may correct
    refused = gate.plan_drift(base, cur, "auto").correction
    assert refused.factor == 1.0 and refused.refused == "calibration 2.00x, outside 0.80-1.25"
    assert gate.plan_drift(base, cur, "never").correction.refused is None  # raw, with a warning


@pytest.mark.parametrize("judging, message", [
    (gate.Judging(threshold=-0.1), "--threshold must be >= 0"),
    (gate.Judging(confidence=1.0), "--confidence must be between 0 and 1"),
    (gate.Judging(memory_tolerance=-1.0), "--memory-tolerance must be >= 0"),
    (gate.Judging(calibration="sometimes"), "--calibration must be auto, always or never"),
])
def test_settings_out_of_range_are_refused_before_any_run_is_read(judging, message):
    gate.check_settings(gate.Judging())
    with pytest.raises(gate.CompareError, match=message):
        gate.check_settings(judging)


def test_one_case_comparison_returns_its_verdict_and_the_facts_that_kept_it_from_comparing(tmp_path):
    base, cur = _runs(tmp_path, base_info={"world_size": 2}, cur_info={"world_size": 4}, factor=1.5)
    name = next(iter(cur.cases))
    args = (name, base.cases[name], cur.cases[name], gate.Correction())
    verdict, refused = gate.compare_case(*args, gate.Judging())
    assert refused == {"world_size"} and verdict.verdict is Verdict.INCONCLUSIVE
    assert verdict.structure.verdict is Verdict.NOT_COUNTED
    verdict, refused = gate.compare_case(*args, gate.Judging(allowed=frozenset({"world_size"})))
    assert refused == set() and verdict.verdict is Verdict.REGRESSION and verdict.reason.startswith("unlike, allowed")
    raw = gate.raw_ratio(base.cases[name], cur.cases[name], 0.95, 0)
    assert raw.method == "bootstrap+mann-whitney" and raw.ratio == pytest.approx(1.5)
    assert (raw.baseline_rounds, raw.current_rounds) == (len(STEADY), len(STEADY))
