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
    if w.activation_checkpointing:
        knobs.append("activation checkpointing")
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


# What the fake process group cannot give a step that reads a collective's result (per comm hook).
FAKE_VALUES_CAVEATS = {
    "powersgd": ("PowerSGD's step reads the all_reduced P and Q matrices to compute the next ones, and torch's "
                 "fake process group returns no other rank's values (each all_reduce leaves this rank's own): "
                 "the collectives' kinds, counts and sizes and the memory are the real step's, the values "
                 "computed from them are not"),
}


def caveats(result: ScaleCensus) -> list[str]:
    """What this simulation cannot stand for, in words (also in the JSON)."""
    w = result.workload
    notes = []
    if w.impl == "ddp" and w.comm_hook in FAKE_VALUES_CAVEATS:
        notes.append(FAKE_VALUES_CAVEATS[w.comm_hook])
    if w.impl == "fsdp2" and w.precision == "bf16" and _memory_rows(result):
        notes.append("FSDP2 with bf16 parameters: the simulated peak memory is not byte-exact against real gloo "
                     "ranks (cpu-small at 2 ranks: 2.6% under; docs/design/census-and-memory.md#what-is-checked)")
    return notes


def _memory_rows(result: ScaleCensus) -> list[dict[str, Any]]:
    return [row for row in result.rows if "memory" in row]


def _memory_columns(result: ScaleCensus) -> list[str]:
    """The categories any world size's peak holds, in the tracker's order."""
    from .memory import CATEGORIES

    seen = {key for row in _memory_rows(result) for key in row["memory"]["peak_breakdown"]}
    return [key for key in dict.fromkeys(CATEGORIES.values()) if key in seen]


_SHORT = {"sharded_parameters": "sharded params", "unsharded_parameters": "unsharded params",
          "sharded_gradients": "sharded grads", "unsharded_gradients": "unsharded grads",
          "optimizer_state": "optimizer", "all_gather_buffers": "all-gather", "reduce_scatter_buffers":
          "reduce-scatter", "temporaries": "temps", "activations": "activations", "parameters": "params",
          "gradients": "grads", "buffers": "buffers", "inputs": "inputs"}


def fit_summary(result: ScaleCensus) -> str | None:
    """'per-rank peak fits 80.0 GiB from 64 ranks up; misses at 8 ranks by 3.2 GiB' (None without
    --device-memory)."""
    from .memory import fits_from

    rows = _memory_rows(result)
    if result.device_bytes is None or not rows:
        return None
    device = human_bytes(result.device_bytes)
    start = fits_from(rows)
    fitting = [row["world_size"] for row in rows if row["memory"]["device"]["fits"]]
    misses = [f"at {row['world_size']} ranks by {human_bytes(-row['memory']['device']['headroom_bytes'])}"
              for row in rows if not row["memory"]["device"]["fits"]]
    if not fitting:
        head = f"does not fit {device} at any simulated world size"
    elif not misses:
        head = f"fits {device} at every simulated world size"
    elif start is not None:
        head = f"fits {device} from {start} ranks up"
    else:
        head = f"fits {device} at {', '.join(str(n) for n in fitting)} ranks only"
    return "per-rank peak " + head + ("; misses " + ", ".join(misses) if misses else "")


