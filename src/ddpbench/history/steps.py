"""Change points in a series: where a case's typical time moved to a new level and stayed there
(docs/design/storage-and-report.md#change-points)."""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

import numpy as np

from ..gates import stats
from .series import Point, Series

DEFAULT_MIN_STEP = 0.05
MIN_POINTS = 6  # fewer runs cannot tell a step from noise (min_size 2 each side, and sigma)
# What a commit id read from a saved run must be before it goes into a suggested command: a git
# hash, full or abbreviated. A run file is data anyone can write; anything else in it is no commit.
GIT_HASH = re.compile(r"[0-9a-fA-F]{7,40}")


def shown_commit(commit: str) -> str:
    """A commit id as text to show: as it is when it is a git hash, else quoted with its escapes
    visible (no control character from a run file reaches a terminal) and cut to 40 characters."""
    if GIT_HASH.fullmatch(commit) or commit == "unknown":  # "unknown": the run recorded none
        return commit
    return repr(commit if len(commit) <= 40 else commit[:40] + "...")
WBS_CONSTANT = 1.3


def noise_sigma(log_medians: np.ndarray) -> float:
    """Robust noise level of a series: MAD (normal-consistent) of successive differences / sqrt(2);
    when over half the differences are equal (MAD 0), their standard deviation / sqrt(2)."""
    from scipy.stats import median_abs_deviation

    diffs = np.diff(log_medians)
    sigma = float(median_abs_deviation(diffs, scale="normal")) / math.sqrt(2)
    if sigma == 0 and len(diffs) > 1:
        sigma = float(np.std(diffs, ddof=1)) / math.sqrt(2)
    return sigma


def penalty(log_medians: np.ndarray) -> float:
    """The penalty per change point (see the module docstring)."""
    return 2 * WBS_CONSTANT**2 * noise_sigma(log_medians) ** 2 * math.log(len(log_medians))


def change_points(log_medians: np.ndarray) -> list[int]:
    """Indices where a new segment starts (ruptures' breakpoints without the final ``n``)."""
    import ruptures

    pen = penalty(log_medians)
    if pen == 0:  # every median equal: nothing moves
        return []
    ends = ruptures.KernelCPD(kernel="linear", min_size=2).fit(log_medians.reshape(-1, 1)).predict(pen=pen)
    return [int(end) for end in ends[:-1]]


