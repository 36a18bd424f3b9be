"""``ddpbench compare``: the noise-aware gate between two saved runs, or an A/B run's own verdicts.
Exit 0: no regression; 1: a regression (a structural or memory one too, unless accepted), a case the
baseline has and the current run lost (unless ``--allow-missing``), an inconclusive case with
``--fail-on-inconclusive``; 2: bad input (missing, unreadable or incomparable runs, runs without
raw rounds unless ``--allow-summary-stats``)."""

from __future__ import annotations

import sys

from .. import option_table
from .. import options as opts
from .. import report
from ..gates import stored_run_gate as cmp
from ..gates import verdicts
from ..gates.ab.profiling import CaseProfile
from ..gates.exit_decision import decide_exit, exit_lines
from ..storage.run_facts import parse_allowed
from ..storage import runs as stored
from .errors import error, output_problem

NAME = "compare"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        NAME, help="noise-aware regression verdicts between two runs",
        description="Compare two pytest-benchmark runs case by case: ratio of medians with a confidence "
                    "interval from the raw rounds, and a verdict. Exit 0: no regression, 1: regression(s), "
                    "2: bad input.")
    parser.add_argument("baseline", nargs="?", help="baseline run: a JSON file, or a saved run's number "
                        "(e.g. 0003). Default: the newest complete run (no failed cases, not stopped early) "
                        "of the candidate's machine and branch. A single A/B run "
                        "(--dist-baseline-* / --dist-candidate-env) prints its own verdicts")
    parser.add_argument("candidate", nargs="?", help="the run judged against the baseline (file or number). "
                        "Default: the newest run")
    option_table.add_command_options(parser, [option_table.STORAGE])
    parser.add_argument("--threshold", type=opts.parse_percent_or_zero, default=cmp.DEFAULT_THRESHOLD,
                        help="smallest slowdown reported as a regression (default 10%%)")
    parser.add_argument("--confidence", type=opts.parse_confidence, default=cmp.DEFAULT_CONFIDENCE,
                        help="confidence of the intervals and the rank test (default 0.95)")
    parser.add_argument("--calibration", choices=("auto", "always", "never"), default="auto",
                        help="normalise by the runs' calibrations: auto (when they differ by more "
                             f"than {cmp.DRIFT_TOLERANCE * 100:g}%%), always, never (default auto); a calibration "
                             f"ratio beyond 0.8-1.25 is never corrected (those cases are inconclusive)")
    parser.add_argument("--allow-different", type=opts.argument_type(parse_allowed), action="append", default=[], metavar="FACTS",
                        help="compare although these facts differ between the runs (comma list; all: any): "
                             "torch, cuda, nccl, engine, python, cpu_model, cpu_cores, gpus refuse the runs "
                             "(exit 2); backend, world_size, device, nodes, pinned_cores, ops_per_round, "
                             "cuda_graphs make a case inconclusive")
    parser.add_argument("--allow-summary-stats", action="store_true",
                        help="runs without raw rounds: give verdicts from the summary stats and exit 0/1 "
                             "instead of 2")
    option_table.add_command_options(parser, option_table.GATE_OPTIONS)
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON instead of the table")
    fmt.add_argument("--markdown", action="store_true", help="print a markdown table (CI comments)")
    parser.add_argument("--chart", metavar="PNG", help="also write a chart of the ratios and their intervals")


