"""What ddpbench adds to a run's terminal summary: each case's three exact answers on one line, what
one step sends (the census), holds (the memory census) and computes (the numerics replay), which
pytest-benchmark's table of times does not show; and why its cases were skipped (pytest lists skip
reasons only with ``-rs``), so a first run says what it measured and left out without options."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterable

from .gates.memory import peak_place
from .gates.structure import size_text
from .storage.records import CENSUS_KEY, MEMORY_KEY, NUMERICS_KEY, NotCounted, Ranks, RecordError, read_census, \
    read_memory, read_numerics

#: The heading of the per-case lines (the plugin writes it as a separator line).
CASES_HEADING = ("ddpbench: what each case's step sends (census), holds (memory, the largest rank's) and "
                 "computes (numerics)")

SKIPS_SHOWN_BY = frozenset("saA")  # -rs / -ra / -rA: pytest lists every skip with its reason itself


def skip_reason(report: Any) -> str:
    """A skipped test's reason as pytest records it (``longrepr`` is ``(path, line, "Skipped: why")``)."""
    longrepr = getattr(report, "longrepr", None)
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    return str(text).removeprefix("Skipped: ").strip() or "no reason given"


def skip_lines(reports: Iterable[Any], cases: set[str], reportchars: str) -> list[str]:
    """One line per reason the ddpbench ``cases`` (node ids) among the skipped ``reports`` were
    skipped for, most frequent first; none where pytest lists the skips itself (``reportchars``)."""
    if SKIPS_SHOWN_BY & set(reportchars or ""):
        return []
    seen, reasons = set(), Counter()
    for report in reports:
        nodeid = getattr(report, "nodeid", None)
        if nodeid in cases and nodeid not in seen:
            seen.add(nodeid)
            reasons[skip_reason(report)] += 1
    return [f"ddpbench: {n} case{'s' if n > 1 else ''} skipped: {reason} (-rs lists them)"
            for reason, n in sorted(reasons.items(), key=lambda item: (-item[1], item[0]))]


def _times(count: float) -> str:
    return f"{count:g}"


def census_fact(extra_info: dict) -> str:
    """A case's census in a few words: the collectives one step sends, by kind, and their bytes
    (graph breaks and recompiles where there were any); why it was not counted; or that none was
    taken."""
    record = extra_info.get(CENSUS_KEY)
    if record is None:
        return "no census"
    try:
        census = read_census(record)
    except RecordError as exc:
        return f"census unreadable ({exc})"
    disagree = ""
    if isinstance(census, Ranks):  # every rank's record: the case's figures are the whole's
        disagree = " (the ranks differ)" if len(census.groups) > 1 else ""  # groups of identical ranks
        census = census.whole
    if isinstance(census, NotCounted):
        return f"census not counted: {census}"
    calls: Counter = Counter()
    total = 0.0
    for (kind, *_), (count, nbytes, *_) in census.collectives.items():
        calls[kind] += count
        total += nbytes
    sends = ("sends " + ", ".join(f"{_times(n)} {kind}" for kind, n in calls.items()) + f" ({size_text(total)})"
             if calls else "sends no collective")
    for what, value in (("graph break", census.graph_breaks), ("recompile", census.recompiles)):
        if value:
            sends += f", {_times(value)} {what}{'s' if value != 1 else ''}"
    return f"{sends} per step{disagree}"


def memory_fact(extra_info: dict) -> str | None:
    """A case's memory census in a few words: the peak of the rank that holds most, where it fell,
    what stays after the step; why it was not counted; None without a census."""
    record = extra_info.get(MEMORY_KEY)
    if record is None:
        return "no memory census"
    try:
        figures = read_memory(record)
    except RecordError as exc:
        return f"memory census unreadable ({exc})"
    if isinstance(figures, Ranks):  # every rank's record: the case's figures are the whole's
        figures = figures.whole
    if isinstance(figures, NotCounted):
        return f"memory not counted: {figures}"
    disagree = " (the ranks disagree)" if figures.ranks_disagree else ""
    return (f"memory peak {size_text(figures.peak)} {peak_place(figures)}{disagree}, "
            f"{size_text(figures.after)} kept after the step")


def numerics_fact(extra_info: dict) -> str | None:
    """A case's numerics replay in a few words: its steps and whether its two replays agreed bit
    for bit; why it was not counted; None without a replay."""
    record = extra_info.get(NUMERICS_KEY)
    if record is None:
        return "no numerics replay"
    try:
        numerics = read_numerics(record)
    except RecordError as exc:
        return f"numerics unreadable ({exc})"
    if isinstance(numerics, NotCounted):
        return f"numerics not counted: {numerics}"
    agree = ("replays bitwise equal" if numerics.first_nondeterministic_step is None
             else f"replays differ from step {numerics.first_nondeterministic_step}, "
                  f"up to {numerics.replay_spread:.2g}")
    return f"numerics {numerics.steps} steps, {agree}, digest {numerics.digests[-1][:12]}"


def unchanged_parameters_fact(extra_info: dict) -> str | None:
    """Why a training step changed no parameter (``parameters_unchanged``), or None."""
    why = extra_info.get("parameters_unchanged")
    return str(why) if why else None


# What each case's summary line says, in order: a component adds its fact here.
CASE_FACTS: list[Callable[[dict], str | None]] = [census_fact, memory_fact, numerics_fact,
                                                   unchanged_parameters_fact]


def case_lines(benchmarks: Iterable[Any]) -> list[str]:
    """Each ddpbench case's line: its name, then each of :data:`CASE_FACTS` (a case that is no
    ddpbench case, with none of their records, has none)."""
    rows = []
    for bench in benchmarks:
        info = getattr(bench, "extra_info", None) or {}
        if not any(key in info for key in (CENSUS_KEY, MEMORY_KEY, NUMERICS_KEY)):
            continue
        facts = [fact for fact in (f(info) for f in CASE_FACTS) if fact]
        rows.append((str(getattr(bench, "name", "?")), "; ".join(facts)))
    width = max((len(name) for name, _ in rows), default=0)
    return [f"{name.ljust(width)}  {facts}" for name, facts in rows]
