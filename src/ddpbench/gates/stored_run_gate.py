"""The stored-baseline gate: noise-aware verdicts between two saved runs, case by case, with the
machine-drift correction, the comparability check and each case's structural and memory verdicts
(docs/design/gates.md#stored-run-gate, #machine-drift, #comparable-runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..storage.runs import Run, RunError
from . import fingerprint, stats, verdicts
from .calibration import MAX_CORRECTION, MAX_PROBE_SPREAD, drift_factor, overload, probe_spread, within_correction
from ..storage.records import MEMORY_KEY, NUMERICS_KEY
from .memory import compare_memory
from .numerics import compare_numerics
from .structure import NOT_COUNTED, StructureVerdict, compare_census
from .verdict_words import Verdict
from .verdicts import MEMORY_COLUMN, NUMERICS_COLUMN, STRUCTURE_COLUMN, CaseVerdict, Column, GateReport

DEFAULT_THRESHOLD = 0.10
DEFAULT_CONFIDENCE = stats.DEFAULT_CONFIDENCE
DRIFT_TOLERANCE = 0.10


class CompareError(RunError):
    """Bad settings, or runs that cannot be compared: a message for the user, exit status 2."""


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
    selection: list[str] = field(default_factory=list)  # why these two runs (no run named)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(baseline=self.baseline, current=self.current, drift=self.drift, normalised=self.normalised,
                   summary_only=self.summary_only, selection=list(self.selection))
        return out


ROUNDS_COLUMN = Column("rounds", lambda c: "-" if c.baseline_rounds is None else f"{c.baseline_rounds}/{c.current_rounds}",
                       own_line=False)


def _calibration_cell(case: CaseVerdict) -> str:
    if case.baseline_median_s is None or case.current_median_s is None:
        return "-"  # missing or new: nothing compared
    return f"÷{case.calibration_factor:.3f}" if case.calibrated else "raw"


CALIBRATION_COLUMN = Column("calibration", _calibration_cell, own_line=False)


def _run_to_run_cell(case: CaseVerdict) -> str:
    between = case.details.get("run_to_run")
    if not between:
        return "-"
    return f"±{between['sd'] * 100:.1f}% ({between['source']})"


RUN_TO_RUN_COLUMN = Column("run-to-run", _run_to_run_cell, own_line=False)


# ----------------------------------------------------------------------------------------------
# Only comparable runs
# ----------------------------------------------------------------------------------------------


def _check_comparable(result: Comparison, base: Run, cur: Run, allowed: set[str]) -> None:
    """Refuse runs whose facts differ (unless allowed); say what cannot be checked."""
    diffs = fingerprint.run_differences(base.machine_info, cur.machine_info)
    refused = [d for d in diffs.differ if d.fact not in allowed]
    if refused:
        facts = ",".join(d.fact for d in refused)
        raise CompareError(
            "the runs are not comparable: what decides their cases' measurements differs: "
            + "; ".join(d.describe() for d in refused)
            + f" ({base.label} -> {cur.label}). A verdict would mix that change with the code's. Compare "
              f"runs measured alike, or accept the difference with --allow-different {facts} "
              f"(--allow-different all accepts any)")
    if diffs.differ:
        result.warnings.append("compared although " + "; ".join(d.describe() for d in diffs.differ)
                               + " (--allow-different): ratios mix that change with the code's")
    if diffs.unrecorded:
        labels = {"baseline": base.label, "candidate": cur.label}
        which = " and ".join(labels[side] for side in diffs.unrecorded)
        result.warnings.append(f"{which} recorded no run facts (saved by an older ddpbench or another "
                               f"tool): {', '.join(diffs.unknown) or 'nothing'} cannot be checked; compared "
                               f"on the facts recorded")
    result.notes.extend(diffs.notes)


def _check_complete(result: Comparison, base: Run, cur: Run) -> None:
    if not base.completeness.complete:
        result.warnings.append(f"the baseline {base.label} is {base.completeness.describe()}: cases it "
                               f"lacks read as new")
    if not cur.completeness.complete:
        result.warnings.append(f"the candidate {cur.label} is {cur.completeness.describe()}: cases it "
                               f"lost read as missing")


# ----------------------------------------------------------------------------------------------
# Machine drift: the bounded correction
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Correction:
    """What the CPU cases measured on this machine get: their ratio divided by ``factor``, or,
    when the probe ratio is out of the band, ``refused`` (the reason they are inconclusive)."""

    factor: float = 1.0
    refused: str | None = None


@dataclass(frozen=True)
class DriftPlan:
    """The decision on machine drift between two runs: the probe ratio (``drift``), the correction
    the CPU cases get, and what the report says about it."""

    drift: float | None = None
    correction: Correction = Correction()
    normalised: bool = False  # the CPU cases' ratios are divided by the drift
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _load_warnings(base: Run, cur: Run) -> tuple[str, ...]:
    busy = {r.label: overload(r.calibration) for r in (base, cur) if overload(r.calibration)}
    if not busy:
        return ()
    return ("the machine was overloaded while saving " + "; ".join(f"{k} ({v})" for k, v in busy.items())
            + ": the intervals hold the run-to-run spread the history and the pools measured, and no more; "
            "a load that came or went in a way neither saw can still move a case",)


def plan_drift(base: Run, cur: Run, calibration: str) -> DriftPlan:
    """Whether and how the CPU cases' ratios are corrected for machine drift (the calibration
    probes' ratio, within a band; docs/design/gates.md#machine-drift), with the lines that say so."""
    warnings = _load_warnings(base, cur)
    noisy = {r.label: probe_spread(r.calibration) for r in (base, cur)
             if probe_spread(r.calibration) is not None and probe_spread(r.calibration) > MAX_PROBE_SPREAD}
    drift = drift_factor(base.calibration, cur.calibration)
    band = f"{1 / MAX_CORRECTION:.2f}-{MAX_CORRECTION:.2f}"
    if drift is None:
        if calibration == "never":
            return DriftPlan(warnings=warnings)
        missing = [r.label for r in (base, cur) if r.calibration is None]
        why = (f"no calibration in {', '.join(missing)}" if missing
               else "the runs' calibrations differ in kind")
        return DriftPlan(notes=(f"not normalised for machine drift: {why}",), warnings=warnings)
    if not within_correction(drift):
        if calibration == "never":
            return DriftPlan(drift, warnings=warnings + (
                f"the calibration ran {drift:.3f}x the baseline's time, outside the {band} it "
                f"may correct: the machine changed; the CPU cases are compared raw (--calibration never)",))
        return DriftPlan(drift, Correction(refused=f"calibration {drift:.2f}x, outside {band}"), warnings=warnings + (
            f"the calibration ran {drift:.3f}x the baseline's time, outside the {band} it may "
            f"correct: another machine, or one under load that one short calibration cannot describe; the CPU "
            f"cases measured on it are inconclusive (compare runs from one machine, or --calibration "
            f"never for raw verdicts)",))
    if noisy and calibration == "auto":
        return DriftPlan(drift, notes=(
            f"not normalised for machine drift: the calibration ran {drift:.3f}x the baseline's time "
            f"but was unsteady (median/min " + ", ".join(f"{v:.2f} in {k}" for k, v in noisy.items())
            + f", limit {MAX_PROBE_SPREAD}): a busy machine, whose load cannot be told from drift",), warnings=warnings)
    if calibration == "always" or (calibration == "auto" and abs(drift - 1) > DRIFT_TOLERANCE):
        direction = "slower" if drift > 1 else "faster"
        raw_cases = sum(1 for c in cur.cases.values() if c.fullname in base.cases and not c.calibrated_by_probe)
        return DriftPlan(drift, Correction(factor=drift), warnings=warnings, normalised=True, notes=(
            f"normalised for machine drift: the calibration ran {drift:.3f}x the baseline's "
            f"time (the candidate machine's CPU {abs(drift - 1) * 100:.1f}% {direction}); the CPU cases' ratios "
            f"are divided by {drift:.3f} (column 'calibration'), never so far as to reverse what was "
            f"measured"
            + (f"; {raw_cases} CUDA or multi-node case(s) are compared raw (the calibration times this "
               f"machine's CPU only)" if raw_cases else ""),))
    if calibration == "auto":
        note = (f"calibration {drift:.3f}x the baseline's, within +-"
                f"{DRIFT_TOLERANCE * 100:.0f}% of it: not normalised")
    else:
        note = f"calibration {drift:.3f}x the baseline's: not normalised (--calibration never)"
    return DriftPlan(drift, notes=(note,), warnings=warnings)


