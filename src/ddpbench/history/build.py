"""The history a page shows: the runs read, their series and each series' steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .numerics import NumericsChange, compare_points
from .series import RunRecord, Series, group_series, load_records, since_filter
from .steps import DEFAULT_MIN_STEP, MIN_POINTS, Step, all_steps


@dataclass
class History:
    """What the page shows: the runs read (in commit order), the series and their steps, and what
    they were read from."""

    runs: list[RunRecord]
    series: list[Series]
    steps: list[Step]  # largest first
    storage: Path
    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one message per unreadable saved run left out
    since: datetime | None = None
    case_patterns: list[str] = field(default_factory=list)
    min_step: float = DEFAULT_MIN_STEP
    min_points: int = MIN_POINTS
    numerics_changes: list[NumericsChange] = field(default_factory=list)  # in page order

    @property
    def machines(self) -> list[str]:
        return list(dict.fromkeys(record.machine.label for record in self.runs))


def build_history(storage: str | Path = ".benchmarks", files=(), *, since: datetime | None = None,
                  cases=(), min_step: float = DEFAULT_MIN_STEP, skip_unreadable: bool = False) -> History:
    """Read the runs, keep those since ``since`` and the cases matching ``cases``, group them into
    series, find each series' steps and where its numerics replay changed from one run to the next."""
    records, skipped = load_records(storage, files, skip_unreadable)
    if since is not None:
        records = since_filter(records, since)
    records.sort(key=RunRecord.order_key)
    series = group_series(records, list(cases))
    changes = compare_points(series)
    return History(records, series, all_steps(series, min_step), Path(storage), [Path(f) for f in files],
                   skipped, since, list(cases), min_step, numerics_changes=changes)
