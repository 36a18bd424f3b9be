"""The stored gate's run-to-run component (docs/design/gates.md#run-to-run-variance): simulated runs
whose medians move between runs by more than their rounds show. Unchanged code must read
regression in at most 1% of comparisons, an injected 20% slowdown must be found where the
machine's run-to-run spread allows, and each estimate (history, pools, the floor) says where it
came from. Seeded simulations: the same draws every time."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ddpbench.gates import stats
from ddpbench.gates import stored_run_gate as gate
from ddpbench.gates.verdict_words import Verdict
from ddpbench.storage.runs import Case, Run

ROUNDS = 20
WITHIN = 0.03  # round-to-round lognormal sigma inside a run


def draw_run(rng, level, run_sd, rounds=ROUNDS, pools=1, pool_sd=0.0):
    """One run's rounds: the case's level moved by this run's own effect (``run_sd``), split across
    ``pools`` pools each with its own effect (``pool_sd``); the rounds' noise on top."""
    run_effect = rng.normal(0.0, run_sd)
    out = []
    for j in range(pools):
        n = rounds // pools
        pool_effect = rng.normal(0.0, pool_sd) if pools > 1 else 0.0
        out.append(list(level * np.exp(run_effect + pool_effect + rng.normal(0.0, WITHIN, n))))
    return out


def as_run(label, pools_rounds):
    data = [t for pool in pools_rounds for t in pool]
    extra = {}
    if len(pools_rounds) > 1:
        extra["pool_split"] = {"count": len(pools_rounds), "rounds": [len(p) for p in pools_rounds],
                               "medians_s": [float(np.median(p)) for p in pools_rounds]}
    case = Case("c", "c", None, extra, {"median": float(np.median(data))}, data)
    return Run(Path(label), {}, {}, None, {"c": case})


def verdict(base, cur, history, run_to_run="auto", seed=0):
    result = gate.compare_runs(base, cur, calibration="never", history=history, run_to_run=run_to_run, seed=seed)
    return result.cases[0]


