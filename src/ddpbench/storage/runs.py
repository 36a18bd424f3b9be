"""Saved runs read back: :class:`Run` and its :class:`Case` objects from a pytest-benchmark JSON
file, every record checked once as it is read (:mod:`.records`), and where runs are found (a
storage's machine folders, a run named by number or path, the default pair ``ddpbench compare``
takes). Bad input is a :class:`RunError` naming the file, the case, the field and the fix."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import run_facts
from .records import AB_KEY, LOST_CASES_KEY, ABRecord, Census, Completeness, Field, MemoryCensus, NotCounted, \
    Numerics, Ranks, RecordError, Shape, completeness_of, expect, probe_of, read_ab, read_extra_info
from .writing import RUN_NAME, run_number, saved_run_files

# commit_info branches that name no branch: a detached checkout (a CI job's pull request merge)
NO_BRANCH = (None, "", "HEAD", "(detached head)", "(unknown)")


class RunError(Exception):
    """Bad input: a run that cannot be found, read or used; a message for the user, exit status 2."""


@dataclass
class Case:
    """One benchmark of a run; building it reads and checks what ddpbench recorded in its
    ``extra_info`` (:func:`~.records.read_extra_info`: :class:`~.records.RecordError` if damaged)."""

    name: str
    fullname: str
    group: str | None
    extra_info: dict[str, Any]
    stats: dict[str, Any]
    data: list[float] | None  # raw rounds (seconds), None when saved without --benchmark-save-data
    census: Census | Ranks | NotCounted | None = field(init=False)  # extra_info["census"], read
    memory: MemoryCensus | Ranks | NotCounted | None = field(init=False)  # extra_info["memory"], read
    ab: ABRecord | None = field(init=False)  # extra_info["ab"], read
    numerics: Numerics | NotCounted | None = field(init=False)  # extra_info["numerics"], read

    def __post_init__(self):
        records = read_extra_info(self.extra_info)
        self.census, self.memory, self.ab = records.census, records.memory, records.ab
        self.numerics = records.numerics

    @property
    def median(self) -> float:
        if self.data:
            return float(np.median(self.data))
        return float(self.stats["median"])

    @property
    def calibrated_by_probe(self) -> bool:
        """Whether the CPU calibration probe speaks for this case: a CPU case measured on the
        controller's own machine (cases of other tools, without these keys, ran in pytest's
        process). A GPU's or another node's speed is not this CPU's."""
        device = self.extra_info.get("device")
        nodes = self.extra_info.get("nodes")
        return device in (None, "cpu") and nodes in (None, 1)


@dataclass
class Run:
    path: Path
    machine_info: dict[str, Any]
    commit_info: dict[str, Any]
    datetime: str | None
    cases: dict[str, Case]
    # A/B runs: the cases the candidate lost, which have no benchmark entry (ddpbench.gates.verdicts).
    lost_ab_cases: list = field(default_factory=list)
    completeness: Completeness = field(default_factory=lambda: Completeness(True, False))
    # the machine-drift calibration probe the run recorded (ddpbench.gates.calibration), None without
    calibration: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return self.path.name

    @property
    def has_raw_data(self) -> bool:
        return all(case.data for case in self.cases.values())


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# pytest-benchmark's summary of a case saved without its rounds, as far as the tables and charts
# divide by it (its median is checked on its own: everything divides by that).
_SECONDS = expect("a time in seconds above 0",
                  lambda value: isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0)
SUMMARY_STATS = Shape(expect("an object", lambda value: isinstance(value, dict)),
                      (Field("mean", _SECONDS), Field("q1", _SECONDS), Field("q3", _SECONDS)))


def read_doc(path: str | Path) -> dict:
    """One JSON run document as a dict; :class:`RunError` naming the problem and the fix."""
    path = Path(path)
    if not path.exists():
        raise RunError(f"{path}: no such file")
    if path.is_dir():
        raise RunError(f"{path}: is a directory, expected a pytest-benchmark JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"{path}: cannot read it ({exc})") from None
    if not text.strip():
        raise RunError(f"{path}: the file is empty (an interrupted or failed run?). Delete it, or "
                       f"name other runs.")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column "
                       f"{exc.colno}): truncated by an interrupted save, or edited by hand? Delete "
                       f"or restore it, or name other runs.") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise RunError(f"{path}: not a pytest-benchmark result (no 'benchmarks' list); expected a "
                       f"file saved by --benchmark-autosave/--benchmark-save or --benchmark-json")
    return doc


