"""Parsing and validating ddpbench's command-line values (pure functions, no torch)."""

from __future__ import annotations

import argparse
import functools
import math
import re
from typing import Callable, TypeVar

T = TypeVar("T")

BACKENDS = ("gloo", "nccl", "auto")
# The options that turn A/B mode on (each names a side's code or environment).
AB_OPTIONS = ("dist_baseline_python", "dist_baseline_path", "dist_baseline_env", "dist_candidate_env")
MAX_WORLD_SIZE = 64
DEFAULT_SIZES = "1MB,10MB,100MB"  # the collective cases' message sizes when --dist-sizes is not given

_SIZE_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?B?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'10MB' -> 10485760 (KB/MB/GB are powers of 1024; a bare number is bytes)."""
    match = _SIZE_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a message size; write a whole number with KB, MB or GB, e.g. 1MB,10MB,100MB"
        )
    unit = match.group(2).upper()
    if unit and not unit.endswith("B"):
        unit += "B"  # "10M" means 10MB
    value = int(match.group(1)) * _SIZE_UNITS[unit]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a message size must be larger than 0 bytes")
    return value


def parse_sizes(text: str) -> list[int]:
    """'1MB,10MB' -> [1048576, 10485760], order kept, duplicates dropped."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("needs at least one size, e.g. --dist-sizes=1MB,10MB")
    return list(dict.fromkeys(parse_size(item) for item in items))


def format_size(size_bytes: int) -> str:
    """The inverse of parse_size for case ids: 10485760 -> '10MB', 1536 -> '1536B'."""
    for unit in ("GB", "MB", "KB"):
        factor = _SIZE_UNITS[unit]
        if size_bytes % factor == 0:
            return f"{size_bytes // factor}{unit}"
    return f"{size_bytes}B"


