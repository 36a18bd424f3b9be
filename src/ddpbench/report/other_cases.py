"""The section of cases no family table shows (a user's own workloads): name and median time."""

from __future__ import annotations

from ..storage.runs import Case
from .cells import table
from .family_table import FamilyTable


def other_table(cases: list[Case]) -> str:
    rows = [[c.name, f"{c.median * 1e3:.3f}"] for c in sorted(cases, key=lambda c: c.fullname)]
    return table(["Case", "Median time (ms)"], rows)


TABLE = FamilyTable(name="other", title="Other cases", tables=other_table)
