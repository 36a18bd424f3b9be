"""What ddpbench adds to a run's terminal summary: each case's memory peak and numerics replay
(pytest-benchmark's table shows time only) and why its cases were skipped (pytest lists skip reasons only with ``-rs``), so a
first run says what it measured and left out without options."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterable

from .gates.memory import peak_place
from .gates.structure import size_text
from .storage.records import MEMORY_KEY, NUMERICS_KEY, NotCounted, Ranks, RecordError, read_memory, read_numerics

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


def memory_fact(extra_info: dict) -> str | None:
    """A case's memory census in a few words: the peak of the rank that holds most, where it fell,
    what stays after the step; why it was not counted; None without a census."""
    record = extra_info.get(MEMORY_KEY)
    if record is None:
        return None
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
        return None
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
CASE_FACTS: list[Callable[[dict], str | None]] = [memory_fact, numerics_fact, unchanged_parameters_fact]


def case_lines(benchmarks: Iterable[Any]) -> list[str]:
    """Each measured case's line: its name, then the facts of :data:`CASE_FACTS` it has."""
    rows = []
    for bench in benchmarks:
        info = getattr(bench, "extra_info", None) or {}
        facts = [fact for fact in (f(info) for f in CASE_FACTS) if fact]
        if facts:
            rows.append((str(getattr(bench, "name", "?")), "; ".join(facts)))
    width = max((len(name) for name, _ in rows), default=0)
    return [f"{name.ljust(width)}  {facts}" for name, facts in rows]
