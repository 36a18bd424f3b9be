"""The gates' one vocabulary (:class:`~.verdict_words.Verdict`), one case verdict and one report with
its formatters; the decided verdict made from its components (docs/design/gates.md#gates,
docs/design/gates.md#the-decided-verdict).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..shown_text import markdown_code, markdown_text, printable
from ..storage.records import BASELINE_CENSUS_KEY, BASELINE_MEMORY_KEY, BASELINE_NUMERICS_KEY, CENSUS_KEY, \
    LOST_CASES_KEY, MEMORY_KEY, NUMERICS_KEY, ABRecord, RecordError, read_ab
from .memory import compare_memory
from .numerics import compare_numerics
from .structure import STRUCTURE_VERDICTS, StructureVerdict, accept, compare_census
from .stats import slowdown_ruled_out
from .verdict_words import CASE_VERDICTS, TIMING_VERDICTS, Verdict

# Old names, kept importable: CASE_VERDICTS (most urgent first: the order of a report's rows and
# counts) and TIMING_VERDICTS (only a case so timed gets a structural verdict too) say which.
VERDICTS = CASE_VERDICTS
TIMED = TIMING_VERDICTS


class VerdictError(ValueError):
    """A saved verdict that cannot be read: the message names the case and the field."""


@dataclass
class CaseVerdict:
    """One case's verdict, with the figures behind it (``current_...``: the candidate's, the run
    judged against the baseline)."""

    name: str
    verdict: Verdict
    fullname: str | None = None
    baseline_median_s: float | None = None
    current_median_s: float | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    baseline_rounds: int | None = None
    current_rounds: int | None = None
    method: str | None = None  # "bootstrap+mann-whitney", "summary-stats", "paired-blocks"
    calibrated: bool = False  # the ratio was divided by the machine-drift factor (stored runs)
    calibration_factor: float | None = None  # what it was divided by (the calibration ratio), when calibrated
    reason: str | None = None  # why a case is missing or new
    details: dict[str, Any] = field(default_factory=dict)  # the gate's own figures (A/B: extra_info["ab"])
    structure: StructureVerdict | None = None  # the census compared (ddpbench.gates.structure)
    timing_verdict: Verdict | None = None  # the timing's own verdict, once the components decided ``verdict``
    memory: StructureVerdict | None = None  # the memory censuses compared (ddpbench.gates.memory)
    failed_by: list[str] = field(default_factory=list)  # the components that made it a regression (decide_case)
    numerics: StructureVerdict | None = None  # the numerics replays compared (ddpbench.gates.numerics)

    @property
    def rules_out_slowdown(self) -> float | None:
        """What an inconclusive case still shows: the smallest slowdown (a fraction) its interval
        rules out. None for other verdicts, for an unbounded interval, and for a case made
        inconclusive for a ``reason`` (figures that cannot be compared: nothing is ruled out)."""
        if self.verdict is not Verdict.INCONCLUSIVE or self.reason:
            return None
        # An A/B look that did not reach its stop level rules out only what its stop bound does
        # (stats.PairedResult.upper_end; null: too few pairs for any bound at that level).
        stop_bound = self.details.get("stop_bound", self.ci_high)
        if stop_bound is None or self.ci_high is None:
            return None
        return slowdown_ruled_out(max(self.ci_high, stop_bound))

    def __post_init__(self):
        if self.verdict not in CASE_VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}; expected one of {', '.join(CASE_VERDICTS)}")
        self.verdict = Verdict(self.verdict)  # a saved word as its member
        if self.timing_verdict is not None:
            self.timing_verdict = Verdict(self.timing_verdict)
        if self.fullname is None:
            self.fullname = self.name

    def judge_structure(self, structure: StructureVerdict, accepted: bool = False) -> None:
        """Add the structural verdict and decide the case (:func:`decide_case`): an unaccepted
        structural regression makes it a regression whatever the timing says (``accepted``: the
        gate's option to accept it)."""
        self.structure = accept(structure) if accepted else structure
        self.decide_from_components()

    def judge_memory(self, memory: StructureVerdict, accepted: bool = False) -> None:
        """Add the memory verdict and decide the case (:func:`decide_case`): an unaccepted memory
        regression makes it a regression whatever the timing says (``accepted``: the gate's option
        to accept it)."""
        self.memory = accept(memory) if accepted else memory
        self.decide_from_components()

    def judge_numerics(self, numerics: StructureVerdict, accepted: bool = False) -> None:
        """Add the numerics verdict and decide the case (:func:`decide_case`): an unaccepted change of
        what the steps compute makes it a regression whatever the timing says (``accepted``: the
        gate's option to accept it)."""
        self.numerics = accept(numerics) if accepted else numerics
        self.decide_from_components()

    def decide_from_components(self) -> None:
        """Set ``verdict`` to what the gate decides from the timing's own verdict (kept in
        ``timing_verdict``) and the components judged so far (:func:`decide_case`); a component's
        ``judge_...`` method calls it after adding its verdict."""
        if self.timing_verdict is None:
            self.timing_verdict = self.verdict
        self.failed_by = component_failures(self)
        self.verdict = decide_case(self.timing_verdict, self.failed_by)

    @property
    def timing_unmeasured(self) -> bool:
        """Stopped at its first look by a structural regression (A/B), its timing inconclusive
        there: the first look's level is below the smallest p its pairs can give, so the timing
        could never have read ``regression``. Its slowdown was not measured."""
        return stopped_by(self.details) is not None and self.timing_verdict is Verdict.INCONCLUSIVE


# The components beside the timing that can fail a case, as the decided verdict's note names them.
STRUCTURE_FAILS = "structure"
MEMORY_FAILS = "memory"
NUMERICS_FAILS = "numerics"
TIMING_UNMEASURED = "timing not measured"


def component_failures(case: CaseVerdict) -> list[str]:
    """Which of a case's components fail it: an unaccepted structural regression; a structural
    change accepted after the run on a case whose timing it cut short (``timing_unmeasured``).
    An unaccepted memory regression likewise. A new component adds its own test here and its saved
    word in :func:`record_decision`."""
    failures = []
    if case.structure is not None and case.structure.fails:
        failures.append(STRUCTURE_FAILS)
    if case.memory is not None and case.memory.fails:
        failures.append(MEMORY_FAILS)
    if case.numerics is not None and case.numerics.fails:
        failures.append(NUMERICS_FAILS)
    accepted = [judged for judged in (case.structure, case.memory, case.numerics)
                if judged is not None and judged.accepted and judged.verdict is Verdict.REGRESSION]
    if not failures and accepted and case.timing_unmeasured:
        failures.append(TIMING_UNMEASURED)
    return failures


def decide_case(timing_verdict: Verdict, failed_by: list[str]) -> Verdict:
    """The verdict a gate decides and exits on: ``regression`` when any component failed the case
    (``failed_by``), else the timing's own verdict."""
    return Verdict.REGRESSION if failed_by else timing_verdict


def record_decision(ab: dict[str, Any], case: CaseVerdict) -> None:
    """Write the decided verdict into a case's ``extra_info["ab"]`` (what a saved run says), the
    components beside it: ``timing_verdict`` (the timing's own), ``structure_verdict`` (the
    census's: regression, improvement, same or not counted) and ``structure_accepted`` when the
    gate accepted a structural regression; likewise ``memory_verdict``, ``memory_line`` and
    ``memory_accepted`` for the memory census. Only for a case both sides timed."""
    if case.timing_verdict is None:
        return
    ab["verdict"] = case.verdict
    ab["timing_verdict"] = case.timing_verdict
    if case.structure is not None:
        ab["structure_verdict"] = case.structure.verdict
        if case.structure.accepted:
            ab["structure_accepted"] = True
    if case.memory is not None:
        ab["memory_verdict"] = case.memory.verdict
        ab["memory_line"] = case.memory.line
        if case.memory.accepted:
            ab["memory_accepted"] = True
    if case.numerics is not None:
        ab["numerics_verdict"] = case.numerics.verdict
        ab["numerics_line"] = case.numerics.line
        if case.numerics.accepted:
            ab["numerics_accepted"] = True
        if hasattr(case.numerics, "to_record"):  # its outcome, difference, band, ratio (gates.numerics)
            ab.update(case.numerics.to_record())


@dataclass(frozen=True)
class Column:
    """A column a gate adds to its report, between the interval and the verdict. In the text form a
    column is a line of its own under the case's row (``own_line``: a component's verdict such as
    structure or memory), or a figure on the case's figures line."""

    header: str
    cell: Callable[[CaseVerdict], str]
    own_line: bool = True


STRUCTURE_COLUMN = Column("structure", lambda case: case.structure.cell() if case.structure else "-")
MEMORY_COLUMN = Column("memory", lambda case: case.memory.cell() if case.memory else "-")


def numerics_cell(case: CaseVerdict) -> str:
    """The numerics column: its line, which starts with its own word (same (bitwise), rounding,
    changed), or ``not counted: why``."""
    judged = case.numerics
    if judged is None:
        return "-"
    if judged.verdict is Verdict.NOT_COUNTED:
        return judged.cell()
    return judged.line + (" (accepted)" if judged.accepted else "")


NUMERICS_COLUMN = Column("numerics", numerics_cell)


def stopped_by(details: dict[str, Any]) -> str | None:
    """Which exact verdict ended an A/B case after its first look ("structure", "memory",
    "numerics"), or None."""
    return next((name for name in ("structure", "memory", "numerics") if details.get(f"stopped_by_{name}")), None)


@dataclass
class GateReport:
    """A run's verdicts and what to say around them."""

    title: str
    cases: list[CaseVerdict]
    threshold: float | None = None
    confidence: float = 0.95
    current_label: str = "candidate"  # the run judged against the baseline, as the report names it
    preamble: list[str] = field(default_factory=list)  # e.g. which files were compared
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)  # e.g. A/B's sides
    columns: list[Column] = field(default_factory=list)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for case in self.cases if case.verdict == verdict)

    def counts(self) -> dict[str, int]:
        return {v: self.count(v) for v in CASE_VERDICTS}

    @property
    def regressions(self) -> list[CaseVerdict]:
        return [case for case in self.cases if case.verdict is Verdict.REGRESSION]

    def structural(self, accepted: bool) -> list[str]:
        """The cases whose structure regressed: accepted as made on purpose (and passing on their
        timing), or not."""
        return [c.fullname or c.name for c in self.cases
                if c.structure is not None and c.structure.verdict is Verdict.REGRESSION
                and c.structure.accepted == accepted
                and TIMING_UNMEASURED not in c.failed_by]

    def unmeasured(self, stopper: str | None = None) -> list[str]:
        """The cases whose structural (or memory) change was accepted after the run but whose timing
        that change had cut short (:attr:`CaseVerdict.timing_unmeasured`); ``stopper``: only those
        stopped by it (``stopped_by_structure``, ``stopped_by_memory`` or ``stopped_by_numerics``)."""
        return [c.fullname or c.name for c in self.cases if TIMING_UNMEASURED in c.failed_by
                and (stopper is None or c.details.get(stopper))]

    def memory_regressions(self, accepted: bool) -> list[str]:
        """The cases whose memory census regressed: accepted as made on purpose, or not."""
        return [c.fullname or c.name for c in self.cases
                if c.memory is not None and c.memory.verdict is Verdict.REGRESSION and c.memory.accepted == accepted]

    def numerics_regressions(self, accepted: bool) -> list[str]:
        """The cases whose numerics changed: accepted as made on purpose, or not."""
        return [c.fullname or c.name for c in self.cases if c.numerics is not None
                and c.numerics.verdict is Verdict.REGRESSION and c.numerics.accepted == accepted]

    def sorted_cases(self) -> list[CaseVerdict]:
        order = {v: i for i, v in enumerate(CASE_VERDICTS)}
        return sorted(self.cases, key=lambda c: (order[c.verdict], c.fullname or c.name))

    def summary(self) -> str:
        counts = ", ".join(f"{n} {v}" for v, n in self.counts().items() if n) or "no cases"
        rule = f"threshold {self.threshold * 100:g}%, " if self.threshold is not None else ""
        judged = [("accepted" if c.structure.accepted else c.structure.verdict) for c in self.cases
                  if c.structure is not None]
        shown = (Verdict.REGRESSION, "accepted", *STRUCTURE_VERDICTS[1:])
        structure = ", ".join(f"{judged.count(v)} {v}" for v in shown if judged.count(v))
        judged = [("accepted" if c.memory.accepted else c.memory.verdict) for c in self.cases
                  if c.memory is not None]
        memory = ", ".join(f"{judged.count(v)} {v}" for v in shown if judged.count(v))
        words = [("accepted" if c.numerics.accepted else c.numerics.verdict if c.numerics.verdict is Verdict.NOT_COUNTED
                  else c.numerics.line.partition(":")[0].split(" from ")[0]) for c in self.cases if c.numerics is not None]
        numerics = ", ".join(f"{words.count(w)} {w}" for w in dict.fromkeys(sorted(words)))
        return (f"{counts}; {rule}{self.confidence * 100:g}% confidence; {self.ratio_meaning()}, > 1 is slower"
                + (f"; structure: {structure}" if structure else "") + (f"; memory: {memory}" if memory else "")
                + (f"; numerics: {numerics}" if numerics else ""))

    def ratio_meaning(self) -> str:
        """What the printed ratio is: A/B's is the Hodges–Lehmann estimate over the paired blocks
        (the median of the pairwise averages of the pairs' log ratios), which the two medians shown
        beside it need not divide to; the stored-run gate's is the ratio of the medians."""
        methods = {case.method for case in self.cases if case.ratio is not None}
        current = f"{self.current_label} / baseline"
        if methods == {"paired-blocks"}:
            return (f"ratio = {current}, the Hodges–Lehmann estimate over the paired blocks "
                    f"(not the ratio of the two medians)")
        if methods and "paired-blocks" not in methods:
            return f"ratio = {current} median"
        return f"ratio = {current}"

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "threshold": self.threshold, "confidence": self.confidence,
                "counts": self.counts(), "notes": list(self.notes), "warnings": list(self.warnings),
                "cases": [_case_dict(case) for case in self.sorted_cases()]}


