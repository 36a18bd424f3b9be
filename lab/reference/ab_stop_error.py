"""Seeded simulation of the A/B gate's looks: how often a case reads `same` or `not-slower` when the
candidate is slower by exactly the threshold, under three stop rules: `interval` (the interval's
upper end within 1 + threshold, the rule until 2026-11-26), `equal` (also the ratio's exact
signed-rank upper bound within it at one common stop level for every look, 0.0041 at the default
12 looks, 2026-11-26/27) and `spending` (that bound at each look's level from error spending in
proportion to the pairs, ddpbench.gates.stats.stop_levels, ABSettings.stop_level_per_look: today's
rule). The same cases, with --slower 1.0 (A/A) or 1.10, give the decided share, the false
regressions and the power under each rule.

    .venv/bin/python lab/reference/ab_stop_error.py                          # 150 cases at 1 + threshold
    .venv/bin/python lab/reference/ab_stop_error.py --slower 1.0 --sigma 0.1 # A/A
    .venv/bin/python lab/reference/ab_stop_error.py --slower 1.10 --sigma 0.1
    .venv/bin/python lab/reference/ab_stop_error.py --bound-only --cases 4000  # the stop bound alone
    .venv/bin/python lab/reference/ab_stop_error.py --rules capped borrowing --cap-after 2  # borrowed time

Each case is a sequence of pairs whose log ratios are independent normal draws, log(slower) +
sigma * z, on two pool pairs taking turns, each block its own minimum (one level per block, as
tests/helpers/fake_pools.py draws them); --tau adds each pool pair's own lasting offset (normal,
that sd), as identical pools show (docs/results.md, *What set identical pools apart*). Every case is
analysed as the engine analyses it (stats.analyse_pairs, skipped where stats.may_decide says no
verdict is possible, as the engine skips it) look by look with the engine's default looks (12
pairs, 12 more up to 96, then the extra looks, 48 more each up to 288), the engine's levels and
each rule's stop levels, and no time cap, so every case may take every look; a case runs until
every rule has decided. At slower = 1 + threshold the share reading same or not-slower does not
depend on sigma (both bounds move with the pairs' location and scale); the A/A decided share
does. A count, not a timing: it runs anywhere, and the seed gives the same figures every time.

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
from ddpbench.gates.ab.pairs_loop import EXTRA_LOOK_LEVEL, ABSettings

POOL_PAIRS = 2
RULES = ("interval", "equal", "spending", "capped", "borrowing")
# `capped` / `borrowing`: today's stop levels with the case's time cap ending it after look
# --cap-after (the look then spends what is left of alpha, stats.level_for_last_look); `borrowing`
# goes on past it while the next look is forecast to decide (stats.projected_stop_bound), each
# later look at EXTRA_LOOK_LEVEL, as the engine does with a run budget's borrowed time.
CAPPED = ("capped", "borrowing")
STOPS = ("same", stats.NOT_SLOWER)


def equal_stop_levels(error: float, look_pairs: tuple[int, ...]) -> tuple[float, ...]:
    """The rule of 2026-11-26/27: one common level for every look, set so that at a slowdown of
    exactly the threshold some look stops with chance ``error`` (the minimum of the looks' random
    walk, simulated as stats.stop_levels simulates it)."""
    from scipy.stats import norm

    pairs = np.asarray(look_pairs, dtype=float)
    rng = np.random.default_rng(stats.BOOTSTRAP_SEED)
    steps = np.sqrt(np.diff(pairs, prepend=0.0))
    walk = np.cumsum(rng.standard_normal((stats.STOP_LEVEL_PATHS, pairs.size)) * steps, axis=1) / np.sqrt(pairs)
    return (float(norm.sf(-float(np.quantile(walk.min(axis=1), error)))),) * pairs.size


def rule_stop_levels(settings: ABSettings) -> dict[str, tuple | None]:
    """Each rule's stop level per look (None: no stop bound)."""
    every = settings.stage_sizes(POOL_PAIRS) + settings.extra_stage_sizes(POOL_PAIRS)
    error = (1.0 - settings.confidence) / 2
    spending = settings.stop_level_per_look(POOL_PAIRS)
    return {"interval": None, "equal": equal_stop_levels(error, tuple(itertools.accumulate(every))),
            "spending": spending, "capped": spending, "borrowing": spending}


