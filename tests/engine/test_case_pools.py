"""--dist-case-pools: a case's rounds split across fresh pools, in turn (engine/timing.py
RoundPlan.share, fixture.py): the rounds add up to what one pool would record, the exact
measurements run in the first pool only, and each pool's count and median are saved
(extra_info pool_split) for the stored gate's run-to-run component."""

from __future__ import annotations

import json

import pytest

from ddpbench.engine.timing import RoundPlan

BENCH = '''
import time

import ddpbench


def setup(ctx):
    return None


def nap(state):
    time.sleep(0.002)


def test_sleepy(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, nap))
'''


def test_a_plans_share_adds_up_and_keeps_the_exact_measurements_in_the_first_pool():
    plan = RoundPlan(rounds=7, min_time_s=1.0, min_rounds=5, max_rounds=1000, precision=0.01, pools=2)
    shares = [plan.share(2, j) for j in range(2)]
    assert [s.rounds for s in shares] == [4, 3] and all(s.pools == 1 for s in shares)
    assert shares[0].census and shares[0].memory_census and shares[0].numerics_steps == plan.numerics_steps
    assert not (shares[1].census or shares[1].memory_census or shares[1].numerics_steps or shares[1].variant_rounds)
    timed = RoundPlan(rounds=0, min_time_s=1.0, min_rounds=5, precision=0.01).share(2, 1)
    assert (timed.min_time_s, timed.min_rounds, timed.max_rounds) == (0.5, 3, 500)
    assert timed.precision == pytest.approx(0.01 * 2 ** 0.5)  # the two pools' median as precise as one's
    assert plan.share(1, 0) is plan


@pytest.mark.case_pools
def test_a_case_measured_in_two_pools_saves_each_pools_rounds(pytester):
    pytester.makepyfile(test_pools=BENCH)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dist-world-sizes=2", "--dist-rounds=7",
                                           "--dist-warmup=1", "-m", "not gpu", "--benchmark-json=out.json",
                                           timeout=180)
    assert result.ret == 0, result.stdout.str()
    [case] = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    split = case["extra_info"]["pool_split"]
    assert split["count"] == 2 and split["rounds"] == [4, 3] and len(case["stats"]["data"]) == 7
    assert all(m > 0.002 for m in split["medians_s"])
    assert case["extra_info"]["census"]["ops_counted"] >= 1  # counted once, in the first pool