# What a case's details keep in JSON: the raw rounds and the sides' descriptions stay in the run.
_BULKY_DETAILS = ("baseline", "candidate", "sides", "pool_pids", BASELINE_CENSUS_KEY, BASELINE_MEMORY_KEY,
                  BASELINE_NUMERICS_KEY)


def _case_dict(case: CaseVerdict) -> dict[str, Any]:
    out = asdict(case)
    out["details"] = {k: v for k, v in case.details.items() if k not in _BULKY_DETAILS}
    out["rules_out_slowdown"] = case.rules_out_slowdown
    for key in ("ci_low", "ci_high"):  # an unbounded interval (too few rounds): JSON has no inf
        if isinstance(out[key], float) and not math.isfinite(out[key]):
            out[key] = None
    if out.get("numerics"):  # a change outside a band of 0 has an infinite ratio
        out["numerics"] = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                           for k, v in out["numerics"].items()}
    return out


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _ratio(case: CaseVerdict) -> str:
    if case.ratio is None:
        return "-"
    interval = "" if case.ci_low is None else f" [{case.ci_low:.3f}, {case.ci_high:.3f}]"
    return f"{case.ratio:.3f}{interval}"


def _headers(report: GateReport) -> list[str]:
    return (["case", "baseline median (ms)", f"{report.current_label} median (ms)",
             f"ratio [{report.confidence * 100:g}% interval]", "p"]
            + [column.header for column in report.columns] + ["verdict"])


