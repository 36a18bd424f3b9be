"""``ddpbench census``: its options, their checks (exit 2 naming the problem and the fix) and the
run. Exit 0 with the table (or ``--json``) and the chart written."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..workloads.training.gpt import GPT_SIZES
from ..workloads.training.transformer import PRECISIONS, TRANSFORMER_IMPLS
from .step import DEFAULT_WARMUP_STEPS

DEFAULT_WORLD_SIZES = "2,8,64,1024"
DEFAULT_CHART = "reports/census.png"
MAX_SIMULATED_WORLD_SIZE = 1 << 20
# DDP's hooks a CPU simulation can run (bf16's needs NCCL: torch refuses it elsewhere).
SIMULATED_COMM_HOOKS = ("none", "fp16", "powersgd")
DDP_DEFAULT_BUCKET_CAP_MB = 25.0


def parse_world_sizes(text: str) -> list[int]:
    """'2,8,64' -> [2, 8, 64] (ascending, once each); whole numbers from 1 up."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("needs at least one world size, e.g. --world-sizes 2,8,64,1024")
    for item in items:
        if not item.isdigit() or not 1 <= int(item) <= MAX_SIMULATED_WORLD_SIZE:
            raise argparse.ArgumentTypeError(f"{item!r} is not a world size: use whole numbers from 1 to "
                                             f"{MAX_SIMULATED_WORLD_SIZE}, e.g. --world-sizes 2,8,64,1024")
    return sorted({int(item) for item in items})


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def _count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
    return int(text)


