"""``ddpbench report``: markdown tables and PNG charts of a saved run. Exit 0, or 2 on bad input."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import option_table
from .. import report
from ..storage import runs as stored
from .errors import error, output_problem

NAME = "report"
DEFAULT_CHARTS = "reports"
#: Its chart options as they were spelled before census, report and compare shared --chart.
OLD_SPELLINGS = (option_table.OldSpelling("--charts", "--chart", "chart", {"metavar": "DIR"}),
                 option_table.OldSpelling("--no-charts", "--no-chart", "no_chart", {"action": "store_true"}))


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        NAME, help="markdown tables and PNG charts of a run",
        description="Markdown tables in the shape of the reports this suite reproduces, and PNG charts, "
                    "from a saved run or a --benchmark-json file.")
    parser.add_argument("run", nargs="?", help="a JSON file or a saved run's number. Default: the newest saved run")
    option_table.add_command_options(parser, [option_table.STORAGE], OLD_SPELLINGS)
    parser.add_argument("--chart", default=DEFAULT_CHARTS, metavar="DIR",
                        help="folder for the PNG charts (one per table); a sub-folder per run (default reports/)")
    parser.add_argument("--no-chart", action="store_true", help="tables only (no matplotlib needed)")
    parser.add_argument("--output", metavar="MD", help="also write the markdown to this file")


def run(args) -> int:
    problem = ((args.output and output_problem("--output", args.output))
               or (not args.no_chart and output_problem("--chart", args.chart, DEFAULT_CHARTS, folder=True)))
    if problem:
        return error(NAME, problem)
    try:
        if args.run:
            path = stored.resolve_run(args.run, args.storage)
        else:
            runs = stored.saved_runs(args.storage)
            if not runs:
                raise stored.RunError(f"no saved run in {args.storage}; run `make bench` (or pytest "
                                       f"benchmarks/ --benchmark-autosave) first, or name a JSON file")
            path = runs[-1]
        saved = stored.load_run(path)
        text = report.markdown_report(saved)
    except stored.RunError as exc:
        return error(NAME, str(exc))
    print(text)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            return error(NAME, f"cannot write the markdown to {args.output} ({exc.strerror or exc})")
        print(f"markdown written to {args.output}", file=sys.stderr)
    if args.no_chart:
        return 0
    try:
        charts = report.write_charts(saved, Path(args.chart) / saved.path.stem)
    except report.MatplotlibMissing as exc:
        return error(NAME, str(exc))
    except OSError as exc:
        return error(NAME, f"cannot write the charts into {args.chart} ({exc.strerror or exc}); "
                           f"give another --chart")
    if charts:
        print(f"charts written to {charts[0].parent}/: {', '.join(p.name for p in charts)}")
    else:
        print("no charts for the families in this run")
    return 0
