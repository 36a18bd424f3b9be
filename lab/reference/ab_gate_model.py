"""A seeded model of ab.yml's A/A run: which share of its 7 cases decide within the run budget, and
how long the run takes, under a stop rule's levels (a model, not a measurement: the real flow is
lab/reference/ab_flow_check.sh).

    .venv/bin/python lab/reference/ab_gate_model.py                      # equal split vs spending (power 1)
    .venv/bin/python lab/reference/ab_gate_model.py --powers 0.5 1 1.5 3 --extra-pairs 48 24
    .venv/bin/python lab/reference/ab_gate_model.py --tau-scale 0      # no lasting pool offsets
    .venv/bin/python lab/reference/ab_gate_model.py --spread-1mb 0.17 0.022  # 1 MB as recorded with ranks pinned

Each case of ab.yml's selection, in its run order, is drawn as ab_stop_error.py draws one: pairs
whose log ratios are normal (sd sigma) plus each pool pair's lasting offset (sd tau), on two pool
pairs, true ratio 1 (A/A). Sigma and tau per size are the recorded ones (docs/results.md: a pair's
log ratio sd 0.21-0.35 at 1 MB, 0.13 at 10 MB, 0.08 at 100 MB; tau, quiet, steady heap, 2.8%,
2.3%, 1.2%); training is taken as 100 MB-like. A case decides at the first look whose stop bound
(stats.signed_rank_upper_bound at the look's stop level) lies within 1 + threshold: at identical
sides the bound, at a level of 2.5% or less, is wider than the 95% bootstrap interval nearly
always, so it is what decides (ab_stop_error.py checks that with the full analysis). The run is
then the engine's loop (gates/ab/pairs_loop.py) under ab.yml's --dist-ab-run-budget: each case's cap
is what is left of the budget over the cases left, a next stage runs only if its pairs fit the
cap (`equal shares`) or, with `borrowing` (today's gate), also when the next look is forecast to
decide the case (stats.projected_stop_bound) and fits the time it may borrow (budget.case_borrow),
and each look costs an analysis — the bootstrap at every look (`full`), or only at a look
that may decide or ends the case (`lazy`, stats.may_decide). Seconds per pair, the analysis's
seconds at n pairs (ANALYSIS_S_AT_288 * (n / 288)^2; stats.analyse_pairs took 4.6 s of process
CPU at 288 pairs on the loaded machine) and the run's and a case's fixed seconds are model inputs
(--seconds-per-pair ...), set so that the rule before 2026-11-26 (`interval only`) gives about the
recorded run (160 s, 90% decided: docs/results.md, *Decisive A/B verdicts*): the walls compare
rules, they are not timings.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ab_stop_error import equal_stop_levels  # noqa: E402

from ddpbench.gates import stats  # noqa: E402
from ddpbench.gates.ab.budget import case_borrow  # noqa: E402
from ddpbench.gates.ab.pairs_loop import ABSettings  # noqa: E402

POOL_PAIRS = 2
# ab.yml's cases in their run order: (name, sigma of a pair's log ratio, tau of a pool pair's offset).
CASES = (("all_reduce 1MB", 0.30, 0.028), ("all_reduce 10MB", 0.13, 0.023), ("all_reduce 100MB", 0.08, 0.012),
         ("all_gather 1MB", 0.25, 0.028), ("all_gather 10MB", 0.13, 0.023), ("all_gather 100MB", 0.08, 0.012),
         ("training", 0.08, 0.012))
SECONDS_PER_PAIR = (0.2, 0.25, 0.8, 0.2, 0.25, 0.9, 0.2)
ANALYSIS_S_AT_288 = 2.8
CASE_S = 3.0  # a case's set-up, warm-up and finish
RUN_S = 15.0  # the run's own: pytest, pools, calibration


class DrawnCase:
    """One drawn case under one rule: its first deciding look (0-based, None: none) and, at each
    look before it, whether the next look is forecast to decide it (stats.projected_stop_bound)."""

    def __init__(self, first: int | None, nearly: list[bool]):
        self.first, self.nearly = first, nearly


def drawn_cases(log_ratios: np.ndarray, look_pairs, rules: dict[str, tuple]) -> dict[str, DrawnCase]:
    """Per rule, the first look whose stop bound lies within 1.05 and each look's forecast."""
    up = math.log1p(ABSettings().threshold)
    out = {rule: DrawnCase(None, []) for rule in rules}
    for k, n in enumerate(look_pairs):
        open_rules = [rule for rule in rules if out[rule].first is None]
        if not open_rules:
            break
        for rule in open_rules:
            levels = rules[rule]
            if stats.signed_rank_upper_bound(log_ratios[:n], levels[k]) <= up:
                out[rule].first = k
            elif k + 1 < len(look_pairs):
                forecast = stats.projected_stop_bound(log_ratios[:n], levels[k], look_pairs[k + 1], levels[k + 1])
                out[rule].nearly.append(forecast <= 1 + ABSettings().threshold)
    return out


