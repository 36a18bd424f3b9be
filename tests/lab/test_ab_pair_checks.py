"""lab/reference/ab_pair_checks.py: order effect, side bias and correlation of recorded A/A pairs."""

import json
import math
import random

import pytest

from helpers.lab_scripts import load_lab_script


@pytest.fixture(scope="module")
def checks():
    return load_lab_script("ab_pair_checks")


def _case(name, slower, pairs=40, per_block=5, seed=1):
    rng = random.Random(seed)
    baseline = [0.010 * rng.uniform(0.97, 1.03) for _ in range(pairs * per_block)]
    candidate = [0.010 * slower * rng.uniform(0.97, 1.03) for _ in range(pairs * per_block)]
    ab = {"pairs": pairs, "rounds_per_block": per_block, "threshold": 0.05, "verdict": "same",
          "pool_pair_of_pair": [i % 2 for i in range(pairs)], "baseline": {"round_times": baseline},
          "order": " ".join("AB" if i % 4 in (0, 3) else "BA" for i in range(pairs))}
    return {"name": name, "stats": {"data": candidate}, "extra_info": {"ab": ab}}


def test_a_side_bias_shows_in_both_orders_and_on_every_pool_pair(tmp_path, checks, capsys):
    cases = [_case(f"test_x[gloo-2p-{i}MB]", 1.02, seed=i) for i in range(3)]
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": cases}))
    checks.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "3 cases" in out and "cases with a positive median log ratio: 3 of 3" in out
    ab, ba = (float(part.split()[0]) for part in out.split("AB pairs ")[1].split("BA pairs ")[:2])
    assert 0.01 < ab < 0.03 and 0.01 < ba < 0.03  # log(1.02) ~ 0.0198 whichever side ran first
    assert "lag-1 autocorrelation within a pool pair" in out


def test_lag1_autocorrelation_tells_alternation_from_drift(checks):
    assert checks.lag1_autocorrelation([1.0, -1.0] * 20) < -0.9
    assert checks.lag1_autocorrelation([float(i) for i in range(40)]) > 0.9
    assert checks.lag1_autocorrelation([1.0] * 10) == 0.0


def _estimate_case(name, log_ratio, se, seed):
    """A recorded case whose recorded estimate is exp(log_ratio) with a 95% interval of +-1.96 se."""
    case = _case(name, 1.0, seed=seed)
    case["extra_info"]["ab"].update(ratio=math.exp(log_ratio), ratio_ci=[
        math.exp(log_ratio - 1.959964 * se), math.exp(log_ratio + 1.959964 * se)])
    return case


def test_a_whole_case_offset_shows_as_estimates_spread_beyond_their_own_error(tmp_path, checks, capsys):
    # Case "drifting": its six runs land at +-0.03 with a standard error of 0.01 each (z = +-3);
    # case "steady": +-0.005 with the same error (z = +-0.5), what pairs alone would give.
    for run in range(6):
        sign = 1 if run % 2 else -1
        cases = [_estimate_case("test_x[drifting]", 0.03 * sign, 0.01, seed=run),
                 _estimate_case("test_x[steady]", 0.005 * sign, 0.01, seed=run)]
        (tmp_path / f"run{run:02d}.json").write_text(json.dumps({"benchmarks": cases}))
    zs, per_case = checks.between_run_dispersion(checks.recorded_estimates(str(tmp_path)))
    assert sorted(round(abs(z), 6) for z in zs) == [0.5] * 6 + [3.0] * 6
    runs, spread, se, offset = per_case["test_x[drifting]"]
    assert runs == 6 and se == pytest.approx(0.01) and spread == pytest.approx(math.sqrt(6 * 0.03 ** 2 / 5))
    assert offset == pytest.approx(math.sqrt(spread ** 2 - 0.01 ** 2))
    assert per_case["test_x[steady]"][3] == 0.0  # spread within its own error: no offset implied
    checks.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "|z| > 2.58 in 6 of 12 (expected 0.1)" in out
    assert "test_x[drifting]: 6 runs" in out


def test_cases_seen_in_fewer_than_three_runs_are_left_out_of_the_spread(checks):
    zs, per_case = checks.between_run_dispersion({"a": [(0.1, 0.01), (-0.1, 0.01)],
                                                  "b": [(0.0, 0.01)] * 3})
    assert list(per_case) == ["b"] and zs == [0.0, 0.0, 0.0]


def _pool_pair_case(name, offsets, pairs_per_pool_pair=30, seed=0):
    """(name, baseline blocks, candidate blocks, pool pair per pair): pool pair k's candidate
    blocks off by ``offsets[k]`` (a ratio), every block with +-3% noise."""
    rng = random.Random(seed)
    baseline, candidate, pools = [], [], []
    for k, offset in enumerate(offsets):
        for _ in range(pairs_per_pool_pair):
            baseline.append(rng.uniform(0.97, 1.03))
            candidate.append(offset * rng.uniform(0.97, 1.03))
            pools.append(k)
    return name, baseline, candidate, pools


def test_pool_pair_offsets_are_zero_for_pools_that_differ_only_by_noise(checks):
    cases = [_pool_pair_case("test_x[gloo-2p-10MB]", [1.0, 1.0, 1.0, 1.0], seed=s) for s in range(20)]
    tau, df, largest = checks.pool_pair_offsets(cases)["10MB"]
    assert df == 60 and tau < 0.005 and largest < 0.02


def test_a_pool_running_off_its_twin_for_a_case_shows_as_pool_pair_offset(checks):
    # One pool pair 10% off the other in every case: between the two pool pair means sd ~0.067.
    cases = [_pool_pair_case("test_x[gloo-2p-1MB]", [1.0, 1.10], seed=s) for s in range(20)]
    cases += [_pool_pair_case("test_x[gloo-2p-100MB]", [1.0, 1.0], seed=s) for s in range(20)]
    offsets = checks.pool_pair_offsets(cases)
    tau, df, largest = offsets["1MB"]
    assert df == 20 and 0.05 < tau < 0.08 and 0.04 < largest < 0.06  # each pool pair ~4.8% off the mean
    assert offsets["100MB"][0] < 0.005
    # A single pool pair says nothing about offsets between pool pairs.
    assert checks.pool_pair_offsets([_pool_pair_case("test_x[gloo-2p-1MB]", [1.2])]) == {}


def test_the_pool_pair_offsets_interval_resamples_cases(checks, capsys):
    offset = [_pool_pair_case("test_x[gloo-2p-1MB]", [1.0, 1.10], seed=s) for s in range(20)]
    noise = [_pool_pair_case("test_x[gloo-2p-100MB]", [1.0, 1.0, 1.0, 1.0], seed=s) for s in range(20)]
    intervals = checks.pool_pair_offset_intervals(offset + noise)
    low, high = intervals["1MB"]
    assert 0.05 < low <= checks.pool_pair_offsets(offset)["1MB"][0] <= high < 0.08
    assert intervals["100MB"][1] < 0.01
    assert checks.pool_pair_offset_intervals(offset + noise) == intervals  # seeded
