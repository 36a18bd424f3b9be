"""lab/reference/ab_gate_model.py's engine loop and ab_stop_error.py's equal split (the rule of
2026-11-26 that the models compare today's with)."""

import itertools

import pytest

from ddpbench.gates.ab.pairs_loop import ABSettings

from helpers.lab_scripts import load_lab_script

LOOKS = tuple(itertools.accumulate(ABSettings().stage_sizes(2) + ABSettings().extra_stage_sizes(2)))


def test_the_equal_split_is_one_level_for_every_look():
    levels = load_lab_script("ab_stop_error").equal_stop_levels(0.025, LOOKS)
    assert len(set(levels)) == 1 and levels[0] == pytest.approx(0.0041, abs=5e-5)


def test_the_models_case_takes_the_looks_until_it_decides_or_its_cap_leaves_no_room():
    model = load_lab_script("ab_gate_model")
    analysis = lambda n: model.ANALYSIS_S_AT_288 * (n / 288) ** 2  # noqa: E731
    far = [False] * len(LOOKS)  # no look forecast to decide
    # Decided at the third look (36 pairs), analysed at every look or only at the deciding one.
    full = model.CASE_S + 36 * 0.5 + sum(analysis(n) for n in (12, 24, 36))
    assert model.case_run(model.DrawnCase(2, far), LOOKS, 0.5, 1e9, lazy=False) == (True, pytest.approx(full))
    assert model.case_run(model.DrawnCase(2, far), LOOKS, 0.5, 1e9, lazy=True) == (
        True, pytest.approx(model.CASE_S + 18 + analysis(36)))
    # Never deciding: all 288 pairs without a cap; with a 20 s cap the next 12 pairs (6 s) stop fitting.
    assert model.case_run(model.DrawnCase(None, far), LOOKS, 0.5, 1e9, lazy=True)[0] is False
    decided, seconds = model.case_run(model.DrawnCase(None, far), LOOKS, 0.5, 20.0, lazy=True)
    assert decided is False and seconds == pytest.approx(model.CASE_S + 24 * 0.5 + analysis(24))


def test_the_models_case_borrows_past_its_cap_only_when_nearly_decided():
    model = load_lab_script("ab_gate_model")
    analysis = lambda n: model.ANALYSIS_S_AT_288 * (n / 288) ** 2  # noqa: E731
    # Decides at the third look (36 pairs, 18 s of pairs), past a 20 s cap (3 s set-up + 12 s by
    # look 2): the look at 24 pairs forecasts it, and 10 s of borrowed time covers the next 12 pairs.
    near = model.DrawnCase(2, [False, True])
    assert model.case_run(near, LOOKS, 0.5, 20.0, lazy=True, borrow_s=10.0) == (
        True, pytest.approx(model.CASE_S + 18 + analysis(24) + analysis(36)))
    # negative controls: nothing to borrow, or no forecast to earn it: the cap ends it at 24 pairs
    assert model.case_run(near, LOOKS, 0.5, 20.0, lazy=True)[0] is False
    assert model.case_run(model.DrawnCase(2, [False, False]), LOOKS, 0.5, 20.0, lazy=True, borrow_s=10.0)[0] is False
