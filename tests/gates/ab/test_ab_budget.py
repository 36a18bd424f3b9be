"""gates/ab/budget.py (--dist-ab-run-budget): each case's time cap is its share of what the run has
left, so the time cases that decide early leave goes to the ones that do not."""

import pytest

from ddpbench.gates.ab.budget import RunBudget, case_cap


def test_a_case_gets_an_even_share_of_what_is_left():
    assert case_cap(420, 0, 7) == pytest.approx(60)
    assert case_cap(420, 120, 5) == pytest.approx(60)  # two cases used their 60 s: the rest keep theirs
    assert case_cap(420, 20, 5) == pytest.approx(80)  # two decided in 10 s each: 40 s more for each other
    assert case_cap(420, 400, 1) == pytest.approx(20)  # the last case gets all that is left
    assert case_cap(420, 500, 3) == 0.0  # spent: the first stage only
    # --dist-ab-max-time still caps every case.
    assert case_cap(420, 20, 5, max_time_s=60) == pytest.approx(60)
    assert case_cap(420, 300, 5, max_time_s=60) == pytest.approx(24)
    for bad in ((0, 0, 1), (420, 0, 0)):
        with pytest.raises(ValueError, match="run budget"):
            case_cap(*bad)


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_budget_follows_the_run_case_by_case():
    clock = _Clock()
    budget = RunBudget(300, planned=["a", "b", "c"], clock=clock)
    assert budget.cap_for("a") == pytest.approx(100)  # its clock starts with the first case
    clock.now += 10  # "a" decided after 10 s
    budget.finish("a")
    assert budget.cap_for("b") == pytest.approx(145)  # (300 - 10) / 2
    clock.now += 145  # "b" used its whole share
    budget.finish("b")
    assert budget.cap_for("c") == pytest.approx(145)
    assert budget.spent_s() == pytest.approx(155)
    # A case that was not planned (a second call in one test, say) still counts as one left.
    assert budget.cap_for("d") == pytest.approx(72.5)  # c and d share what is left
    # Negative control: without finish() the shares never grow.
    stuck = RunBudget(300, planned=["a", "b", "c"], clock=_Clock())
    stuck.cap_for("a")
    assert stuck.cap_for("b") == pytest.approx(100)