def _verdict_note(case: CaseVerdict) -> str:
    """What follows the verdict word: why (a reason), and what the timing said when the structure
    made the case a regression."""
    stopper = stopped_by(case.details)
    first_look = " at its first look" if stopper else ""
    notes = [case.reason] if case.reason else []
    by = _failed_components(case)
    if by and case.timing_verdict != case.verdict:
        notes.append(f"{_joined(by)}; timing {case.timing_verdict}{first_look}")
    if TIMING_UNMEASURED in case.failed_by:
        what = {"structure": "structural"}.get(stopper, stopper)
        name = {"structure": "structure", "memory": "memory census"}.get(stopper, "numerics replay")
        notes.append(f"{what} change accepted after the run; timing not measured: {case.timing_verdict} at "
                     f"its first look, where the {name} stopped it")
    return f" ({'; '.join(notes)})" if notes else ""


def _failed_components(case: CaseVerdict) -> list[str]:
    return [name for name in (STRUCTURE_FAILS, MEMORY_FAILS, NUMERICS_FAILS) if name in case.failed_by]


def _joined(words: list[str]) -> str:
    """'structure', 'structure and memory', 'structure, memory and numerics'."""
    return " and ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} and {words[-1]}"


def _short_verdict(case: CaseVerdict) -> str:
    """A verdict cell that fits a row: the word and what failed it (the components, or a timing
    not measured), or what an inconclusive case rules out; the rest of its note goes under the row."""
    failed = _failed_components(case) or [name for name in case.failed_by if name == TIMING_UNMEASURED]
    if failed:
        return f"{case.verdict} ({_joined(failed)})"
    return case.verdict + _resolution(case)


