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
    return f"probe ÷{case.calibration_factor:.3f}" if case.calibrated else "raw"


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
        labels = {"baseline": base.label, "current": cur.label}
        which = " and ".join(labels[side] for side in diffs.unrecorded)
        result.warnings.append(f"{which} recorded no fingerprint (saved by an older ddpbench or another "
                               f"tool): {', '.join(diffs.unknown) or 'nothing'} cannot be checked; compared "
                               f"on the facts recorded")
    result.notes.extend(diffs.notes)


def _check_complete(result: Comparison, base: Run, cur: Run) -> None:
    if not base.completeness.complete:
        result.warnings.append(f"the baseline {base.label} is {base.completeness.describe()}: cases it "
                               f"lacks read as new")
    if not cur.completeness.complete:
        result.warnings.append(f"the current run {cur.label} is {cur.completeness.describe()}: cases it "
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


def _plan_correction(result: Comparison, base: Run, cur: Run, calibration: str) -> Correction:
    probes = {r.label: r.calibration for r in (base, cur)}
    busy = {label: overload(p) for label, p in probes.items() if overload(p)}
    if busy:
        result.warnings.append(
            "the machine was overloaded while saving " + "; ".join(f"{k} ({v})" for k, v in busy.items())
            + ": between-run load changes are not in the rounds' noise, so verdicts may be false alarms")
    noisy = {label: probe_spread(p) for label, p in probes.items()
             if probe_spread(p) is not None and probe_spread(p) > MAX_PROBE_SPREAD}
    drift = drift_factor(base.calibration, cur.calibration)
    result.drift = drift
    band = f"{1 / MAX_CORRECTION:.2f}-{MAX_CORRECTION:.2f}"
    if drift is None:
        if calibration != "never":
            missing = [r.label for r in (base, cur) if r.calibration is None]
            why = (f"no calibration probe in {', '.join(missing)}" if missing
                   else "the runs' calibration probes differ in kind")
            result.notes.append(f"not normalised for machine drift: {why}")
        return Correction()
    if not within_correction(drift):
        if calibration == "never":
            result.warnings.append(
                f"the calibration probe ran {drift:.3f}x the baseline's time, outside the {band} a probe "
                f"may correct: the machine changed; the CPU cases are compared raw (--calibration never)")
            return Correction()
        result.warnings.append(
            f"the calibration probe ran {drift:.3f}x the baseline's time, outside the {band} it may "
            f"correct: another machine, or one under load that one short probe cannot describe; the CPU "
            f"cases measured on it are inconclusive (compare runs from one machine, or --calibration "
            f"never for raw verdicts)")
        return Correction(refused=f"probe {drift:.2f}x, outside {band}")
    if noisy and calibration == "auto":
        result.notes.append(
            f"not normalised for machine drift: the calibration probe ran {drift:.3f}x the baseline's time "
            f"but was unsteady (median/min " + ", ".join(f"{v:.2f} in {k}" for k, v in noisy.items())
            + f", limit {MAX_PROBE_SPREAD}): a busy machine, whose load cannot be told from drift")
        return Correction()
    if calibration == "always" or (calibration == "auto" and abs(drift - 1) > DRIFT_TOLERANCE):
        result.normalised = True
        direction = "slower" if drift > 1 else "faster"
        raw_cases = sum(1 for c in cur.cases.values() if c.fullname in base.cases and not c.calibrated_by_probe)
        result.notes.append(
            f"normalised for machine drift: the calibration probe ran {drift:.3f}x the baseline's "
            f"time (current machine's CPU {abs(drift - 1) * 100:.1f}% {direction}); the CPU cases' ratios "
            f"are divided by {drift:.3f} (column 'calibration'), never so far as to reverse what was "
            f"measured"
            + (f"; {raw_cases} CUDA or multi-node case(s) are compared raw (the probe times this "
               f"machine's CPU only)" if raw_cases else ""))
        return Correction(factor=drift)
    if calibration == "auto":
        result.notes.append(f"calibration probe {drift:.3f}x the baseline's, within +-"
                            f"{DRIFT_TOLERANCE * 100:.0f}% of it: not normalised")
    else:
        result.notes.append(f"calibration probe {drift:.3f}x the baseline's: not normalised (--calibration never)")
    return Correction()


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
        verdict.reason = (f"measured {measured} (raw {ratio:.3f} [{lo:.3f}, {hi:.3f}]); the probe's "
                          f"÷{factor:.3f} would read {verdict.verdict}")
        verdict.verdict = Verdict.INCONCLUSIVE


# ----------------------------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------------------------


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
    if not threshold >= 0:
        raise CompareError(f"--threshold must be >= 0, got {threshold}")
    if not 0 < confidence < 1:
        raise CompareError(f"--confidence must be between 0 and 1, got {confidence}")
    if memory_tolerance is not None and not memory_tolerance >= 0:
        raise CompareError(f"--memory-tolerance must be >= 0, got {memory_tolerance}")
    if numerics_tolerance is not None and not numerics_tolerance >= 0:
        raise CompareError(f"--numerics-tolerance must be >= 0, got {numerics_tolerance}")
    if calibration not in ("auto", "always", "never"):
        raise CompareError(f"--calibration must be auto, always or never, got {calibration!r}")
    allowed = set(allow_different)
    result = Comparison("ddpbench compare", [], threshold, confidence,
                        columns=[ROUNDS_COLUMN, CALIBRATION_COLUMN, STRUCTURE_COLUMN, MEMORY_COLUMN,
                                 NUMERICS_COLUMN],
                        preamble=[f"baseline: {base.path}", f"current:  {cur.path}"],
                        baseline=str(base.path), current=str(cur.path))
    _check_comparable(result, base, cur, allowed)
    _check_complete(result, base, cur)
    correction = _plan_correction(result, base, cur, calibration)

    raw = base.has_raw_data and cur.has_raw_data
    if not raw:
        result.summary_only = True
        missing = [r.label for r in (base, cur) if not r.has_raw_data]
        result.warnings.append(
            f"no raw round times in {', '.join(missing)} (saved without --benchmark-save-data): verdicts "
            f"fall back to the summary stats (median, IQR, rounds) and are less reliable")

    unlike: set[str] = set()  # the facts that kept cases from being compared
    not_compared = 0  # cases whose facts differ and that difference is not allowed
    for fullname, bcase in base.cases.items():
        if fullname not in cur.cases:
            result.cases.append(CaseVerdict(bcase.name, Verdict.MISSING, fullname, baseline_median_s=bcase.median))
    for fullname, ccase in cur.cases.items():
        bcase = base.cases.get(fullname)
        if bcase is None:
            result.cases.append(CaseVerdict(ccase.name, Verdict.NEW, fullname, current_median_s=ccase.median))
            continue
        verdict = CaseVerdict(ccase.name, Verdict.INCONCLUSIVE, fullname,
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
        by_probe = ccase.calibrated_by_probe and bcase.calibrated_by_probe
        _corrected(verdict, ratio, lo, hi, p, correction if by_probe else Correction(), threshold, confidence)
        differ = fingerprint.case_differences(bcase.extra_info, ccase.extra_info)
        refused = [d for d in differ if d.fact not in allowed]
        what = "; ".join(d.describe() for d in differ)
        if refused:  # unlike: not compared, its census and memory census not counted
            unlike.update(d.fact for d in refused)
            not_compared += 1
            verdict.verdict, verdict.reason = Verdict.INCONCLUSIVE, f"unlike: {what}"
            verdict.structure = StructureVerdict(NOT_COUNTED, "the cases are unlike")
            verdict.memory = StructureVerdict(NOT_COUNTED, "the cases are unlike")
            verdict.numerics = StructureVerdict(NOT_COUNTED, "the cases are unlike")
        else:
            if differ:
                verdict.reason = f"unlike, allowed: {what}"
            verdict.judge_structure(compare_census(bcase.census, ccase.census), accept_structure_change)
            verdict.judge_memory(compare_memory(bcase.memory, ccase.memory, tolerance=memory_tolerance),
                                 accept_memory_change)
            verdict.judge_numerics(compare_numerics(bcase.numerics, ccase.numerics, tolerance=numerics_tolerance),
                                   accept_numerics_change)
        result.cases.append(verdict)
    if unlike:
        result.warnings.append(
            f"{not_compared} case(s) not compared: what decides their measurement differs between the runs "
            f"(see each case); --allow-different {','.join(sorted(unlike))} compares them anyway")
    if not any(MEMORY_KEY in case.extra_info for run in (base, cur) for case in run.cases.values()):
        result.columns.remove(MEMORY_COLUMN)  # runs saved before the memory census: their table as it was
    if not any(NUMERICS_KEY in case.extra_info for run in (base, cur) for case in run.cases.values()):
        result.columns.remove(NUMERICS_COLUMN)  # likewise before the numerics replay
    result.cases = result.sorted_cases()
    return result


# ----------------------------------------------------------------------------------------------
# Output: the gates' shared formatters (ddpbench.gates.verdicts)
# ----------------------------------------------------------------------------------------------

format_text, format_markdown, format_json = verdicts.format_text, verdicts.format_markdown, verdicts.format_json