def _corrected(verdict: CaseVerdict, ratio: float, lo: float, hi: float, p: float | None,
               correction: Correction, threshold: float, confidence: float, alpha: float | None = None) -> None:
    """The case's verdict from its raw ratio and interval and the run's correction: the sign rule
    of the module docstring (``alpha``: the level a change must be significant at)."""
    if correction.refused:
        verdict.ratio, verdict.ci_low, verdict.ci_high, verdict.p_value = ratio, lo, hi, p
        verdict.verdict, verdict.reason = Verdict.INCONCLUSIVE, correction.refused
        return
    factor = correction.factor
    verdict.ratio, verdict.ci_low, verdict.ci_high, verdict.p_value = ratio / factor, lo / factor, hi / factor, p
    verdict.verdict = stats.decide_unpaired(verdict.ratio, verdict.ci_low, verdict.ci_high, p, threshold, confidence,
                                            alpha)
    if factor == 1.0:
        return
    verdict.calibrated, verdict.calibration_factor = True, factor
    verdict.details.update(raw_ratio=ratio, raw_ci=[lo, hi])
    measured = "slower" if lo > 1 else "faster" if hi < 1 else None
    if (measured, verdict.verdict) in (("slower", Verdict.IMPROVEMENT), ("faster", Verdict.REGRESSION)):
        verdict.reason = (f"measured {measured} (raw {ratio:.3f} [{lo:.3f}, {hi:.3f}]); the calibration's "
                          f"÷{factor:.3f} would read {verdict.verdict}")
        verdict.verdict = Verdict.INCONCLUSIVE


