"""The gates' statistics, on scipy.stats: paired blocks for A/B (docs/design/ab.md#the-ab-verdict),
independent samples for stored runs (docs/design/gates.md#stored-run-gate)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .verdict_words import TIMING_VERDICTS, Verdict

NOT_SLOWER = Verdict.NOT_SLOWER  # a slowdown of the threshold or more is ruled out; faster or not, open
VERDICTS = TIMING_VERDICTS
DEFAULT_ALPHA = 0.01
DEFAULT_CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261122
# With several pool pairs, the share of the threshold every pool pair's own estimate must show.
POOL_PAIR_SHARE = 1.0
# The fewest values on a side (rounds; pairs per pool pair) that bound an interval (module docstring).
MIN_VALUES = 2
UNBOUNDED = (0.0, math.inf)  # the ratio interval when there are fewer
# The chance, at a true slowdown of exactly the threshold, that a case reads same or not-slower:
# the one-sided miss of the 95% interval, spent over all of a case's looks (stop_levels).
DEFAULT_STOP_ERROR = (1.0 - DEFAULT_CONFIDENCE) / 2
STOP_LEVEL_PATHS = 400_000  # simulated looks that set stop_levels' levels (seeded)
# How stop_levels spends the stop's error over the pairs: error * (pairs / planned pairs) ** power.
STOP_SPENDING_POWER = 1.0


@dataclass(frozen=True)
class PairedResult:
    pairs: int
    ratio: float  # exp(Hodges-Lehmann estimate of the log ratios)
    ci_low: float
    ci_high: float
    p_value: float
    verdict: Verdict
    pool_pair_ratios: tuple[float, ...] = ()  # exp(Hodges-Lehmann) of each pool pair's log ratios
    ratio_of_block_minima: float | None = None  # exp(Hodges-Lehmann) of the block minima's log ratios
    # The look's stop level and the ratio's exact signed-rank upper bound at it (stop_levels,
    # signed_rank_upper_bound); None: analysed without the stop rule.
    stop_level: float | None = None
    stop_bound: float | None = None

    def to_dict(self) -> dict:
        interval = [self.ci_low, self.ci_high] if math.isfinite(self.ci_high) else None  # JSON has no inf
        out = {"pairs": self.pairs, "ratio": self.ratio, "ratio_ci": interval,
               "p_value": self.p_value, "verdict": self.verdict,
               "ratio_per_pool_pair": list(self.pool_pair_ratios)}
        if self.ratio_of_block_minima is not None:
            out["ratio_of_block_minima"] = self.ratio_of_block_minima
        if self.stop_level is not None:
            out["stop_level"] = self.stop_level
            out["stop_bound"] = self.stop_bound if math.isfinite(self.stop_bound) else None
        if self.verdict == Verdict.INCONCLUSIVE:
            out["rules_out_slowdown"] = slowdown_ruled_out(self.upper_end)
        return out

    @property
    def upper_end(self) -> float:
        """The ratio's upper end as the verdict used it: the interval's, or the stop bound where
        that is higher (what an inconclusive case rules out)."""
        return self.ci_high if self.stop_bound is None else max(self.ci_high, self.stop_bound)


def slowdown_ruled_out(ci_high: float | None) -> float | None:
    """The smallest slowdown (a fraction: 0.087 is 8.7%) that an interval ending at ``ci_high``
    rules out: every slowdown from there up lies beyond it. 0.0 when the interval ends at or below
    1 (no slowdown at all is left open); None when it is unbounded (too little to tell)."""
    if ci_high is None or not math.isfinite(ci_high):
        return None
    return max(0.0, ci_high - 1.0)


def interval_verdict(ci_low: float, ci_high: float, threshold: float) -> Verdict:
    """The verdict an interval gives when no change was shown: ``same`` when it lies within
    [1 / (1 + threshold), 1 + threshold], ``not-slower`` when only its upper end does, else
    ``inconclusive``. Both gates end their rules with it."""
    up, down = 1.0 + threshold, 1.0 / (1.0 + threshold)
    if ci_high <= up:
        return Verdict.SAME if ci_low >= down else Verdict.NOT_SLOWER
    return Verdict.INCONCLUSIVE


@functools.lru_cache(maxsize=None)
def sequential_levels(alpha: float, looks: int) -> tuple[float, ...]:
    """Two-sided significance levels for looks 1..K at the pairs (group-sequential, O'Brien-Fleming
    shape): look k rejects when |z| > c * sqrt(K / k), with c chosen so that under no change the
    chance of rejecting at *any* look is ``alpha``. Early looks, on few pairs, need overwhelming
    evidence (a slow mode lasting a few seconds can cover a whole first stage); the last look tests
    at nearly ``alpha`` itself. The z-statistics of nested looks are correlated as sqrt(k / l); c comes from
    their joint normal distribution (scipy's multivariate normal, seeded: the same levels every time).
    """
    from scipy import optimize
    from scipy import stats

    if looks < 1 or not 0 < alpha < 1:
        raise ValueError("sequential_levels needs at least one look and 0 < alpha < 1")
    if looks == 1:
        return (alpha,)
    weights = np.sqrt(looks / np.arange(1, looks + 1))
    joint = _nested_looks(looks)

    def overall(c: float) -> float:
        return _chance_any_look_rejects(joint, c * weights) - alpha

    c = optimize.brentq(overall, stats.norm.isf(alpha / 2), stats.norm.isf(alpha / (2 * looks)) + 1.0, xtol=1e-5)
    return tuple(float(2 * stats.norm.sf(c * w)) for w in weights)


@functools.lru_cache(maxsize=None)
def stop_levels(error: float, look_pairs: tuple[int, ...], spending_power: float = STOP_SPENDING_POWER
                ) -> tuple[float, ...]:
    """One-sided levels for the looks at ``look_pairs`` pairs (cumulative, first to last) of the
    test that lets a look end a case as ``same`` or ``not-slower``: at a true slowdown of exactly
    the threshold, the chance that *any* look ends the case so is ``error``. The error is spent
    as the pairs accrue (Lan and DeMets' error spending): by the look at n of the N planned pairs,
    at most ``error * (n / N) ** spending_power`` (1: in proportion to the pairs; larger: kept for
    the late looks, as O'Brien-Fleming). Each look's level spends its increment given that no
    earlier look stopped: with nested looks the test statistics are correlated as sqrt(n_k / n_l),
    so the levels are set on that random walk, simulated (``STOP_LEVEL_PATHS`` paths, seeded: the
    same levels every time). A case that takes fewer looks (it decided, or its time cap ended it)
    spends less. Why this shape: docs/design/ab.md#the-stops-own-error."""
    from scipy import stats

    pairs = np.asarray(look_pairs, dtype=float)
    if not 0 < error < 1 or pairs.size == 0 or np.any(np.diff(pairs) <= 0) or pairs[0] <= 0:
        raise ValueError("stop_levels needs 0 < error < 1 and at least one look, at growing pair counts")
    if not spending_power > 0:
        raise ValueError(f"stop_levels needs a spending power above 0 (got {spending_power})")
    if pairs.size == 1:
        return (error,)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    steps = np.sqrt(np.diff(pairs, prepend=0.0))
    walk = np.cumsum(rng.standard_normal((STOP_LEVEL_PATHS, pairs.size)) * steps, axis=1) / np.sqrt(pairs)
    running = np.ones(STOP_LEVEL_PATHS, dtype=bool)  # paths no look has stopped yet
    stopped, levels = 0, []
    for k, fraction in enumerate(pairs / pairs[-1]):
        more = int(error * fraction ** spending_power * STOP_LEVEL_PATHS) - stopped  # this look's share
        if more <= 0:
            levels.append(0.0)
            continue
        bound = -float(np.partition(walk[running, k], more - 1)[more - 1])  # the more-th lowest still running
        levels.append(float(stats.norm.sf(bound)))
        stops = running & (walk[:, k] <= -bound)
        stopped += int(stops.sum())
        running &= ~stops
    return tuple(levels)


@functools.lru_cache(maxsize=None)
def _signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= k), k = 0 .. n(n+1)/2, for the signed-rank sum T+ of n values symmetric about 0
    (exact: the distribution of a sum of a random subset of 1..n)."""
    pmf = np.zeros(n * (n + 1) // 2 + 1)
    pmf[0] = 1.0
    for i in range(1, n + 1):
        pmf[i:] = pmf[i:] + pmf[:-i]
        pmf /= 2.0
    return np.cumsum(pmf)


def signed_rank_upper_bound(values, level: float) -> float:
    """The exact one-sided (1 - ``level``) upper confidence bound of the values' centre (the
    pseudo-median the Hodges-Lehmann estimate estimates): the Walsh average that inverts the
    one-sided signed-rank test, so at any number of values, for values symmetric about their
    centre, the bound falls below the centre with chance at most ``level`` (the bootstrap
    interval, resampling a handful of values, falls below it more often). +inf when the values
    are too few for any bound at that level (2^-n > level)."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n == 0:
        return math.inf
    cdf = _signed_rank_cdf(n)
    critical = int(np.searchsorted(cdf, level * (1 + 1e-12), side="right")) - 1  # largest k: P(T+ <= k) <= level
    if critical < 0:
        return math.inf
    i, j = np.triu_indices(n)
    walsh = np.sort((x[i] + x[j]) / 2.0)
    return float(walsh[walsh.size - 1 - critical])


def projected_stop_bound(log_ratios, level: float, next_pairs: int, next_level: float) -> float:
    """The ratio's stop bound a look at ``next_pairs`` pairs and stop level ``next_level`` would
    give if the pairs so far kept their centre and spread: the Hodges-Lehmann centre plus the
    present bound's distance above it (at ``level``), scaled by the two levels' normal quantiles
    and by sqrt(pairs / next_pairs). A forecast, never a verdict: the gate uses it only to choose
    which case spends borrowed time (docs/design/ab.md#the-run-budget). +inf where the present
    bound is, or a level is 0 (no bound at it)."""
    from scipy import stats

    x = np.asarray(log_ratios, dtype=float)
    if not 0 < x.size < next_pairs or not level < 0.5 or not next_level < 0.5:
        raise ValueError("projected_stop_bound needs pairs, more pairs next, and levels below 0.5")
    bound = signed_rank_upper_bound(x, level) if level > 0 < next_level else math.inf
    if not math.isfinite(bound):
        return math.inf
    centre = float(hodges_lehmann(x))
    spread = max(0.0, bound - centre) / stats.norm.isf(level)  # the centre's standard error, read off the bound
    return math.exp(centre + stats.norm.isf(next_level) * spread * math.sqrt(x.size / next_pairs))


def _nested_looks(looks: int):
    """The joint normal distribution of the z-statistics of looks 1..``looks`` at equal increments
    of pairs (correlated as sqrt(k / l))."""
    from scipy import stats

    k = np.arange(1, looks + 1)
    return stats.multivariate_normal(mean=np.zeros(looks), cov=np.sqrt(np.minimum.outer(k, k) / np.maximum.outer(k, k)))


def _chance_any_look_rejects(joint, bounds) -> float:
    """Under no change, the chance that some look's |z| passes its bound (``joint``: from
    :func:`_nested_looks`; integrated numerically, seeded: the same answer every time)."""
    return 1.0 - float(joint.cdf(bounds, lower_limit=-bounds, rng=np.random.default_rng(BOOTSTRAP_SEED)))


@functools.lru_cache(maxsize=None)
def level_for_last_look(alpha: float, planned: int, last: int) -> float:
    """The level of look ``last`` when the case ends there although ``planned`` looks were planned
    (the per-case time cap left no time for the next stage): the level that spends all of
    ``alpha`` the earlier looks (at their :func:`sequential_levels`) did not, so a case cut short
    by time keeps its whole alpha instead of ending on an early look's near-zero level (error
    spending, as Lan and DeMets allow for looks whose timing does not depend on the data). With
    the O'Brien-Fleming shape the earlier looks spend almost nothing: the level is just under alpha.
    """
    from scipy import optimize
    from scipy import stats

    if not 1 <= last <= planned:
        raise ValueError(f"look {last} is not one of the {planned} planned looks")
    levels = sequential_levels(alpha, planned)
    if last == planned:
        return levels[-1]
    if last == 1:
        return alpha
    earlier = stats.norm.isf(np.array(levels[:last - 1]) / 2)  # the earlier looks' |z| bounds
    joint = _nested_looks(last)

    def overall(z: float) -> float:
        return _chance_any_look_rejects(joint, np.append(earlier, z)) - alpha

    # The bracket: below alpha's own bound the looks together reject more than alpha, above it
    # plus one less (the cdf is integrated numerically, to about 1e-5).
    start = stats.norm.isf(alpha / 2)
    z = optimize.brentq(overall, start - 0.5, start + 1.0, xtol=1e-5)
    return min(alpha, float(2 * stats.norm.sf(z)))


def hodges_lehmann(values, axis: int = -1):
    """Median of the Walsh averages (x_i + x_j) / 2, i <= j, along ``axis`` (vectorised)."""
    x = np.moveaxis(np.asarray(values, dtype=float), axis, -1)
    n = x.shape[-1]
    i, j = np.triu_indices(n)
    walsh = (x[..., i] + x[..., j]) / 2.0
    return np.median(walsh, axis=-1)


def signed_rank_p(log_ratios) -> float:
    """Two-sided Wilcoxon signed-rank p-value (scipy; exact for small samples without ties)."""
    from scipy import stats

    x = np.asarray(log_ratios, dtype=float)
    x = x[x != 0]
    if len(x) < 2:
        return 1.0
    return float(stats.wilcoxon(x, alternative="two-sided", method="auto").pvalue)


def _pooled_hodges_lehmann(*groups, axis: int = -1):
    return hodges_lehmann(np.concatenate(groups, axis=axis), axis=axis)


def bootstrap_interval(groups, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap interval of the Hodges-Lehmann estimate of all log ratios together,
    resampling within each group (a pool pair's log ratios) separately (scipy.stats.bootstrap)."""
    from scipy import stats

    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    x = np.concatenate(groups) if groups else np.asarray([], dtype=float)
    if not groups or any(len(g) < MIN_VALUES for g in groups):  # too little to tell
        return -math.inf, math.inf
    if np.all(x == x[0]):
        value = float(hodges_lehmann(x))
        return value, value
    result = stats.bootstrap(tuple(groups), _pooled_hodges_lehmann, confidence_level=confidence,
                             n_resamples=BOOTSTRAP_RESAMPLES, method="percentile", vectorized=True,
                             batch=250, random_state=np.random.default_rng(BOOTSTRAP_SEED))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def decide_paired(ratio: float, ci_low: float, ci_high: float, p_value: float, threshold: float,
                  alpha: float = DEFAULT_ALPHA, pool_pair_ratios=(), pool_pair_share: float = POOL_PAIR_SHARE,
                  ratio_of_block_minima: float | None = None, stop_bound: float | None = None) -> Verdict:
    """The verdict (module docstring). With two or more pool pairs, each pool pair's estimate must
    clear ``pool_pair_share`` of the threshold; with one, nothing can tell its pools' own offset
    from a change, so the whole interval must clear the threshold instead. Given the ratio of the
    block minima, it must clear the threshold in the same direction too. Given ``stop_bound``
    (the ratio's upper bound at the look's stop level), ``same`` and ``not-slower`` need it within
    1 + threshold too."""
    up, down = 1.0 + threshold, 1.0 / (1.0 + threshold)
    each = list(pool_pair_ratios)
    if len(each) >= 2:
        each_up = 1.0 + pool_pair_share * threshold
        slower = ci_low > 1.0 and ratio > up and all(r > each_up for r in each)
        faster = ci_high < 1.0 and ratio < down and all(r < 1.0 / each_up for r in each)
    else:
        slower, faster = ci_low > up, ci_high < down
    if ratio_of_block_minima is not None:
        slower = slower and ratio_of_block_minima > up
        faster = faster and ratio_of_block_minima < down
    if p_value < alpha and slower:
        return Verdict.REGRESSION
    if p_value < alpha and faster:
        return Verdict.IMPROVEMENT
    if stop_bound is not None and stop_bound > up:
        return Verdict.INCONCLUSIVE  # the look's stop level does not yet rule out a slowdown of the threshold
    return interval_verdict(ci_low, ci_high, threshold)


def analyse_pairs(baseline_blocks: list[float], candidate_blocks: list[float], threshold: float,
                  alpha: float = DEFAULT_ALPHA, confidence: float = DEFAULT_CONFIDENCE,
                  pool_pair_of: list[int] | None = None,
                  pool_pair_share: float = POOL_PAIR_SHARE,
                  baseline_minima: list[float] | None = None,
                  candidate_minima: list[float] | None = None,
                  stop_level: float | None = DEFAULT_STOP_ERROR) -> PairedResult:
    """The verdict over paired block summaries (baseline_blocks[i] and candidate_blocks[i] ran next
    to each other, on pool pair ``pool_pair_of[i]``; all on one pool pair when not given). With
    each block's fastest round (``*_minima``, pair by pair as the blocks), a change must show in
    those too (module docstring). ``stop_level``: the look's level for ending as ``same`` or
    ``not-slower`` (:func:`stop_levels`; the default: a single look's whole share); None analyses
    without that rule, as before 2026-11-26 (the replay and simulation scripts compare the two)."""
    figures = _PairFigures.of(baseline_blocks, candidate_blocks, pool_pair_of, baseline_minima, candidate_minima,
                              stop_level)
    low, high = bootstrap_interval(figures.groups, confidence)
    ci_low, ci_high = math.exp(low), math.exp(high)
    verdict = figures.decide_paired(ci_low, ci_high, threshold, alpha, pool_pair_share)
    return PairedResult(figures.pairs, figures.ratio, ci_low, ci_high, figures.p_value, verdict,
                        figures.pool_pair_ratios, figures.minima_ratio, stop_level, figures.stop_bound)


def may_decide(baseline_blocks: list[float], candidate_blocks: list[float], threshold: float,
               alpha: float = DEFAULT_ALPHA, pool_pair_of: list[int] | None = None,
               pool_pair_share: float = POOL_PAIR_SHARE, baseline_minima: list[float] | None = None,
               candidate_minima: list[float] | None = None,
               stop_level: float | None = DEFAULT_STOP_ERROR) -> bool:
    """Whether :func:`analyse_pairs` on these arguments could give a verdict other than
    ``inconclusive``: False only when no interval at all could (the p-value, the ratios and the
    stop bound already rule every verdict out). Exact and cheap (no bootstrap, which at 288 pairs
    costs seconds a look): a look it answers False for needs no interval when more pairs follow."""
    figures = _PairFigures.of(baseline_blocks, candidate_blocks, pool_pair_of, baseline_minima, candidate_minima,
                              stop_level)
    # decide_paired() needs ci_low above a bound for a regression, ci_high below one for an improvement
    # and for same / not-slower: the interval most favourable to each is tried.
    return any(figures.decide_paired(low, high, threshold, alpha, pool_pair_share) != Verdict.INCONCLUSIVE
               for low, high in ((math.inf, math.inf), (0.0, 0.0), (1.0, 1.0)))


@dataclass(frozen=True)
class _PairFigures:
    """What a look's verdict reads from the pairs besides the bootstrap interval."""

    pairs: int
    groups: list  # each pool pair's log ratios
    ratio: float
    p_value: float
    pool_pair_ratios: tuple[float, ...]
    minima_ratio: float | None
    stop_bound: float | None

    @classmethod
    def of(cls, baseline_blocks, candidate_blocks, pool_pair_of, baseline_minima, candidate_minima,
           stop_level) -> "_PairFigures":
        if len(baseline_blocks) != len(candidate_blocks) or not baseline_blocks:
            raise ValueError("analyse_pairs needs the same, non-zero number of baseline and candidate blocks")
        if (baseline_minima is None) != (candidate_minima is None):
            raise ValueError("analyse_pairs needs both sides' block minima or neither")
        minima_ratio = None
        if baseline_minima is not None:
            if not len(baseline_minima) == len(candidate_minima) == len(baseline_blocks):
                raise ValueError("analyse_pairs needs one block minimum per block on each side")
            minima_logs = np.log(np.asarray(candidate_minima, dtype=float)) - np.log(
                np.asarray(baseline_minima, dtype=float))
            minima_ratio = math.exp(float(hodges_lehmann(minima_logs)))
        if pool_pair_of is None:
            pool_pair_of = [0] * len(baseline_blocks)
        if len(pool_pair_of) != len(baseline_blocks):
            raise ValueError("analyse_pairs needs one pool pair index per pair")
        logs = np.log(np.asarray(candidate_blocks, dtype=float)) - np.log(np.asarray(baseline_blocks, dtype=float))
        labels = np.asarray(pool_pair_of)
        groups = [logs[labels == k] for k in sorted(set(pool_pair_of))]
        stop_bound = None if stop_level is None else _exp(signed_rank_upper_bound(logs, stop_level))
        return cls(len(logs), groups, math.exp(float(hodges_lehmann(logs))), signed_rank_p(logs),
                   tuple(math.exp(float(hodges_lehmann(g))) for g in groups), minima_ratio, stop_bound)

    def decide_paired(self, ci_low: float, ci_high: float, threshold: float, alpha: float,
                      pool_pair_share: float) -> Verdict:
        return decide_paired(self.ratio, ci_low, ci_high, self.p_value, threshold, alpha, self.pool_pair_ratios,
                             pool_pair_share, self.minima_ratio, self.stop_bound)


def _exp(x: float) -> float:
    return math.inf if x == math.inf else math.exp(x)



# ----------------------------------------------------------------------------------------------
# Stored runs: two independent samples of rounds
# ----------------------------------------------------------------------------------------------


def bootstrap_ratio_ci(baseline, current, confidence: float = DEFAULT_CONFIDENCE,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of median(current) / median(baseline), each sample resampled
    on its own (scipy.stats.bootstrap; ``seed``: the same rounds always give the same interval)."""
    from scipy import stats

    base = np.asarray(baseline, dtype=float)
    cur = np.asarray(current, dtype=float)

    def ratio_of_medians(b, c, axis=-1):
        return np.median(c, axis=axis) / np.median(b, axis=axis)

    if base.size < MIN_VALUES or cur.size < MIN_VALUES:  # too little to tell
        return UNBOUNDED
    if np.all(base == base[0]) and np.all(cur == cur[0]):
        value = float(ratio_of_medians(base, cur))
        return value, value
    result = stats.bootstrap((base, cur), ratio_of_medians, confidence_level=confidence, n_resamples=resamples,
                             method="percentile", vectorized=True, random_state=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def mann_whitney_p(baseline, current) -> float:
    """Two-sided Mann-Whitney U p-value (normal approximation, tie- and continuity-corrected);
    1 when the samples give no evidence at all (empty, or every value tied)."""
    from scipy import stats

    a = np.asarray(list(baseline), dtype=float)
    b = np.asarray(list(current), dtype=float)
    if a.size == 0 or b.size == 0:
        return 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        p = stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", use_continuity=True).pvalue
    return 1.0 if not math.isfinite(p) else float(p)


def summary_ratio_ci(base_stats: dict, cur_stats: dict,
                     confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float, float]:
    """(ratio, lo, hi) from summary statistics only: the median's standard error ~ 1.253 * sigma /
    sqrt(n) with sigma ~ IQR / 1.349, combined on the log scale."""
    from scipy import stats

    def rel_se(summary):
        n = max(int(summary.get("rounds") or 1), 1)
        iqr = summary.get("iqr")
        iqr = float(iqr) if isinstance(iqr, (int, float)) and math.isfinite(iqr) else 0.0
        return 1.2533 * (iqr / 1.349) / math.sqrt(n) / float(summary["median"])

    ratio = float(cur_stats["median"]) / float(base_stats["median"])
    if any(int(summary.get("rounds") or 0) < MIN_VALUES for summary in (base_stats, cur_stats)):
        return (ratio, *UNBOUNDED)  # too little to tell
    se = math.hypot(rel_se(base_stats), rel_se(cur_stats))
    z = float(stats.norm.isf((1.0 - confidence) / 2))
    return ratio, ratio * math.exp(-z * se), ratio * math.exp(z * se)


def decide_unpaired(ratio: float, ci_low: float, ci_high: float, p_value: float | None, threshold: float,
                    confidence: float = DEFAULT_CONFIDENCE, alpha: float | None = None) -> Verdict:
    """The stored-run verdict (module docstring); ``p_value`` None: summary statistics only, the
    interval alone decides. ``alpha``: the level a change must be significant at (default
    1 - ``confidence``; with the run-to-run component, :func:`stored_alpha`)."""
    significant = p_value is None or p_value < (1.0 - confidence if alpha is None else alpha)
    if ratio > 1 + threshold and ci_low > 1 and significant:
        return Verdict.REGRESSION
    if ratio < 1 / (1 + threshold) and ci_high < 1 and significant:
        return Verdict.IMPROVEMENT
    return interval_verdict(ci_low, ci_high, threshold)


# ----------------------------------------------------------------------------------------------
# Stored runs: the run-to-run component (docs/design/gates.md#run-to-run-variance)
# ----------------------------------------------------------------------------------------------

# The run-to-run SD assumed when nothing measured it: the runs hold no pool spread and the storage
# fewer than MIN_HISTORY_RUNS saved runs of the case on this machine. Stated, and conservative: a
# run's log median moved by about this much (SD) between runs minutes apart on a quiet 2-core
# machine at 10 MB and above (docs/results.md, "Reliability of the stored-baseline gate").
RUN_TO_RUN_FLOOR = 0.05
# The fewest saved runs of a case whose spread may set its run-to-run SD below the floor (4
# differences); a shorter history (2 runs or more) can only widen the interval past the floor.
MIN_HISTORY_RUNS = 5
# Successive differences further than this many (normal-consistent) MADs from their median are a
# step in the history (a code change), not noise, and are left out of the estimate.
HISTORY_TRIM_MADS = 3.0
HISTORY_TRIM_MIN = 8  # ... and only with this many differences (fewer: a step widens the interval)
# The most recent saved runs the history estimate reads: the machine as it is now.
HISTORY_RUNS = 30


@dataclass(frozen=True)
class RunToRun:
    """The run-to-run component of a case's time: ``sd``, the SD of one run's log median about the
    case's level that the rounds inside a run do not show (where the OS placed the ranks, the heap,
    the machine's load and clock), the degrees of freedom of that estimate (``math.inf``: a stated
    figure) and, in words, where it came from."""

    sd: float
    df: float
    source: str
    measured: bool = True  # False: the stated floor, nothing measured it
    trusted: bool = True  # False: measured on too little to go below the floor (a short history, pools)

    def to_dict(self) -> dict:
        return {"sd": self.sd, "df": self.df if math.isfinite(self.df) else None, "source": self.source,
                "measured": self.measured}

    def cell(self) -> str:
        """'±4.1% (history, 12 runs)': the run-to-run SD in the report's run-to-run column."""
        return f"±{self.sd * 100:.1f}% ({self.source})"


NO_RUN_TO_RUN = RunToRun(0.0, math.inf, "off: the rounds' own interval", measured=False)


def floor_run_to_run(why: str) -> RunToRun:
    return RunToRun(RUN_TO_RUN_FLOOR, math.inf, f"floor, {why}", measured=False)


def log_median_se(rounds) -> float:
    """The standard error of a run's log median from its rounds: the 95% distribution-free interval
    of the median (order statistics) on the log scale, as a normal SE. 0 for fewer than 2 rounds."""
    x = np.sort(np.asarray(rounds, dtype=float))
    n = x.size
    if n < MIN_VALUES:
        return 0.0
    half = 1.959964 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half) - 1)
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return float(math.log(x[high] / x[low]) / (2 * 1.959964))


def history_spread(log_medians) -> tuple[float, int]:
    """(variance, differences kept) of the successive differences of a series of run log medians
    (in run order): the mean square of the differences within HISTORY_TRIM_MADS robust SDs of their
    median (with HISTORY_TRIM_MIN of them or more), so a lasting step (a code change) is left out.
    A successive difference of two runs of unchanged code has the variance of a stored comparison's
    log ratio, within-run noise included. (nan, 0) for fewer than 2 medians."""
    from scipy.stats import median_abs_deviation

    diffs = np.diff(np.asarray(log_medians, dtype=float))
    if diffs.size == 0:
        return math.nan, 0
    scale = float(median_abs_deviation(diffs, scale="normal"))
    centre = float(np.median(diffs))
    few = diffs.size < HISTORY_TRIM_MIN  # a MAD of a few differences is too loose to trim by
    kept = diffs if few else diffs[np.abs(diffs - centre) <= HISTORY_TRIM_MADS * scale]  # MAD 0: the equal ones
    if kept.size == 0:
        kept = diffs
    return float(np.mean(kept ** 2)), int(kept.size)


def history_df(differences: int) -> float:
    """The degrees of freedom of a variance read from ``differences`` successive differences: they
    overlap (each run is in two), worth about 2/3 of one each for normal runs; half of one is taken,
    (simulated with 2/3, unchanged code read regression in ~1% of comparisons at alpha 0.01, about
    twice the nominal rate)."""
    return max(1.0, differences / 2.0)


def run_to_run_from_history(runs_rounds: list) -> RunToRun | None:
    """The run-to-run SD from a case's saved runs on this machine, oldest first, each its raw rounds
    (a random-effects estimate: runs, then rounds within a run). The successive differences of the
    runs' log medians hold twice the run-to-run variance plus two runs' within-run variance; the
    latter (from each run's rounds) is taken out. None for fewer than 2 runs; with fewer than
    MIN_HISTORY_RUNS, not ``trusted`` (it may only widen the interval past the floor)."""
    runs = [r for r in runs_rounds if len(r) >= 1][-HISTORY_RUNS:]
    if len(runs) < 2:
        return None
    logs = [math.log(float(np.median(r))) for r in runs]
    spread, kept = history_spread(logs)
    within = float(np.mean([log_median_se(r) ** 2 for r in runs]))
    variance = max(0.0, spread / 2 - within)
    return RunToRun(math.sqrt(variance), history_df(kept), f"history, {len(runs)} runs",
                    trusted=len(runs) >= MIN_HISTORY_RUNS)


def run_to_run_from_pools(runs_pools: list) -> RunToRun | None:
    """The run-to-run SD of a run's median from the runs' own pools: each run measured the case in
    k >= 2 fresh pools, rounds split across them (``runs_pools``: per run, per pool its rounds). The
    spread of the pool medians about their run's, less their within-pool variance, estimates the
    pool-to-pool variance; a run's median over k pools carries 1/k of it. None where no run has 2
    pools."""
    squares, df, ks = 0.0, 0, []
    for pools in runs_pools:
        pools = [p for p in pools if len(p) >= 1]
        if len(pools) < 2:
            continue
        logs = np.log([float(np.median(p)) for p in pools])
        within = float(np.mean([log_median_se(p) ** 2 for p in pools]))
        squares += max(0.0, float(np.sum((logs - logs.mean()) ** 2)) - (len(pools) - 1) * within)
        df += len(pools) - 1
        ks.append(len(pools))
    if not df:
        return None
    pool_variance = squares / df
    k = min(ks)
    return RunToRun(math.sqrt(pool_variance / k), float(df), f"pools, {' + '.join(map(str, ks))}", trusted=False)


def combine_run_to_run(*estimates: RunToRun | None) -> RunToRun:
    """The run-to-run component a comparison uses (each estimate sees only part of what moves a run:
    pools the placement and the heap within one session, the history everything the machine did in
    between, as far as it holds runs). With a ``trusted`` estimate (a history of MIN_HISTORY_RUNS
    runs or more): the largest SD, at that history's degrees of freedom, so a current run whose
    pools spread more than the history widens its own comparison. Without one, the stated floor, or
    a larger SD the short history or the pools show, read as a stated figure (their few degrees of
    freedom would make the first comparisons of a quiet machine undecidable): they can only raise
    the floor."""
    measured = [e for e in estimates if e is not None]
    trusted = [e for e in measured if e.trusted]
    largest = max(measured, key=lambda e: e.sd, default=None)
    if trusted:
        history = max(trusted, key=lambda e: e.sd)
        if largest.sd > history.sd:
            return RunToRun(largest.sd, history.df, f"{largest.source}, above {history.cell()}")
        return history
    if largest is None:
        return floor_run_to_run("no saved history or pool spread of the case")
    if largest.sd < RUN_TO_RUN_FLOOR:
        return RunToRun(RUN_TO_RUN_FLOOR, math.inf, f"floor, above {largest.cell()}", measured=False)
    return RunToRun(largest.sd, math.inf, largest.source, trusted=False)


def stored_alpha(confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The two-sided level at which a stored comparison's change is significant when the run-to-run
    component is in its interval: DEFAULT_ALPHA (as A/B's), or 1 - ``confidence`` when that is
    stricter. The 95% interval alone would let unchanged code read regression in up to 2.5% of
    comparisons (its one-sided miss); the goal is at most 1%."""
    return min(DEFAULT_ALPHA, 1.0 - confidence)


@dataclass(frozen=True)
class StoredInterval:
    """A stored comparison's ratio of medians with its interval and p, the run-to-run component in
    it, and the smallest slowdown the comparison could flag (``detectable_slowdown``)."""

    ratio: float
    low: float
    high: float
    p_value: float | None
    run_to_run: RunToRun
    detectable_slowdown: float | None


def with_run_to_run(ratio: float, low: float, high: float, run_to_run: RunToRun, threshold: float,
                    confidence: float = DEFAULT_CONFIDENCE) -> StoredInterval:
    """The interval of ``ratio`` (current / baseline medians) with the run-to-run component added to
    the rounds' own (``low``, ``high``: the bootstrap interval of the two runs' rounds): on the log
    scale the rounds' standard error (read off their interval) and twice the run-to-run variance
    (each run carries its own), a t quantile with Satterthwaite's degrees of freedom (the run-to-run
    estimate's; a stated figure has infinitely many). The p-value is that model's (two-sided); the
    detectable slowdown is the smallest ratio the regression rule could flag, less 1: above 1 +
    ``threshold`` and far enough from 1 for the interval to lie above it."""
    from scipy import stats

    if not math.isfinite(high) or low <= 0:
        return StoredInterval(ratio, low, high, None, run_to_run, None)
    z = float(stats.norm.isf((1.0 - confidence) / 2))
    within = (math.log(high) - math.log(low)) / (2 * z)
    between = 2.0 * run_to_run.sd ** 2
    se = math.sqrt(within ** 2 + between)
    if se == 0:
        return StoredInterval(ratio, low, high, None if between == 0 else 1.0, run_to_run, threshold)
    df = math.inf if between == 0 or not math.isfinite(run_to_run.df) else (
        se ** 4 / (between ** 2 / run_to_run.df))
    q = float(stats.t.isf((1.0 - confidence) / 2, df)) if math.isfinite(df) else z
    centre = math.log(ratio)
    p = float(2 * (stats.t.sf(abs(centre) / se, df) if math.isfinite(df) else stats.norm.sf(abs(centre) / se)))
    alpha = stored_alpha(confidence)
    q_flag = float(stats.t.isf(alpha / 2, df)) if math.isfinite(df) else float(stats.norm.isf(alpha / 2))
    return StoredInterval(ratio, ratio * math.exp(-q * se), ratio * math.exp(q * se), p, run_to_run,
                          max(threshold, math.exp(q_flag * se) - 1.0))


def levels_interval(ratio: float, runs_before: int, runs_after: int, series_log_medians,
                    confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float, RunToRun]:
    """The interval of a step between two levels of a case's history (the history page's change
    points): ``ratio`` = after / before, each level the median of its runs' medians (``runs_before``
    and ``runs_after`` of them), with the run-to-run
    component the stored gate reads from the same series (:func:`history_spread`: a run's
    variance about its level, within-run noise included), so a step is shown as decided exactly when
    a stored comparison of those levels would be. (low, high, the run-to-run estimate)."""
    from scipy import stats

    spread, kept = history_spread(series_log_medians)
    if not kept or not math.isfinite(spread) or runs_before < 1 or runs_after < 1 or not ratio > 0:
        return 0.0, math.inf, floor_run_to_run("too few runs")
    centre = math.log(ratio)
    run_variance = spread / 2
    df = history_df(kept)
    # a median of n runs' medians: its variance ~ (pi / 2) * variance / n
    se = math.sqrt(math.pi / 2 * run_variance * (1 / runs_before + 1 / runs_after))
    q = float(stats.t.isf((1.0 - confidence) / 2, df))
    between = RunToRun(math.sqrt(run_variance), df, f"history, {len(np.asarray(series_log_medians))} runs")
    return math.exp(centre - q * se), math.exp(centre + q * se), between