def simulate(trials, slowdown, run_sd, history_runs, pools=1, pool_sd=0.0, run_to_run="auto", seed=0):
    """Verdicts of ``trials`` comparisons, each a saved history of ``history_runs`` runs (the oldest
    the baseline) then a current run ``slowdown`` times slower."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(trials):
        history = [as_run(f"h{k}", draw_run(rng, 0.01, run_sd, pools=pools, pool_sd=pool_sd))
                   for k in range(max(1, history_runs))]
        cur = as_run("cur", draw_run(rng, 0.01 * slowdown, run_sd, pools=pools, pool_sd=pool_sd))
        out.append(verdict(history[0], cur, history, run_to_run, seed=i))
    return out


def regressions(cases):
    return sum(case.verdict is Verdict.REGRESSION for case in cases)


def test_between_run_variance_fools_the_rounds_own_interval_but_not_the_gates():
    # Runs move by 8% (SD) between runs, their rounds by 3%: the rounds' own interval is far too
    # narrow and flags unchanged code often; with the run-to-run component (from 12 saved runs)
    # unchanged code reads regression in at most 1% of the comparisons.
    before = simulate(150, 1.0, run_sd=0.08, history_runs=12, run_to_run="off")
    after = simulate(150, 1.0, run_sd=0.08, history_runs=12)
    assert regressions(before) >= 15
    assert regressions(after) <= 1
    assert all(case.details["run_to_run"]["source"] == "history, 12 runs" for case in after)


def test_a_20_percent_slowdown_is_found_where_the_runs_move_little():
    # A quiet machine: runs move by 2% (SD). A 20% slowdown reads regression in >= 90% of the
    # comparisons, and unchanged code in none.
    slowed = simulate(100, 1.2, run_sd=0.02, history_runs=12, seed=1)
    assert regressions(slowed) >= 90
    assert regressions(simulate(100, 1.0, run_sd=0.02, history_runs=12, seed=2)) <= 1


def test_each_comparison_says_the_smallest_slowdown_it_could_have_flagged():
    # detectable_slowdown: the smallest ratio the regression rule flags at these interval widths
    for case in simulate(10, 1.0, run_sd=0.08, history_runs=12, seed=3):
        detectable = case.details["detectable_slowdown"]
        assert detectable >= gate.DEFAULT_THRESHOLD
        between = case.details["run_to_run"]
        r2r = stats.RunToRun(between["sd"], between["df"] or math.inf, between["source"])
        low, high = case.details["rounds_ci"]
        for factor, flagged in ((1.001, True), (0.999, False)):
            ratio = (1 + detectable) * factor
            scale = ratio / case.ratio  # the same widths about another ratio
            widened = stats.with_run_to_run(ratio, low * scale, high * scale, r2r, gate.DEFAULT_THRESHOLD)
            read = stats.decide_unpaired(widened.ratio, widened.low, widened.high, widened.p_value,
                                         gate.DEFAULT_THRESHOLD, alpha=stats.stored_alpha())
            assert (read is Verdict.REGRESSION) == flagged, (case.ratio, detectable, factor)
        if case.verdict is Verdict.INCONCLUSIVE:
            assert case.rules_out_slowdown == pytest.approx(case.ci_high - 1)


def test_the_history_estimate_is_not_inflated_by_a_step_in_the_history():
    rng = np.random.default_rng(4)
    runs = [draw_run(rng, 0.01 if k < 10 else 0.015, 0.03)[0] for k in range(20)]  # a x1.5 step at run 10
    estimate = stats.run_to_run_from_history(runs)
    assert 0.01 < estimate.sd < 0.06 and estimate.df == 9  # 18 of the 19 differences kept: the step left out
    assert estimate.trusted and not stats.run_to_run_from_history(runs[:4]).trusted  # 4 runs: widen only
    assert stats.run_to_run_from_history(runs[:1]) is None


def test_the_pools_estimate_sees_the_pool_to_pool_spread():
    rng = np.random.default_rng(5)
    runs = [draw_run(rng, 0.01, 0.0, rounds=40, pools=2, pool_sd=0.06) for _ in range(30)]
    estimate = stats.run_to_run_from_pools(runs)
    # a run's median over 2 pools carries half the pool-to-pool variance: sd 0.06 / sqrt(2)
    assert estimate.sd == pytest.approx(0.06 / math.sqrt(2), rel=0.3) and estimate.df == 30
    assert stats.run_to_run_from_pools([[[0.01] * 5]]) is None  # one pool: nothing to tell


def test_without_history_or_pools_the_stated_floor_is_used_and_said():
    rng = np.random.default_rng(6)
    base, cur = (as_run(label, draw_run(rng, 0.01, 0.0)) for label in ("b", "c"))
    result = gate.compare_runs(base, cur, calibration="never")
    [case] = result.cases
    assert case.details["run_to_run"] == {"sd": stats.RUN_TO_RUN_FLOOR, "df": None, "measured": False,
                                          "source": "floor, no saved history or pool spread of the case"}
    assert any("stated run-to-run floor" in note for note in result.notes)
    # the floor alone keeps a same-looking pair from reading same: it cannot rule out 10%
    assert case.verdict in (Verdict.INCONCLUSIVE, Verdict.NOT_SLOWER)


def test_a_short_history_only_widens_the_interval_past_the_floor():
    rng = np.random.default_rng(9)
    calm = [as_run(f"h{k}", draw_run(rng, 0.01, 0.0)) for k in range(3)]  # 3 runs that agree
    case = verdict(calm[0], as_run("c", draw_run(rng, 0.01, 0.0)), calm)
    assert case.details["run_to_run"]["sd"] == stats.RUN_TO_RUN_FLOOR
    assert case.details["run_to_run"]["source"].startswith("floor, above ±")
    wild = [as_run(f"h{k}", draw_run(rng, 0.01 * (2.0 if k == 1 else 1.0), 0.0)) for k in range(3)]
    case = verdict(wild[0], as_run("c", draw_run(rng, 0.01, 0.0)), wild)  # a x2 run among 3
    assert case.details["run_to_run"]["source"] == "history, 3 runs"
    assert case.details["run_to_run"]["sd"] > 0.3 and case.verdict is Verdict.INCONCLUSIVE


def test_pools_in_the_runs_widen_the_interval_past_the_floor_when_they_spread():
    rng = np.random.default_rng(7)
    base, cur = (as_run(label, draw_run(rng, 0.01, 0.0, rounds=40, pools=2, pool_sd=0.15)) for label in "bc")
    case = verdict(base, cur, [base])
    assert case.details["run_to_run"]["source"] == "pools, 2 + 2"
    assert case.details["run_to_run"]["sd"] > stats.RUN_TO_RUN_FLOOR


def test_the_rounds_own_interval_is_kept_beside_the_widened_one():
    rng = np.random.default_rng(8)
    base, cur = (as_run(label, draw_run(rng, 0.01, 0.0)) for label in "bc")
    case = verdict(base, cur, [base])
    off = verdict(base, cur, [base], run_to_run="off")
    assert case.details["rounds_ci"] == pytest.approx([off.ci_low, off.ci_high])
    assert case.details["rounds_p"] == pytest.approx(off.p_value)
    assert case.ci_low < off.ci_low and case.ci_high > off.ci_high
    assert "run_to_run" not in off.details