# ----------------------------------------------------------------------------------------------
# The comparison, step by step
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Judging:
    """How the cases are judged: the gate's settings, checked (:func:`check_settings`)."""

    threshold: float = DEFAULT_THRESHOLD
    confidence: float = DEFAULT_CONFIDENCE
    calibration: str = "auto"
    seed: int = 0
    allowed: frozenset[str] = frozenset()  # --allow-different: facts that may differ
    accept_structure_change: bool = False
    accept_memory_change: bool = False
    memory_tolerance: float | None = None
    accept_numerics_change: bool = False
    numerics_tolerance: float | None = None
    # "auto": the run-to-run component (history, pools, the stated floor) in every interval;
    # "off": the rounds' own interval alone, as before 2026-11-28 (the lab's before/after reading).
    run_to_run: str = "auto"


def check_settings(judging: Judging) -> None:
    """:class:`CompareError` naming the first setting out of its range."""
    if not judging.threshold >= 0:
        raise CompareError(f"--threshold must be >= 0, got {judging.threshold}")
    if not 0 < judging.confidence < 1:
        raise CompareError(f"--confidence must be between 0 and 1, got {judging.confidence}")
    if judging.memory_tolerance is not None and not judging.memory_tolerance >= 0:
        raise CompareError(f"--memory-tolerance must be >= 0, got {judging.memory_tolerance}")
    if judging.numerics_tolerance is not None and not judging.numerics_tolerance >= 0:
        raise CompareError(f"--numerics-tolerance must be >= 0, got {judging.numerics_tolerance}")
    if judging.calibration not in ("auto", "always", "never"):
        raise CompareError(f"--calibration must be auto, always or never, got {judging.calibration!r}")
    if judging.run_to_run not in ("auto", "off"):
        raise CompareError(f"run_to_run must be auto or off, got {judging.run_to_run!r}")


@dataclass(frozen=True)
class RawRatio:
    """A case's timing compared before any correction: current / baseline and its interval, the
    run-to-run component in it (``run_to_run``; None: the rounds' own interval alone) and the rounds'
    own interval and p beside it (``rounds_low``, ``rounds_high``, ``rounds_p``)."""

    method: str
    ratio: float
    low: float
    high: float
    p_value: float | None
    baseline_rounds: int | None
    current_rounds: int | None
    run_to_run: stats.RunToRun | None = None
    detectable_slowdown: float | None = None
    rounds_low: float | None = None
    rounds_high: float | None = None
    rounds_p: float | None = None