def _resolution(case: CaseVerdict) -> str:
    """What follows an inconclusive verdict: the slowdown it rules out (rounded up, so never more
    than it rules out)."""
    ruled_out = case.rules_out_slowdown
    return "" if ruled_out is None else f" (rules out >= {math.ceil(round(ruled_out * 1000, 6)) / 10:.1f}% slower)"


def _resolution_reason(case: CaseVerdict, confidence: float) -> str:
    """Why an inconclusive case rules out what it does when that is more than its interval shows:
    a look may stop only on the exact signed-rank bound at its stop level too, and that bound, not
    the interval's end, is what the case has shown (docs/design/ab.md#the-stops-own-error)."""
    bound, level = case.details.get("stop_bound"), case.details.get("stop_level")
    if case.rules_out_slowdown is None or bound is None or case.ci_high is None or bound <= case.ci_high:
        return ""
    at = f" ({level:.2g})" if isinstance(level, (int, float)) else ""
    return (f"{bound:.3f} is the ratio's exact upper bound at this look's stop level{at}, above the "
            f"{confidence * 100:g}% interval's end {case.ci_high:.3f}; a look stops only within both")


def _row(report: GateReport, case: CaseVerdict) -> list[str]:
    verdict = case.verdict + _resolution(case) + _verdict_note(case)
    return ([case.name, _ms(case.baseline_median_s), _ms(case.current_median_s), _ratio(case),
             "-" if case.p_value is None else f"{case.p_value:.2g}"]
            + [column.cell(case) for column in report.columns] + [verdict])


