"""What ``ddpbench census`` prints and draws: a table (a row per world size), a JSON document and a
chart of how each figure grows with the world size (log2 axis)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import ScaleCensus

STATE_KEYS = (("param_bytes_per_rank", "params"), ("grad_bytes_per_rank", "grads"),
              ("optimizer_state_bytes_per_rank", "optimizer"))


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory is counted)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def describe(result: ScaleCensus) -> str:
    """One line naming what was simulated."""
    w = result.workload
    knobs = [w.impl, w.precision, f"grad_accum {w.grad_accum}"]
    if w.impl == "ddp":
        knobs.append(f"bucket_cap_mb {w.bucket_cap_mb:g}")
        if w.comm_hook != "none":
            knobs.append(f"comm_hook {w.comm_hook}")
        if w.find_unused_parameters:
            knobs.append("find_unused_parameters")
        if w.gradient_as_bucket_view:
            knobs.append("gradient_as_bucket_view")
    else:
        knobs.append(f"reshard_after_forward {'on' if w.reshard_after_forward else 'off'}")
    params = w.config.parameter_count
    return (f"{w.size} ({params / 1e6:.2f} M parameters), {', '.join(knobs)}: one optimizer step after "
            f"{result.warmup_steps} warm-up step(s), simulated as rank 0 of N (torch's fake process group)")


def _columns(result: ScaleCensus) -> list[tuple[str, str]]:
    """The (kind, dtype) pairs any world size issued, in the record's order."""
    seen: dict[tuple[str, str], None] = {}
    for row in result.rows:
        for entry in row["census"]["collectives"]:
            seen[(entry["kind"], entry["dtype"])] = None
    return sorted(seen)


def _cell(row: dict[str, Any], kind: str, dtype: str) -> str:
    entries = [e for e in row["census"]["collectives"] if (e["kind"], e["dtype"]) == (kind, dtype)]
    if not entries:
        return "-"
    return f"{sum(e['count'] for e in entries)} x {human_bytes(sum(e['bytes'] for e in entries))}"


def format_table(result: ScaleCensus) -> str:
    """The table: per world size, each collective (kind and dtype) as calls x payload bytes per
    step on one rank, then the training state that rank holds."""
    columns = _columns(result)
    header = ["ranks"] + [f"{kind} {dtype}" for kind, dtype in columns] + [f"{label}/rank" for _, label in STATE_KEYS]
    rows = [[str(row["world_size"])] + [_cell(row, kind, dtype) for kind, dtype in columns]
            + [human_bytes(row[key]) for key, _ in STATE_KEYS] for row in result.rows]
    widths = [max(len(line[i]) for line in [header] + rows) for i in range(len(header))]
    lines = [describe(result), "collectives per step and rank: calls x payload bytes (all_gather: output, "
             "reduce_scatter: input)", ""]
    for line in [header] + rows:
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(line, widths)).rstrip())
        if line is header:
            lines.append("  ".join("-" * width for width in widths))
    buckets = {tuple(row["census"]["ddp_buckets"]) for row in result.rows if row["census"].get("ddp_buckets")}
    if len(buckets) == 1:
        sizes = next(iter(buckets))
        lines.append(f"DDP buckets (every world size): {len(sizes)}, " + ", ".join(human_bytes(b) for b in sizes))
    return "\n".join(lines)


def to_json(result: ScaleCensus) -> str:
    """The JSON document: the workload's knobs, the method, and a record per world size."""
    w = result.workload
    knobs = {"size": w.size, "impl": w.impl, "precision": w.precision, "grad_accum": w.grad_accum}
    if w.impl == "ddp":
        knobs.update(bucket_cap_mb=w.bucket_cap_mb, comm_hook=w.comm_hook,
                     find_unused_parameters=w.find_unused_parameters,
                     gradient_as_bucket_view=w.gradient_as_bucket_view)
    else:
        knobs["reshard_after_forward"] = w.reshard_after_forward
    return json.dumps({"workload": knobs, "parameters": w.config.parameter_count,
                       "simulated": "rank 0 of world_size on torch's fake process group",
                       "warmup_steps": result.warmup_steps, "world_sizes": result.rows}, indent=2)


def chart_unavailable() -> str | None:
    """Why the chart cannot be drawn here, or None."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return ("the chart needs matplotlib, which is not installed: pip install 'ddpbench[plot]', or pass "
                "--no-chart for the table only")
    return None


def write_chart(result: ScaleCensus, path: str | Path) -> Path:
    """Two panels over the world size (log2): each collective's payload bytes per step and rank,
    and the state each rank holds; call counts in the legend."""
    from ..report import _pyplot

    plt = _pyplot()
    sizes = [row["world_size"] for row in result.rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, dtype in _columns(result):
        per_size = [[e for e in row["census"]["collectives"] if (e["kind"], e["dtype"]) == (kind, dtype)]
                    for row in result.rows]
        counts = sorted({sum(e["count"] for e in entries) for entries in per_size})
        calls = "/".join(str(c) for c in counts)
        left.plot(sizes, [sum(e["bytes"] for e in entries) for entries in per_size], marker="o",
                  label=f"{kind} {dtype} ({calls} calls)")
    left.set_title("collective payload per step and rank")
    for key, label in STATE_KEYS:
        right.plot(sizes, [row[key] for row in result.rows], marker="o", label=label)
    right.set_title("training state per rank")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_yscale("log", base=2)
        ax.set_xlabel("world size (ranks)")
        ax.set_ylabel("bytes")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(describe(result), fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