def simulate_case(log_ratios: np.ndarray, settings: ABSettings, rules: dict[str, tuple | None],
                  cap_after: int = 0) -> dict[str, tuple[str, int, int]]:
    """Per rule, (verdict, look it decided at (1-based; the last look when inconclusive), pairs);
    ``cap_after``: the look after which the `capped` and `borrowing` rules' time cap ends."""
    sizes = settings.stage_sizes(POOL_PAIRS)
    every = sizes + settings.extra_stage_sizes(POOL_PAIRS)
    levels = list(settings.alpha_per_look(POOL_PAIRS)) + [EXTRA_LOOK_LEVEL] * (len(every) - len(sizes))
    base_all = np.ones(log_ratios.size)
    cand_all = np.exp(log_ratios)
    pools = [i % POOL_PAIRS for i in range(log_ratios.size)]
    out: dict[str, tuple[str, int, int]] = {}
    look_pairs = list(itertools.accumulate(every))
    for look, pairs in enumerate(look_pairs, start=1):
        base, cand = list(base_all[:pairs]), list(cand_all[:pairs])
        common = dict(pool_pair_of=pools[:pairs], baseline_minima=base, candidate_minima=cand)
        for rule, stop_levels in rules.items():
            if rule in out:
                continue
            stop_level = None if stop_levels is None else stop_levels[look - 1]
            level = levels[look - 1]
            if rule in CAPPED and look == cap_after and look < len(sizes):
                level = stats.level_for_last_look(settings.alpha, len(sizes), look)
            elif rule in CAPPED and look > cap_after:
                level = EXTRA_LOOK_LEVEL
            verdict = "inconclusive"
            if stats.may_decide(base, cand, settings.threshold, level, stop_level=stop_level, **common):
                verdict = stats.analyse_pairs(base, cand, settings.threshold, level, settings.confidence,
                                              stop_level=stop_level, **common).verdict
            ends = look == len(every)
            if rule in CAPPED and look >= cap_after and not ends:
                ends = rule == "capped" or stats.projected_stop_bound(
                    log_ratios[:pairs], stop_level, look_pairs[look], stop_levels[look]) > 1 + settings.threshold
            if verdict != "inconclusive" or ends:
                out[rule] = (verdict, look, pairs)
        if len(out) == len(rules):
            break
    return out


def stop_bound_passes(log_ratios: np.ndarray, settings: ABSettings, stop_levels: tuple) -> bool:
    """Whether some look's stop bound (the ratio's, at the look's stop level) lies within 1 + threshold."""
    every = settings.stage_sizes(POOL_PAIRS) + settings.extra_stage_sizes(POOL_PAIRS)
    return any(stats.signed_rank_upper_bound(log_ratios[:pairs], level) <= math.log1p(settings.threshold)
               for pairs, level in zip(itertools.accumulate(every), stop_levels))


def _draw(rng, slower: float, sigma: float, tau: float, pairs: int) -> np.ndarray:
    offsets = tau * rng.standard_normal(POOL_PAIRS) if tau else np.zeros(POOL_PAIRS)
    return math.log(slower) + offsets[np.arange(pairs) % POOL_PAIRS] + sigma * rng.standard_normal(pairs)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=150)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--sigma", type=float, default=0.1, help="spread of a pair's log ratio (default 0.1)")
    parser.add_argument("--tau", type=float, default=0.0, help="sd of each pool pair's lasting offset (default 0)")
    parser.add_argument("--slower", type=float, default=None,
                        help="the candidate's true ratio (default: 1 + the engine's threshold)")
    parser.add_argument("--rules", nargs="+", choices=RULES, default=list(RULES),
                        help="the rules to simulate (default all; `interval` bootstraps every look, the slowest)")
    parser.add_argument("--cap-after", type=int, default=4,
                        help="the look after which the capped and borrowing rules' time cap ends (default 4)")
    parser.add_argument("--bound-only", action="store_true",
                        help="count the cases in which some look's stop bound lies within 1 + threshold (no bootstrap)")
    args = parser.parse_args(argv)
    settings = ABSettings()
    slower = 1.0 + settings.threshold if args.slower is None else args.slower
    most = sum(settings.stage_sizes(POOL_PAIRS) + settings.extra_stage_sizes(POOL_PAIRS))
    rules = {rule: levels for rule, levels in rule_stop_levels(settings).items() if rule in args.rules}
    rng = np.random.default_rng(args.seed)
    if args.bound_only:
        draws = [_draw(rng, slower, args.sigma, args.tau, most) for _ in range(args.cases)]
        for rule in [rule for rule in rules if rules[rule] is not None and rule not in CAPPED]:
            passed = sum(stop_bound_passes(x, settings, rules[rule]) for x in draws)
            print(f"{args.cases} cases, true ratio {slower:.3f}, seed {args.seed}, rule {rule}: some look's stop "
                  f"bound within 1 + threshold in {passed} ({100 * passed / args.cases:.2f}%; stop levels "
                  f"{' '.join(f'{v:.2g}' for v in rules[rule])})")
        return
    results = [simulate_case(_draw(rng, slower, args.sigma, args.tau, most), settings, rules, args.cap_after)
               for _ in range(args.cases)]
    print(f"{args.cases} cases, true ratio {slower:.3f}, sigma {args.sigma:g}, tau {args.tau:g}, seed {args.seed}; "
          f"threshold {settings.threshold:g}; looks at {list(itertools.accumulate(settings.stage_sizes(POOL_PAIRS)))} "
          f"+ extra {settings.extra_stage_sizes(POOL_PAIRS)} pairs")
    for rule in rules:
        verdicts = [r[rule][0] for r in results]
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in stats.VERDICTS)
        stopped = sum(v in STOPS for v in verdicts)
        first_look = sum(r[rule][0] in STOPS and r[rule][1] == 1 for r in results)
        decided = sum(v != "inconclusive" for v in verdicts)
        pairs = statistics.median(r[rule][2] for r in results)
        print(f"{rule:8s}: {counts}; same or not-slower {stopped} of {args.cases} "
              f"({100 * stopped / args.cases:.1f}%; {first_look} at the first look); decided {decided} "
              f"({100 * decided / args.cases:.0f}%); median pairs {pairs:g}")


if __name__ == "__main__":
    main()