# The text form: a short row per case (case, ratio and interval, verdict and what failed it) of at
# most TEXT_WIDTH columns, its details indented under it as pytest prints a failure's, wrapped to
# that width too; no line of a gate's output is longer than LINE_WIDTH (a path or a name that
# cannot break is the one exception).
TEXT_WIDTH = 120
LINE_WIDTH = 160
DETAIL_INDENT = "    "


# Spaces a wrapped line never breaks at: before a number ("pairs 36", "other +96.0 KiB") and
# between a number and its unit.
_KEEP_TOGETHER = re.compile(r" (?=[+\-−×÷]?\d)|(?<=\d) (?=(?:[KMGT]i)?B\b|ms\b|s\b)")


def wrap_text(text: str, indent: str = "", more: str = "  ", width: int = TEXT_WIDTH) -> list[str]:
    import textwrap

    lines = textwrap.wrap(_KEEP_TOGETHER.sub("\u00a0", text.strip()), width, initial_indent=indent,
                          subsequent_indent=indent + more, break_long_words=False, break_on_hyphens=False)
    return [line.replace("\u00a0", " ") for line in lines] or [indent.rstrip()]


def _figures(report: GateReport, case: CaseVerdict) -> str:
    """The numbers behind a case's ratio, for the first line under its row."""
    parts = []
    if case.baseline_median_s is not None or case.current_median_s is not None:
        parts.append(f"medians {_ms(case.baseline_median_s)} ms baseline, {_ms(case.current_median_s)} ms "
                     f"{report.current_label}")
    if case.p_value is not None:
        parts.append(f"p {case.p_value:.2g}")
    for column in report.columns:
        cell = column.cell(case)
        if not column.own_line and cell != "-":
            parts.append(f"{column.header} {cell}")
    return "; ".join(part.replace(" ", "\u00a0") for part in parts)  # a line wraps between figures only