def raw_ratio(bcase, ccase, confidence: float, seed: int, run_to_run: stats.RunToRun | None = None,
              threshold: float = DEFAULT_THRESHOLD) -> RawRatio:
    """The ratio of a case's medians with its interval: bootstrapped with a Mann-Whitney p from the
    raw rounds where both runs kept them, else from the summary statistics; with ``run_to_run``, that
    component added to the interval and the p-value taken from the same model
    (:func:`~ddpbench.gates.stats.with_run_to_run`), the rounds' own figures kept beside it."""
    if bcase.data and ccase.data:
        lo, hi = stats.bootstrap_ratio_ci(bcase.data, ccase.data, confidence, seed=seed)
        raw = RawRatio("bootstrap+mann-whitney", ccase.median / bcase.median, lo, hi,
                       stats.mann_whitney_p(bcase.data, ccase.data), len(bcase.data), len(ccase.data))
    else:
        ratio, lo, hi = stats.summary_ratio_ci(bcase.stats, ccase.stats, confidence)
        raw = RawRatio("summary-stats", ratio, lo, hi, None, bcase.stats.get("rounds"), ccase.stats.get("rounds"))
    if run_to_run is None:
        return raw
    widened = stats.with_run_to_run(raw.ratio, raw.low, raw.high, run_to_run, threshold, confidence)
    return RawRatio(raw.method.replace("mann-whitney", "run-to-run"), raw.ratio, widened.low, widened.high,
                    widened.p_value, raw.baseline_rounds, raw.current_rounds,
                    run_to_run, widened.detectable_slowdown, raw.low, raw.high, raw.p_value)


# ----------------------------------------------------------------------------------------------
# The run-to-run component: the case's history on this machine, the runs' pools, the stated floor
# ----------------------------------------------------------------------------------------------


def _like(case, other) -> bool:
    return not fingerprint.case_differences(case.extra_info, other.extra_info)


def case_run_to_run(fullname: str, bcase, ccase, history) -> stats.RunToRun:
    """The run-to-run component of one case's comparison (docs/design/gates.md#run-to-run-variance):
    from the case's saved runs on this machine before the current one (``history``, oldest first,
    the baseline among them; only runs with its raw rounds, measured alike), and from the pools the
    baseline, the current run and those runs split its rounds across; the stated floor where
    neither measures it."""
    past = [run.cases[fullname] for run in history if fullname in run.cases]
    past = [case for case in past if case.data and _like(case, ccase)]
    from_history = stats.run_to_run_from_history([case.data for case in past])
    cases = []
    for case in (*past, bcase, ccase):  # the baseline is also in the history: once
        if not any(case is seen for seen in cases):
            cases.append(case)
    from_pools = stats.run_to_run_from_pools([case.pool_rounds for case in cases if case.pool_rounds])
    return stats.combine_run_to_run(from_history, from_pools)


def _same_file(a: Run, b: Run) -> bool:
    if a is b:
        return True
    try:
        return a.path.exists() and b.path.exists() and a.path.resolve() == b.path.resolve()
    except OSError:
        return False


def history_of(base: Run, cur: Run, runs: list[Run]) -> list[Run]:
    """The runs a comparison's history is read from: those of ``runs`` (a storage's, oldest first)
    saved on the current run's machine (:data:`~ddpbench.gates.fingerprint.MACHINE_FACTS`) before
    it (all of them when it is not among them: this session's results), the current run itself left
    out (it may hold the change being judged); the baseline always among them."""
    at = next((i for i, run in enumerate(runs) if _same_file(run, cur)), len(runs))
    out = [base if _same_file(run, base) else run for run in runs[:at]
           if not fingerprint.run_differences(run.machine_info, cur.machine_info, facts=fingerprint.MACHINE_FACTS).differ]
    if not any(run is base for run in out):
        out.append(base)
    return out


