"""Checks on the pairs of recorded A/A cases: is there an order effect, a side bias, or correlation
between consecutive pairs? (What the signed-rank test assumes: pairs independent and, for identical
sides, symmetric about no change.)

Each case's blocks are rebuilt from its saved rounds and summarised as ab_replay.py does. Per folder of
ab_reliability.py runs it prints:

* the median log(candidate / baseline) of AB pairs and of BA pairs (an order effect would make
  them differ with opposite signs);
* how many cases have a positive median log ratio, and the pooled median per pool pair (a side
  bias of identical sides would make these lean one way on every pool pair);
* the lag-1 autocorrelation of the log ratios of consecutive pairs of one pool pair, by size
  (a lasting state of a pool would make it positive), for cases of at least 40 pairs;
* the spread of each case's recorded estimate over the runs against its own standard error (from
  its recorded 95% interval): z = log(ratio) / se. Were the pairs of a case its only noise, z
  would spread as a standard normal (sd 1, |z| > 2.58 in 1% of cases); a larger spread is an
  offset that lasts a whole case, which no within-case statistic can see, and the implied
  case-to-case offset sd(log ratio) beyond the within-case error is printed per case (cases seen
  in at least 3 runs);
* the pool pairs' own offsets within a case: with K >= 2 pool pairs, the spread of their mean log
  ratios beyond what their pairs' noise explains, tau^2 = var(pool pair means) - mean(their squared
  standard errors) (method of moments, pooled over cases with K - 1 degrees of freedom each), by
  size. 0 when a case's pools differ only by the pairs' noise; one pool of processes running off
  its twin for a whole case makes it positive. A case's own estimate carries tau / sqrt(K) of it.
  With a 95% interval from resampling cases; with several folders, also pooled over all of them.

    .venv/bin/python lab/reference/ab_pair_checks.py DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

from ab_replay import recorded_ab_cases, recorded_cases  # the same folder of runs, read the same way

Z_99 = 2.5758  # two-sided 1% point of the standard normal
Z_95 = 1.959964  # the recorded interval is a 95% one
RESAMPLES, RESAMPLE_SEED = 2000, 20261123  # the pool-pair offsets' interval (resampling cases)


def lag1_autocorrelation(values: list[float]) -> float:
    mean = statistics.fmean(values)
    centred = [v - mean for v in values]
    denominator = sum(v * v for v in centred)
    return sum(a * b for a, b in zip(centred, centred[1:])) / denominator if denominator else 0.0


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:+.3f}" if values else "-"
    q = statistics.quantiles(values, n=4)
    return f"median {statistics.median(values):+.3f} (IQR {q[0]:+.3f} to {q[2]:+.3f}, n={len(values)})"


def recorded_estimates(folder: str) -> dict[str, list[tuple[float, float]]]:
    """Per case name, over the runs in ``folder``: (log of the recorded ratio, its standard error
    taken from the width of the recorded 95% interval)."""
    found: dict[str, list[tuple[float, float]]] = {}
    for case, ab in recorded_ab_cases(folder):
        if "ratio_ci" not in ab:
            continue
        low, high = ab["ratio_ci"]
        se = (math.log(high) - math.log(low)) / (2 * Z_95)
        if se > 0:
            found.setdefault(case["name"], []).append((math.log(ab["ratio"]), se))
    return found


def between_run_dispersion(estimates: dict[str, list[tuple[float, float]]], min_runs: int = 3):
    """(every z = log ratio / se of cases seen in ``min_runs`` runs or more, and per such case: its
    runs, the sd of its log ratios over the runs, its median se, and the implied case-to-case
    offset sd, sqrt(max(0, sd^2 - se^2)))."""
    zs: list[float] = []
    per_case = {}
    for name, values in sorted(estimates.items()):
        if len(values) < min_runs:
            continue
        logs = [v for v, _ in values]
        spread = statistics.stdev(logs)
        se = statistics.median(s for _, s in values)
        zs += [v / s for v, s in values]
        per_case[name] = (len(values), spread, se, math.sqrt(max(0.0, spread ** 2 - se ** 2)))
    return zs, per_case


def _offset_terms(cases) -> dict[str, list[tuple[float, int, float]]]:
    """Per size (the case id's last part), one term per case with at least two pool pairs of at
    least two pairs each: (its pool pair means' variance beyond their squared standard errors,
    times its degrees of freedom; those degrees of freedom, K - 1; its largest |pool pair mean -
    case mean|, in log ratio)."""
    terms: dict[str, list[tuple[float, int, float]]] = {}
    for name, baseline, candidate, pools in cases:
        logs = [math.log(c / b) for b, c in zip(baseline, candidate)]
        groups = [[v for v, p in zip(logs, pools) if p == k] for k in sorted(set(pools))]
        if len(groups) < 2 or any(len(g) < 2 for g in groups):
            continue
        means = [statistics.fmean(g) for g in groups]
        variance_of_mean = statistics.fmean(statistics.variance(g) / len(g) for g in groups)
        centre = statistics.fmean(means)
        terms.setdefault(name.rsplit("-", 1)[-1].rstrip("]"), []).append(
            ((statistics.variance(means) - variance_of_mean) * (len(groups) - 1), len(groups) - 1,
             max(abs(m - centre) for m in means)))
    return terms


def _tau(terms) -> float:
    return math.sqrt(max(0.0, sum(t for t, _, _ in terms) / sum(df for _, df, _ in terms)))


def pool_pair_offsets(cases) -> dict[str, tuple[float, int, float]]:
    """Per size, from (name, baseline blocks, candidate blocks, pool pair per pair) of cases with
    at least two pool pairs of at least two pairs each: (tau, the sd of a pool pair's own offset
    within a case, pooled as in the module docstring; its degrees of freedom; the largest |pool pair
    mean - case mean| seen, as a ratio offset)."""
    return {size: (_tau(terms), sum(df for _, df, _ in terms), math.exp(max(x for _, _, x in terms)) - 1)
            for size, terms in sorted(_offset_terms(cases).items())}


def pool_pair_offset_intervals(cases, resamples: int = RESAMPLES) -> dict[str, tuple[float, float]]:
    """Per size, a 95% percentile interval of tau from resampling its cases with replacement
    (seeded: the same cases always give the same interval)."""
    rng = random.Random(RESAMPLE_SEED)
    intervals = {}
    for size, terms in sorted(_offset_terms(cases).items()):
        taus = sorted(_tau(rng.choices(terms, k=len(terms))) for _ in range(resamples))
        intervals[size] = (taus[int(0.025 * resamples)], taus[int(0.975 * resamples) - 1])
    return intervals


def _print_offsets(cases) -> None:
    intervals = pool_pair_offset_intervals(cases)
    for size, (tau, df, largest) in pool_pair_offsets(cases).items():
        low, high = intervals[size]
        print(f"  pool pairs' own offset within a case, {size}: tau {tau * 100:.2f}% [95%: {low * 100:.2f}, "
              f"{high * 100:.2f}, resampling cases] ({df} degrees of freedom); "
              f"largest pool pair off its case's mean: {largest * 100:.1f}%")


def check(folder: str) -> list:
    """Print the checks of one folder; returns its cases as pool_pair_offsets takes them."""
    cases = []
    by_order: dict[str, list[float]] = {"AB": [], "BA": []}
    by_pool_pair: dict[int, list[float]] = {}
    case_medians: list[float] = []
    autocorrelations: dict[str, list[float]] = {}
    for name, baseline, candidate, pools, _threshold, _capped, order, *_minima in recorded_cases(folder):
        cases.append((name, baseline, candidate, pools))
        logs = [math.log(c / b) for b, c in zip(baseline, candidate)]
        case_medians.append(statistics.median(logs))
        for value, first_second, pool in zip(logs, order, pools):
            by_order[first_second].append(value)
            by_pool_pair.setdefault(pool, []).append(value)
        if len(logs) >= 40:
            size = name.rsplit("-", 1)[-1].rstrip("]")
            for pool in sorted(set(pools)):
                sequence = [v for v, p in zip(logs, pools) if p == pool]
                if len(sequence) >= 20:
                    autocorrelations.setdefault(size, []).append(lag1_autocorrelation(sequence))
    print(f"{folder}: {len(case_medians)} cases")
    print(f"  median log(candidate / baseline): AB pairs {statistics.median(by_order['AB']):+.4f} "
          f"(n={len(by_order['AB'])}), BA pairs {statistics.median(by_order['BA']):+.4f} (n={len(by_order['BA'])})")
    print(f"  cases with a positive median log ratio: {sum(m > 0 for m in case_medians)} of {len(case_medians)}; "
          "pooled median per pool pair: " + ", ".join(f"{p}: {statistics.median(v):+.4f}"
                                                    for p, v in sorted(by_pool_pair.items())))
    for size, values in sorted(autocorrelations.items()):
        print(f"  lag-1 autocorrelation within a pool pair, {size}: {_spread(values)}")
    _print_offsets(cases)
    zs, per_case = between_run_dispersion(recorded_estimates(folder))
    if len(zs) >= 2:
        beyond = sum(abs(z) > Z_99 for z in zs)
        print(f"  estimate / own standard error over runs: sd(z) {statistics.stdev(zs):.2f} (1 if the pairs "
              f"were a case's only noise); |z| > {Z_99:.2f} in {beyond} of {len(zs)} (expected {0.01 * len(zs):.1f})")
        for name, (runs, spread, se, offset) in per_case.items():
            print(f"    {name}: {runs} runs, sd(log ratio) {spread:.4f}, median se {se:.4f}, "
                  f"case-to-case offset sd {offset:.4f}")
    return cases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="folders of run*.json files from ab_reliability.py")
    folders = parser.parse_args(argv).folders
    cases = [case for folder in folders for case in check(folder)]
    if len(folders) > 1:
        print(f"all {len(folders)} folders together:")
        _print_offsets(cases)


if __name__ == "__main__":
    main()
