"""Saved runs read back: :class:`Run` and its :class:`Case` objects from a pytest-benchmark JSON
file, and where runs are found (a storage's machine folders, a run named by number or path, the
default pair ``ddpbench compare`` takes). Bad input is a :class:`RunError` naming the file and
the fix."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..gates import fingerprint
from ..gates.calibration import probe_of
from ..gates.completeness import Completeness, completeness_of
from ..gates.verdicts import LOST_CASES_KEY
from .writing import RUN_NAME, run_number, saved_run_files

# commit_info branches that name no branch: a detached checkout (a CI job's pull request merge)
NO_BRANCH = (None, "", "HEAD", "(detached head)", "(unknown)")


class RunError(Exception):
    """Bad input: a run that cannot be found, read or used; a message for the user, exit status 2."""


@dataclass
class Case:
    name: str
    fullname: str
    group: str | None
    extra_info: dict[str, Any]
    stats: dict[str, Any]
    data: list[float] | None  # raw rounds (seconds), None when saved without --benchmark-save-data

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


def run_of_doc(path: Path, doc: dict) -> Run:
    """A run document (as read by :func:`read_doc`, or a session's own) as a :class:`Run`;
    :class:`RunError` naming ``path`` when it is unusable."""
    cases: dict[str, Case] = {}
    for index, bench in enumerate(doc["benchmarks"]):
        stats = bench.get("stats") if isinstance(bench, dict) else None
        if not isinstance(stats, dict) or not _number(stats.get("median")):
            raise RunError(f"{path}: benchmark #{index} has no stats.median; the file is damaged")
        fullname = str(bench.get("fullname") or bench.get("name") or f"#{index}")
        data = stats.get("data")
        if data is not None:
            if not isinstance(data, list) or not data or not all(_number(x) and x > 0 for x in data):
                raise RunError(f"{path}: {fullname}: stats.data is not a list of round times "
                                   f"(seconds, each above 0)")
            data = [float(x) for x in data]
        median = float(np.median(data)) if data else float(stats["median"])
        if not median > 0:  # ratios divide by it
            raise RunError(f"{path}: {fullname}: its median round time is {median:g} s, and a round "
                               f"cannot take no time; the file is damaged or was edited: restore it or "
                               f"rerun the case")
        if bench.get("extra_info") is not None and not isinstance(bench.get("extra_info"), dict):
            raise RunError(f"{path}: {fullname}: extra_info is {type(bench['extra_info']).__name__}, "
                               f"not an object of keys; the file is damaged or was edited")
        cases[fullname] = Case(
            name=str(bench.get("name") or fullname),
            fullname=fullname,
            group=bench.get("group"),
            extra_info=bench.get("extra_info") if isinstance(bench.get("extra_info"), dict) else {},
            stats=stats,
            data=data,
        )
    completeness = completeness_of(doc)
    if not cases:
        why = "" if completeness.complete else f" It is {completeness.describe()}."
        raise RunError(f"{path}: the run holds no benchmarks (were they all skipped or deselected?).{why}")
    machine_info = doc.get("machine_info") if isinstance(doc.get("machine_info"), dict) else {}
    commit_info = doc.get("commit_info") if isinstance(doc.get("commit_info"), dict) else {}
    lost = doc.get(LOST_CASES_KEY) if isinstance(doc.get(LOST_CASES_KEY), list) else []
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
    """Why a saved run cannot be read (truncated, not JSON, not a run), or None when it can."""
    try:
        load_run(path)
    except RunError as exc:
        return str(exc)
    return None


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
    status = load_run(target).completeness
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
    same machine (:data:`ddpbench.gates.fingerprint.MACHINE_FACTS`) and of the same branch; when
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
        machine = fingerprint.run_differences(doc.get("machine_info"), cur_doc.get("machine_info"),
                                              facts=fingerprint.MACHINE_FACTS).differ
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
