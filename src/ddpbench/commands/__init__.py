"""The ``ddpbench`` commands, one module each: ``add_parser(subparsers)`` declares its arguments,
``run(args)`` runs it and returns the exit status. :mod:`ddpbench.cli` builds the command line
from :data:`COMMANDS` and dispatches on the command's ``NAME``."""

from . import bisect, census, compare, history, report

#: In the order ``ddpbench --help`` lists them.
COMMANDS = (compare, report, history, census, bisect)