@dataclass
class Step:
    """A lasting change of a series' median between two consecutive runs."""

    series: Series
    index: int  # the first point after the step
    before_s: float  # median of the run medians of the segment before
    after_s: float  # ... and after
    # The step's interval as the stored gate reads it (stats.levels_interval: the run-to-run
    # component from the same series); (0, inf) when unknown.
    ci_low: float = 0.0
    ci_high: float = math.inf
    run_to_run_sd: float | None = None

    @property
    def beyond_noise(self) -> bool:
        """Whether the interval lies wholly on the step's side of 1: a step the run-to-run noise
        of this series does not explain."""
        return self.ci_low > 1 if self.ratio > 1 else self.ci_high < 1

    @property
    def ratio(self) -> float:
        return self.after_s / self.before_s

    @property
    def size(self) -> float:
        """|log ratio|: a halving is as large as a doubling."""
        return abs(math.log(self.ratio))

    @property
    def last_before(self) -> Point:
        return self.series.points[self.index - 1]

    @property
    def first_after(self) -> Point:
        return self.series.points[self.index]

    def bisect_command(self) -> str | None:
        """The ``ddpbench bisect`` command that searches this step's commits for the one that made
        the case slower, every argument shell-quoted; None when there is none to suggest
        (:meth:`bisect_unavailable` says why)."""
        if self.bisect_unavailable() is not None:
            return None
        before, after = self.last_before.record.commit, self.first_after.record.commit
        path = self.series.fullname.split("::", 1)[0]
        tail = f" -- {shlex.quote(path)}" if path.endswith(".py") else ""
        return (f"ddpbench bisect {shlex.quote(before)} {shlex.quote(after)} "
                f"-k {shlex.quote(self.series.name)}{tail}")

    def bisect_unavailable(self) -> str | None:
        """Why no bisect command is suggested, or None when one is: a faster step (bisect searches
        slowdowns), or a run whose commit id is unknown or not a git hash (7 to 40 hex digits)."""
        if self.ratio <= 1:
            return "a faster step: bisect searches slowdowns"
        if not self.beyond_noise:
            return (f"within this series' run-to-run noise: the stored gate's interval "
                    f"[{self.ci_low:.3f}, {self.ci_high:.3f}] holds 1")
        for point in (self.last_before, self.first_after):
            commit, record = point.record.commit, point.record
            run = f"the run {record.file}" if record.run is not None else "a run"
            if commit == "unknown":
                return f"{run} records no commit"
            if not GIT_HASH.fullmatch(commit):
                return f"{run} records the commit id {shown_commit(commit)}, not a git hash (7 to 40 hex digits)"
        return None

    def to_dict(self) -> dict:
        def side(point: Point) -> dict:
            record = point.record
            return {"commit": record.commit, "branch": record.branch, "file": record.file,
                    "time": record.when.isoformat() if record.when else None}

        return {"case": self.series.name, "fullname": self.series.fullname,
                "machine": self.series.machine.label, "backend": self.series.backend,
                "chart": self.series.chart_id, "before_median_s": self.before_s,
                "after_median_s": self.after_s, "ratio": self.ratio,
                "ci": [self.ci_low, self.ci_high if math.isfinite(self.ci_high) else None],
                "run_to_run_sd": self.run_to_run_sd, "beyond_noise": self.beyond_noise,
                "last_before": side(self.last_before), "first_after": side(self.first_after),
                "bisect": self.bisect_command(), "bisect_unavailable": self.bisect_unavailable()}

    def describe(self) -> str:
        """One line: 'x1.50 case on machine, backend: 10.0 -> 15.0 ms between abc1234 (date) and ...'."""
        def commit(point: Point) -> str:
            when = point.record.when
            shown = shown_commit(point.record.commit)
            return f"{shown} ({when:%Y-%m-%d})" if when else shown

        interval = f" [{self.ci_low:.2f}, {self.ci_high:.2f}]" if math.isfinite(self.ci_high) else ""
        return (f"x{self.ratio:.2f}{interval}  {self.series.name} on {self.series.machine.label}, {self.series.backend}: "
                f"{self.before_s * 1e3:.4g} -> {self.after_s * 1e3:.4g} ms, between {commit(self.last_before)} "
                f"and {commit(self.first_after)}")


def detect_steps(series: Series, min_step: float = DEFAULT_MIN_STEP) -> list[Step]:
    """The steps of one series (none with fewer than :data:`MIN_POINTS` runs), in run order."""
    medians = np.array([p.median_s for p in series.points], dtype=float)
    if len(medians) < MIN_POINTS or not np.all(medians > 0):
        return []
    cuts = change_points(np.log(medians))
    threshold = math.log1p(min_step)
    while True:
        edges = [0, *cuts, len(medians)]
        levels = [float(np.median(medians[a:b])) for a, b in zip(edges, edges[1:])]
        sizes = [abs(math.log(after / before)) for before, after in zip(levels, levels[1:])]
        if not sizes or min(sizes) >= threshold:
            break
        del cuts[sizes.index(min(sizes))]
    logs = np.log(medians)
    steps = []
    for i, cut in enumerate(cuts):
        low, high, between = stats.levels_interval(levels[i + 1] / levels[i], cut - edges[i], edges[i + 2] - cut, logs)
        steps.append(Step(series, cut, levels[i], levels[i + 1], low, high, between.sd))
    return steps


def all_steps(series_list: list[Series], min_step: float = DEFAULT_MIN_STEP) -> list[Step]:
    """Every series' steps, largest first."""
    steps = [step for series in series_list for step in detect_steps(series, min_step)]
    return sorted(steps, key=lambda s: (-s.size, s.series.index, s.index))