def load_run(path: str | Path) -> Run:
    """Read one pytest-benchmark JSON file; :class:`RunError` with a clear message if unusable."""
    path = Path(path)
    return run_of_doc(path, read_doc(path))


def _stats(index: int, bench: Any) -> tuple[dict[str, Any], list[float] | None]:
    """A benchmark entry's statistics as pytest-benchmark saved them, checked: (stats, its raw
    rounds or None); :class:`RecordError` naming what is wrong."""
    stats = bench.get("stats") if isinstance(bench, dict) else None
    if not isinstance(stats, dict) or not _number(stats.get("median")):
        raise RecordError("no stats.median")
    data = stats.get("data")
    if data is not None:
        if not isinstance(data, list) or not data or not all(_number(x) and x > 0 for x in data):
            raise RecordError("stats.data is not a list of round times (seconds, each above 0)")
        data = [float(x) for x in data]
    median = float(np.median(data)) if data else float(stats["median"])
    if not median > 0:  # ratios divide by it
        raise RecordError(f"its median round time is {median:g} s, and a round cannot take no time")
    if not data:
        SUMMARY_STATS.check(stats, "stats")
    return stats, data


def _case(index: int, bench: Any) -> Case:
    """One benchmark entry as a :class:`Case`, ddpbench's records read; :class:`RecordError`
    naming what is wrong."""
    stats, data = _stats(index, bench)
    fullname = str(bench.get("fullname") or bench.get("name") or f"#{index}")
    return Case(name=str(bench.get("name") or fullname), fullname=fullname, group=bench.get("group"),
                extra_info={} if bench.get("extra_info") is None else bench["extra_info"], stats=stats, data=data)


def _each_benchmark(doc: dict, read: Callable[[int, Any], Any]) -> tuple[list, list[tuple[str, RecordError]]]:
    """``read`` applied to each benchmark entry of a run document: what it gave, and what is wrong
    with the entries it refused (named by case)."""
    out, problems = [], []
    for index, bench in enumerate(doc["benchmarks"]):
        try:
            out.append(read(index, bench))
        except RecordError as exc:
            named = isinstance(bench, dict) and (bench.get("fullname") or bench.get("name"))
            problems.append((str(named or f"benchmark #{index}"), exc))
    return out, problems


def _lost_cases(doc: dict) -> tuple[list, list[tuple[str, RecordError]]]:
    """An A/B run's lost cases (entries with a name and an ``ab`` record), and what is wrong with
    their records."""
    lost = doc.get(LOST_CASES_KEY) if isinstance(doc.get(LOST_CASES_KEY), list) else []
    problems = []
    for entry in lost:
        if isinstance(entry, dict) and isinstance(entry.get(AB_KEY), dict):
            try:
                read_ab(entry[AB_KEY])
            except RecordError as exc:
                problems.append((str(entry.get("name", "?")), RecordError(f"extra_info {exc}", record=AB_KEY)))
    return lost, problems


def damaged(path: Path, problems: list[tuple[str, RecordError]]) -> str:
    """The message for a run whose cases hold what their records' shapes do not allow: the file,
    up to five cases with the field and what it holds, and the fix."""
    shown = "; ".join(f"{name}: {problem}" for name, problem in problems[:5])
    if len(problems) > 5:
        shown += f" (and {len(problems) - 5} more)"
    if all(problem.record == AB_KEY for _, problem in problems):
        return (f"{path}: {shown}. The run's file is damaged or was edited: restore it or run the A/B "
                f"comparison again")
    cases = "the case" if len({name for name, _ in problems}) == 1 else "those cases"
    return f"{path}: {shown}. The file is damaged or was edited: restore it or rerun {cases}"


def _no_benchmarks(path: Path, completeness: Completeness) -> str:
    why = "" if completeness.complete else f" It is {completeness.describe()}."
    return f"{path}: the run holds no benchmarks (were they all skipped or deselected?).{why}"


