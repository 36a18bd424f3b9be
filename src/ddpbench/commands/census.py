"""``ddpbench census``: a transformer step's collectives and per-rank memory at N ranks, simulated
on torch's fake process group. Its options, checks and run are :mod:`ddpbench.scale.command`'s.
Exit 0, or 2 on bad input."""

from __future__ import annotations

from .. import option_table
from ..scale import command as scale_command
from .errors import error, output_problem

NAME = "census"
#: Its options as they were spelled before: --precision, which --dist-precision (a stopping rule)
#: also names, is the step's compute dtype.
OLD_SPELLINGS = (option_table.OldSpelling("--precision", "--dtype", "precision",
                                          {"choices": scale_command.PRECISIONS}),)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        NAME, help="collectives and per-rank memory of a transformer step at N ranks, simulated",
        description="The collective census of one optimizer step of the transformer family (DDP or FSDP2) "
                    "at each world size, simulated in this process as rank 0 of N on torch's fake process "
                    "group: per collective kind and dtype the calls and payload bytes per step and rank, the "
                    "parameter, gradient and optimizer bytes each rank holds, and each rank's peak memory "
                    "over the step with its breakdown (--device-memory: where it fits); a table (or --json) "
                    "and a chart. Counts and bytes, no timing. Exit 0, or 2 on bad input.")
    scale_command.add_arguments(parser)
    option_table.add_command_options(parser, (), OLD_SPELLINGS)


def run(args) -> int:
    problem = not args.no_chart and output_problem("--chart", args.chart, scale_command.DEFAULT_CHART)
    if problem:
        return error(NAME, problem)
    try:
        return scale_command.run_census(args)
    except scale_command.CensusInputError as exc:
        return error(NAME, str(exc))
