"""``ddpbench compare`` (the noise-aware gate), ``ddpbench report`` (tables and charts) and
``ddpbench history`` (a static HTML page of every saved run, with the steps detected in each case),
``ddpbench bisect`` (the commit between two that made a case slower, through the A/B gate) and
``ddpbench census`` (a transformer step's collectives and per-rank memory at N ranks, simulated).

Exit status of ``compare``: 0 no regression, 1 at least one regression (a structural one too:
more collectives, bytes or graph breaks per step than the baseline's census, unless
``--accept-structure-change``) or a case the baseline has and the current run lost (unless
``--allow-missing``; inconclusive cases too with ``--fail-on-inconclusive``), 2 bad input (missing or unreadable runs, runs that are not comparable
unless ``--allow-different``, or runs without raw rounds unless ``--allow-summary-stats``).
``history`` exits 0 whatever the steps (it is a view, not a gate) and 2 on bad input. ``bisect``: 0
found (or no regression to search), 1 undecided, 2 bad input (:mod:`ddpbench.bisect`). ``census``: 0, or 2
on bad input (:mod:`ddpbench.scale`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .gates import compare as cmp
from .gates import verdicts
from . import history as hist
from .storage.runs import RunError, choose_runs, load_run, resolve_run, saved_runs
from . import options as opts

DEFAULT_STORAGE = ".benchmarks"
DEFAULT_CHARTS = "reports"


def _percent(text: str) -> float:
    return opts.parse_percent(text, allow_zero=True)


def _since(text: str):
    try:
        return hist.parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _confidence(text: str) -> float:
    percent = text.strip().endswith("%")
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 0.95 or 95%, got {text!r}") from None
    if percent:
        value /= 100.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie between 0 and 1 (or 0% and 100%), got {text!r}")
    return value


def _facts(text: str) -> set[str]:
    from .gates.fingerprint import parse_allowed

    try:
        return parse_allowed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    import ddpbench

    parser = argparse.ArgumentParser(prog="ddpbench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {ddpbench.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compare", help="noise-aware regression verdicts between two runs",
                       description="Compare two pytest-benchmark runs case by case: ratio of medians "
                                   "with a confidence interval from the raw rounds, and a verdict. "
                                   "Exit 0: no regression, 1: regression(s), 2: bad input.")
    c.add_argument("baseline", nargs="?", help="baseline run: a JSON file, or a saved run's number "
                   "(e.g. 0003). Default: the newest complete run (no failed cases, not stopped early) "
                   "of the current run's machine and branch. A single A/B run "
                   "(--dist-baseline-* / --dist-candidate-env) prints its own verdicts")
    c.add_argument("current", nargs="?", help="current run (file or number). Default: the newest run")
    c.add_argument("--storage", default=DEFAULT_STORAGE, help="pytest-benchmark storage folder (default .benchmarks)")
    c.add_argument("--threshold", type=_percent, default=cmp.DEFAULT_THRESHOLD,
                   help="smallest slowdown reported as a regression (default 10%%)")
    c.add_argument("--confidence", type=_confidence, default=cmp.DEFAULT_CONFIDENCE,
                   help="confidence of the intervals and the rank test (default 0.95)")
    c.add_argument("--calibration", choices=("auto", "always", "never"), default="auto",
                   help="normalise by the runs' calibration probes: auto (when they differ by more "
                        f"than {cmp.DRIFT_TOLERANCE * 100:g}%%), always, never (default auto); a probe "
                        f"ratio beyond 0.8-1.25 is never corrected (those cases are inconclusive)")
    c.add_argument("--allow-different", type=_facts, action="append", default=[], metavar="FACTS",
                   help="compare although these facts differ between the runs (comma list; all: any): "
                        "torch, cuda, nccl, engine, python, cpu_model, cpu_cores, gpus refuse the runs "
                        "(exit 2); backend, world_size, device, nodes, pinned_cores, ops_per_round, "
                        "cuda_graphs make a case inconclusive")
    c.add_argument("--allow-summary-stats", action="store_true",
                   help="runs without raw rounds: give verdicts from the summary stats and exit 0/1 "
                        "instead of 2")
    c.add_argument("--allow-missing", action="store_true",
                   help="cases the baseline has and the current run lost (crashed, hung, removed) are "
                        "listed but do not fail the gate")
    c.add_argument("--allow-baseline-failure", action="store_true",
                   help="A/B runs: cases whose baseline side failed (raised, died, hung) are listed but "
                        "do not fail the gate")
    c.add_argument("--accept-structure-change", action="store_true", help=opts.ACCEPT_STRUCTURE_HELP)
    c.add_argument("--accept-memory-change", action="store_true", help=opts.ACCEPT_MEMORY_HELP)
    c.add_argument("--memory-tolerance", type=opts.parse_memory_tolerance, default=None, metavar="FRACTION",
                   help=opts.MEMORY_TOLERANCE_HELP)
    c.add_argument("--fail-on-inconclusive", action="store_true",
                   help="exit 1 when a case is inconclusive (neither a change nor the same within the "
                        "threshold); by default they are counted and exit 0")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON instead of the table")
    fmt.add_argument("--markdown", action="store_true", help="print a markdown table (CI comments)")
    c.add_argument("--chart", metavar="PNG", help="also write a chart of the ratios and their intervals")

    r = sub.add_parser("report", help="markdown tables and PNG charts of a run",
                       description="Markdown tables in the shape of the reports this suite reproduces, "
                                   "and PNG charts, from a saved run or a --benchmark-json file.")
    r.add_argument("run", nargs="?", help="a JSON file or a saved run's number. Default: the newest saved run")
    r.add_argument("--storage", default=DEFAULT_STORAGE, help="pytest-benchmark storage folder (default .benchmarks)")
    r.add_argument("--charts", default=DEFAULT_CHARTS, metavar="DIR",
                   help="folder for the PNG charts; a sub-folder per run (default reports/)")
    r.add_argument("--no-charts", action="store_true", help="tables only (no matplotlib needed)")
    r.add_argument("--output", metavar="MD", help="also write the markdown to this file")

    h = sub.add_parser("history", help="a static HTML page of every saved run, with detected steps",
                       description="One self-contained HTML page over every saved run of the storage "
                                   "(all machine folders) and the JSON files named: a chart of the run "
                                   "medians (IQR band) per machine, backend and case in commit order, "
                                   "with the steps found in them (ruptures). Exit 0, or 2 on bad input.")
    h.add_argument("files", nargs="*", metavar="JSON", help="also these pytest-benchmark JSON files "
                   "(--benchmark-json outputs)")
    h.add_argument("--storage", default=DEFAULT_STORAGE, help="pytest-benchmark storage folder (default .benchmarks)")
    h.add_argument("--output", default=hist.DEFAULT_OUTPUT, metavar="HTML",
                   help=f"where to write the page (default {hist.DEFAULT_OUTPUT})")
    h.add_argument("--since", type=_since, metavar="DATE",
                   help="only runs whose commit (else run) time is on or after DATE (ISO, e.g. 2026-01-31, UTC)")
    h.add_argument("--case", action="append", default=[], metavar="PATTERN",
                   help="only cases whose name or fullname matches PATTERN (fnmatch, e.g. 'test_all_reduce*') "
                        "or contains it; repeatable")
    h.add_argument("--min-step", type=_percent, default=hist.DEFAULT_MIN_STEP, metavar="PCT",
                   help=f"smallest change of a series' median reported as a step (default "
                        f"{hist.DEFAULT_MIN_STEP * 100:g}%%)")
    h.add_argument("--skip-unreadable", action="store_true",
                   help="leave unreadable saved runs out (a warning each) instead of stopping")
    h.add_argument("--json", action="store_true", help="print the detected steps as JSON (for CI)")

    s = sub.add_parser("census", help="collectives and per-rank memory of a transformer step at N ranks, simulated",
                       description="The collective census of one optimizer step of the transformer family "
                                   "(DDP or FSDP2) at each world size, simulated in this process as rank 0 of N "
                                   "on torch's fake process group: per collective kind and dtype the calls and "
                                   "payload bytes per step and rank, the parameter, gradient and optimizer "
                                   "bytes each rank holds, and each rank's peak memory over the step with its "
                                   "breakdown (--device-memory: where it fits); a table (or --json) and a chart. "
                                   "Counts and bytes, no timing. Exit 0, or 2 on bad input.")
    from .scale.command import add_arguments as add_census_arguments

    add_census_arguments(s)

    b = sub.add_parser("bisect", help="find the commit that made a case slower (A/B gate at each probe)",
                       usage="ddpbench bisect GOOD BAD [-k EXPR] [--max-time S] [--setup CMD [--python PATH]] "
                             "[--missing-is-bad] [--collect-timeout S] [--probe-timeout S] [-- PYTEST_ARGS...]",
                       description="Run in a git checkout of your project: bisects the first-parent commits "
                                   "from GOOD to BAD, running the A/B gate at each probe (GOOD's worktree the "
                                   "baseline, the probe's the candidate). Exit 0: found, or no regression to "
                                   "search; 1: undecided; 2: bad input.")
    b.add_argument("good", metavar="GOOD", help="a commit whose code is fast (the baseline of every probe)")
    b.add_argument("bad", metavar="BAD", help="a later commit, descending from GOOD, that is slower")
    b.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest -k: the cases to compare (keep it narrow)")
    b.add_argument("--max-time", type=float, default=60.0, metavar="SECONDS",
                   help="--dist-ab-max-time of each A/B run; an inconclusive probe is run once more with twice "
                        "this (default 60)")
    b.add_argument("--setup", metavar="CMD", help="shell command run once in each commit's worktree before its "
                   "runs (e.g. build a venv: python -m venv .venv && .venv/bin/pip install -e . ddpbench); "
                   "a commit where it fails is skipped")
    b.add_argument("--python", metavar="PATH", help="with --setup: the interpreter it made, relative to the "
                   "worktree (e.g. .venv/bin/python); default: this one")
    b.add_argument("--missing-is-bad", action="store_true",
                   help="a case the probe's candidate lost (crashed, hung, failed a check) makes the probe bad: "
                        "search for the commit that broke a case. Default: such a probe is skipped, as a slowdown "
                        "search cannot place a commit it could not time")
    b.add_argument("--collect-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long GOOD's and BAD's pytest --collect-only may take (default 300)")
    b.add_argument("--probe-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long one probe's A/B run may take before it is stopped and the commit skipped "
                        "(default: --collect-timeout plus, per selected case, its --max-time and 300 s)")
    return parser


def _error(command: str, message: str) -> int:
    print(f"ddpbench {command}: error: {message}", file=sys.stderr)
    return 2


def output_problem(option: str, path: str, default: str | None = None, folder: bool = False) -> str | None:
    """Why an output path given to ``option`` cannot be used, or None. The folder it goes in must
    exist, as a shell's ``> FILE`` and ``mkdir DIR`` need: a mistyped path is named, not created
    folder by folder. The default path's folders are created (reports/ on a fresh clone).
    ``folder``: the option names a folder to write into (created itself), not a file."""
    target = Path(path)
    if folder and target.exists() and not target.is_dir():
        return f"{option} {path}: is a file, not a folder; name a folder for the files"
    if not folder and target.is_dir():
        return f"{option} {path}: is a folder; name a file in it"
    parent = target.parent
    if str(path) != str(default) and not parent.is_dir():
        return (f"{option} {path}: the folder {parent} does not exist; create it (mkdir -p {parent}) or "
                f"give {option} a path in an existing folder")
    return None


def _print_report(args, report) -> int:
    """The report in the format asked for, then the gate's outcome; returns the exit status."""
    status, lines = report.gate_status(args.allow_missing, args.fail_on_inconclusive,
                                       allow_baseline_failure=args.allow_baseline_failure)
    if args.json:
        print(verdicts.format_json(report))
    elif args.markdown:
        print(verdicts.format_markdown(report))
    else:
        print(verdicts.format_text(report))
    if lines and args.markdown:
        print()
    for line in lines:  # after JSON they go to stderr, so stdout stays one JSON document
        print(("- " if args.markdown else "") + line, file=sys.stderr if args.json else sys.stdout)
    return status