def _details(report: GateReport, case: CaseVerdict) -> list[str]:
    """A case's lines under its row: its figures, why it rules out what it does, then each
    component that says more than ``same``."""
    reason = _resolution_reason(case, report.confidence)
    texts = [_figures(report, case), f"{_resolution(case).strip(' ()')}: {reason}" if reason else ""]
    for column in report.columns:
        cell = column.cell(case)
        if column.own_line and cell not in ("-", Verdict.SAME) and not cell.startswith(f"{Verdict.NOT_COUNTED}: neither side"):
            texts.append(f"{column.header}: {cell}")
    return [line for text in texts if text for line in wrap_text(printable(text), DETAIL_INDENT)]


def format_text(report: GateReport) -> str:
    """The report for a terminal: every line and cell printable (a run file's strings are input,
    and a newline or an escape sequence in one must not reach the terminal as such)."""
    # The title wraps at the rows' width; the preamble, notes and warnings at LINE_WIDTH.
    lines = wrap_text(f"{report.title} ({report.summary()})")
    for prefix, texts in (("", report.preamble), ("note: ", report.notes), ("WARNING: ", report.warnings)):
        lines += [line for text in texts for line in wrap_text(prefix + printable(text), width=LINE_WIDTH)]
    footer = [line for text in report.footer
              for line in wrap_text(printable(text), " " * (len(text) - len(text.lstrip())))]
    if not report.cases:
        return "\n".join(lines + ["no cases to compare"] + footer)
    cases = report.sorted_cases()
    ratio_width = max([len(f"ratio [{report.confidence * 100:g}% interval]")] + [len(_ratio(c)) for c in cases])

    def fits(name: str, verdict: str, flag: str) -> bool:
        return len(name) + 2 + ratio_width + 2 + len(verdict) + len(flag) <= TEXT_WIDTH

    flags = ["  <<" if case.verdict.fails else "" for case in cases]
    # The case column is as wide as the longest name whose row fits; a longer one stands on a line
    # of its own, the rest of its row under it.
    name_width = max([len("case")] + [len(printable(c.name)) for c, flag in zip(cases, flags)
                                      if fits(printable(c.name), printable(_short_verdict(c)), flag)])
    lines.append(f"{'case'.ljust(name_width)}  {f'ratio [{report.confidence * 100:g}% interval]'.ljust(ratio_width)}"
                 f"  verdict")
    for case, flag in zip(cases, flags):
        name = printable(case.name)
        verdict, why = printable(case.verdict + _resolution(case) + _verdict_note(case)), []
        if not fits(name.ljust(name_width), verdict, flag):  # the row keeps what failed it, the rest goes under it
            verdict, note = printable(_short_verdict(case)), _verdict_note(case).strip(" ()")
            why = wrap_text(f"why: {printable(note)}", DETAIL_INDENT) if note else []
        if len(name) > name_width:
            lines.append(name)
            name = DETAIL_INDENT.ljust(name_width)
        lines.append(f"{name.ljust(name_width)}  {_ratio(case).ljust(ratio_width)}  {verdict}{flag}")
        lines += why + _details(report, case)
    return "\n".join(lines + footer)


