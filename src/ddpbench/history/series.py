"""Saved runs -> series of points: one series per (machine, backend, case), points in commit order
(docs/design/storage-and-report.md#series)."""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime, time, timezone
from pathlib import Path
from typing import Any

from ..storage.runs import Run, RunError, load_run, storage_files
from ..report import backend_label, family, spread

SAVE_HINT = ("save runs with `pytest benchmarks/ --benchmark-autosave --benchmark-save-data` "
             "(as `make bench` does)")
FAMILIES = ("collectives", "syncbn", "datasets", "training", "transformer", "other")  # page order


@dataclass(frozen=True)
class Machine:
    """The hardware a run was measured on: ``key`` tells machines apart, ``label`` names one."""

    key: tuple
    label: str


def machine_of(machine_info: dict) -> Machine:
    """Node, CPU brand and GPU models of pytest-benchmark's machine_info (software versions left out:
    an upgrade is part of the history, not another machine)."""
    node = str(machine_info.get("node") or "unknown node")
    cpu = machine_info.get("cpu") if isinstance(machine_info.get("cpu"), dict) else {}
    brand = str(cpu.get("brand_raw") or machine_info.get("processor") or "unknown CPU")
    gpus = machine_info.get("ddpbench_gpus") if isinstance(machine_info.get("ddpbench_gpus"), dict) else {}
    devices = tuple(str(d) for d in gpus.get("devices") or ())
    label = f"{node} ({brand})"
    if devices:
        label += f", {len(devices)} x {', '.join(sorted(set(devices)))}"
    return Machine((node, brand, devices), label)


def parse_time(text) -> datetime | None:
    """An ISO time as an aware UTC datetime (no zone: UTC); None when absent or not ISO."""
    if not isinstance(text, str) or not text.strip():
        return None
    text = text.strip()
    if text.endswith("Z"):  # git's strict ISO for UTC; datetime.fromisoformat reads it only from 3.11
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)


def parse_since(text: str) -> datetime:
    """``--since``: an ISO date (midnight UTC) or date and time; ValueError naming the format."""
    try:
        day = date.fromisoformat(text.strip())
    except ValueError:
        when = parse_time(text)
        if when is None:
            raise ValueError(f"{text!r} is not an ISO date; write e.g. 2026-01-31 "
                             f"(or 2026-01-31T12:00)") from None
        return when
    return datetime.combine(day, time(), tzinfo=timezone.utc)


def short_commit(commit_id: str) -> str:
    """A git hash shortened as git shows it (7 hex digits); other ids ('unversioned') unchanged."""
    return commit_id[:7] if re.fullmatch(r"[0-9a-f]{8,}", commit_id) else commit_id


@dataclass
class RunRecord:
    """One loaded run with where (machine) and when (commit, run time) it was measured."""

    run: Run
    machine: Machine
    commit: str  # short commit id
    branch: str
    dirty: bool
    commit_time: datetime | None
    run_time: datetime | None

    @classmethod
    def of(cls, run: Run) -> RunRecord:
        info = run.commit_info
        return cls(run, machine_of(run.machine_info), short_commit(str(info.get("id") or "unknown")),
                   str(info.get("branch") or "(unknown)"), bool(info.get("dirty")),
                   parse_time(info.get("time")), parse_time(run.datetime))

    @property
    def when(self) -> datetime | None:
        """The time the run is ordered by: its commit's, else its own."""
        return self.commit_time or self.run_time

    @property
    def file(self) -> str:
        return self.run.path.name

    def order_key(self) -> tuple:
        far = datetime.max.replace(tzinfo=timezone.utc)  # runs of unknown time go last
        return (self.when or far, self.run_time or far, self.file)

    def when_text(self) -> str:
        """'committed 2026-01-03 14:02 UTC', or the run's time when the commit's is unknown."""
        if self.commit_time:
            return f"committed {self.commit_time:%Y-%m-%d %H:%M} UTC"
        if self.run_time:
            return f"run saved {self.run_time:%Y-%m-%d %H:%M} UTC (no commit time)"
        return "time unknown"


@dataclass
class Point:
    """One run's figure for one case (seconds); ``q1_s`` / ``q3_s`` None: saved without raw rounds."""

    record: RunRecord
    median_s: float
    q1_s: float | None
    q3_s: float | None
    verdict: str | None = None  # A/B runs: the case's verdict and candidate / baseline ratio
    ab_ratio: float | None = None
    memory_peak_bytes: int | None = None  # the memory census's peak (largest rank), when the run has one
    numerics: Any = None  # the case's numerics replay as read (storage.records.Numerics / NotCounted), or None
    numerics_state: str | None = None  # that replay in a few words (history.numerics.numerics_state)
    numerics_line: str | None = None  # its verdict against the series' previous replay (history.numerics)