def run_ab_verdicts(args, run) -> int:
    """``ddpbench compare AB_RUN.json``: the verdicts an A/B run measured (exit 1 on a regression
    or a case the candidate lost)."""
    try:
        cases = [verdicts.ab_verdict(case.fullname, case.ab, case.median, case.census, args.accept_structure_change,
                                     case.memory, args.accept_memory_change, args.memory_tolerance)
                 for case in run.cases.values() if case.ab is not None]
        cases += [verdicts.ab_verdict(str(lost.get("name", "?")), lost["ab"], None)
                  for lost in run.lost_ab_cases if isinstance(lost, dict) and isinstance(lost.get("ab"), dict)]
        profiles = _profiles(run)
    except verdicts.VerdictError as exc:
        return _error("compare", f"{run.path}: {exc}")
    status = _print_report(args, verdicts.ab_report(cases))
    if not args.json:  # the JSON run holds them already (extra_info ab.profile)
        for profile in profiles:  # each profiled case's grown ops (--dist-ab-profile), beneath the verdicts
            print()
            print(profile.markdown() if args.markdown else "\n".join(profile.lines()))
    return status


def _profiles(run) -> list:
    """The profiles an A/B run holds (extra_info ab.profile); VerdictError when one is malformed."""
    from .gates.ab.forensics import CaseProfile

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


