"""A gate's exit, decided apart from the words that say why: :func:`decide_exit` reads a report's
verdicts and the allowances a run gives into an :class:`ExitDecision`; :func:`exit_lines` writes it.
Exit 1 for a regression, a missing case or one the baseline failed (unless allowed), and an
inconclusive case when asked; else 0 (docs/design/gates.md#exit-status)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .verdict_words import Verdict

# The A/B stoppers a change accepted after the run leaves unmeasured: (the case detail that names
# it, what it was, the word of its --dist-accept-...-change option).
STOPPERS = (("stopped_by_structure", "a structural change", "structure"),
            ("stopped_by_memory", "a memory change", "memory"),
            ("stopped_by_numerics", "a numerics change", "numerics"))


@dataclass(frozen=True)
class ExitDecision:
    """What a gate exits on: each list names the cases in it, ``..._accepted`` those an accept
    option lets through."""

    regressions: int = 0
    structural: tuple[str, ...] = ()
    structural_accepted: tuple[str, ...] = ()
    memory: tuple[str, ...] = ()
    memory_accepted: tuple[str, ...] = ()
    numerics: tuple[str, ...] = ()
    numerics_accepted: tuple[str, ...] = ()
    unmeasured: dict[str, tuple[str, ...]] = field(default_factory=dict)  # stopper -> cases
    missing: tuple[str, ...] = ()
    missing_allowed: bool = False
    baseline_failed: tuple[str, ...] = ()
    baseline_failure_allowed: bool = False
    inconclusive: int = 0
    inconclusive_fails: bool = False

    @property
    def failing(self) -> list[Verdict]:
        """The verdicts that make the exit 1, in the order the lines give them."""
        fails = [(Verdict.REGRESSION, self.regressions > 0),
                 (Verdict.MISSING, bool(self.missing) and not self.missing_allowed),
                 (Verdict.BASELINE_FAILED, bool(self.baseline_failed) and not self.baseline_failure_allowed),
                 (Verdict.INCONCLUSIVE, self.inconclusive > 0 and self.inconclusive_fails)]
        return [verdict for verdict, fails_it in fails if fails_it]

    @property
    def status(self) -> int:
        return 1 if self.failing else 0


def decide_exit(report, allow_missing: bool = False, fail_on_inconclusive: bool = False,
                allow_baseline_failure: bool = False) -> ExitDecision:
    """The exit of ``report`` (a :class:`~.verdicts.GateReport`) under the run's allowances."""
    def named(verdict: Verdict) -> tuple[str, ...]:
        return tuple(c.fullname or c.name for c in report.cases if c.verdict is verdict)

    return ExitDecision(
        regressions=report.count(Verdict.REGRESSION),
        structural=tuple(report.structural(False)), structural_accepted=tuple(report.structural(True)),
        memory=tuple(report.memory_regressions(False)), memory_accepted=tuple(report.memory_regressions(True)),
        numerics=tuple(report.numerics_regressions(False)),
        numerics_accepted=tuple(report.numerics_regressions(True)),
        unmeasured={stopper: tuple(report.unmeasured(stopper)) for stopper, _, _ in STOPPERS},
        missing=named(Verdict.MISSING), missing_allowed=allow_missing,
        baseline_failed=named(Verdict.BASELINE_FAILED), baseline_failure_allowed=allow_baseline_failure,
        inconclusive=report.count(Verdict.INCONCLUSIVE), inconclusive_fails=fail_on_inconclusive)


def _shown(names: tuple[str, ...]) -> str:
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")


#: No exit line is longer (a case name that cannot break is the one exception): it wraps, the
#: lines after its first indented.
LINE_WIDTH = 160