def _megabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of megabytes, e.g. 25") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a bucket holds more than 0 MB")
    return value


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_memory_size(text: str) -> int:
    """'80GiB' -> 85899345920, '80GB' -> 80000000000 (binary and decimal units, bytes bare)."""
    import re

    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS or not float(match.group(1)) > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size: give a number and a unit, e.g. "
                                         f"--device-memory 80GiB (or 80GB, 81920MiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def _batch_size(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of sequences of 1 or more")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=list(GPT_SIZES), default="cpu-small",
                        help="the transformer family's model (default cpu-small). A simulated rank holds it on "
                             "the CPU: the command says so, naming the memory it needs, where this machine has "
                             "too little")
    parser.add_argument("--impl", choices=TRANSFORMER_IMPLS, default="ddp", help="DDP or FSDP2 (default ddp)")
    parser.add_argument("--world-sizes", type=parse_world_sizes, default=parse_world_sizes(DEFAULT_WORLD_SIZES),
                        metavar="N,N,...", help=f"simulated world sizes (default {DEFAULT_WORLD_SIZES})")
    parser.add_argument("--dtype", dest="precision", choices=PRECISIONS, default="fp32",
                        help="the step's compute dtype (default fp32); bf16: DDP autocast, FSDP2 "
                             "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)")
    parser.add_argument("--grad-accum", type=_positive_int, default=1, metavar="K",
                        help="micro-batches per step, all but the last without gradient sync (default 1)")
    parser.add_argument("--bucket-cap-mb", type=_megabytes, default=None, metavar="MB",
                        help=f"DDP bucket size (default {DDP_DEFAULT_BUCKET_CAP_MB:g})")
    parser.add_argument("--comm-hook", choices=SIMULATED_COMM_HOOKS, default=None,
                        help="DDP communication hook (default none)")
    parser.add_argument("--find-unused-parameters", action="store_true", default=None,
                        help="DDP: also all_reduce which parameters each rank used")
    parser.add_argument("--gradient-as-bucket-view", action="store_true", default=None,
                        help="DDP: gradients are views of the buckets")
    parser.add_argument("--no-reshard", action="store_true", default=None,
                        help="FSDP2: reshard_after_forward=False (parameters stay gathered until backward)")
    parser.add_argument("--batch-size", type=_batch_size, default=0, metavar="B",
                        help="sequences per rank and micro-batch for the memory census (default: the size's own; "
                             "activations grow with it)")
    parser.add_argument("--device-memory", type=parse_memory_size, default=None, metavar="SIZE",
                        help="a GPU's memory, e.g. 80GiB: says at which world sizes a rank's peak fits and by how "
                             "much it misses")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="recompute each block in backward (torch.utils.checkpoint): fewer activations kept")
    parser.add_argument("--no-memory", action="store_true",
                        help="the collective census only (no per-rank peak memory)")
    parser.add_argument("--warmup-steps", type=_count, default=DEFAULT_WARMUP_STEPS, metavar="K",
                        help=f"steps before the counted one (default {DEFAULT_WARMUP_STEPS}, the engine's "
                             f"--dist-warmup: DDP has rebuilt its buckets, PowerSGD compresses)")
    chart = parser.add_mutually_exclusive_group()
    chart.add_argument("--chart", default=DEFAULT_CHART, metavar="PNG",
                       help=f"where to write the chart (default {DEFAULT_CHART})")
    chart.add_argument("--no-chart", action="store_true", help="table only (no matplotlib needed)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


_DDP_ONLY = (("bucket_cap_mb", "--bucket-cap-mb"), ("comm_hook", "--comm-hook"),
             ("find_unused_parameters", "--find-unused-parameters"),
             ("gradient_as_bucket_view", "--gradient-as-bucket-view"))


def build_workload(args):
    """The TransformerTraining the options describe; ValueError naming an option that does not
    apply to the implementation."""
    from ..workloads.training.transformer import TransformerTraining

    if args.impl == "fsdp2":
        given = [flag for name, flag in _DDP_ONLY if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: DDP option(s), not FSDP2's; drop them or use --impl ddp")
    elif args.no_reshard:
        raise ValueError("--no-reshard is an FSDP2 option (reshard_after_forward), not DDP's; drop it or use "
                         "--impl fsdp2")
    if args.no_memory and (args.device_memory is not None or args.batch_size):
        raise ValueError("--device-memory and --batch-size are the memory census's; drop them or drop --no-memory")
    knobs = dict(size=args.size, impl=args.impl, precision=args.precision, grad_accum=args.grad_accum,
                 batch_size=args.batch_size, activation_checkpointing=args.activation_checkpointing,
                 measure_peak=False)
    if args.impl == "ddp":
        knobs.update(bucket_cap_mb=args.bucket_cap_mb or DDP_DEFAULT_BUCKET_CAP_MB,
                     comm_hook=args.comm_hook or "none", find_unused_parameters=bool(args.find_unused_parameters),
                     gradient_as_bucket_view=bool(args.gradient_as_bucket_view))
    else:
        knobs["reshard_after_forward"] = not args.no_reshard
    return TransformerTraining(**knobs)


def memory_problem(workload, world_sizes: list[int], memory: bool = True) -> str | None:
    """Why this machine cannot hold the simulation (what it will allocate, FSDP2's padding
    included), or None."""
    import psutil

    from . import memory_needed_bytes
    from .output import human_bytes

    sizes = {n: memory_needed_bytes(workload, n, memory) for n in world_sizes}
    worst = max(sizes, key=sizes.get)
    needed = sizes[worst]
    available = psutil.virtual_memory().available
    if needed <= available:
        return None
    what = ("one rank's whole model, gradients, AdamW state" + (" and the step's activations" if memory else "")
            if workload.impl == "ddp" else
            f"one rank's shards and, at {worst} ranks, one block's gathered parameters and gradients, each "
            f"parameter padded to a multiple of {worst} rows")
    fixes = ["a smaller --size"]
    if workload.impl == "ddp":
        fixes.append("--impl fsdp2")
        if memory:
            fixes.append("a smaller --batch-size")
    else:
        fixes.append("smaller --world-sizes")
    where = f" at {worst} ranks" if workload.impl == "fsdp2" else ""  # a DDP rank's needs do not depend on N
    return (f"simulating {workload.size} with {workload.impl}{where} needs about {human_bytes(needed)} of "
            f"memory on this machine ({what}), and this machine has {human_bytes(available)} available; use "
            f"{', '.join(fixes[:-1])} or {fixes[-1]}, or a machine with more memory")


class CensusInputError(ValueError):
    """Bad input to ``ddpbench census``: the message names the problem and the fix (exit 2)."""


def run_census(args) -> int:
    """Simulate, print the table (or JSON) and write the chart (``args.chart``, whose folder the
    caller has checked); CensusInputError on bad input."""
    try:
        workload = build_workload(args)
    except ValueError as exc:
        raise CensusInputError(str(exc)) from None
    problem = memory_problem(workload, args.world_sizes, not args.no_memory)
    if problem:
        raise CensusInputError(problem)
    from . import census_at_scale
    from .output import chart_unavailable, format_table, to_json, write_chart

    problem = not args.no_chart and chart_unavailable()
    if problem:
        raise CensusInputError(problem)
    import torch

    torch.set_num_threads(1)  # bookkeeping, not a measurement: one thread shares a busy machine best
    result = census_at_scale(workload, args.world_sizes, args.warmup_steps,
                             progress=lambda n: print(f"simulating {n} ranks ...", file=sys.stderr, flush=True),
                             memory=not args.no_memory, device_bytes=args.device_memory)
    print(to_json(result) if args.json else format_table(result))
    if args.no_chart:
        return 0
    try:
        Path(args.chart).parent.mkdir(parents=True, exist_ok=True)  # only the default's folder may be missing
        path = write_chart(result, args.chart)
    except OSError as exc:
        raise CensusInputError(f"cannot write the chart to {args.chart} ({exc.strerror or exc}); give another "
                          f"--chart") from None
    print(f"census chart: {path}", file=sys.stderr)
    return 0