def run_compare(args) -> int:
    problem = args.chart and output_problem("--chart", args.chart)
    if problem:
        return _error("compare", problem)
    try:
        base = None
        if args.baseline and args.current:
            base_path = resolve_run(args.baseline, args.storage)
            cur_path = resolve_run(args.current, args.storage)
        elif args.baseline:  # one run given: an A/B run's own verdicts, or compared with the newest run
            base_path = resolve_run(args.baseline, args.storage)
            base = load_run(base_path)
            if any(isinstance(c.extra_info.get("ab"), dict) for c in base.cases.values()):
                return run_ab_verdicts(args, base)
            runs = saved_runs(args.storage)
            if not runs:
                raise RunError(f"only a baseline was given and {args.storage} has no saved run "
                               f"to compare it with; name the current run too")
            cur_path = runs[-1]
        else:
            selection = choose_runs(args.storage)
            base_path, cur_path = selection.baseline, selection.current
        if base_path.resolve() == cur_path.resolve():
            raise RunError(f"baseline and current are the same file: {base_path}")
        base = base or load_run(base_path)
        cur = load_run(cur_path)
        result = cmp.compare_runs(base, cur, threshold=args.threshold, confidence=args.confidence,
                                  calibration=args.calibration, allow_different=set().union(*args.allow_different),
                                  accept_structure_change=args.accept_structure_change,
                                  accept_memory_change=args.accept_memory_change,
                                  memory_tolerance=args.memory_tolerance)
        if not (args.baseline or args.current):
            result.selection = selection.lines
            result.preamble += selection.lines
    except RunError as exc:
        return _error("compare", str(exc))
    status = _print_report(args, result)
    if args.chart:
        from .report import MatplotlibMissing, compare_chart

        try:
            path = compare_chart(result, args.chart)
            print(f"compare chart: {path}", file=sys.stderr)
        except MatplotlibMissing as exc:
            return _error("compare", str(exc))
        except OSError as exc:
            return _error("compare", f"cannot write the chart to {args.chart} ({exc.strerror or exc})")
    if result.summary_only and not args.allow_summary_stats:
        return _error("compare", "the runs lack raw round times, so the noise-aware gate could not run "
                                 "(verdicts above come from summary stats). Save runs with "
                                 "--benchmark-save-data, or pass --allow-summary-stats to accept them")
    return status


