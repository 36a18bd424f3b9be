"""Parsing and validating ddpbench's command-line values (pure functions, no torch)."""

from __future__ import annotations

import argparse
import re

BACKENDS = ("gloo", "nccl", "auto")
MAX_WORLD_SIZE = 64

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


def _positive_number(kind, text: str, what: str, allow_zero: bool = False):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of {what}") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the number of {what} must be {'0 or more' if allow_zero else 'larger than 0'}"
        )
    return value


def parse_timeout(text: str) -> float:
    return _positive_number(float, text, "seconds")


def parse_rounds(text: str) -> int:
    """Recorded rounds per case; 0 means 'choose from --dist-min-time'."""
    return _positive_number(int, text, "rounds", allow_zero=True)


def parse_warmup(text: str) -> int:
    return _positive_number(int, text, "warm-up rounds", allow_zero=True)


def parse_pools_per_side(text: str) -> int:
    """A/B mode: independent pools of ranks per side (1 or more)."""
    return _positive_number(int, text, "pools per side")


def parse_min_time(text: str) -> float:
    return _positive_number(float, text, "seconds")


def parse_precision(text: str) -> float:
    """'1%' or '0.01' -> 0.01; '0' turns the early stop off."""
    value = text.strip()
    percent = value.endswith("%")
    try:
        number = float(value.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a precision; write e.g. 1% or 0.01 (0: off)") from None
    if percent:
        number /= 100.0
    if not 0 <= number < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the precision must lie between 0 and 1 (0% and 100%)")
    return number


def parse_percent(text: str, allow_zero: bool = False) -> float:
    """'5%' or '5' -> 0.05 (a bare number is a percentage)."""
    value = text.strip().rstrip("%")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage; write e.g. 5% or 5") from None
    if not (0 <= number if allow_zero else 0 < number) or not number < 1000:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the percentage must be {'0 or more' if allow_zero else 'above 0'} (e.g. 5%)")
    return number / 100.0
