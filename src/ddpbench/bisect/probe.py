"""What one probe found (:class:`Probe`, its :class:`ProbeCase` verdicts) and how bisect reads it:
:func:`read_probe` gives good, bad, skip or inconclusive. No git, no subprocess."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..gates.verdict_words import Verdict
from ..gates.verdicts import TIMED, ab_verdicts_of_run
from .terminal import printable

BAD_VERDICTS = (Verdict.REGRESSION,)  # and Verdict.MISSING with --missing-is-bad
GOOD_VERDICTS = (Verdict.SAME, Verdict.NOT_SLOWER, Verdict.IMPROVEMENT)  # not on the slow side of the step
GATE_DEFAULT_THRESHOLD = 0.05  # the A/B gate's --dist-ab-threshold default


@dataclass
class ProbeCase:
    """One case's verdict as a probe's A/B run gave it (the gate's ``CaseVerdict``, reduced to
    what the search and its table need)."""

    name: str
    verdict: str
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    structure: str = ""  # what the collective and memory censuses say changed, when they did
    reason: str = ""  # why a case is missing, new or baseline-failed

    def cell(self) -> str:
        structure = f" ({self.structure})" if self.structure else ""
        if self.ratio is None:
            return f"{self.verdict}{structure}" + (f" ({self.reason})" if self.reason else "")
        ci = f" [{self.ci[0]:.3f}, {self.ci[1]:.3f}]" if self.ci else ""
        return f"x{self.ratio:.3f}{ci} {self.verdict}{structure}"


@dataclass
class Probe:
    index: int  # position in the first-parent list (0 = the first commit after GOOD)
    sha: str
    subject: str
    outcome: str = ""  # good / bad / inconclusive / skip
    cases: list[ProbeCase] = field(default_factory=list)
    seconds: float = 0.0
    runs: int = 0
    note: str = ""
    command: str = ""  # the A/B command of the last run, reproducible (see ProbeRunner.reproduce)

    def summary(self) -> str:
        cases = "; ".join(f"{printable(c.name)}: {printable(c.cell())}" for c in self.cases)
        return " -- ".join(part for part in (cases, printable(self.note)) if part)


def cases_of_run(doc: dict, accept_structure_change: bool, accept_memory_change: bool = False,
                 memory_tolerance: float | None = None) -> list[ProbeCase]:
    """A run file's A/B verdicts, read as the gate that ran it read them (its acceptance of
    structural and memory changes and its memory tolerance included); VerdictError when they
    cannot be read."""
    return [ProbeCase(v.name, v.verdict, v.ratio,
                      (v.ci_low, v.ci_high) if v.ci_low is not None and v.ci_high is not None else None,
                      "; ".join(f"{what}: {judged.cell()}" for what, judged in (("structure", v.structure),
                                                                             ("memory", v.memory))
                                if judged is not None and judged.verdict != "same"),
                      v.reason or "")
            for v in ab_verdicts_of_run(doc, accept_structure_change, accept_memory_change, memory_tolerance)]


def seed_of_run(doc: dict) -> int | None:
    """The block-order seed of a run file's first A/B case (the reproduce line repeats it)."""
    seeds = [b["extra_info"]["ab"].get("seed") for b in doc.get("benchmarks", [])
             if isinstance((b.get("extra_info") or {}).get("ab"), dict)]
    return seeds[0] if seeds else None


def read_probe(cases: Sequence[ProbeCase], reference: Sequence[str] | None = None,
               missing_is_bad: bool = False) -> tuple[str, str]:
    """How bisect reads one A/B run's verdicts: (outcome, note). ``reference``: the cases BAD
    judged (None while BAD itself is read: every case of the run is then one).

    * ``bad``: any case is ``regression``, or ``missing`` with ``missing_is_bad``;
    * ``skip``: a reference case is not judged here (absent, missing, baseline-failed, new): the
      note names each with why; a search for a slowdown cannot place a commit it did not time;
    * ``good``: every reference case is on the fast side (``same``, ``not-slower``, ``improvement``);
    * ``inconclusive``: the rest (an inconclusive reference case, none bad, none unjudged).
    """
    if not cases:
        return "skip", "no A/B verdict in the run"
    if any(c.verdict in BAD_VERDICTS for c in cases):
        return "bad", ""
    missing = [c.name for c in cases if c.verdict == Verdict.MISSING]
    if missing and missing_is_bad:
        return "bad", f"missing counts as bad (--missing-is-bad): {', '.join(missing)}"
    by_name = {c.name: c for c in cases}
    names = list(by_name) if reference is None else list(reference)
    unjudged = []
    for name in names:
        case = by_name.get(name)
        if case is None:
            unjudged.append(f"{name} (not in the run)")
        elif case.verdict not in TIMED:
            unjudged.append(f"{name} ({case.verdict})")
    if unjudged:
        hint = (" (a case lost is not a slowdown; --missing-is-bad searches for the commit that lost it)"
                if missing else "")
        return "skip", "not judged here: " + ", ".join(unjudged) + hint
    verdicts = {by_name[name].verdict for name in names}
    return ("good" if verdicts <= set(GOOD_VERDICTS) else "inconclusive"), ""


def judged_cases(cases: Sequence[ProbeCase], missing_is_bad: bool = False) -> list[str]:
    """The cases a confirmed BAD judged: each later probe must judge them too (:func:`read_probe`)."""
    return [c.name for c in cases if c.verdict in TIMED or (missing_is_bad and c.verdict == Verdict.MISSING)]


def step_threshold(bad_cases: Sequence[ProbeCase]) -> float | None:
    """The threshold that splits GOOD's timing from BAD's in the middle (geometrically): from the
    lowest interval end among BAD's regressions, never below the gate's default. None when BAD's
    regressions carry no interval (a missing case)."""
    lows = [c.ci[0] for c in bad_cases if c.verdict == Verdict.REGRESSION and c.ci and c.ci[0] > 1.0]
    if not lows:
        return None
    return max(GATE_DEFAULT_THRESHOLD, math.sqrt(min(lows)) - 1.0)