def case_run(case: DrawnCase, look_pairs, seconds_per_pair: float, cap_s: float, lazy: bool,
             borrow_s: float = 0.0) -> tuple[bool, float]:
    """The engine's loop on one case (gates/ab/pairs_loop.py): (decided, seconds). A case whose cap
    ends while the next look is forecast to decide it goes on within ``borrow_s`` more."""
    spent, before = CASE_S, 0
    for k, n in enumerate(look_pairs):
        spent += (n - before) * seconds_per_pair
        before = n
        decided = case.first == k
        more = k + 1 < len(look_pairs)
        fits = more and (look_pairs[k + 1] - n) * seconds_per_pair <= cap_s - spent
        analysed = decided or not fits or not lazy
        spent += ANALYSIS_S_AT_288 * (n / 288) ** 2 if analysed else 0.0
        if decided:
            return True, spent
        if not fits and not (more and (look_pairs[k + 1] - n) * seconds_per_pair <= cap_s + borrow_s - spent
                             and case.nearly[k]):
            return False, spent
    return False, spent


def main(argv=None) -> None:
    global ANALYSIS_S_AT_288, CASE_S, RUN_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300, help="drawn cases per case of the selection")
    parser.add_argument("--runs", type=int, default=1000, help="runs drawn from them")
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--budget", type=float, default=420.0, help="ab.yml's AB_RUN_BUDGET")
    parser.add_argument("--powers", type=float, nargs="+", default=[1.0], help="spending powers (stats.stop_levels)")
    parser.add_argument("--extra-pairs", type=int, nargs="+", default=[48], help="pairs per extra look")
    parser.add_argument("--rules", nargs="+", choices=("equal", "spending", "interval"),
                        default=["equal", "spending", "interval"], help="the rules to model (default all)")
    parser.add_argument("--first-pairs", type=int, default=ABSettings.first_pairs, help="ABSettings.first_pairs")
    parser.add_argument("--more-pairs", type=int, default=ABSettings.more_pairs, help="ABSettings.more_pairs")
    parser.add_argument("--max-extended-pairs", type=int, default=ABSettings.max_extended_pairs,
                        help="ABSettings.max_extended_pairs: the most pairs a case may take")
    parser.add_argument("--tau-scale", type=float, default=1.0, help="multiplies every case's tau")
    parser.add_argument("--spread-1mb", type=float, nargs=2, metavar=("SIGMA", "TAU"),
                        help="the 1 MB cases' sigma and tau instead of the recorded ones")
    parser.add_argument("--seconds-per-pair", type=float, nargs=len(CASES), default=SECONDS_PER_PAIR)
    parser.add_argument("--analysis-s", type=float, default=ANALYSIS_S_AT_288, help="an analysis at 288 pairs")
    parser.add_argument("--case-s", type=float, default=CASE_S)
    parser.add_argument("--run-s", type=float, default=RUN_S)
    args = parser.parse_args(argv)
    ANALYSIS_S_AT_288, CASE_S, RUN_S = args.analysis_s, args.case_s, args.run_s
    cases = CASES if args.spread_1mb is None else tuple(
        (name, *args.spread_1mb) if "1MB" in name else (name, sigma, tau) for name, sigma, tau in CASES)
    print(f"ab.yml's 7 cases, A/A, {args.cases} drawn each, {args.runs} runs, budget {args.budget:g} s, "
          f"tau x {args.tau_scale:g}, seed {args.seed}; (sigma, tau) per case: "
          + ", ".join(f"{sigma:g}, {tau:g}" for _, sigma, tau in cases))
    print("| looks | rule | analysis | budget | decided | " + " | ".join(name for name, _, _ in cases)
          + " | run wall (model) median [IQR] s | decided without a cap |")
    print("|---" * (len(CASES) + 7) + "|")
    for extra in args.extra_pairs:
        settings = ABSettings(extra_pairs=extra, first_pairs=args.first_pairs, more_pairs=args.more_pairs,
                              max_extended_pairs=args.max_extended_pairs)
        every = settings.stage_sizes(POOL_PAIRS) + settings.extra_stage_sizes(POOL_PAIRS)
        look_pairs = tuple(itertools.accumulate(every))
        error = (1.0 - settings.confidence) / 2
        rules = {"equal": equal_stop_levels(error, look_pairs)} if "equal" in args.rules else {}
        if "spending" in args.rules:
            rules.update({f"spending {p:g}": stats.stop_levels(error, look_pairs, p) for p in args.powers})
        if "interval" in args.rules:
            rules["interval only"] = (error,) * len(look_pairs)  # stands in for the rule before 2026-11-26
        firsts = []
        for c, (_, sigma, tau) in enumerate(cases):
            rng = np.random.default_rng([args.seed, c])
            per_case = []
            for _ in range(args.cases):
                offsets = args.tau_scale * tau * rng.standard_normal(POOL_PAIRS)
                x = offsets[np.arange(look_pairs[-1]) % POOL_PAIRS] + sigma * rng.standard_normal(look_pairs[-1])
                per_case.append(drawn_cases(x, look_pairs, rules))
            firsts.append(per_case)
        draws = np.random.default_rng(args.seed).integers(0, args.cases, size=(args.runs, len(CASES)))
        for rule, lazy, borrow in itertools.product(rules, (False, True), (False, True)):
            if borrow and not lazy:
                continue  # borrowing came after the lazy analysis
            decided = np.zeros((args.runs, len(CASES)), dtype=bool)
            walls = np.zeros(args.runs)
            for r in range(args.runs):
                spent = 0.0
                for c in range(len(CASES)):
                    cap = max(0.0, args.budget - spent) / (len(CASES) - c)
                    more = case_borrow(args.budget, spent, len(CASES) - c) if borrow else 0.0
                    decided[r, c], seconds = case_run(firsts[c][draws[r, c]][rule], look_pairs,
                                                      args.seconds_per_pair[c], cap, lazy, more)
                    spent += seconds
                walls[r] = RUN_S + spent
            uncapped = np.mean([[f[rule].first is not None for f in per_case] for per_case in firsts])
            q = np.percentile(walls, [25, 50, 75])
            planned = len(settings.stage_sizes(POOL_PAIRS))
            print(f"| {look_pairs[0]}x{planned} + {extra}x{len(every) - planned} | {rule} | {'lazy' if lazy else 'full'} | "
                  f"{'borrowing' if borrow else 'equal shares'} | "
                  f"**{100 * decided.mean():.1f}%** | "
                  + " | ".join(f"{100 * decided[:, c].mean():.0f}" for c in range(len(CASES)))
                  + f" | {q[1]:.0f} [{q[0]:.0f}-{q[2]:.0f}] | {100 * uncapped:.1f}% |")


if __name__ == "__main__":
    main()
