"""A look that cannot decide needs no bootstrap interval when more pairs follow (stats.may_decide):
the engine skips it there, so a case that takes many looks spends its time on pairs, and every
verdict stays what the full analysis at every look gives."""

import math

import numpy as np
import pytest

from ddpbench.engine.timing import RoundPlan
from ddpbench.gates import stats
from ddpbench.gates.ab.pairs_loop import ABSettings, run_case

from helpers.fake_pools import ROUND_S, fake_pools

SETTINGS = ABSettings(block_time_s=3 * ROUND_S, max_time_s=600.0, max_extended_pairs=192)


def _case(seed, noise, slower=1.0):
    return run_case(fake_pools(seed, noise, slower), workload=None, plan=RoundPlan(warmup=1), settings=SETTINGS,
                    timeout_s=60, case_id="lazy-interval", seed=seed)


@pytest.mark.parametrize("pools", [1, 2])
def test_a_look_that_may_not_decide_is_inconclusive_whatever_the_interval(pools):
    # Seeded pair sets from identical sides to clear slowdowns and speed-ups, quiet to noisy, at
    # the levels the engine uses: wherever may_decide says no, the full analysis is inconclusive.
    rng = np.random.default_rng(11)
    said_no = decided = 0
    for trial in range(240):
        n = int(rng.choice([4, 12, 24, 48]))
        shift = float(rng.choice([0.0, 0.03, 0.05, 0.1, 0.3, -0.1, -0.3]))
        noise = float(rng.choice([0.01, 0.05, 0.2]))
        base = list(np.exp(rng.normal(0.0, 0.01, n)))
        cand = [b * math.exp(shift + noise * z) for b, z in zip(base, rng.standard_normal(n))]
        minima = [b * 0.9 for b in base], [c * 0.9 for c in cand]
        kwargs = dict(pool_pair_of=[i % pools for i in range(n)], baseline_minima=minima[0],
                      candidate_minima=minima[1], stop_level=float(rng.choice([0.0005, 0.004, 0.025])))
        alpha = float(rng.choice([1e-7, 0.001, 0.01]))
        verdict = stats.analyse_pairs(base, cand, 0.05, alpha, **kwargs).verdict
        decided += verdict != "inconclusive"
        if not stats.may_decide(base, cand, 0.05, alpha, **kwargs):
            said_no += 1
            assert verdict == "inconclusive", (trial, n, shift, noise)
    assert said_no > 40 and decided > 40  # both kinds of look were tried


def test_the_engine_bootstraps_only_the_looks_that_may_decide(monkeypatch):
    # Noisy identical sides that end not-slower at the 10th look (192 pairs): before, every look
    # ran the bootstrap; now only the looks that may decide do, with the same verdict and pairs.
    calls = []
    real = stats.bootstrap_interval

    def counted(groups, confidence=stats.DEFAULT_CONFIDENCE):
        calls.append(sum(len(g) for g in groups))
        return real(groups, confidence)

    monkeypatch.setattr(stats, "bootstrap_interval", counted)
    outcome = _case(seed=5, noise=0.2)
    assert outcome.result.verdict == stats.NOT_SLOWER and len(outcome.pairs) == 192
    assert len(outcome.levels_applied) == 10
    assert calls[-1] == 192 and len(calls) < 4


@pytest.mark.parametrize("seed, noise, slower", [(3, 0.05, 1.2), (1, 0.1, 1.0), (2, 0.15, 1.08)])
def test_every_case_ends_as_it_does_with_an_interval_at_every_look(monkeypatch, seed, noise, slower):
    lazy = _case(seed, noise, slower)
    monkeypatch.setattr(stats, "may_decide", lambda *args, **kwargs: True)  # the full analysis at every look
    full = _case(seed, noise, slower)
    assert lazy.result == full.result and lazy.pairs == full.pairs and lazy.levels_applied == full.levels_applied