def run_of_doc(path: Path, doc: dict) -> Run:
    """A run document (as read by :func:`read_doc`, or a session's own) as a :class:`Run`, every
    record read and checked; :class:`RunError` naming ``path`` when it is unusable."""
    read, problems = _each_benchmark(doc, _case)
    lost, lost_problems = _lost_cases(doc)
    if problems or lost_problems:
        raise RunError(damaged(path, problems + lost_problems))
    completeness = completeness_of(doc)
    if not read:
        raise RunError(_no_benchmarks(path, completeness))
    cases = {case.fullname: case for case in read}
    machine_info = doc.get("machine_info") if isinstance(doc.get("machine_info"), dict) else {}
    commit_info = doc.get("commit_info") if isinstance(doc.get("commit_info"), dict) else {}
    return Run(path, machine_info, commit_info, doc.get("datetime"), cases, lost, completeness, probe_of(doc))


def saved_runs(storage_dir: str | Path) -> list[Path]:
    """Saved runs (``<storage>/<machine-id>/NNNN_*.json``) of the machine id with the most recently
    saved run, oldest first (by pytest-benchmark's run number, of any width: 10000 after 9999)."""
    storage_dir = Path(storage_dir)
    if not storage_dir.is_dir():
        return []
    files = [p for p in storage_dir.glob("*/*.json") if RUN_NAME.match(p.name)]
    if not files:
        return []
    newest_dir = max(files, key=lambda p: p.stat().st_mtime).parent
    return saved_run_files(newest_dir)


def unreadable_run(path: Path) -> str | None:
    """Why pytest-benchmark cannot use a saved run (truncated, not JSON, not a run, a case without
    its statistics, no case at all), or None when it can. ddpbench's own records are not read:
    pytest-benchmark does not read them either."""
    try:
        doc = read_doc(path)
    except RunError as exc:
        return str(exc)
    read, problems = _each_benchmark(doc, _stats)
    if problems:
        return damaged(path, problems)
    return None if read else _no_benchmarks(path, completeness_of(doc))


def storage_files(storage: str | Path) -> list[Path]:
    """Every saved run of every machine folder: ``<storage>/<machine-id>/NNNN_*.json``."""
    storage = Path(storage)
    if not storage.is_dir():
        return []
    return sorted(p for p in storage.glob("*/*.json") if RUN_NAME.match(p.name))


def compare_target_problem(storage_option: str, machine_id: str, compare_option) -> str | None:
    """For ``pytest --benchmark-compare[=NUM]``: a message when the saved run it would compare
    against is unreadable, or when the default target (the newest run) is incomplete or numbered
    past 9999. pytest-benchmark skips an unreadable file with a warning that scrolls away and
    silently compares against an older run (an interrupted save leaves exactly such a newest file);
    it takes an incomplete run as it is; and its four-digit glob does not see run 10000 and later."""
    if not compare_option or ("://" in storage_option and not storage_option.startswith("file://")):
        return None  # nothing to compare, or a storage that is not a folder (elasticsearch)
    folder = Path(storage_option.removeprefix("file://")) / machine_id
    runs = saved_run_files(folder)
    if compare_option is not True:
        runs = [p for p in runs if p.name.startswith(str(compare_option))]
    if not runs:
        return None
    target = runs[-1]
    which = "the newest saved run" if compare_option is True else f"saved run {compare_option}"
    problem = unreadable_run(target)
    if problem is not None:
        return (f"--benchmark-compare: {which} cannot be read: {problem} pytest-benchmark "
                f"would skip it and compare against an older run without saying so in the results. "
                f"Delete or restore that file (an interrupted save leaves a truncated one), or name "
                f"the run to compare against: --benchmark-compare=NNNN")
    if compare_option is not True:
        return None  # a run the user named is taken as named
    if run_number(target) > 9999:
        return (f"--benchmark-compare: the newest saved run, {target.name}, is numbered past 9999, and "
                f"pytest-benchmark's own search sees only four-digit numbers: it would compare against "
                f"an older run. Name it: --benchmark-compare={run_number(target)}")
    status = completeness_of(read_doc(target))
    if not status.complete:
        return (f"--benchmark-compare: the newest saved run, {target.name}, is {status.describe()}; "
                f"as a baseline it would silently lack those cases. Name a complete run to compare "
                f"against: --benchmark-compare=NNNN (ddpbench compare picks one by itself)")
    return None