def run_report(args) -> int:
    from . import report

    problem = ((args.output and output_problem("--output", args.output))
               or (not args.no_charts and output_problem("--charts", args.charts, DEFAULT_CHARTS, folder=True)))
    if problem:
        return _error("report", problem)
    try:
        if args.run:
            path = resolve_run(args.run, args.storage)
        else:
            runs = saved_runs(args.storage)
            if not runs:
                raise RunError(f"no saved run in {args.storage}; run `make bench` (or pytest "
                               f"benchmarks/ --benchmark-autosave) first, or name a JSON file")
            path = runs[-1]
        run = load_run(path)
        text = report.markdown_report(run)
    except RunError as exc:
        return _error("report", str(exc))
    print(text)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            return _error("report", f"cannot write the markdown to {args.output} ({exc.strerror or exc})")
        print(f"markdown written to {args.output}", file=sys.stderr)
    if args.no_charts:
        return 0
    try:
        charts = report.write_charts(run, Path(args.charts) / run.path.stem)
    except report.MatplotlibMissing as exc:
        return _error("report", str(exc))
    except OSError as exc:
        return _error("report", f"cannot write the charts into {args.charts} ({exc.strerror or exc}); "
                                f"give another --charts")
    if charts:
        print(f"charts written to {charts[0].parent}/: {', '.join(p.name for p in charts)}")
    else:
        print("no charts for the families in this run")
    return 0


