"""lab/reference/ab_reliability.py: which recorded cases the pool-pair rule or the block-minima rule held back."""

import pytest

from helpers.lab_scripts import load_lab_script


@pytest.fixture(scope="module")
def reliability():
    return load_lab_script("ab_reliability")


def _ab(ratio, interval, each, p=0.001, verdict="inconclusive", minima=None):
    ab = {"verdict": verdict, "ratio": ratio, "ratio_ci": list(interval), "ratio_per_pool_pair": list(each),
          "p_value": p, "threshold": 0.05, "alpha": 0.01, "alpha_at_last_look": 0.0081}
    if minima is not None:
        ab["ratio_of_block_minima"] = minima
    return ab


def test_a_case_is_held_back_by_a_rule_only_when_everything_else_says_regression(reliability):
    held = reliability.held_back_by
    assert held(_ab(1.086, (1.045, 1.126), (1.221, 0.941))) == {"pool pair"}  # one pool pair's own offset
    assert held(_ab(0.95, (0.925, 0.977), (0.905, 0.997))) == {"pool pair"}  # the improvement mirrored
    assert held(_ab(1.086, (0.99, 1.126), (1.221, 0.941))) == set()  # the interval reaches 1: no rule's doing
    assert held(_ab(1.086, (1.045, 1.126), (1.221, 0.941), p=0.009)) == set()  # not significant at the last look
    assert held(_ab(1.04, (1.01, 1.07), (1.08, 1.0))) == set()  # under the threshold overall
    assert held(_ab(1.086, (1.045, 1.126), (1.09,))) == set()  # one pool pair: the rule does not apply
    assert held(_ab(1.086, (1.045, 1.126), (1.09, 1.08), verdict="regression")) == set()
    # Broadcast 100 MB: every pool pair slower, the fastest rounds not; or both rules at once.
    assert held(_ab(1.18, (1.12, 1.25), (1.18, 1.18), minima=1.003)) == {"block minima"}
    assert held(_ab(0.9, (0.86, 0.94), (0.88, 0.92), minima=0.99)) == {"block minima"}
    assert held(_ab(1.18, (1.12, 1.25), (1.3, 1.02), minima=1.01)) == {"pool pair", "block minima"}
    assert held(_ab(1.18, (1.12, 1.25), (1.18, 1.18), minima=1.07)) == set()
