"""Extra looks: after the planned looks, an inconclusive A/B case takes more pairs while its time
cap allows, and those looks can end it only as same or not-slower (their level is 0: the planned
looks spent all of alpha). The engine runs here on fake pools whose blocks are drawn from seeded
lognormal noise, so what the loop decides is exact and fast."""

import math
import random

from ddpbench.engine.timing import RoundPlan
from ddpbench.gates import stats
from ddpbench.gates.ab.pairs_loop import EXTRA_LOOK_LEVEL, ABSettings, run_case

from helpers.fake_pools import ROUND_S, fake_pools as _pools


# Two extra looks at most (144 and 192 pairs): each look's bootstrap grows with the pairs squared.
SETTINGS = ABSettings(block_time_s=3 * ROUND_S, max_time_s=600.0, max_extended_pairs=192)


def _case(seed: int, noise: float, slower: float = 1.0, settings: ABSettings = SETTINGS):
    return run_case(_pools(seed, noise, slower), workload=None, plan=RoundPlan(warmup=1), settings=settings,
                    timeout_s=60, case_id="extra-looks", seed=seed)


def test_the_extra_looks_come_after_the_planned_ones_and_add_48_pairs_each():
    settings = ABSettings()
    assert settings.stage_sizes(2) == [12] * 8
    assert settings.extra_stage_sizes(2) == [48] * 4  # 96 planned + 4 x 48 = 288 pairs at most
    assert settings.extra_stage_sizes(1) == [48] * 4
    assert ABSettings(max_extended_pairs=96).extra_stage_sizes(2) == []  # no room: no extra look
    assert ABSettings(max_extended_pairs=150).extra_stage_sizes(2) == [48]


def test_an_extra_look_cannot_reject():
    # Overwhelming evidence of a 50% slowdown: at any planned level a regression, at an extra
    # look's level 0 the interval alone speaks, and it lies above 1 + threshold: inconclusive.
    rng = random.Random(7)
    base = [math.exp(rng.gauss(0, 0.05)) for _ in range(96)]
    cand = [b * 1.5 for b in base]
    assert stats.analyse_pairs(base, cand, 0.05, alpha=0.001).verdict == "regression"
    assert stats.analyse_pairs(base, cand, 0.05, alpha=EXTRA_LOOK_LEVEL).verdict == "inconclusive"
    # ... while identical sides still end same at level 0.
    assert stats.analyse_pairs(base, list(base), 0.05, alpha=EXTRA_LOOK_LEVEL).verdict == "same"


def test_identical_sides_inconclusive_after_the_planned_looks_are_decided_by_extra_looks():
    # Noisy blocks (seeded): the 96 planned pairs leave the case undecided, the second extra
    # look's pairs (192 in all) rule out a slowdown of the threshold at its stop level.
    outcome = _case(seed=5, noise=0.2)
    summary = outcome.summary({})
    assert outcome.result.verdict == stats.NOT_SLOWER and len(outcome.pairs) == 192
    assert summary["planned_looks"] == 8 and summary["extra_looks"] == 2
    assert list(outcome.levels_applied[8:]) == [EXTRA_LOOK_LEVEL] * 2
    assert all(level > 0 for level in outcome.levels_applied[:8])
    # Every look, extra ones too, had its stop level (growing with the pairs: stats.stop_levels).
    assert summary["stop_level_per_look"] == list(SETTINGS.stop_level_per_look(2))
    assert summary["stop_level"] == summary["stop_level_per_look"][-1]
    # negative control: the same case without room for extra looks ends inconclusive at 96 pairs
    capped = _case(seed=5, noise=0.2, settings=ABSettings(block_time_s=3 * ROUND_S, max_time_s=600.0,
                                                          max_extended_pairs=96))
    assert len(capped.pairs) == 96 and capped.result.verdict == "inconclusive"
    assert capped.summary({})["extra_looks"] == 0


def test_a_case_decided_at_a_planned_look_takes_no_extra_look():
    outcome = _case(seed=0, noise=0.02)
    assert outcome.result.verdict == "same" and len(outcome.pairs) == 12
    assert outcome.summary({})["extra_looks"] == 0


def test_a_slowdown_found_only_in_extra_looks_stays_inconclusive_never_regression():
    # 8% slower in very noisy blocks: not shown by the planned looks, and never a regression
    # after them; the interval, above 1 + threshold or across it, keeps it from not-slower.
    outcome = _case(seed=0, noise=0.6, slower=1.08,
                    settings=ABSettings(block_time_s=3 * ROUND_S, max_time_s=600.0, max_extended_pairs=144))
    assert len(outcome.pairs) == 144 and outcome.levels_applied[-1] == EXTRA_LOOK_LEVEL
    assert outcome.result.verdict == "inconclusive" and outcome.result.ci_high > 1.05


def test_a_cap_that_ends_the_planned_looks_leaves_no_extra_look():
    # A cap of 0 s: the first stage always runs, then nothing fits; that look spends all of alpha.
    settings = ABSettings(block_time_s=3 * ROUND_S, max_time_s=0.0)
    outcome = _case(seed=0, noise=0.5, settings=settings)
    assert len(outcome.pairs) == 12 and len(outcome.levels_applied) == 1
    assert outcome.levels_applied[0] == stats.level_for_last_look(settings.alpha, 8, 1) == settings.alpha