def format_memory_table(result: ScaleCensus) -> list[str]:
    """Per world size, rank 0's peak and its breakdown at the peak, where it fell, and (with a
    device) the headroom or the shortfall."""
    rows = _memory_rows(result)
    if not rows:
        return []
    columns = _memory_columns(result)
    header = ["ranks", "peak/rank"] + [_SHORT.get(c, c) for c in columns] + ["peak at"]
    if result.device_bytes is not None:
        header.append(f"vs {human_bytes(result.device_bytes)}")
    table = []
    for row in rows:
        memory = row["memory"]
        at = memory["peak_at"]
        line = [str(row["world_size"]), human_bytes(memory["peak_bytes"])]
        line += [human_bytes(memory["peak_breakdown"].get(c, 0)) for c in columns]
        line.append(f"{at['module'] or '(no module)'} {at['phase']}")
        if result.device_bytes is not None:
            verdict = memory["device"]
            line.append(f"fits, {human_bytes(verdict['headroom_bytes'])} spare" if verdict["fits"]
                        else f"MISSES by {human_bytes(-verdict['headroom_bytes'])}")
        table.append(line)
    widths = [max(len(line[i]) for line in [header] + table) for i in range(len(header))]
    w = result.workload
    first = rows[0]["memory"]
    lines = ["", f"peak memory per rank over the step (live tensor bytes; rank 0, which holds the most), micro-batch "
                 f"{first['micro_batch'][0]} x {first['micro_batch'][1]} tokens, AdamW foreach="
                 f"{first['adamw_foreach']}, {first['tracker']} "
                 + ("under FakeTensorMode" if w.impl == "fsdp2" else
                    f"on real tensors (a DDP rank's memory does not depend on N: simulated once, at "
                    f"{first.get('simulated_at_world_size', rows[0]['world_size'])} ranks)"), ""]
    for line in [header] + table:
        lines.append("  ".join(cell.rjust(width) if i < len(line) - (2 if result.device_bytes is not None else 1)
                               else cell.ljust(width) for i, (cell, width) in enumerate(zip(line, widths))).rstrip())
        if line is header:
            lines.append("  ".join("-" * width for width in widths))
    if w.impl == "ddp" and first.get("ddp_bucket_bytes"):
        lines.append(f"DDP's bucket buffers ({human_bytes(first['ddp_bucket_bytes'])}) are counted among temps")
    summary = fit_summary(result)
    if summary:
        lines.append(summary)
    return lines


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
    lines += format_memory_table(result)
    lines += [f"note: {note}" for note in caveats(result)]
    return "\n".join(lines)


def to_json(result: ScaleCensus) -> str:
    """The JSON document: the workload's knobs, the method, and a record per world size."""
    w = result.workload
    knobs = {"size": w.size, "impl": w.impl, "precision": w.precision, "grad_accum": w.grad_accum,
             "activation_checkpointing": w.activation_checkpointing}
    if w.impl == "ddp":
        knobs.update(bucket_cap_mb=w.bucket_cap_mb, comm_hook=w.comm_hook,
                     find_unused_parameters=w.find_unused_parameters,
                     gradient_as_bucket_view=w.gradient_as_bucket_view)
    else:
        knobs["reshard_after_forward"] = w.reshard_after_forward
    knobs["batch_size"] = w.micro_batch
    from .memory import fits_from

    doc = {"workload": knobs, "parameters": w.config.parameter_count,
           "simulated": "rank 0 of world_size on torch's fake process group",
           "fake_collective_values": "the fake process group returns no other rank's values: a step that reads "
                                     "a collective's result computes on this rank's own",
           "caveats": caveats(result), "warmup_steps": result.warmup_steps}
    if result.device_bytes is not None:
        doc["device_memory_bytes"] = result.device_bytes
        doc["fits_from_world_size"] = fits_from(_memory_rows(result))
        doc["fits_at_world_sizes"] = [row["world_size"] for row in _memory_rows(result)
                                      if row["memory"]["device"]["fits"]]
    doc["world_sizes"] = result.rows
    return json.dumps(doc, indent=2)


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
    from ..report.charts import pyplot

    plt = pyplot()
    sizes = [row["world_size"] for row in result.rows]
    memory_rows = _memory_rows(result)
    fig, axes = plt.subplots(1, 3 if memory_rows else 2, figsize=(16 if memory_rows else 11, 4.2))
    left, right = axes[0], axes[1]
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
    if memory_rows:
        peak = axes[2]
        memory_sizes = [row["world_size"] for row in memory_rows]
        peak.plot(memory_sizes, [row["memory"]["peak_bytes"] for row in memory_rows], marker="o", color="black",
                  linewidth=2, label="peak")
        for key in _memory_columns(result):
            values = [row["memory"]["peak_breakdown"].get(key, 0) for row in memory_rows]
            if any(values):
                peak.plot(memory_sizes, [max(v, 1) for v in values], marker=".", linewidth=1,
                          label=_SHORT.get(key, key))
        if result.device_bytes is not None:
            peak.axhline(result.device_bytes, color="red", linestyle="--",
                         label=f"device {human_bytes(result.device_bytes)}")
        peak.set_title("peak memory per rank, and its breakdown at the peak")
    for ax in axes:
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
