"""``ddpbench compare`` (the noise-aware gate), ``ddpbench report`` (tables and charts) and
``ddpbench history`` (a static HTML page of every saved run, with the steps detected in each case),
``ddpbench bisect`` (the commit between two that made a case slower, through the A/B gate) and
``ddpbench census`` (a transformer step's collectives and per-rank memory at N ranks, simulated).

Each command is a module of :mod:`ddpbench.commands`, which says its arguments and exit statuses.
"""

from __future__ import annotations

import argparse
import os
import sys

import ddpbench

from . import option_table
from .commands import COMMANDS
from .commands import bisect as bisect_command

_BY_NAME = {command.NAME: command for command in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The ``ddpbench`` command line: a sub-command per module of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog="ddpbench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {ddpbench.__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed; for ``bisect``, what follows ``--`` is pytest's (``pytest_args``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if argv[:1] == [bisect_command.NAME] and "--" in argv:
        argv, rest = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = build_parser().parse_args(argv)
    if args.command == bisect_command.NAME:
        args.pytest_args = rest
    for line in option_table.old_spelling_notices(args):
        print(line, file=sys.stderr)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        return _BY_NAME[args.command].run(args)
    except BrokenPipeError:  # `ddpbench report | head`: the reader left; end quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
