"""How the report's tables write a cell (numbers, times, bytes, the backend), the markdown table
itself, and the lines printed under a table (the straggler, the run and machine it came from)."""

from __future__ import annotations

from ..options import usual_device
from ..shown_text import markdown_text
from ..storage.runs import Case, Run


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def positive_whole(value) -> bool:
    return is_number(value) and value > 0 and float(value).is_integer()


def num(value, fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    if not is_number(value):
        return "n/a"
    return fmt.format(value * scale)


def mem(value) -> str:
    """Bytes in binary (IEC) units, the report's one convention for sizes: 32772 -> '32.0 KiB',
    76080712 -> '72.6 MiB' (a size is never printed as '0.0' of a unit too large for it)."""
    if not is_number(value):
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def yes_no(value) -> str:
    return "-" if value is None else ("yes" if value else "no")


def census_peak(info: dict) -> str:
    """The memory census's peak (largest rank) with the measured CUDA max allocated beside it."""
    memory = info.get("memory")
    if not isinstance(memory, dict) or memory.get("incomplete") is not None:
        return "n/a"
    text = mem(memory.get("max_peak_bytes", memory.get("peak_bytes")))
    measured = memory.get("measured") if isinstance(memory.get("measured"), dict) else {}
    if is_number(measured.get("max_allocated_bytes")):
        text += f" (measured {mem(measured['max_allocated_bytes'])})"
    return text


def backend_label(info: dict) -> str:
    """``gloo``, ``nccl``; a backend off its usual device says so: ``gloo (cuda)``."""
    backend, device = str(info.get("backend", "?")), info.get("device")
    return backend if device in (None, usual_device(backend)) else f"{backend} ({device})"


def sort_key(*values) -> tuple:
    """Numbers before text, numbers numerically (so 64 sorts before 256)."""
    return tuple((0, v, "") if is_number(v) else (1, 0, str(v))
                 for v in values)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A markdown table; every cell shown literally (a run file's strings are input: a newline,
    an image or an @mention in a case or module name must not become one)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def mean(case: Case) -> float:
    if case.data:
        return sum(case.data) / len(case.data)
    return float(case.stats.get("mean", case.stats["median"]))


def spread(case: Case) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of a case's rounds, in seconds (from the raw rounds
    when saved, else from pytest-benchmark's stats)."""
    if case.data:
        import numpy as np

        q1, q3 = np.percentile(case.data, [25, 75])
        return float(q1), case.median, float(q3)
    stats = case.stats
    return float(stats.get("q1", case.median)), case.median, float(stats.get("q3", case.median))


def straggler_line(cases: list[Case]) -> str | None:
    """The case whose slowest rank was most often the same rank: which, how often, by how much."""
    known = [c for c in cases if isinstance(c.extra_info.get("straggler_rank"), int)
             and is_number(c.extra_info.get("straggler_share"))]
    if not known:
        return None
    case = max(known, key=lambda c: (c.extra_info["straggler_share"], c.extra_info.get("straggler_excess_pct") or 0))
    info = case.extra_info
    return (f"_Straggler: in {markdown_text(case.name)}, rank {info['straggler_rank']} was the slowest rank in "
            f"{info['straggler_share'] * 100:.0f}% of the rounds, by {num(info.get('straggler_excess_pct'), '{:.1f}')}% "
            f"over the other ranks (median of those rounds)._")


def with_straggler(text: str, cases: list[Case]) -> str:
    """``text`` (a family's table) followed by the straggler line of its cases, if any."""
    line = straggler_line(cases)
    return text if line is None else f"{text}\n\n{line}"


def gpus_label(gpus: dict) -> str:
    """A run's ``ddpbench_gpus`` machine_info in words: '1 x NVIDIA H100 80GB HBM3 (torch
    2.11.0+cu130, CUDA 13.0, NCCL 2.28.9)'."""
    devices = gpus.get("devices") if isinstance(gpus.get("devices"), list) else []
    return (f"{len(devices)} x {', '.join(sorted({str(d) for d in devices}))} (torch {gpus.get('torch')}, "
            f"CUDA {gpus.get('cuda')}, NCCL {gpus.get('nccl')})")


def provenance(run: Run) -> str:
    """Which run and machine a table came from (a line to print under it)."""
    info = run.machine_info or {}
    cpu = info.get("cpu") if isinstance(info.get("cpu"), dict) else {}
    brand = cpu.get("brand_raw") or info.get("processor") or "unknown CPU"
    cores = cpu.get("count")
    machine = f"{info.get('node', 'unknown node')} ({brand}" + (f", {cores} cores)" if cores else ")")
    gpus = info.get("ddpbench_gpus") if isinstance(info.get("ddpbench_gpus"), dict) else {}
    if gpus.get("devices"):
        machine += f", {gpus_label(gpus)}"
    saved = f", saved {run.datetime}" if run.datetime else ""
    return f"_Run {markdown_text(run.label + saved)}; machine {markdown_text(machine)}._"


def with_provenance(text: str, line: str) -> str:
    """``line`` after every table in ``text`` (tables are separated by blank lines)."""
    blocks = text.split("\n\n")
    return "\n\n".join(block + ("\n\n" + line if block.startswith("|") else "") for block in blocks)
