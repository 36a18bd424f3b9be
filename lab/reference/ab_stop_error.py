"""Seeded simulation of the A/B gate's looks: how often a case reads `same` or `not-slower` when the
candidate is slower by exactly the threshold, under the stop rule before 2026-11-26 (the interval's
upper end within 1 + threshold) and now (the ratio's exact signed-rank upper bound at each look's
stop level within it too: ddpbench.gates.stats.stop_levels, ABSettings.stop_level_per_look).
The same cases, with --slower 1.0 (A/A) or 1.10, give the decided share, the false regressions
and the power under both rules.

    .venv/bin/python lab/reference/ab_stop_error.py                          # 150 cases at 1 + threshold
    .venv/bin/python lab/reference/ab_stop_error.py --slower 1.0 --sigma 0.1 # A/A
    .venv/bin/python lab/reference/ab_stop_error.py --slower 1.10 --sigma 0.1
    .venv/bin/python lab/reference/ab_stop_error.py --bound-only --cases 4000  # the stop bound alone

Each case is a sequence of pairs whose log ratios are independent normal draws, log(slower) +
sigma * z, on two pool pairs taking turns, each block its own minimum (one level per block, as
tests/helpers/fake_pools.py draws them). Every case is analysed as the engine analyses it (stats.
analyse_pairs) look by look with the engine's default looks (12 pairs, 12 more up to 96, then the
extra looks, 48 more each up to 288), the engine's levels and stop levels, and no time cap, so
every case may take every look. Both rules read the same analysis (the rule before is stats.decide
without the stop bound); a case runs until both have decided. At slower = 1 + threshold the share
reading same or not-slower does not depend on sigma (both bounds move with the pairs' location
and scale); the A/A decided share does. A count, not a timing: it runs anywhere, and the seed
gives the same figures every time.

--bound-only counts, without the bootstrap (fast, so over many cases), the cases in which some
look's stop bound lies within 1 + threshold: a case can end same or not-slower only at such a look,
so that share bounds the rule's from above.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics

import numpy as np

from ddpbench.gates import stats
from ddpbench.gates.ab.engine import EXTRA_LOOK_LEVEL, ABSettings

POOL_PAIRS = 2
RULES = ("before", "after")
STOPS = ("same", stats.NOT_SLOWER)


def simulate_case(log_ratios: np.ndarray, settings: ABSettings) -> dict[str, tuple[str, int, int]]:
    """Per rule, (verdict, look it decided at (1-based; the last look when inconclusive), pairs)."""
    sizes = settings.stage_sizes(POOL_PAIRS)
    every = sizes + settings.extra_stage_sizes(POOL_PAIRS)
    levels = list(settings.alpha_per_look(POOL_PAIRS)) + [EXTRA_LOOK_LEVEL] * (len(every) - len(sizes))
    stop_levels = settings.stop_level_per_look(POOL_PAIRS)
    base_all = np.ones(log_ratios.size)
    cand_all = np.exp(log_ratios)
    pools = [i % POOL_PAIRS for i in range(log_ratios.size)]
    out: dict[str, tuple[str, int, int]] = {}
    for look, pairs in enumerate(itertools.accumulate(every), start=1):
        base, cand = list(base_all[:pairs]), list(cand_all[:pairs])
        result = stats.analyse_pairs(base, cand, settings.threshold, levels[look - 1], settings.confidence,
                                     pool_pair_of=pools[:pairs], baseline_minima=base, candidate_minima=cand,
                                     stop_level=stop_levels[look - 1])
        before = stats.decide(result.ratio, result.ci_low, result.ci_high, result.p_value, settings.threshold,
                              levels[look - 1], result.pool_pair_ratios, settings.pool_pair_share,
                              result.ratio_of_block_minima)
        for rule, verdict in (("before", before), ("after", result.verdict)):
            if rule not in out and (verdict != "inconclusive" or look == len(every)):
                out[rule] = (verdict, look, pairs)
        if len(out) == len(RULES):
            break
    return out


def stop_bound_passes(log_ratios: np.ndarray, settings: ABSettings) -> bool:
    """Whether some look's stop bound (the ratio's, at the look's stop level) lies within 1 + threshold."""
    every = settings.stage_sizes(POOL_PAIRS) + settings.extra_stage_sizes(POOL_PAIRS)
    levels = settings.stop_level_per_look(POOL_PAIRS)
    return any(stats.signed_rank_upper_bound(log_ratios[:pairs], level) <= math.log1p(settings.threshold)
               for pairs, level in zip(itertools.accumulate(every), levels))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=150)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--sigma", type=float, default=0.1, help="spread of a pair's log ratio (default 0.1)")
    parser.add_argument("--slower", type=float, default=None,
                        help="the candidate's true ratio (default: 1 + the engine's threshold)")
    parser.add_argument("--bound-only", action="store_true",
                        help="count the cases in which some look's stop bound lies within 1 + threshold (no bootstrap)")
    args = parser.parse_args(argv)
    settings = ABSettings()
    slower = 1.0 + settings.threshold if args.slower is None else args.slower
    most = sum(settings.stage_sizes(POOL_PAIRS) + settings.extra_stage_sizes(POOL_PAIRS))
    rng = np.random.default_rng(args.seed)
    if args.bound_only:
        passed = sum(stop_bound_passes(math.log(slower) + args.sigma * rng.standard_normal(most), settings)
                     for _ in range(args.cases))
        print(f"{args.cases} cases, true ratio {slower:.3f}, seed {args.seed}: some look's stop bound within "
              f"1 + threshold in {passed} ({100 * passed / args.cases:.2f}%; stop level per look "
              f"{settings.stop_level_per_look(POOL_PAIRS)[0]:.4g})")
        return
    results = []
    for _ in range(args.cases):
        results.append(simulate_case(math.log(slower) + args.sigma * rng.standard_normal(most), settings))
    print(f"{args.cases} cases, true ratio {slower:.3f}, sigma {args.sigma:g}, seed {args.seed}; threshold "
          f"{settings.threshold:g}; looks at {list(itertools.accumulate(settings.stage_sizes(POOL_PAIRS)))} "
          f"+ extra {settings.extra_stage_sizes(POOL_PAIRS)} pairs; stop level per look "
          f"{settings.stop_level_per_look(POOL_PAIRS)[0]:.4g}")
    for rule in RULES:
        verdicts = [r[rule][0] for r in results]
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in stats.VERDICTS)
        stopped = sum(v in STOPS for v in verdicts)
        first_look = sum(r[rule][0] in STOPS and r[rule][1] == 1 for r in results)
        decided = sum(v != "inconclusive" for v in verdicts)
        pairs = statistics.median(r[rule][2] for r in results)
        print(f"{rule:6s}: {counts}; same or not-slower {stopped} of {args.cases} "
              f"({100 * stopped / args.cases:.1f}%; {first_look} at the first look); decided {decided} "
              f"({100 * decided / args.cases:.0f}%); median pairs {pairs:g}")


if __name__ == "__main__":
    main()