@dataclass
class Series:
    """One case's points on one machine and backend, in commit order."""

    index: int
    machine: Machine
    backend: str
    fullname: str
    name: str
    family: str
    points: list[Point] = field(default_factory=list)

    @property
    def chart_id(self) -> str:
        return f"chart-{self.index}"


def load_records(storage: str | Path, files=(), skip_unreadable: bool = False) -> tuple[list[RunRecord], list[str]]:
    """The runs of ``storage`` and of the named ``files`` (each file once), and one message per
    saved run skipped as unreadable. A named file must be a run; an unreadable saved run is an
    error unless ``skip_unreadable``. :class:`RunError` when no run is left."""
    records, skipped, seen = [], [], set()
    for path in map(Path, files):  # named on the command line: it must be a run
        if path.resolve() not in seen:
            seen.add(path.resolve())
            records.append(RunRecord.of(load_run(path)))
    for path in storage_files(storage):
        if path.resolve() in seen:
            continue
        try:
            records.append(RunRecord.of(load_run(path)))
        except RunError as exc:
            if not skip_unreadable:
                raise RunError(f"{exc} For the history of {storage}: delete that file, or pass "
                               f"--skip-unreadable to leave it out") from None
            skipped.append(f"skipped unreadable saved run: {exc}")
    if not records:
        where = f"{storage} holds no saved run (<machine>/NNNN_*.json)"
        if skipped:
            where = f"none of the {len(skipped)} saved runs in {storage} can be read"
        raise RunError(f"no runs to show: {where}. To build a history, {SAVE_HINT}, or name "
                       f"pytest-benchmark JSON files (--benchmark-json) on the command line")
    return records, skipped


def since_filter(records: list[RunRecord], since: datetime) -> list[RunRecord]:
    """The runs ordered on or after ``since``; :class:`RunError` naming the newest run if none."""
    kept = [r for r in records if r.when is not None and r.when >= since]
    if not kept:
        dated = [r for r in records if r.when is not None]
        newest = max(dated, key=RunRecord.order_key) if dated else None
        found = (f"the newest of the {len(records)} runs is from {newest.when:%Y-%m-%d} ({newest.file})"
                 if newest else f"none of the {len(records)} runs records a commit or run time")
        raise RunError(f"--since {since:%Y-%m-%d}: no run on or after it; {found}. Give an earlier "
                       f"date, or leave --since out")
    return kept


def case_matches(name: str, fullname: str, patterns) -> bool:
    """A case is wanted when a pattern matches its name or fullname (fnmatch) or is part of either."""
    return any(pattern in name or pattern in fullname or fnmatch.fnmatchcase(name, pattern)
               or fnmatch.fnmatchcase(fullname, pattern) for pattern in patterns)


def memory_peak_of(extra_info: dict) -> int | None:
    """The memory census's peak of a case (the largest over ranks), or None without one."""
    memory = extra_info.get("memory")
    if not isinstance(memory, dict):
        return None
    peak = memory.get("max_peak_bytes", memory.get("peak_bytes"))
    return peak if isinstance(peak, int) and not isinstance(peak, bool) and peak >= 0 else None


def group_series(records: list[RunRecord], patterns=()) -> list[Series]:
    """One :class:`Series` per (machine, backend, case fullname), points in commit order; only the
    cases ``patterns`` match when given (:class:`RunError` naming some cases if none does)."""
    groups: dict[tuple, Series] = {}
    for record in sorted(records, key=RunRecord.order_key):
        for case in record.run.cases.values():
            if patterns and not case_matches(case.name, case.fullname, patterns):
                continue
            backend = backend_label(case.extra_info)
            key = (record.machine.key, backend, case.fullname)
            series = groups.get(key)
            if series is None:
                series = groups[key] = Series(0, record.machine, backend, case.fullname, case.name, family(case))
            if case.data:
                q1, median, q3 = spread(case)
            else:
                q1, median, q3 = None, case.median, None
            ab = case.extra_info.get("ab") if isinstance(case.extra_info.get("ab"), dict) else {}
            ratio = ab.get("ratio")
            known = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and math.isfinite(ratio)
            verdict = ab.get("verdict") if isinstance(ab.get("verdict"), str) else None
            series.points.append(Point(record, median, q1, q3, verdict, float(ratio) if known else None,
                                       memory_peak_of(case.extra_info), case.numerics))
    if not groups:
        names = sorted({case.name for r in records for case in r.run.cases.values()})
        shown = ", ".join(names[:5]) + (f" (and {len(names) - 5} more)" if len(names) > 5 else "")
        raise RunError(f"--case {' '.join(patterns)}: no case matches; the runs hold {shown}. Give a "
                       f"part of a case name or a pattern such as 'test_all_reduce*'")
    ordered = sorted(groups.values(), key=lambda s: (FAMILIES.index(s.family), s.name, s.fullname,
                                                     s.machine.label, s.backend))
    for index, series in enumerate(ordered):
        series.index = index
    return ordered
