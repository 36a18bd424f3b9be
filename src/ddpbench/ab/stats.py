"""Paired statistics and the verdict of an A/B case.

The unit is a *pair*: one block of baseline rounds and one block of candidate rounds run next to
each other (in either order). Each block is summarised by the median of its rounds; each pair by
the log of candidate median / baseline median. Over the pairs:

* the estimate is the Hodges-Lehmann location of the log ratios (median of the Walsh averages),
  reported as a ratio (>1: the candidate is slower);
* its interval is a percentile bootstrap of that estimate (fixed seed: the same blocks always give
  the same interval);
* significance is the two-sided Wilcoxon signed-rank test of "log ratios symmetric about 0"
  (exact for small samples), as Chromium's Pinpoint decides.

Verdicts, for a threshold t (the smallest change that counts) and a significance level alpha:
``regression`` when p < alpha and the whole interval lies above 1 + t (so the estimate does too);
``improvement`` symmetrically (p < alpha, the interval below 1 / (1 + t)); ``same`` when the whole
interval lies within [1 / (1 + t), 1 + t] (any change is smaller than what counts);
``inconclusive`` otherwise: more pairs are needed.

Why the interval and not only the estimate must clear the threshold: identical sides measured A/A
on the dev machine kept case-long offsets of up to ~9% between the two pools of processes (not
removed by setting the workload up anew per block), with intervals like [1.02, 1.10] and p < 0.01;
an estimate-only rule called 3-5% of such cases regressions or improvements (docs/results.md).

Tests come from scipy.stats rather than being written by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

VERDICTS = ("regression", "improvement", "same", "inconclusive")
DEFAULT_ALPHA = 0.01
DEFAULT_CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261122


@dataclass(frozen=True)
class PairedResult:
    pairs: int
    ratio: float  # exp(Hodges-Lehmann estimate of the log ratios)
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str

    def to_dict(self) -> dict:
        return {"pairs": self.pairs, "ratio": self.ratio, "ratio_ci": [self.ci_low, self.ci_high],
                "p_value": self.p_value, "verdict": self.verdict}


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


def bootstrap_interval(log_ratios, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap interval of the Hodges-Lehmann estimate (scipy.stats.bootstrap)."""
    from scipy import stats

    x = np.asarray(log_ratios, dtype=float)
    if len(x) < 2 or np.all(x == x[0]):
        value = float(hodges_lehmann(x)) if len(x) else 0.0
        return value, value
    result = stats.bootstrap((x,), hodges_lehmann, confidence_level=confidence, n_resamples=BOOTSTRAP_RESAMPLES,
                             method="percentile", vectorized=True, batch=250,
                             random_state=np.random.default_rng(BOOTSTRAP_SEED))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def decide(ratio: float, ci_low: float, ci_high: float, p_value: float, threshold: float,
           alpha: float = DEFAULT_ALPHA) -> str:
    up, down = 1.0 + threshold, 1.0 / (1.0 + threshold)
    if p_value < alpha and ci_low > up:
        return "regression"
    if p_value < alpha and ci_high < down:
        return "improvement"
    if ci_low >= down and ci_high <= up:
        return "same"
    return "inconclusive"


def analyse_pairs(baseline_blocks: list[float], candidate_blocks: list[float], threshold: float,
                  alpha: float = DEFAULT_ALPHA, confidence: float = DEFAULT_CONFIDENCE) -> PairedResult:
    """The verdict over paired block medians (baseline_blocks[i] and candidate_blocks[i] ran next
    to each other)."""
    if len(baseline_blocks) != len(candidate_blocks) or not baseline_blocks:
        raise ValueError("analyse_pairs needs the same, non-zero number of baseline and candidate blocks")
    logs = np.log(np.asarray(candidate_blocks, dtype=float)) - np.log(np.asarray(baseline_blocks, dtype=float))
    estimate = float(hodges_lehmann(logs))
    low, high = bootstrap_interval(logs, confidence)
    p_value = signed_rank_p(logs)
    ratio, ci_low, ci_high = math.exp(estimate), math.exp(low), math.exp(high)
    return PairedResult(len(logs), ratio, ci_low, ci_high, p_value,
                        decide(ratio, ci_low, ci_high, p_value, threshold, alpha))