def run_history(args) -> int:
    problem = output_problem("--output", args.output, hist.DEFAULT_OUTPUT)
    if problem:
        return _error("history", f"cannot write the page: {problem}")
    try:
        history = hist.build_history(args.storage, args.files, since=args.since, cases=args.case,
                                     min_step=args.min_step, skip_unreadable=args.skip_unreadable)
    except RunError as exc:
        return _error("history", str(exc))
    for message in history.skipped:
        print(f"ddpbench history: warning: {message}", file=sys.stderr)
    try:
        path = hist.write_page(history, args.output)
    except OSError as exc:
        return _error("history", f"cannot write the page to {args.output} ({exc}); give another --output")
    out = sys.stderr if args.json else sys.stdout  # with --json, stdout stays one JSON document
    print(f"history page: {path}", file=out)
    print(f"{len(history.runs)} runs from {len(history.machines)} machine(s), {len(history.series)} series, "
          f"{len(history.steps)} step(s) of {args.min_step * 100:g}% or more", file=out)
    shown = 10
    for step in history.steps[:shown]:
        print(f"  {step.describe()}", file=out)
    if len(history.steps) > shown:
        print(f"  ... and {len(history.steps) - shown} more on the page", file=out)
    if args.json:
        print(json.dumps({"page": str(path), "runs": len(history.runs), "series": len(history.series),
                          "min_step": args.min_step, "steps": [s.to_dict() for s in history.steps]}, indent=2))
    return 0


def run_census(args) -> int:
    from .scale.command import DEFAULT_CHART, CensusInputError, run_census as census

    problem = not args.no_chart and output_problem("--chart", args.chart, DEFAULT_CHART)
    if problem:
        return _error("census", problem)
    try:
        return census(args)
    except CensusInputError as exc:
        return _error("census", str(exc))


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `ddpbench report | head`: the reader left; end quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed; for ``bisect``, what follows ``--`` is pytest's (``pytest_args``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if argv[:1] == ["bisect"] and "--" in argv:
        argv, rest = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = _parser().parse_args(argv)
    if args.command == "bisect":
        args.pytest_args = rest
    return args


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    if args.command == "bisect":
        from .bisect import run_bisect

        if args.python and not args.setup:
            return _error("bisect", "--python names the interpreter --setup builds in each worktree; give --setup "
                                    "too, or leave --python out to use this interpreter")
        for option, value in (("--max-time", args.max_time), ("--collect-timeout", args.collect_timeout),
                              ("--probe-timeout", args.probe_timeout)):
            if value is not None and not value > 0:
                return _error("bisect", f"{option} must be above 0 seconds, got {value:g}")
        return run_bisect(args)
    if args.command == "compare":
        return run_compare(args)
    if args.command == "history":
        return run_history(args)
    if args.command == "census":
        return run_census(args)
    return run_report(args)


if __name__ == "__main__":
    sys.exit(main())