def compare_case(fullname: str, bcase, ccase, correction: Correction,
                 judging: Judging, history=()) -> tuple[CaseVerdict, set[str]]:
    """One case both runs hold: its verdict, and the facts that kept it from being compared (what
    decides its measurement differs, and ``--allow-different`` does not name it). ``history``: the
    saved runs its run-to-run component is read from (:func:`history_of`)."""
    verdict = CaseVerdict(ccase.name, Verdict.INCONCLUSIVE, fullname,
                          baseline_median_s=bcase.median, current_median_s=ccase.median)
    between = None if judging.run_to_run == "off" else case_run_to_run(fullname, bcase, ccase, history)
    raw = raw_ratio(bcase, ccase, judging.confidence, judging.seed, between, judging.threshold)
    verdict.method, verdict.baseline_rounds, verdict.current_rounds = raw.method, raw.baseline_rounds, raw.current_rounds
    if raw.run_to_run is not None:
        verdict.details.update(run_to_run=raw.run_to_run.to_dict(), detectable_slowdown=raw.detectable_slowdown,
                               rounds_ci=[raw.rounds_low, raw.rounds_high if math.isfinite(raw.rounds_high) else None],
                               rounds_p=raw.rounds_p)
    by_probe = ccase.calibrated_by_probe and bcase.calibrated_by_probe
    _corrected(verdict, raw.ratio, raw.low, raw.high, raw.p_value, correction if by_probe else Correction(),
               judging.threshold, judging.confidence,
               None if raw.run_to_run is None else stats.stored_alpha(judging.confidence))
    differ = fingerprint.case_differences(bcase.extra_info, ccase.extra_info)
    refused = {d.fact for d in differ if d.fact not in judging.allowed}
    what = "; ".join(d.describe() for d in differ)
    if refused:  # unlike: not compared, its census and memory census not counted
        verdict.verdict, verdict.reason = Verdict.INCONCLUSIVE, f"unlike: {what}"
        verdict.structure = StructureVerdict(NOT_COUNTED, "the cases are unlike")
        verdict.memory = StructureVerdict(NOT_COUNTED, "the cases are unlike")
        verdict.numerics = StructureVerdict(NOT_COUNTED, "the cases are unlike")
        return verdict, refused
    if differ:
        verdict.reason = f"unlike, allowed: {what}"
    judge_components(verdict, bcase, ccase, judging)
    return verdict, refused


def judge_components(verdict: CaseVerdict, bcase, ccase, judging: Judging) -> None:
    """The exact verdicts beside the timing: structure, memory, numerics (each may fail the case)."""
    verdict.judge_structure(compare_census(bcase.census, ccase.census, "candidate"), judging.accept_structure_change)
    verdict.judge_memory(compare_memory(bcase.memory, ccase.memory, "candidate", tolerance=judging.memory_tolerance),
                         judging.accept_memory_change)
    verdict.judge_numerics(compare_numerics(bcase.numerics, ccase.numerics, "candidate",
                                            tolerance=judging.numerics_tolerance),
                           judging.accept_numerics_change)


def compare_cases(base: Run, cur: Run, correction: Correction, judging: Judging,
                  history=()) -> tuple[list[CaseVerdict], int, set[str]]:
    """Every case's verdict (the baseline's lost cases first, then the current run's in order), how
    many were not compared, and the facts that kept them from it."""
    cases = [CaseVerdict(bcase.name, Verdict.MISSING, fullname, baseline_median_s=bcase.median)
             for fullname, bcase in base.cases.items() if fullname not in cur.cases]
    unlike: set[str] = set()
    not_compared = 0
    for fullname, ccase in cur.cases.items():
        bcase = base.cases.get(fullname)
        if bcase is None:
            cases.append(CaseVerdict(ccase.name, Verdict.NEW, fullname, current_median_s=ccase.median))
            continue
        verdict, refused = compare_case(fullname, bcase, ccase, correction, judging, history)
        unlike |= refused
        not_compared += bool(refused)
        cases.append(verdict)
    return cases, not_compared, unlike