def _wrapped(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``; an option stays with the words before it ("allowed by
    --allow-missing", "(--allow-missing accepts them)")."""
    import re
    import textwrap

    text = re.sub(r"\b(allowed|accepted) by (--\S+)", "\\1\u00a0by\u00a0\\2", text)
    text = re.sub(r"\((--\S+) (accepts|makes)", "(\\1\u00a0\\2", text)
    lines = textwrap.wrap(text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    return [line.replace("\u00a0", " ") for line in lines]


def exit_lines(decision: ExitDecision, option_prefix: str = "--", candidate_label: str = "candidate",
               width: int = LINE_WIDTH) -> list[str]:
    """The lines that say why ``decision`` exits as it does, each at most ``width`` columns.
    ``option_prefix``: how the gate's options begin ("--" for ddpbench compare, "--dist-" in pytest:
    ddpbench.option_table spells them so); ``candidate_label``: how the run judged against the
    baseline is named."""
    allow, fail = f"{option_prefix}allow-missing", f"{option_prefix}fail-on-inconclusive"
    allow_failed = f"{option_prefix}allow-baseline-failure"
    accept_change = f"{option_prefix}accept-structure-change"
    accept_memory = f"{option_prefix}accept-memory-change"
    accept_numerics = f"{option_prefix}accept-numerics-change"
    lines = []
    if decision.regressions:
        lines.append(f"{decision.regressions} regression(s): exit status 1")
    if decision.structural:
        lines.append(f"{len(decision.structural)} structural regression(s) ({_shown(decision.structural)}): what "
                     f"one step launches grew or changed, a regression whatever the timing says ({accept_change} "
                     f"accepts a change made on purpose)")
    if decision.structural_accepted:
        lines.append(f"{len(decision.structural_accepted)} structural change(s) accepted by {accept_change} "
                     f"({_shown(decision.structural_accepted)}): shown, not failing")
    if decision.memory:
        lines.append(f"{len(decision.memory)} memory regression(s) ({_shown(decision.memory)}): one step's peak of "
                     f"live tensor bytes (or what held it, or what stays after it) grew, a regression whatever the "
                     f"timing says ({accept_memory} accepts a change made on purpose)")
    if decision.memory_accepted:
        lines.append(f"{len(decision.memory_accepted)} memory change(s) accepted by {accept_memory} "
                     f"({_shown(decision.memory_accepted)}): shown, not failing")
    if decision.numerics:
        lines.append(f"{len(decision.numerics)} numerics change(s) ({_shown(decision.numerics)}): a seeded replay "
                     f"of the first steps computes other values than the baseline's, past the band its rounding-level "
                     f"perturbations grow into or in a figure rounding cannot move, a regression whatever the timing says ({accept_numerics} accepts a change made on "
                     f"purpose)")
    if decision.numerics_accepted:
        lines.append(f"{len(decision.numerics_accepted)} numerics change(s) accepted by {accept_numerics} "
                     f"({_shown(decision.numerics_accepted)}): shown, not failing")
    for stopper, what, option in STOPPERS:
        # Each line names the option that lets its own stopper through (a case stopped by both: both).
        unmeasured = decision.unmeasured.get(stopper, ())
        if unmeasured:
            lines.append(f"{len(unmeasured)} case(s) stopped at their first look by {what} that was "
                         f"accepted after the run ({_shown(unmeasured)}): their timing was not measured, so they "
                         f"cannot pass. Run the A/B gate again with --dist-accept-{option}-change to time them "
                         f"in full")
    for cases, allowed, option, cause in (
            (decision.missing, decision.missing_allowed, allow,
             f"the baseline has were lost by the {candidate_label} run ({{names}}): crashed, hung or removed"),
            (decision.baseline_failed, decision.baseline_failure_allowed, allow_failed,
             f"failed on the baseline side ({{names}}): nothing to compare the {candidate_label} with, "
             f"and a broken baseline is not a new case")):
        if not cases:
            continue
        what = f"{len(cases)} case(s) " + cause.format(names=_shown(cases))
        lines.append(f"{what}; allowed by {option}" if allowed else f"{what}. Exit status 1 ({option} accepts them)")
    if decision.inconclusive:
        lines.append(f"{decision.inconclusive} inconclusive case(s): exit status 1 ({fail})"
                     if decision.inconclusive_fails
                     else f"{decision.inconclusive} inconclusive case(s): not a failure ({fail} makes them one)")
    return [wrapped for line in lines for wrapped in _wrapped(line, width)]
