"""The stored-baseline gate: noise-aware verdicts between two pytest-benchmark runs (saved runs or
--benchmark-json files), case by case (matched by pytest-benchmark's ``fullname``), in the gates'
one vocabulary (:mod:`.verdicts`) from the ratio of the medians, its bootstrap interval and the
Mann-Whitney p (:mod:`.stats`). A case the baseline has and the current run lacks is ``missing``
(it crashed, hung or was removed); one only the current run has is ``new``.

Runs saved without ``--benchmark-save-data`` hold only summary statistics: compare then falls back
to the medians with an interval from the IQR and round counts (normal approximation of the median's
standard error) and says so; :attr:`Comparison.summary_only` is set (the CLI exits 2 unless
``--allow-summary-stats``).

Machine drift: every run saved by ddpbench carries a calibration probe (:mod:`ddpbench.gates.calibration`)
in ``machine_info``. The probe times this machine's CPU, so it corrects only CPU cases measured on
the controller's own machine (extra_info ``device`` cpu, one node); CUDA and multi-node cases are
compared raw. With ``calibration="auto"`` (default) those cases' ratios are divided by
current_probe / baseline_probe when that factor is outside 1 +- :data:`DRIFT_TOLERANCE` (inside it,
the probe's own noise would only add noise) and both probes were steady (median repetition at most
:data:`ddpbench.gates.calibration.MAX_PROBE_SPREAD` x the fastest: an unsteady probe means a busy machine,
whose load a probe cannot tell from drift); ``"always"`` / ``"never"`` force it. A run saved while
the load average exceeded the CPU count gets a warning: load that changes between runs is not in
the rounds' noise, so no within-run statistic can guard against it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import stats, verdicts
from .calibration import MAX_PROBE_SPREAD, drift_factor, overload, probe_of, probe_spread
from .verdicts import CaseVerdict, Column, GateReport

DEFAULT_THRESHOLD = 0.10
DEFAULT_CONFIDENCE = stats.DEFAULT_CONFIDENCE
DRIFT_TOLERANCE = 0.10
# machine_info fields whose difference makes timings hard to compare
MACHINE_FIELDS = ("node", "processor", "machine", "system", "release", "python_implementation",
                  "python_version", "ddpbench_gpus")
RUN_NAME = re.compile(r"^(\d{4})_.*\.json$")


class CompareError(Exception):
    """Bad input: a message for the user, exit status 2."""


# ----------------------------------------------------------------------------------------------
# Loading runs
# ----------------------------------------------------------------------------------------------


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

    @property
    def label(self) -> str:
        return self.path.name

    @property
    def has_raw_data(self) -> bool:
        return all(case.data for case in self.cases.values())


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_run(path: str | Path) -> Run:
    """Read one pytest-benchmark JSON file; :class:`CompareError` with a clear message if unusable."""
    path = Path(path)
    if not path.exists():
        raise CompareError(f"{path}: no such file")
    if path.is_dir():
        raise CompareError(f"{path}: is a directory, expected a pytest-benchmark JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: cannot read it ({exc})") from None
    if not text.strip():
        raise CompareError(f"{path}: the file is empty (an interrupted or failed run?). Delete it, or "
                           f"name other runs.")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column "
                           f"{exc.colno}): truncated by an interrupted save, or edited by hand? Delete "
                           f"or restore it, or name other runs.") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise CompareError(f"{path}: not a pytest-benchmark result (no 'benchmarks' list); expected a "
                           f"file saved by --benchmark-autosave/--benchmark-save or --benchmark-json")
    cases: dict[str, Case] = {}
    for index, bench in enumerate(doc["benchmarks"]):
        stats = bench.get("stats") if isinstance(bench, dict) else None
        if not isinstance(stats, dict) or not _number(stats.get("median")):
            raise CompareError(f"{path}: benchmark #{index} has no stats.median; the file is damaged")
        fullname = str(bench.get("fullname") or bench.get("name") or f"#{index}")
        data = stats.get("data")
        if data is not None:
            if not isinstance(data, list) or not data or not all(_number(x) and x > 0 for x in data):
                raise CompareError(f"{path}: {fullname}: stats.data is not a list of round times "
                                   f"(seconds, each above 0)")
            data = [float(x) for x in data]
        median = float(np.median(data)) if data else float(stats["median"])
        if not median > 0:  # ratios divide by it
            raise CompareError(f"{path}: {fullname}: its median round time is {median:g} s, and a round "
                               f"cannot take no time; the file is damaged or was edited: restore it or "
                               f"rerun the case")
        if bench.get("extra_info") is not None and not isinstance(bench.get("extra_info"), dict):
            raise CompareError(f"{path}: {fullname}: extra_info is {type(bench['extra_info']).__name__}, "
                               f"not an object of keys; the file is damaged or was edited")
        cases[fullname] = Case(
            name=str(bench.get("name") or fullname),
            fullname=fullname,
            group=bench.get("group"),
            extra_info=bench.get("extra_info") if isinstance(bench.get("extra_info"), dict) else {},
            stats=stats,
            data=data,
        )
    if not cases:
        raise CompareError(f"{path}: the run holds no benchmarks (were they all skipped or deselected?)")
    machine_info = doc.get("machine_info") if isinstance(doc.get("machine_info"), dict) else {}
    commit_info = doc.get("commit_info") if isinstance(doc.get("commit_info"), dict) else {}
    from .verdicts import LOST_CASES_KEY

    lost = doc.get(LOST_CASES_KEY) if isinstance(doc.get(LOST_CASES_KEY), list) else []
    return Run(path, machine_info, commit_info, doc.get("datetime"), cases, lost)


def saved_runs(storage: str | Path) -> list[Path]:
    """Saved runs (``<storage>/<machine-id>/NNNN_*.json``) of the machine id with the most recently
    saved run, oldest first (by pytest-benchmark's run number)."""
    storage = Path(storage)
    if not storage.is_dir():
        return []
    files = [p for p in storage.glob("*/*.json") if RUN_NAME.match(p.name)]
    if not files:
        return []
    newest_dir = max(files, key=lambda p: p.stat().st_mtime).parent
    mine = [p for p in files if p.parent == newest_dir]
    return sorted(mine, key=lambda p: (int(RUN_NAME.match(p.name).group(1)), p.name))


def unreadable_run(path: Path) -> str | None:
    """Why a saved run cannot be read (truncated, not JSON, not a run), or None when it can."""
    try:
        load_run(path)
    except CompareError as exc:
        return str(exc)
    return None


def compare_target_problem(storage_option: str, machine_id: str, compare_option) -> str | None:
    """For ``pytest --benchmark-compare[=NUM]``: a message when the saved run it would compare
    against is unreadable. pytest-benchmark skips such a file with a warning that scrolls away and
    silently compares against an older run; an interrupted save leaves exactly such a newest file."""
    if not compare_option or ("://" in storage_option and not storage_option.startswith("file://")):
        return None  # nothing to compare, or a storage that is not a folder (elasticsearch)
    folder = Path(storage_option.removeprefix("file://")) / machine_id
    runs = sorted((p for p in folder.glob("*.json") if RUN_NAME.match(p.name)),
                  key=lambda p: (int(RUN_NAME.match(p.name).group(1)), p.name))
    if compare_option is not True:
        runs = [p for p in runs if p.name.startswith(str(compare_option))]
    if not runs:
        return None
    target = runs[-1]
    problem = unreadable_run(target)
    if problem is None:
        return None
    which = "the newest saved run" if compare_option is True else f"saved run {compare_option}"
    return (f"--benchmark-compare: {which} cannot be read: {problem} pytest-benchmark "
            f"would skip it and compare against an older run without saying so in the results. "
            f"Delete or restore that file (an interrupted save leaves a truncated one), or name "
            f"the run to compare against: --benchmark-compare=NNNN")


def resolve_run(spec: str, storage: str | Path) -> Path:
    """A file path, or a saved run's number / name prefix (``0003``, ``3``) in ``storage``."""
    path = Path(spec)
    if path.exists() or spec.endswith(".json") or "/" in spec:
        return path
    runs = saved_runs(storage)
    wanted = f"{int(spec):04d}" if spec.isdigit() else spec
    matches = [p for p in runs if p.name.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise CompareError(f"no saved run matching {spec!r} in {storage} (and no such file)")
    raise CompareError(f"{spec!r} matches several saved runs: {', '.join(p.name for p in matches)}")


def default_runs(storage: str | Path) -> tuple[Path, Path]:
    runs = saved_runs(storage)
    if len(runs) < 2:
        found = "no saved run" if not runs else f"only one saved run ({runs[0]})"
        raise CompareError(
            f"need a baseline and a current run, but {storage} has {found}. Save runs with "
            f"`pytest benchmarks/ --benchmark-autosave --benchmark-save-data` (as `make bench` does) "
            f"or name two --benchmark-json files: ddpbench compare BASELINE.json CURRENT.json")
    return runs[-2], runs[-1]


# ----------------------------------------------------------------------------------------------
# Comparison
# ----------------------------------------------------------------------------------------------


@dataclass
class Comparison(GateReport):
    """Two stored runs' verdicts (a :class:`GateReport`) and the machine drift between them."""

    baseline: str = ""
    current: str = ""
    drift: float | None = None  # current / baseline calibration probe
    normalised: bool = False  # the CPU cases' ratios were divided by the drift
    summary_only: bool = False  # a run lacks raw rounds: verdicts from summary statistics

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(baseline=self.baseline, current=self.current, drift=self.drift, normalised=self.normalised,
                   summary_only=self.summary_only)
        return out


ROUNDS_COLUMN = Column("rounds", lambda c: "-" if c.baseline_rounds is None else f"{c.baseline_rounds}/{c.current_rounds}")


def machine_differences(base: dict, cur: dict) -> list[str]:
    diffs = []
    for key in MACHINE_FIELDS:
        if base.get(key) != cur.get(key):
            diffs.append(f"{key}: {base.get(key)!r} -> {cur.get(key)!r}")
    base_cpu = (base.get("cpu") or {}).get("brand_raw") if isinstance(base.get("cpu"), dict) else None
    cur_cpu = (cur.get("cpu") or {}).get("brand_raw") if isinstance(cur.get("cpu"), dict) else None
    if base_cpu != cur_cpu:
        diffs.append(f"cpu: {base_cpu!r} -> {cur_cpu!r}")
    return diffs


def compare_runs(base: Run, cur: Run, threshold: float = DEFAULT_THRESHOLD,
                 confidence: float = DEFAULT_CONFIDENCE, calibration: str = "auto",
                 seed: int = 0) -> Comparison:
    if not threshold >= 0:
        raise CompareError(f"--threshold must be >= 0, got {threshold}")
    if not 0 < confidence < 1:
        raise CompareError(f"--confidence must be between 0 and 1, got {confidence}")
    if calibration not in ("auto", "always", "never"):
        raise CompareError(f"--calibration must be auto, always or never, got {calibration!r}")
    result = Comparison("ddpbench compare", [], threshold, confidence, columns=[ROUNDS_COLUMN],
                        preamble=[f"baseline: {base.path}", f"current:  {cur.path}"],
                        baseline=str(base.path), current=str(cur.path))

    diffs = machine_differences(base.machine_info, cur.machine_info)
    if diffs:
        result.warnings.append("the runs come from different machines or environments ("
                               + "; ".join(diffs) + "); ratios mix code and machine changes")

    probes = {r.label: probe_of(r.machine_info) for r in (base, cur)}
    busy = {label: overload(p) for label, p in probes.items() if overload(p)}
    if busy:
        result.warnings.append(
            "the machine was overloaded while saving " + "; ".join(f"{k} ({v})" for k, v in busy.items())
            + ": between-run load changes are not in the rounds' noise, so verdicts may be false alarms")
    noisy = {label: probe_spread(p) for label, p in probes.items()
             if probe_spread(p) is not None and probe_spread(p) > MAX_PROBE_SPREAD}
    drift = drift_factor(probe_of(base.machine_info), probe_of(cur.machine_info))
    result.drift = drift
    scale = 1.0
    if drift is not None and noisy and calibration == "auto":
        result.notes.append(
            f"not normalised for machine drift: the calibration probe ran {drift:.3f}x the baseline's time "
            f"but was unsteady (median/min " + ", ".join(f"{v:.2f} in {k}" for k, v in noisy.items())
            + f", limit {MAX_PROBE_SPREAD}): a busy machine, whose load cannot be told from drift")
    elif drift is None:
        if calibration != "never":
            missing = [r.label for r in (base, cur) if probe_of(r.machine_info) is None]
            why = (f"no calibration probe in {', '.join(missing)}" if missing
                   else "the runs' calibration probes differ in kind")
            result.notes.append(f"not normalised for machine drift: {why}")
    elif calibration == "always" or (calibration == "auto" and abs(drift - 1) > DRIFT_TOLERANCE):
        scale = drift
        result.normalised = True
        direction = "slower" if drift > 1 else "faster"
        raw_cases = sum(1 for c in cur.cases.values() if c.fullname in base.cases and not c.calibrated_by_probe)
        result.notes.append(
            f"normalised for machine drift: the calibration probe ran {drift:.3f}x the baseline's "
            f"time (current machine's CPU {abs(drift - 1) * 100:.1f}% {direction}); the CPU cases' ratios "
            f"are divided by {drift:.3f}"
            + (f"; {raw_cases} CUDA or multi-node case(s) are compared raw (the probe times this "
               f"machine's CPU only)" if raw_cases else ""))
    elif calibration == "auto":
        result.notes.append(f"calibration probe {drift:.3f}x the baseline's, within +-"
                            f"{DRIFT_TOLERANCE * 100:.0f}% of it: not normalised")
    else:
        result.notes.append(f"calibration probe {drift:.3f}x the baseline's: not normalised (--calibration never)")

    raw = base.has_raw_data and cur.has_raw_data
    if not raw:
        result.summary_only = True
        missing = [r.label for r in (base, cur) if not r.has_raw_data]
        result.warnings.append(
            f"no raw round times in {', '.join(missing)} (saved without --benchmark-save-data): verdicts "
            f"fall back to the summary stats (median, IQR, rounds) and are less reliable")

    for fullname, bcase in base.cases.items():
        if fullname not in cur.cases:
            result.cases.append(CaseVerdict(bcase.name, "missing", fullname, baseline_median_s=bcase.median))
    for fullname, ccase in cur.cases.items():
        bcase = base.cases.get(fullname)
        if bcase is None:
            result.cases.append(CaseVerdict(ccase.name, "new", fullname, current_median_s=ccase.median))
            continue
        verdict = CaseVerdict(ccase.name, "inconclusive", fullname,
                              baseline_median_s=bcase.median, current_median_s=ccase.median)
        if bcase.data and ccase.data:
            verdict.method = "bootstrap+mann-whitney"
            ratio = ccase.median / bcase.median
            lo, hi = stats.bootstrap_ratio_ci(bcase.data, ccase.data, confidence, seed=seed)
            p = stats.mann_whitney_p(bcase.data, ccase.data)
            verdict.baseline_rounds, verdict.current_rounds = len(bcase.data), len(ccase.data)
        else:
            verdict.method = "summary-stats"
            ratio, lo, hi = stats.summary_ratio_ci(bcase.stats, ccase.stats, confidence)
            p = None
            verdict.baseline_rounds = bcase.stats.get("rounds")
            verdict.current_rounds = ccase.stats.get("rounds")
        case_scale = scale if ccase.calibrated_by_probe and bcase.calibrated_by_probe else 1.0
        verdict.calibrated = case_scale != 1.0
        ratio, lo, hi = ratio / case_scale, lo / case_scale, hi / case_scale
        verdict.ratio, verdict.ci_low, verdict.ci_high, verdict.p_value = ratio, lo, hi, p
        verdict.verdict = stats.decide_unpaired(ratio, lo, hi, p, threshold, confidence)
        if result.normalised and not verdict.calibrated:
            verdict.reason = "raw"
        result.cases.append(verdict)
    result.cases = result.sorted_cases()
    return result


# ----------------------------------------------------------------------------------------------
# Output: the gates' shared formatters (ddpbench.gates.verdicts)
# ----------------------------------------------------------------------------------------------

format_text, format_markdown, format_json = verdicts.format_text, verdicts.format_markdown, verdicts.format_json