def _columns(base: Run, cur: Run) -> list[Column]:
    """The report's columns: memory and numerics only where a run recorded them (the table of runs
    saved before those censuses stays as it was)."""
    columns = [ROUNDS_COLUMN, RUN_TO_RUN_COLUMN, CALIBRATION_COLUMN, STRUCTURE_COLUMN, MEMORY_COLUMN, NUMERICS_COLUMN]
    for key, column in ((MEMORY_KEY, MEMORY_COLUMN), (NUMERICS_KEY, NUMERICS_COLUMN)):
        if not any(key in case.extra_info for run in (base, cur) for case in run.cases.values()):
            columns.remove(column)
    return columns


def _raw_data_warning(base: Run, cur: Run) -> str | None:
    missing = [r.label for r in (base, cur) if not r.has_raw_data]
    if not missing:
        return None
    return (f"no raw round times in {', '.join(missing)} (saved without --benchmark-save-data): verdicts "
            f"fall back to the summary stats (median, IQR, rounds) and are less reliable")


def compare_runs(base: Run, cur: Run, threshold: float = DEFAULT_THRESHOLD,
                 confidence: float = DEFAULT_CONFIDENCE, calibration: str = "auto",
                 seed: int = 0, allow_different: set[str] | frozenset[str] = frozenset(),
                 accept_structure_change: bool = False, accept_memory_change: bool = False,
                 memory_tolerance: float | None = None, accept_numerics_change: bool = False,
                 numerics_tolerance: float | None = None, history: list[Run] | None = None,
                 run_to_run: str = "auto") -> Comparison:
    """Each case's verdict, timing, structure and memory (the cases' records were read and checked
    when the runs were); :class:`CompareError` for bad settings and for runs that are not
    comparable (facts not in ``allow_different`` differ). ``accept_structure_change`` /
    ``accept_memory_change``: structural / memory regressions are shown as accepted, not failing;
    ``memory_tolerance``: judge the measured CUDA max allocated too (a share of the baseline's);
    ``accept_numerics_change`` / ``numerics_tolerance``: as the numerics verdict takes them;
    ``history``: the saved runs of the storage, oldest first, the run-to-run component is read from
    (:func:`history_of` keeps this machine's before the current run; None: the two runs alone);
    ``run_to_run``: ``off`` leaves that component out (the rounds' own interval, the lab's "before")."""
    judging = Judging(threshold, confidence, calibration, seed, frozenset(allow_different), accept_structure_change,
                      accept_memory_change, memory_tolerance, accept_numerics_change, numerics_tolerance,
                      run_to_run)
    check_settings(judging)
    result = Comparison("ddpbench compare", [], threshold, confidence, columns=_columns(base, cur),
                        preamble=[f"baseline:  {base.path}", f"candidate: {cur.path}"],
                        baseline=str(base.path), current=str(cur.path))
    _check_comparable(result, base, cur, set(judging.allowed))
    _check_complete(result, base, cur)
    drift = plan_drift(base, cur, calibration)
    result.drift, result.normalised = drift.drift, drift.normalised
    result.warnings += drift.warnings
    result.notes += drift.notes
    raw_missing = _raw_data_warning(base, cur)
    if raw_missing:
        result.summary_only = True
        result.warnings.append(raw_missing)
    cases, not_compared, unlike = compare_cases(base, cur, drift.correction, judging,
                                                history_of(base, cur, history or [base]))
    floored = sum(1 for case in cases if (case.details.get("run_to_run") or {}).get("measured") is False)
    if floored:
        result.notes.append(
            f"{floored} case(s) compared with the stated run-to-run floor (±{stats.RUN_TO_RUN_FLOOR * 100:g}% per "
            f"run: fewer than {stats.MIN_HISTORY_RUNS} saved runs of them on this machine, and no spread above "
            f"it between those runs or the runs' pools): each saved run of this machine (make bench) "
            f"measures it better")
    if unlike:
        result.warnings.append(
            f"{not_compared} case(s) not compared: what decides their measurement differs between the runs "
            f"(see each case); --allow-different {','.join(sorted(unlike))} compares them anyway")
    result.cases = cases
    result.cases = result.sorted_cases()
    return result


# ----------------------------------------------------------------------------------------------
# Output: the gates' shared formatters (ddpbench.gates.verdicts)
# ----------------------------------------------------------------------------------------------

format_text, format_markdown, format_json = verdicts.format_text, verdicts.format_markdown, verdicts.format_json
