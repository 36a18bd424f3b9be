"""benchmarks/raw/ab_reliability.py: which recorded cases the pool-pair rule held back."""

import pytest

from raw_scripts import load_raw_script


@pytest.fixture(scope="module")
def reliability():
    return load_raw_script("ab_reliability")


def _ab(ratio, interval, each, p=0.001, verdict="inconclusive"):
    return {"verdict": verdict, "ratio": ratio, "ratio_ci": list(interval), "ratio_per_pool_pair": list(each),
            "p_value": p, "threshold": 0.05, "alpha": 0.01, "alpha_at_last_look": 0.0081}


def test_a_case_is_held_back_by_the_pool_pair_rule_only_when_everything_else_says_regression(reliability):
    held = reliability._held_back
    assert held(_ab(1.086, (1.045, 1.126), (1.221, 0.941)))  # one pool pair's own offset
    assert held(_ab(0.95, (0.925, 0.977), (0.905, 0.997)))  # the improvement mirrored
    assert not held(_ab(1.086, (0.99, 1.126), (1.221, 0.941)))  # the interval reaches 1: not the rule's doing
    assert not held(_ab(1.086, (1.045, 1.126), (1.221, 0.941), p=0.009))  # not significant at the last look
    assert not held(_ab(1.04, (1.01, 1.07), (1.08, 1.0)))  # under the threshold overall
    assert not held(_ab(1.086, (1.045, 1.126), (1.09,)))  # one pool pair: the rule does not apply
    assert not held(_ab(1.086, (1.045, 1.126), (1.09, 1.08), verdict="regression"))