def format_markdown(report: GateReport) -> str:
    """The report as a pull-request comment: every cell and line from a run file shown literally
    (:func:`~ddpbench.shown_text.markdown_text`: no new line, heading, image, link, HTML or
    @mention can come from a case name, a module name or a side's path)."""
    status = "regressions found" if report.regressions else "no regression"
    lines = [f"### {report.title}: {status}", "", report.summary() + ".", ""]
    lines += [f"- {markdown_text(line)}" for line in report.preamble]
    lines += [f"- {markdown_text(n)}" for n in report.notes]
    lines += [f"- **Warning:** {markdown_text(w)}" for w in report.warnings]
    if report.preamble or report.notes or report.warnings:
        lines.append("")
    if not report.cases:
        return "\n".join(lines + ["No cases to compare."])
    headers = _headers(report)
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for case in report.sorted_cases():
        row = [markdown_text(cell) for cell in _row(report, case)]
        row[0] = markdown_code(case.name)
        reason = _resolution_reason(case, report.confidence)
        resolution = f"{_resolution(case)[:-1]}: {reason})" if reason else _resolution(case)
        row[-1] = case.verdict.markdown + markdown_text(resolution + _verdict_note(case))
        lines.append("| " + " | ".join(row) + " |")
    if report.footer:
        lines.append("")
        lines += [f"- {markdown_text(line.strip())}" for line in report.footer]
    return "\n".join(lines)


def format_json(report: GateReport) -> str:
    return json.dumps(report.to_dict(), indent=2)


# ----------------------------------------------------------------------------------------------
# A/B verdicts: from a case's extra_info["ab"]
# ----------------------------------------------------------------------------------------------


def ab_verdict(name: str, ab: dict[str, Any] | ABRecord, candidate_median_s: float | None, census: Any = None,
               accept_structure_change: bool = False, memory: Any = None, accept_memory_change: bool = False,
               memory_tolerance: float | None = None, numerics: Any = None, accept_numerics_change: bool = False,
               numerics_tolerance: float | None = None) -> CaseVerdict:
    """A case's A/B verdict from its ``extra_info["ab"]`` (the timing verdict and the baseline's
    census, memory census and numerics) and the candidate's ``census``, ``memory`` and ``numerics``
    (``extra_info["census"]`` / ``["memory"]`` / ``["numerics"]``), each as saved or as read already (a loaded
    :class:`~ddpbench.storage.runs.Case` holds them read); :class:`VerdictError` when a field does
    not hold what it should (a damaged or hand-edited run)."""
    try:
        record = read_ab(ab)
        summary = record.summary
        low, high = summary.get("ratio_ci") or [None, None]
        if candidate_median_s is None:
            candidate_median_s = (summary.get("candidate") or {}).get("median_s")
        # The timing's own verdict: ``timing_verdict`` beside the decided one (record_decision), or,
        # in a run saved before the decided verdict was saved, ``verdict`` itself. The components are
        # judged anew, so a reader's --accept-structure-change applies.
        case = CaseVerdict(name, summary.get("timing_verdict") or summary.get("verdict", Verdict.INCONCLUSIVE), name,
                           baseline_median_s=(summary.get("baseline") or {}).get("median_s"),
                           current_median_s=candidate_median_s, ratio=summary.get("ratio"), ci_low=low, ci_high=high,
                           p_value=summary.get("p_value"), method="paired-blocks" if "pairs" in summary else None,
                           reason=summary.get("reason"), details=summary)
        if case.verdict in TIMING_VERDICTS:  # both sides ran it: their structures compare too
            case.judge_structure(compare_census(record.baseline_census, census, "candidate",
                                                (f"ab.{BASELINE_CENSUS_KEY}", CENSUS_KEY)), accept_structure_change)
            case.judge_memory(compare_memory(record.baseline_memory, memory, "candidate",
                                             (f"ab.{BASELINE_MEMORY_KEY}", MEMORY_KEY), memory_tolerance),
                              accept_memory_change)
            case.judge_numerics(compare_numerics(record.baseline_numerics, numerics, "candidate",
                                                 (f"ab.{BASELINE_NUMERICS_KEY}", NUMERICS_KEY), numerics_tolerance),
                                accept_numerics_change)
    except RecordError as exc:
        raise VerdictError(f"{name}: extra_info {exc}. The run's file is damaged or was edited: restore it "
                           f"or run the A/B comparison again") from None
    return case