def parse_world_sizes(text: str) -> list[int]:
    """'2,4' -> [2, 4]."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("needs at least one world size, e.g. --dist-world-sizes=2,4")
    sizes = []
    for item in items:
        if not item.isdigit() or not 1 <= int(item) <= MAX_WORLD_SIZE:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a world size; use whole numbers from 1 to {MAX_WORLD_SIZE}, e.g. 2,4"
            )
        sizes.append(int(item))
    return list(dict.fromkeys(sizes))


def usual_device(backend: str) -> str:
    """The device a backend's tensors live on unless a case says otherwise: NCCL's on a GPU,
    gloo's on the CPU (gloo with CUDA tensors, e.g. ranks sharing one GPU, is the exception
    that case ids and report rows spell out)."""
    return "cuda" if backend == "nccl" else "cpu"


def parse_backend(text: str) -> str:
    value = text.strip().lower()
    if value not in BACKENDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a backend; choose one of {', '.join(BACKENDS)}")
    return value


# Upper bounds past which a value is a typo rather than a plan (a unit mix-up, a stray digit).
MAX_TASK_SECONDS = 24 * 3600
MAX_MIN_TIME_SECONDS = 3600
MAX_BLOCK_SECONDS = 60
MAX_ROUNDS = 1_000_000
MAX_POOLS_PER_SIDE = 16
MAX_VARIANT_ROUNDS = 10_000


def _positive_number(kind, text: str, what: str, allow_zero: bool = False, maximum=None):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of {what}; give e.g. 30")
    if value < 0 or (value == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the number of {what} must be {'0 or more' if allow_zero else 'larger than 0'}"
        )
    if maximum is not None and value > maximum:
        raise argparse.ArgumentTypeError(
            f"{text!r}: more than {maximum:g} {what} is not a plan this option supports (a unit or "
            f"a digit too many?); give at most {maximum:g}")
    return value


def parse_timeout(text: str) -> float:
    """Seconds a task or a wait may take (--dist-timeout, --dist-controller-wait, --dist-ab-max-time)."""
    return _positive_number(float, text, "seconds", maximum=MAX_TASK_SECONDS)


def parse_block_time(text: str) -> float:
    """A/B mode: recorded seconds aimed for per block."""
    return _positive_number(float, text, "seconds", maximum=MAX_BLOCK_SECONDS)


def parse_rounds(text: str) -> int:
    """Recorded rounds per case; 0 means 'choose from --dist-max-time'."""
    return _positive_number(int, text, "rounds", allow_zero=True, maximum=MAX_ROUNDS)


def parse_exposed_comm(text: str) -> str | int:
    """--dist-exposed-comm: ``auto`` (each case's own choice), ``off`` (0: no variant rounds
    anywhere) or N, the rounds of each variant for every case whose workload has variants."""
    word = text.strip().lower()
    if word == "auto":
        return "auto"
    if word == "off":
        return 0
    try:
        int(word)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give auto (each case's own choice), off, or a number of rounds, e.g. 8") from None
    return _positive_number(int, word, "variant rounds", maximum=MAX_VARIANT_ROUNDS)


def parse_warmup(text: str) -> int:
    return _positive_number(int, text, "warm-up rounds", allow_zero=True, maximum=MAX_ROUNDS)


def parse_pools_per_side(text: str) -> int:
    """A/B mode: independent pools of ranks per side (1 or more)."""
    return _positive_number(int, text, "pools per side", maximum=MAX_POOLS_PER_SIDE)


MAX_CASE_POOLS = 8


def parse_case_pools(text: str) -> int:
    """Fresh pools each case is measured in, its rounds split across them (1 or more)."""
    return _positive_number(int, text, "pools per case", maximum=MAX_CASE_POOLS)


def parse_seed(text: str) -> int:
    """A/B mode: the seed of the block order (a whole number from 0 to 2**32 - 1)."""
    value = text.strip()
    if not value.isdigit() or int(value) >= 2**32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed; give a whole number from 0 to "
                                         f"{2**32 - 1}, as a run's header prints it")
    return int(value)


def parse_min_time(text: str) -> float:
    return _positive_number(float, text, "seconds", maximum=MAX_MIN_TIME_SECONDS)


def _share(text: str) -> float | None:
    """'10%' -> 0.1, '0.1' -> 0.1 (a bare number is a fraction); None when it is no number."""
    value = text.strip()
    try:
        number = float(value.rstrip("%"))
    except ValueError:
        return None
    return number / 100.0 if value.endswith("%") else number


def parse_precision(text: str) -> float:
    """'1%' or '0.01' -> 0.01; '0' turns the early stop off."""
    number = _share(text)
    if number is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a precision; write e.g. 1% or 0.01 (0: off)")
    if not 0 <= number < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the precision must lie between 0 and 1 (0% and 100%)")
    return number


# The censuses a case may take (--dist-census), in the order a list names them.
CENSUSES = ("collectives", "memory")


def parse_censuses(text: str) -> tuple[str, ...]:
    """--dist-census: 'collectives,memory' -> ('collectives', 'memory') (the order is CENSUSES'),
    'none' -> (). The words on and off, which named the collective census alone before the option
    took a list, come back as ('on',) / ('off',) for :class:`ddpbench.option_table.CensusList`."""
    words = [word.strip().lower() for word in text.split(",") if word.strip()]
    if words in (["on"], ["off"]):
        return (words[0],)
    if words == ["none"]:
        return ()
    wrong = [word for word in words if word not in CENSUSES]
    if not words or wrong:
        raise argparse.ArgumentTypeError(
            f"{text!r}: name the censuses to take, {' and '.join(CENSUSES)} (comma-separated), or none; "
            f"e.g. --dist-census=collectives")
    return tuple(census for census in CENSUSES if census in words)


def parse_numerics_tolerance(text: str) -> float:
    """'0.01%' or '0.01' -> 1e-04: the relative difference of the numerics replay's figures that still
    reads 'rounding' where the measured band is narrower, written as every gate's threshold is
    (:func:`parse_percent`)."""
    return parse_percent(text, allow_zero=True)


def parse_numerics_steps(text: str) -> int:
    """'3' -> 3: the steps of the numerics replay, 0 (none) or more."""
    try:
        value = int(str(text).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--dist-numerics-steps {text!r}: give a whole number of steps, 0 (no "
                                         f"replay) or more, e.g. 3")
    return value


def parse_memory_tolerance(text: str) -> float:
    """'10%' or '10' -> 0.1: how far above the baseline's a measured CUDA memory figure may go,
    written as every gate's threshold is (:func:`parse_percent`); 0 judges any growth."""
    return parse_percent(text, allow_zero=True)


def parse_percent(text: str, allow_zero: bool = False) -> float:
    """'5%' or '5' -> 0.05: the one convention of every gate's threshold and tolerance (a bare
    number is a percentage). A bare number between 0 and 1 is refused: '0.1' reads as 0.1% here and
    as a fraction (10%) elsewhere, and a silent 100x misreading would pass or fail the wrong
    changes."""
    value = text.strip()
    bare = not value.endswith("%")
    try:
        number = float(value.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage; write e.g. 5% or 5") from None
    if not (0 <= number if allow_zero else 0 < number) or not number < 1000:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the percentage must be {'0 or more' if allow_zero else 'above 0'} (e.g. 5%)")
    if bare and 0 < number < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is ambiguous: a bare number is a percentage ({number:g}%), but {text.strip()} also reads "
            f"as a fraction ({number * 100:g}%); write the percent sign: {number:g}% or {number * 100:g}%")
    return number / 100.0


def parse_percent_or_zero(text: str) -> float:
    """'5%' or '5' -> 0.05, and '0' -> 0.0 (ddpbench compare --threshold, history --min-step)."""
    return parse_percent(text, allow_zero=True)


def parse_confidence(text: str) -> float:
    """'0.95' or '95%' -> 0.95: a confidence level, between 0 and 1."""
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


def parse_ops_per_round(text: str) -> int | str:
    """'auto' or a whole number of ops each round launches back to back (1 to 100000)."""
    value = text.strip().lower()
    if value == "auto":
        return "auto"
    if not value.isdigit() or not 1 <= int(value) <= 100_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ops per round; give auto or a whole "
                                         f"number from 1 to 100000, e.g. --dist-ops-per-round=auto")
    return int(value)


def name_list(valid, what: str, example: str):
    """A parser of comma lists of names out of ``valid`` (order kept, duplicates dropped)."""

    def parse(text: str) -> list[str]:
        items = [item.strip().lower() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"needs at least one {what}, e.g. {example}")
        wrong = [item for item in items if item not in valid]
        if wrong:
            raise argparse.ArgumentTypeError(f"{', '.join(map(repr, wrong))}: not a {what}; choose from "
                                             f"{', '.join(valid)} (e.g. {example})")
        return list(dict.fromkeys(items))

    return parse


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type``: the message of the ValueError it raises is the option's error."""

    @functools.wraps(parse)
    def parse_argument(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse_argument