def run(args) -> int:
    problem = args.chart and output_problem("--chart", args.chart)
    if problem:
        return error(NAME, problem)
    try:
        base = None
        if args.baseline and args.candidate:
            base_path = stored.resolve_run(args.baseline, args.storage)
            cur_path = stored.resolve_run(args.candidate, args.storage)
        elif args.baseline:  # one run given: an A/B run's own verdicts, or compared with the newest run
            base_path = stored.resolve_run(args.baseline, args.storage)
            base_doc = stored.read_doc(base_path)
            base = stored.run_of_doc(base_path, base_doc)
            if any(isinstance(c.extra_info.get("ab"), dict) for c in base.cases.values()):
                return _print_ab_verdicts(args, base, base_doc)
            runs = stored.saved_runs(args.storage)
            if not runs:
                raise stored.RunError(f"only a baseline was given and {args.storage} has no saved run "
                                       f"to compare it with; name the current run too")
            cur_path = runs[-1]
        else:
            selection = stored.choose_runs(args.storage)
            base_path, cur_path = selection.baseline, selection.current
        if base_path.resolve() == cur_path.resolve():
            raise stored.RunError(f"baseline and current are the same file: {base_path}")
        base = base or stored.load_run(base_path)
        cur = stored.load_run(cur_path)
        result = cmp.compare_runs(base, cur, threshold=args.threshold, confidence=args.confidence,
                                  calibration=args.calibration, allow_different=set().union(*args.allow_different),
                                  accept_structure_change=args.accept_structure_change,
                                  accept_memory_change=args.accept_memory_change,
                                  memory_tolerance=args.memory_tolerance,
                                  accept_numerics_change=args.accept_numerics_change,
                                  numerics_tolerance=args.numerics_tolerance)
        if not (args.baseline or args.candidate):
            result.selection = selection.lines
            result.preamble += selection.lines
    except stored.RunError as exc:
        return error(NAME, str(exc))
    status = _print_report(args, result)
    if args.chart:
        try:
            path = report.compare_chart(result, args.chart)
            print(f"compare chart: {path}", file=sys.stderr)
        except report.MatplotlibMissing as exc:
            return error(NAME, str(exc))
        except OSError as exc:
            return error(NAME, f"cannot write the chart to {args.chart} ({exc.strerror or exc})")
    if result.summary_only and not args.allow_summary_stats:
        return error(NAME, "the runs lack raw round times, so the noise-aware gate could not run "
                           "(verdicts above come from summary stats). Save runs with "
                           "--benchmark-save-data, or pass --allow-summary-stats to accept them")
    return status


def _print_report(args, result) -> int:
    """The verdicts in the format asked for, then the gate's outcome; returns the exit status."""
    decision = decide_exit(result, args.allow_missing, args.fail_on_inconclusive, args.allow_baseline_failure)
    if args.json:
        print(verdicts.format_json(result))
    elif args.markdown:
        print(verdicts.format_markdown(result))
    else:
        print(verdicts.format_text(result))
    lines = exit_lines(decision, "--", result.current_label)
    if lines and args.markdown:
        print()
    for line in lines:  # after JSON they go to stderr, so stdout stays one JSON document
        print(("- " if args.markdown else "") + line, file=sys.stderr if args.json else sys.stdout)
    return decision.status


def _print_ab_verdicts(args, run: stored.Run, doc: dict) -> int:
    """``ddpbench compare AB_RUN.json``: the verdicts an A/B run measured (exit 1 on a regression
    or a case the candidate lost), each profiled case's grown ops beneath them."""
    try:
        cases = verdicts.ab_verdicts_of_run(doc, args.accept_structure_change, args.accept_memory_change,
                                            args.memory_tolerance, args.accept_numerics_change,
                                            args.numerics_tolerance)
        profiles = _profiles(run)
    except verdicts.VerdictError as exc:
        return error(NAME, f"{run.path}: {exc}")
    status = _print_report(args, verdicts.ab_report(cases))
    if not args.json:  # the JSON run holds them already (extra_info ab.profile)
        for profile in profiles:  # each profiled case's grown ops (--dist-ab-profile), beneath the verdicts
            print()
            print(profile.markdown() if args.markdown else "\n".join(profile.lines()))
    return status


def _profiles(run: stored.Run) -> list[CaseProfile]:
    """The profiles an A/B run holds (extra_info ab.profile); VerdictError when one is malformed."""
    profiles = []
    for case in run.cases.values():
        if not isinstance(case.extra_info.get("ab"), dict):
            continue
        try:
            profile = CaseProfile.from_summary(case.fullname, case.extra_info["ab"])
        except (TypeError, ValueError, AttributeError) as exc:
            raise verdicts.VerdictError(f"{case.fullname}: extra_info ab.profile cannot be read "
                                        f"({type(exc).__name__}: {exc}). The run's file is damaged or "
                                        f"was edited: restore it or run the A/B comparison again") from None
        if profile is not None:
            profiles.append(profile)
    return profiles