def ab_verdicts(results: list[tuple[str, dict, float | None, dict | None]],
                accept_structure_change: bool = False, accept_memory_change: bool = False,
                memory_tolerance: float | None = None, accept_numerics_change: bool = False,
                numerics_tolerance: float | None = None) -> list[CaseVerdict]:
    """The verdicts of an A/B run in progress: (case id, extra_info["ab"], candidate median, the
    case's extra_info or None), the candidate's census and memory census read from that extra_info now."""
    return [ab_verdict(name, summary, median, (info or {}).get(CENSUS_KEY), accept_structure_change,
                       (info or {}).get(MEMORY_KEY), accept_memory_change, memory_tolerance,
                       (info or {}).get(NUMERICS_KEY), accept_numerics_change, numerics_tolerance)
            for name, summary, median, info in results]


def _ab_number(key: str, fmt: str) -> Callable[[CaseVerdict], str]:
    def cell(case: CaseVerdict) -> str:
        value = case.details.get(key)
        return "-" if value is None else fmt.format(value)
    return cell


AB_COLUMNS = [
    Column("per pool pair", lambda c: " / ".join(f"{r:.3f}" for r in c.details.get("ratio_per_pool_pair") or []) or "-",
           own_line=False),
    Column("block minima", _ab_number("ratio_of_block_minima", "{:.3f}"), own_line=False),
    Column("pairs", _ab_number("pairs", "{}"), own_line=False),
    Column("wall (s)", _ab_number("wall_s", "{:.1f}"), own_line=False),
    STRUCTURE_COLUMN,
    MEMORY_COLUMN,
    NUMERICS_COLUMN,
]


def describe_side(desc: dict) -> str:
    """One line for an A/B side as extra_info describes it."""
    parts = [f"python {desc.get('python')}", f"torch {desc.get('torch_version')}"]
    parts += [f"sys.path+ {p}" for p in desc.get("sys_path_prepended") or []]
    parts += [f"{k}={v}" for k, v in (desc.get("env") or {}).items()]
    return ", ".join(parts)


def ab_report(cases: list[CaseVerdict], sides: dict | None = None) -> GateReport:
    """The report of an A/B run: its cases, the threshold they were judged at, both sides."""
    threshold = next((c.details["threshold"] for c in cases if "threshold" in c.details), None)
    if sides is None:
        sides = next((c.details["sides"] for c in cases if isinstance(c.details.get("sides"), dict)), {})
    columns = [column for column in AB_COLUMNS if column is not MEMORY_COLUMN or any(
        c.memory is not None and not c.memory.line.startswith("neither side") for c in cases)]
    columns = [column for column in columns if column is not NUMERICS_COLUMN or any(
        c.numerics is not None and not c.numerics.line.startswith("neither side") for c in cases)]
    return GateReport("ddpbench A/B verdicts", cases, threshold, current_label="candidate", columns=columns,
                      footer=[f"  {name}: {describe_side(desc)}" for name, desc in (sides or {}).items()])


def ab_verdicts_of_run(doc: dict, accept_structure_change: bool = False, accept_memory_change: bool = False,
                       memory_tolerance: float | None = None, accept_numerics_change: bool = False,
                       numerics_tolerance: float | None = None) -> list[CaseVerdict]:
    """The A/B verdicts stored in a pytest-benchmark JSON run (cases without ``ab`` are skipped),
    the cases the candidate lost included."""
    out = []
    for case in doc.get("benchmarks", []):
        info = case.get("extra_info") or {}
        ab = info.get("ab")
        if isinstance(ab, dict) and "verdict" in ab:
            out.append(ab_verdict(case.get("fullname") or case.get("name", "?"), ab,
                                  (case.get("stats") or {}).get("median"), info.get(CENSUS_KEY),
                                  accept_structure_change, info.get(MEMORY_KEY), accept_memory_change,
                                  memory_tolerance, info.get(NUMERICS_KEY), accept_numerics_change,
                                  numerics_tolerance))
    for lost in doc.get(LOST_CASES_KEY) or []:
        if isinstance(lost, dict) and isinstance(lost.get("ab"), dict):
            out.append(ab_verdict(str(lost.get("name", "?")), lost["ab"], None))
    return out
