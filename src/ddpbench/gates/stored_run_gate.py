"""The stored-baseline gate: noise-aware verdicts between two saved runs, case by case, with the
machine-drift correction, the comparability check and each case's structural and memory verdicts
(docs/design/gates.md#stored-run-gate, #machine-drift, #comparable-runs).
"""

from __future__ import annotations

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
            + ": between-run load changes are not in the rounds' noise, so verdicts may be false alarms",)


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
               correction: Correction, threshold: float, confidence: float) -> None:
    """The case's verdict from its raw ratio and interval and the run's correction: the sign rule
    of the module docstring."""
    if correction.refused:
        verdict.ratio, verdict.ci_low, verdict.ci_high, verdict.p_value = ratio, lo, hi, p
        verdict.verdict, verdict.reason = Verdict.INCONCLUSIVE, correction.refused
        return
    factor = correction.factor
    verdict.ratio, verdict.ci_low, verdict.ci_high, verdict.p_value = ratio / factor, lo / factor, hi / factor, p
    verdict.verdict = stats.decide_unpaired(verdict.ratio, verdict.ci_low, verdict.ci_high, p, threshold, confidence)
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


@dataclass(frozen=True)
class RawRatio:
    """A case's timing compared before any correction: current / baseline and its interval."""

    method: str
    ratio: float
    low: float
    high: float
    p_value: float | None
    baseline_rounds: int | None
    current_rounds: int | None


def raw_ratio(bcase, ccase, confidence: float, seed: int) -> RawRatio:
    """The ratio of a case's medians with its interval: bootstrapped with a Mann-Whitney p from the
    raw rounds where both runs kept them, else from the summary statistics."""
    if bcase.data and ccase.data:
        lo, hi = stats.bootstrap_ratio_ci(bcase.data, ccase.data, confidence, seed=seed)
        return RawRatio("bootstrap+mann-whitney", ccase.median / bcase.median, lo, hi,
                        stats.mann_whitney_p(bcase.data, ccase.data), len(bcase.data), len(ccase.data))
    ratio, lo, hi = stats.summary_ratio_ci(bcase.stats, ccase.stats, confidence)
    return RawRatio("summary-stats", ratio, lo, hi, None, bcase.stats.get("rounds"), ccase.stats.get("rounds"))


def compare_case(fullname: str, bcase, ccase, correction: Correction,
                 judging: Judging) -> tuple[CaseVerdict, set[str]]:
    """One case both runs hold: its verdict, and the facts that kept it from being compared (what
    decides its measurement differs, and ``--allow-different`` does not name it)."""
    verdict = CaseVerdict(ccase.name, Verdict.INCONCLUSIVE, fullname,
                          baseline_median_s=bcase.median, current_median_s=ccase.median)
    raw = raw_ratio(bcase, ccase, judging.confidence, judging.seed)
    verdict.method, verdict.baseline_rounds, verdict.current_rounds = raw.method, raw.baseline_rounds, raw.current_rounds
    by_probe = ccase.calibrated_by_probe and bcase.calibrated_by_probe
    _corrected(verdict, raw.ratio, raw.low, raw.high, raw.p_value, correction if by_probe else Correction(),
               judging.threshold, judging.confidence)
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


def compare_cases(base: Run, cur: Run, correction: Correction, judging: Judging) -> tuple[list[CaseVerdict],
                                                                                            int, set[str]]:
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
        verdict, refused = compare_case(fullname, bcase, ccase, correction, judging)
        unlike |= refused
        not_compared += bool(refused)
        cases.append(verdict)
    return cases, not_compared, unlike


def _columns(base: Run, cur: Run) -> list[Column]:
    """The report's columns: memory and numerics only where a run recorded them (the table of runs
    saved before those censuses stays as it was)."""
    columns = [ROUNDS_COLUMN, CALIBRATION_COLUMN, STRUCTURE_COLUMN, MEMORY_COLUMN, NUMERICS_COLUMN]
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
                 numerics_tolerance: float | None = None) -> Comparison:
    """Each case's verdict, timing, structure and memory (the cases' records were read and checked
    when the runs were); :class:`CompareError` for bad settings and for runs that are not
    comparable (facts not in ``allow_different`` differ). ``accept_structure_change`` /
    ``accept_memory_change``: structural / memory regressions are shown as accepted, not failing;
    ``memory_tolerance``: judge the measured CUDA max allocated too (a share of the baseline's);
    ``accept_numerics_change`` / ``numerics_tolerance``: as the numerics verdict takes them."""
    judging = Judging(threshold, confidence, calibration, seed, frozenset(allow_different), accept_structure_change,
                      accept_memory_change, memory_tolerance, accept_numerics_change, numerics_tolerance)
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
    cases, not_compared, unlike = compare_cases(base, cur, drift.correction, judging)
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
