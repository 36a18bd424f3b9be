"""``ddpbench history``: every saved run of a pytest-benchmark storage (all machine folders) and any
named JSON files, as one static HTML page of series with their detected steps.

* :mod:`.series`: runs -> one series per (machine, backend, case), points in commit order;
* :mod:`.steps`: change points of each series (ruptures), kept when at least ``min_step``;
* :mod:`.page`: the self-contained HTML page (``page.html`` / ``page.css`` / ``page.js``).

The command is a view, not a gate: it exits 0 whatever the steps (``ddpbench compare`` and A/B
mode are the gates); bad input raises :class:`ddpbench.storage.runs.RunError` (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .page import write_page
from .series import RunRecord, Series, group_series, load_records, parse_since, since_filter
from .steps import DEFAULT_MIN_STEP, MIN_POINTS, Step, all_steps

DEFAULT_OUTPUT = "reports/history.html"

__all__ = ["DEFAULT_MIN_STEP", "DEFAULT_OUTPUT", "History", "build_history", "parse_since", "write_page"]


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

    @property
    def machines(self) -> list[str]:
        return list(dict.fromkeys(record.machine.label for record in self.runs))


def build_history(storage: str | Path = ".benchmarks", files=(), *, since: datetime | None = None,
                  cases=(), min_step: float = DEFAULT_MIN_STEP, skip_unreadable: bool = False) -> History:
    """Read the runs, keep those since ``since`` and the cases matching ``cases``, group them into
    series and find each series' steps."""
    records, skipped = load_records(storage, files, skip_unreadable)
    if since is not None:
        records = since_filter(records, since)
    records.sort(key=RunRecord.order_key)
    series = group_series(records, list(cases))
    return History(records, series, all_steps(series, min_step), Path(storage), [Path(f) for f in files],
                   skipped, since, list(cases), min_step)
