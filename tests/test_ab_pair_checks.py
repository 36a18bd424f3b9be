"""benchmarks/raw/ab_pair_checks.py: order effect, side bias and correlation of recorded A/A pairs."""

import importlib.util
import json
import pathlib
import random
import sys

import pytest

RAW = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "raw"


@pytest.fixture(scope="module")
def checks():
    sys.path.insert(0, str(RAW))  # the script imports ab_replay from its own folder
    try:
        spec = importlib.util.spec_from_file_location("ab_pair_checks", RAW / "ab_pair_checks.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(RAW))


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
