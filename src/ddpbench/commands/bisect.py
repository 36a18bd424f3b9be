"""``ddpbench bisect``: the first-parent commit between GOOD and BAD that made a case slower, with
the A/B gate at each probe. Its arguments here; the search is :mod:`ddpbench.bisect`'s. Exit 0:
found (or no regression to search), 1: undecided, 2: bad input."""

from __future__ import annotations

from ..bisect import run_bisect
from .errors import error

NAME = "bisect"


def add_parser(subparsers) -> None:
    """What follows ``--`` on the command line is pytest's (``args.pytest_args``, set by
    :func:`ddpbench.cli.parse_args`)."""
    parser = subparsers.add_parser(
        NAME, help="find the commit that made a case slower (A/B gate at each probe)",
        usage="ddpbench bisect GOOD BAD [-k EXPR] [--max-time S] [--setup CMD [--python PATH]] "
              "[--missing-is-bad] [--collect-timeout S] [--probe-timeout S] [-- PYTEST_ARGS...]",
        description="Run in a git checkout of your project: bisects the first-parent commits from GOOD to "
                    "BAD, running the A/B gate at each probe (GOOD's worktree the baseline, the probe's the "
                    "candidate). Exit 0: found, or no regression to search; 1: undecided; 2: bad input.")
    parser.add_argument("good", metavar="GOOD", help="a commit whose code is fast (the baseline of every probe)")
    parser.add_argument("bad", metavar="BAD", help="a later commit, descending from GOOD, that is slower")
    parser.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest -k: the cases to compare (keep it narrow)")
    parser.add_argument("--max-time", type=float, default=60.0, metavar="SECONDS",
                        help="--dist-ab-max-time of each A/B run; an inconclusive probe is run once more with "
                             "twice this (default 60)")
    parser.add_argument("--setup", metavar="CMD", help="shell command run once in each commit's worktree before "
                        "its runs (e.g. build a venv: python -m venv .venv && .venv/bin/pip install -e . ddpbench); "
                        "a commit where it fails is skipped")
    parser.add_argument("--python", metavar="PATH", help="with --setup: the interpreter it made, relative to the "
                        "worktree (e.g. .venv/bin/python); default: this one")
    parser.add_argument("--missing-is-bad", action="store_true",
                        help="a case the probe's candidate lost (crashed, hung, failed a check) makes the probe "
                             "bad: search for the commit that broke a case. Default: such a probe is skipped, as "
                             "a slowdown search cannot place a commit it could not time")
    parser.add_argument("--collect-timeout", type=float, default=None, metavar="SECONDS",
                        help="how long GOOD's and BAD's pytest --collect-only may take (default 300)")
    parser.add_argument("--probe-timeout", type=float, default=None, metavar="SECONDS",
                        help="how long one probe's A/B run may take before it is stopped and the commit skipped "
                             "(default: --collect-timeout plus, per selected case, its --max-time and 300 s)")


def run(args) -> int:
    if args.python and not args.setup:
        return error(NAME, "--python names the interpreter --setup builds in each worktree; give --setup "
                           "too, or leave --python out to use this interpreter")
    for option, value in (("--max-time", args.max_time), ("--collect-timeout", args.collect_timeout),
                          ("--probe-timeout", args.probe_timeout)):
        if value is not None and not value > 0:
            return error(NAME, f"{option} must be above 0 seconds, got {value:g}")
    return run_bisect(args)