def resolve_run(spec: str, storage_dir: str | Path) -> Path:
    """A file path, or a saved run's number / name prefix (``0003``, ``3``) in ``storage``."""
    path = Path(spec)
    if path.exists() or spec.endswith(".json") or "/" in spec:
        return path
    runs = saved_runs(storage_dir)
    wanted = f"{int(spec):04d}" if spec.isdigit() else spec
    matches = [p for p in runs if p.name.startswith(wanted + "_")] if spec.isdigit() else \
        [p for p in runs if p.name.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunError(f"no saved run matching {spec!r} in {storage_dir} (and no such file)")
    raise RunError(f"{spec!r} matches several saved runs: {', '.join(p.name for p in matches)}")




# ----------------------------------------------------------------------------------------------
# The default pair: the newest run and the newest complete run of the same machine and branch
# ----------------------------------------------------------------------------------------------


@dataclass
class Selection:
    """The two runs ``ddpbench compare`` compares when none is named, and why those."""

    baseline: Path
    current: Path
    lines: list[str] = field(default_factory=list)


def _branch(doc: dict) -> str | None:
    commit = doc.get("commit_info") if isinstance(doc.get("commit_info"), dict) else {}
    branch = commit.get("branch")
    return None if branch in NO_BRANCH or not isinstance(branch, str) else branch


_SHOWN_SKIPS = 10


def choose_runs(storage_dir: str | Path) -> Selection:
    """The newest saved run, and as its baseline the newest older run that is complete, of the
    same machine (:data:`ddpbench.storage.run_facts.MACHINE_FACTS`) and of the same branch; when
    the current run names no branch (a detached CI checkout) or no run of its branch qualifies,
    the newest complete run of that machine on any branch, said so. :class:`RunError` when
    none qualifies, naming what was passed over."""
    runs = saved_runs(storage_dir)
    if len(runs) < 2:
        found = "no saved run" if not runs else f"only one saved run ({runs[0]})"
        raise RunError(
            f"need a baseline and a current run, but {storage_dir} has {found}. Save runs with "
            f"`pytest benchmarks/ --benchmark-autosave --benchmark-save-data` (as `make bench` does) "
            f"or name two --benchmark-json files: ddpbench compare BASELINE.json CURRENT.json")
    current = runs[-1]
    cur_doc = read_doc(current)
    branch = _branch(cur_doc)
    skipped: list[tuple[Path, str]] = []
    other_branch: tuple[Path, str | None] | None = None  # the newest qualifying run of another branch
    chosen = None
    for path in reversed(runs[:-1]):
        doc = read_doc(path)
        status = completeness_of(doc)
        if not status.complete:
            skipped.append((path, f"{path.name}: {status.describe()}"))
            continue
        machine = run_facts.run_differences(doc.get("machine_info"), cur_doc.get("machine_info"),
                                              facts=run_facts.MACHINE_FACTS).differ
        if machine:
            skipped.append((path, f"{path.name}: another machine ({'; '.join(d.describe() for d in machine)})"))
            continue
        if branch is None or _branch(doc) == branch:
            chosen = path
            break
        if other_branch is None:
            other_branch = (path, _branch(doc))
        skipped.append((path, f"{path.name}: branch {_branch(doc) or 'unknown'}, not {branch}"))
    if chosen is None and other_branch is not None:
        chosen, its_branch = other_branch
        why = (f"the newest complete run of this machine, from branch {its_branch or 'unknown'}: no complete "
               f"run of branch {branch} qualifies")
    elif chosen is not None:
        why = ("the newest complete run of this machine" + (f" on branch {branch}" if branch else
               " (the current run names no branch: any branch)"))
    else:
        raise RunError(
            f"no complete saved run of this machine to compare {current.name} with in "
            f"{Path(current).parent}: " + "; ".join(line for _, line in skipped) + ". By default the baseline "
            "is a complete run (no failed case, not stopped by -x / --maxfail or a crash) of the same "
            "machine: save one, or name the runs to compare: ddpbench compare BASELINE CURRENT")
    lines = [f"baseline chosen: {why}"]
    skipped = [line for path, line in skipped if run_number(path) > run_number(chosen)]
    lines += [f"passed over {line}" for line in skipped[:_SHOWN_SKIPS]]
    if len(skipped) > _SHOWN_SKIPS:
        lines.append(f"passed over {len(skipped) - _SHOWN_SKIPS} more run(s)")
    return Selection(chosen, current, lines)
