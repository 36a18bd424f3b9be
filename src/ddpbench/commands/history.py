"""``ddpbench history``: a static HTML page of every saved run, with the steps detected in each
case's series. Exit 0 whatever the steps (a view, not a gate), 2 on bad input."""

from __future__ import annotations

import json
import sys

from .. import history as hist
from .. import option_table
from .. import options as opts
from ..storage import runs as stored
from .errors import error, output_problem

NAME = "history"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        NAME, help="a static HTML page of every saved run, with detected steps",
        description="One self-contained HTML page over every saved run of the storage (all machine folders) "
                    "and the JSON files named: a chart of the run medians (IQR band) per machine, backend and "
                    "case in commit order, with the steps found in them (ruptures), and where a case's numerics "
                    "replay computed other values than the run before. Exit 0, or 2 on bad input.")
    parser.add_argument("files", nargs="*", metavar="JSON", help="also these pytest-benchmark JSON files "
                        "(--benchmark-json outputs)")
    option_table.add_command_options(parser, [option_table.STORAGE])
    parser.add_argument("--output", default=hist.DEFAULT_OUTPUT, metavar="HTML",
                        help=f"where to write the page (default {hist.DEFAULT_OUTPUT})")
    parser.add_argument("--since", type=opts.argument_type(hist.parse_since), metavar="DATE",
                        help="only runs whose commit (else run) time is on or after DATE (ISO, e.g. 2026-01-31, UTC)")
    parser.add_argument("--case", action="append", default=[], metavar="PATTERN",
                        help="only cases whose name or fullname matches PATTERN (fnmatch, e.g. 'test_all_reduce*') "
                             "or contains it; repeatable")
    parser.add_argument("--min-step", type=opts.parse_percent_or_zero, default=hist.DEFAULT_MIN_STEP, metavar="PCT",
                        help=f"smallest change of a series' median reported as a step (default "
                             f"{hist.DEFAULT_MIN_STEP * 100:g}%%)")
    parser.add_argument("--skip-unreadable", action="store_true",
                        help="leave unreadable saved runs out (a warning each) instead of stopping")
    parser.add_argument("--json", action="store_true", help="print the detected steps as JSON (for CI)")


def run(args) -> int:
    problem = output_problem("--output", args.output, hist.DEFAULT_OUTPUT)
    if problem:
        return error(NAME, f"cannot write the page: {problem}")
    try:
        history = hist.build_history(args.storage, args.files, since=args.since, cases=args.case,
                                     min_step=args.min_step, skip_unreadable=args.skip_unreadable)
    except stored.RunError as exc:
        return error(NAME, str(exc))
    for message in history.skipped:
        print(f"ddpbench history: warning: {message}", file=sys.stderr)
    try:
        path = hist.write_page(history, args.output)
    except OSError as exc:
        return error(NAME, f"cannot write the page to {args.output} ({exc}); give another --output")
    out = sys.stderr if args.json else sys.stdout  # with --json, stdout stays one JSON document
    print(f"history page: {path}", file=out)
    print(f"{len(history.runs)} runs from {len(history.machines)} machine(s), {len(history.series)} series, "
          f"{len(history.steps)} step(s) of {args.min_step * 100:g}% or more", file=out)
    shown = 10
    for step in history.steps[:shown]:
        print(f"  {step.describe()}", file=out)
    if len(history.steps) > shown:
        print(f"  ... and {len(history.steps) - shown} more on the page", file=out)
    changes = history.numerics_changes
    rounding = sum(change.outcome == "rounding" for change in changes)
    print(f"{len(changes)} numerics change(s) from one run to the next"
          + (f" ({len(changes) - rounding} changed, {rounding} within rounding)" if rounding else ""), file=out)
    for change in changes[:shown]:
        print(f"  {change.describe()}", file=out)
    if len(changes) > shown:
        print(f"  ... and {len(changes) - shown} more on the page", file=out)
    if args.json:
        print(json.dumps({"page": str(path), "runs": len(history.runs), "series": len(history.series),
                          "min_step": args.min_step, "steps": [s.to_dict() for s in history.steps],
                          "numerics_changes": [c.to_dict() for c in changes]}, indent=2))
    return 0
