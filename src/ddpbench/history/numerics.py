"""The numerics of a series: each point's replay (its last step's digest) and, from one run to the
next that has a replay, the numerics verdict between them, so that a page over many commits shows
where training started computing other values (docs/design/storage-and-report.md#numerics-from-run-to-run)."""

from __future__ import annotations

from dataclasses import dataclass

from ..gates.numerics import CHANGED, ROUNDING, compare_numerics
from ..gates.verdict_words import Verdict
from ..storage.records import Numerics, NotCounted
from .series import Point, Series
from .steps import shown_commit


def numerics_state(record: Numerics | NotCounted | None) -> str | None:
    """A case's replay (as read) in a few words: ``3 steps, digest 1a2b3c4d5e6f`` (the last step's,
    over every rank), ``not counted (why)``, or None without a replay."""
    if isinstance(record, Numerics):
        return f"{record.steps} step{'s' if record.steps != 1 else ''}, digest {record.digests[-1][:12]}"
    if isinstance(record, NotCounted):
        return f"not counted ({record})"
    return None


@dataclass(frozen=True)
class NumericsChange:
    """A point whose replay differs from the previous point's: ``changed`` (a regression between
    the two runs, as the gates would read it) or ``rounding`` (the bits differ within the earlier
    run's band: shown, not failed)."""

    series: Series
    before: Point
    after: Point
    line: str
    outcome: str = CHANGED

    def describe(self) -> str:
        return (f"{self.series.name} [{self.series.machine.label}, {self.series.backend}]: numerics "
                f"{shown_commit(self.before.record.commit)} -> {shown_commit(self.after.record.commit)}: {self.line}")

    def to_dict(self) -> dict:
        return {"case": self.series.fullname, "machine": self.series.machine.label, "backend": self.series.backend,
                "before": {"commit": self.before.record.commit, "file": self.before.record.file},
                "after": {"commit": self.after.record.commit, "file": self.after.record.file}, "line": self.line,
                "outcome": self.outcome}


def compare_points(series: list[Series]) -> list[NumericsChange]:
    """Fill each point's ``numerics_state`` and its ``numerics_line``: the verdict against the series'
    previous point with a counted replay (the first such point gets none). Returns the changes:
    ``changed`` and ``rounding`` alike, each with its outcome."""
    changes: list[NumericsChange] = []
    for one in series:
        previous: Point | None = None
        for point in one.points:
            record = point.numerics
            point.numerics_state = numerics_state(record)
            if not isinstance(record, Numerics):
                continue
            if previous is not None:
                verdict = compare_numerics(previous.numerics, record, "later run")
                point.numerics_line = verdict.line
                if verdict.verdict is Verdict.REGRESSION:
                    changes.append(NumericsChange(one, previous, point, verdict.line))
                elif verdict.outcome == ROUNDING:
                    changes.append(NumericsChange(one, previous, point, verdict.line, ROUNDING))
            previous = point
    return changes
