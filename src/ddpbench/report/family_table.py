"""What each family's report module declares: its section's title, its tables and its charts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..storage.runs import Case


@dataclass(frozen=True)
class Chart:
    """One PNG a family draws: its file name and the figure of the family's cases."""

    file_name: str  # e.g. "collectives_time.png"
    figure: Callable[[Any, list[Case]], Any]  # (matplotlib.pyplot, the family's cases) -> a Figure


@dataclass(frozen=True)
class FamilyTable:
    """A family's section of the report: its cases are those whose ``extra_info["family"]`` is
    ``name``; ``tables`` writes their markdown (one table, or ``### `` sub-tables), every table of
    it followed by the line naming the run and machine; ``charts`` are drawn with ``--chart``;
    ``required`` names the extra_info keys the tables cannot do without (a case of the family
    lacking one is named as damaged before any table is written)."""

    name: str
    title: str
    tables: Callable[[list[Case]], str]
    charts: tuple[Chart, ...] = ()
    required: tuple[str, ...] = ()
