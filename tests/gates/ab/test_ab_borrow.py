"""Borrowed time: a case whose time cap ends while it is nearly decided takes its next looks on
time borrowed from the run budget (gates/ab/budget.py), as extra looks (they can end it only as
same or not-slower); a case far from deciding does not, so the budget goes to the case its pairs
can decide. The loop runs on fake pools whose blocks are drawn from seeded lognormal noise, so
what it decides is exact and fast."""

import math
import random

import pytest

from ddpbench.engine.timing import RoundPlan
from ddpbench.gates import stats
from ddpbench.gates.ab.budget import RunBudget, case_borrow
from ddpbench.gates.ab.pairs_loop import EXTRA_LOOK_LEVEL, ABSettings, run_case

from helpers.fake_pools import ROUND_S, fake_pools


def _case(seed: int, noise: float, borrow_s: float, slower: float = 1.0):
    # A cap of 0 s: the first stage always runs, and every later look is on borrowed time.
    settings = ABSettings(block_time_s=3 * ROUND_S, max_time_s=0.0, borrow_time_s=borrow_s, max_extended_pairs=96)
    return run_case(fake_pools(seed, noise, slower), workload=None, plan=RoundPlan(warmup=1), settings=settings,
                    timeout_s=60, case_id="borrow", seed=seed)


def test_a_nearly_decided_case_borrows_the_look_that_decides_it():
    outcome = _case(seed=3, noise=0.04, borrow_s=600.0)
    assert outcome.result.verdict == "same" and len(outcome.pairs) == 24
    assert outcome.borrowed_looks == 1
    # The look the cap ended spent what was left of alpha; the borrowed one is an extra look.
    assert outcome.levels_applied == (ABSettings().alpha, EXTRA_LOOK_LEVEL)
    summary = outcome.summary({})
    assert summary["borrowed_looks"] == 1 and summary["borrow_time_s"] == 600.0
    # negative control: nothing to borrow, the same pairs end inconclusive at the cap
    capped = _case(seed=3, noise=0.04, borrow_s=0.0)
    assert capped.result.verdict == "inconclusive" and len(capped.pairs) == 12 and capped.borrowed_looks == 0


def test_a_case_far_from_deciding_leaves_the_budget_to_the_others():
    # Identical sides, but pairs so noisy that 24 pairs could not rule out 5%: no borrowing.
    outcome = _case(seed=1, noise=0.1, borrow_s=600.0)
    assert outcome.result.verdict == "inconclusive" and len(outcome.pairs) == 12
    assert outcome.borrowed_looks == 0


def test_a_borrowed_look_never_flags_a_regression():
    # 3% slower, within the threshold: a nearly decided case borrows; whatever its borrowed looks
    # say, none is a regression (their level is 0), and the planned one tested at alpha.
    verdicts, borrowed = [], []
    for seed in range(4):
        outcome = _case(seed=seed, noise=0.04, borrow_s=600.0, slower=1.03)
        verdicts.append(outcome.result.verdict)
        borrowed.append(outcome.borrowed_looks)
        assert all(level == EXTRA_LOOK_LEVEL for level in outcome.levels_applied[1:])
    assert "regression" not in verdicts and any(borrowed)


def test_the_forecast_bound_follows_the_pairs_centre_and_spread():
    rng = random.Random(11)
    logs = [rng.gauss(0.0, 0.05) for _ in range(24)]
    now = stats.signed_rank_upper_bound(logs, 0.002)
    later = stats.projected_stop_bound(logs, 0.002, 48, 0.003)
    centre = float(stats.hodges_lehmann(logs))
    # Twice the pairs at a slightly easier level: the bound's distance above the centre shrinks
    # by sqrt(2) and by the levels' quantiles.
    from scipy.stats import norm
    expected = centre + (now - centre) * norm.isf(0.003) / norm.isf(0.002) / math.sqrt(2)
    assert math.log(later) == pytest.approx(expected)
    assert math.log(later) < now
    # A shifted sample moves the forecast by the shift.
    shifted = stats.projected_stop_bound([x + 0.1 for x in logs], 0.002, 48, 0.003)
    assert math.log(shifted) == pytest.approx(expected + 0.1)
    # Too few pairs for any bound at the level (2^-3 > 0.002): no forecast either.
    assert stats.projected_stop_bound(logs[:3], 0.002, 12, 0.003) == math.inf
    with pytest.raises(ValueError, match="more pairs next"):
        stats.projected_stop_bound(logs, 0.002, 24, 0.003)


def test_a_case_may_borrow_one_more_share_never_past_the_budget():
    assert case_borrow(420, 0, 7) == pytest.approx(60)  # its own 60 s and 60 s more
    assert case_borrow(420, 300, 2) == pytest.approx(60)  # 120 s left: 60 s each, the first may take all
    assert case_borrow(420, 400, 1) == 0.0  # the last case has all that is left already
    assert case_borrow(420, 500, 3) == 0.0  # spent
    # --dist-ab-max-time still caps each case in all.
    assert case_borrow(420, 0, 7, max_time_s=90) == pytest.approx(30)
    assert case_borrow(420, 0, 7, max_time_s=60) == 0.0


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_borrowed_time_comes_out_of_the_later_cases_shares():
    clock = _Clock()
    budget = RunBudget(300, planned=["a", "b", "c"], clock=clock)
    assert budget.cap_for("a") == pytest.approx(100) and budget.borrow_for("a") == pytest.approx(100)
    clock.now += 180  # "a" was nearly decided at its cap and borrowed 80 s
    budget.finish("a")
    assert budget.cap_for("b") == pytest.approx(60)  # (300 - 180) / 2
    assert budget.borrow_for("b") == pytest.approx(60)
