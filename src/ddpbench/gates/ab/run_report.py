"""What an A/B run says: the header before its cases, where each side's code comes from, the verdict
table and the lines after it, ending with the exit status and why. The verdicts are decided by
ddpbench.gates.verdicts and the exit by ddpbench.gates.exit_decision; this module only writes."""

from __future__ import annotations

from ..exit_decision import LINE_WIDTH, ExitDecision, exit_lines
from ..verdict_words import Verdict
from ..verdicts import GateReport, ab_report, ab_verdicts, format_text, record_decision
from .profiling import CaseProfile
from .run_plan import OPTION_PREFIX, ABPlan
from .run_sides import Sides
from .side_environments import engine_lines, module_lines

PREFIX = "ddpbench A/B: "  # every line the gate writes starts so


def header_lines(plan: ABPlan, sides: Sides, world_sizes: list[int], cores: int, pin_cores: bool) -> list[str]:
    """The run's header: the settings, the heap, the seed, both sides and their engines."""
    s = plan.settings
    common = ", ".join(f"{k}={v}" for k, v in sides.baseline.common_env) or "glibc's defaults"
    if plan.run_budget_s is None:
        more = f"more up to {s.max_time_s:g} s per case"
    else:
        more = (f"more within a run budget of {plan.run_budget_s:g} s (each case: its share of what is "
                f"left" + (f", at most {plan.max_time_given_s:g} s)" if plan.max_time_given_s else ")"))
    lines = [f"threshold {s.threshold * 100:g}%, blocks of ~{s.block_time_s:g} s, {s.first_pairs} pairs "
             f"first, {more}, {s.pools_per_side} pool(s) per side, ranks "
             f"{'pinned one core each' if pin_cores else 'placed by the OS'} (--dist-pin-cores)",
             f"heap {plan.heap}, both sides' ranks: {common} (--dist-ab-heap)",
             seed_line(plan.seed),
             f"baseline  = {sides.baseline.short()}",
             f"candidate = {sides.candidate.short()}",
             *engine_lines(sides.baseline, sides.candidate)]
    alive = 2 * s.pools_per_side * max(world_sizes)
    if alive > cores:
        lines.append(f"both sides' pools are alive at once ({alive} rank processes on {cores} cores); "
                     f"only the pool measuring a block is busy")
    return [PREFIX + line for line in lines]


def seed_line(seed: int) -> str:
    return f"block order seed {seed} (--dist-ab-seed {seed} repeats it)"


def code_under_test_lines(sides: Sides) -> list[str]:
    """Where each side's ranks import the code under test from (none when nothing resolved)."""
    lines = module_lines(sides.baseline, sides.candidate)
    if not lines:
        return []
    return [f"{PREFIX}where each side's ranks import the code under test from:"] + [PREFIX + line for line in lines]


def baseline_build_lines(builds) -> list[str]:
    """What the baseline's build of its own workloads found (gates/ab/baseline_workloads.py)."""
    if builds is None:
        return []
    counts: dict[str, int] = {}
    for case in builds.cases.values():
        counts[case.status] = counts.get(case.status, 0) + 1
    where = (f"its own checkout {builds.folder}" if builds.own_checkout
             else f"the candidate's test files in {builds.folder} (the baseline names no checkout of its own)")
    built = counts.pop("built", 0)
    rest = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    lines = [f"{PREFIX}the baseline's workloads, built by its own code from {where}: {built} of "
             f"{len(builds.cases)} case(s)" + (f" ({rest})" if rest else "")]
    lines += [f"{PREFIX}  {case_id}: {case.detail.splitlines()[0][:200]}"
              for case_id, case in builds.cases.items() if case.status != "built"][:8]
    return lines


def decided_report(results: list, plan: ABPlan, sides: Sides) -> GateReport:
    """The run's verdicts, each case's decided verdict written back into its extra_info["ab"]
    (record_decision): the run file says what the gate decided and exited on."""
    cases = ab_verdicts(results, plan.accept_structure_change, plan.accept_memory_change,
                        plan.memory_tolerance, plan.accept_numerics_change, plan.numerics_tolerance)
    for (_, summary, _, _), case in zip(results, cases):
        record_decision(summary, case)
    return ab_report(cases, sides.describe())


def summary_lines(report: GateReport, decision: ExitDecision, seed: int,
                  profiles: list[CaseProfile]) -> list[tuple[str, bool]]:
    """(line, whether it reports a failure) of the verdict table and the gate's outcome; the
    last line says the run's exit status and why (pytest's own count of passed tests beneath
    it does not: a case that ran to the end passes as a test whatever its verdict)."""
    lines = [(line, line.endswith("<<")) for line in format_text(report).splitlines()]
    for profile in profiles:
        lines += [(PREFIX + line, False) for line in profile.lines()]
    lines.append((PREFIX + seed_line(seed), False))
    lines += [(PREFIX + line, "exit status 1" in line)
              for line in exit_lines(decision, OPTION_PREFIX, report.current_label, LINE_WIDTH - len(PREFIX))]
    lines.append((exit_line(decision.status, report), bool(decision.status)))
    return lines


def exit_line(status: int, report: GateReport) -> str:
    """The run's last ddpbench line: the gate's exit status and the verdicts behind it (pytest's own
    count beneath it passes every case that ran, whatever its verdict)."""
    counts = ", ".join(f"{n} {verdict}" for verdict, n in report.counts().items() if n) or "no cases"
    if not status:
        return f"{PREFIX}exit status 0: no case fails the gate ({counts})"
    failing = [c.fullname or c.name for c in report.sorted_cases() if c.verdict.fails]
    tail = ", whatever pytest counts as passed"
    if not failing:
        return f"{PREFIX}exit status 1: {counts}; {OPTION_PREFIX}fail-on-inconclusive{tail}"
    names = "the cases marked << above"  # unless some of them fit in LINE_WIDTH (at most three)
    for shown in range(min(3, len(failing)), 0, -1):
        listed = ", ".join(failing[:shown]) + (" ..." if len(failing) > shown else "")
        if len(f"{PREFIX}exit status 1: {counts} ({listed}){tail}") <= LINE_WIDTH:
            names = listed
            break
    return f"{PREFIX}exit status 1: {counts} ({names}){tail}"


def lost_cases(results: list) -> list[dict]:
    """The cases the candidate lost, for the run's JSON (they have no benchmark entry)."""
    return [{"name": name, "ab": summary} for name, summary, _, _ in results
            if summary.get("verdict") == Verdict.MISSING]
