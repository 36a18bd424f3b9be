"""Seed-shaped markdown tables and PNG charts from one saved run (or --benchmark-json file).

Families are recognised by their extra_info keys, so a run holding any subset of them works:

* collectives (``op``, ``size_bytes``): per op, Backend | Processes | Size | Avg Time (ms) |
  Effective Bandwidth (GB/s) | Bus Bandwidth (GB/s), bandwidths from the average time;
* SyncBN (``variant``, ``hidden_dim``): batch_size | hidden_dim | num_workers | backend, then median time
  and peak memory per variant;
* training (``impl``): per impl, Ranks | Model | grad_accum | batch_size | Time per step |
  samples/s | scaling efficiency | final loss | peak memory;
* dataset sharing (``layout``): layout | num_samples | sample size | data | workers | worker start |
  persistent | sharing strategy | share time | epoch time (median and IQR) | open fds | memory;
* anything else: Case | Median time;
* every case with a memory census (``memory``), after the families: Case | Ranks | Peak | bytes per
  category at the peak | Peak at | Kept after the step | Optimizer (foreach) | on CUDA the measured
  max allocated and census / measured. "Peak memory" in the families' tables is the census peak
  (the largest rank), the measured CUDA max allocated beside it.

Every table is followed by the line saying which run (file, saved datetime) and machine
(pytest-benchmark's machine_info: node, CPU, cores) it came from.

Charts (matplotlib, the ``plot`` extra): collectives time and bus bandwidth vs size, one line per
backend and process count, one panel per op, sizes labelled as in the tables; training samples/s
and transformer tokens/s and MFU vs world size, a row of panels per model, whole-number world-size
ticks, one line per configuration (a case's id without its world size), legends beside the data
(at one world size, a sorted bar per configuration instead);
every point is the median with its interquartile range as error bars; and :func:`compare_chart`
for the ratios of a comparison with their intervals.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from .options import format_size, usual_device
from .storage.runs import Case, Run
from .workloads.collectives import COLLECTIVES, bandwidths_gbps

if TYPE_CHECKING:
    from .gates.compare import Comparison


class MatplotlibMissing(RuntimeError):
    pass


def _positive_whole(value) -> bool:
    return _is_number(value) and value > 0 and float(value).is_integer()


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MatplotlibMissing(
            "charts need matplotlib, which is not installed: pip install 'ddpbench[plot]' "
            "(or pass --no-charts for the tables only)") from None
    return plt


def family(case: Case) -> str:
    info = case.extra_info
    if "op" in info and "size_bytes" in info:
        return "collectives"
    if "variant" in info and "hidden_dim" in info:
        return "syncbn"
    if "tokens_per_second" in info and "model_flops_per_step" in info:
        return "transformer"
    if "impl" in info:
        return "training"
    if "layout" in info:
        return "datasets"
    return "other"


def by_family(run: Run) -> dict[str, list[Case]]:
    groups: dict[str, list[Case]] = defaultdict(list)
    for case in run.cases.values():
        groups[family(case)].append(case)
    return groups


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _num(value, fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    if not _is_number(value):
        return "n/a"
    return fmt.format(value * scale)


def _mem(value) -> str:
    return _num(value, "{:.1f} MB", 1 / 2**20)


def _census_peak(info: dict) -> str:
    """The memory census's peak (largest rank) with the measured CUDA max allocated beside it."""
    memory = info.get("memory")
    if not isinstance(memory, dict) or memory.get("incomplete") is not None:
        return "n/a"
    text = _mem(memory.get("max_peak_bytes", memory.get("peak_bytes")))
    measured = memory.get("measured") if isinstance(memory.get("measured"), dict) else {}
    if _is_number(measured.get("max_allocated_bytes")):
        text += f" (measured {_mem(measured['max_allocated_bytes'])})"
    return text


# The memory table's category columns, in order, with their headers.
MEMORY_COLUMNS = (("parameters", "Parameters"), ("sharded_parameters", "Sharded params"),
                  ("unsharded_parameters", "Unsharded params"), ("buffers", "Buffers"),
                  ("gradients", "Gradients"), ("sharded_gradients", "Sharded grads"),
                  ("unsharded_gradients", "Unsharded grads"), ("optimizer_state", "Optimizer state"),
                  ("activations", "Activations"), ("temporaries", "Temporaries"), ("ddp_buckets", "DDP buckets"),
                  ("collective_buffers", "Collective buffers"), ("all_gather_buffers", "All-gather buffers"),
                  ("reduce_scatter_buffers", "Reduce-scatter buffers"), ("inputs", "Inputs"), ("other", "Other"))


def memory_table(cases: list[Case]) -> str:
    """Every case with a memory census: its peak (the largest rank), the bytes per category at the
    peak (only the categories some case holds), where the peak fell, what stays after the step,
    whether AdamW ran foreach, and on CUDA the allocator's measured max allocated with census /
    measured."""
    counted = [c for c in cases if isinstance(c.extra_info.get("memory"), dict)
               and c.extra_info["memory"].get("incomplete") is None]
    if not counted:
        return ""
    present = [(key, header) for key, header in MEMORY_COLUMNS
               if any(c.extra_info["memory"].get("at_peak", {}).get(key) for c in counted)]
    measured_any = any(isinstance(c.extra_info["memory"].get("measured"), dict) for c in counted)
    rows = []
    for case in sorted(counted, key=lambda c: c.fullname):
        memory = case.extra_info["memory"]
        at = memory.get("at_peak", {})
        where = memory.get("peak_at") or {}
        place = " ".join(str(v) for v in (where.get("module"), where.get("phase")) if v) or "-"
        optimizers = ", ".join(f"{o.get('name')}" + ("" if o.get("foreach") is None else
                                                      f" (foreach {'on' if o['foreach'] else 'off'})")
                               for o in memory.get("optimizers") or []) or "-"
        row = [case.name, str(case.extra_info.get("world_size", "?")),
               _mem(memory.get("max_peak_bytes", memory.get("peak_bytes")))]
        row += [_mem(at[key]) if at.get(key) else "-" for key, _ in present]
        row += [place + (" (ranks disagree)" if memory.get("ranks_disagree") else ""),
                _mem(memory.get("after_step_bytes")), optimizers]
        if measured_any:
            measured = memory.get("measured") if isinstance(memory.get("measured"), dict) else {}
            row += [_mem(measured.get("max_allocated_bytes")) if measured else "-",
                    _num(measured.get("census_over_allocated"), "{:.3f}") if measured else "-"]
        rows.append(row)
    headers = (["Case", "Ranks", "Peak (census)"] + [header for _, header in present]
               + ["Peak at", "Kept after the step", "Optimizer"])
    if measured_any:
        headers += ["Measured max allocated", "Census / measured"]
    return _table(headers, rows)


def decimal_size(nbytes) -> str:
    """Bytes in decimal units, 3 significant digits: 602112 -> '602 KB', 12288 -> '12.3 KB'."""
    if not _is_number(nbytes):
        return "n/a"
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= factor:
            return f"{nbytes / factor:.3g} {unit}"
    return f"{nbytes:.0f} B"


def sample_size(info: dict) -> str:
    """A dataset case's sample: '3x224x224 (602 KB)', 'variable', or 'n/a' (not recorded)."""
    shape, nbytes = info.get("sample_shape"), info.get("sample_bytes")
    if isinstance(shape, list) and shape:
        label = "x".join(str(d) for d in shape)
        return f"{label} ({decimal_size(nbytes)})" if nbytes is not None else label
    if info.get("variable_size"):
        return "variable"
    return "n/a"


def _yes_no(value) -> str:
    return "-" if value is None else ("yes" if value else "no")


def spread(case: Case) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of a case's rounds, in seconds (from the raw rounds
    when saved, else from pytest-benchmark's stats)."""
    if case.data:
        import numpy as np

        q1, q3 = np.percentile(case.data, [25, 75])
        return float(q1), case.median, float(q3)
    stats = case.stats
    return float(stats.get("q1", case.median)), case.median, float(stats.get("q3", case.median))


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
    return f"_Run {run.label}{saved}; machine {machine}._"


def _sort_key(*values) -> tuple:
    """Numbers before text, numbers numerically (so 64 sorts before 256)."""
    return tuple((0, v, "") if _is_number(v) else (1, 0, str(v))
                 for v in values)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _mean(case: Case) -> float:
    if case.data:
        return sum(case.data) / len(case.data)
    return float(case.stats.get("mean", case.stats["median"]))


def backend_label(info: dict) -> str:
    """``gloo``, ``nccl``; a backend off its usual device says so: ``gloo (cuda)``."""
    backend, device = str(info.get("backend", "?")), info.get("device")
    return backend if device in (None, usual_device(backend)) else f"{backend} ({device})"


# Columns a collectives table gains when a case's value differs from the default or between cases:
# (extra_info key, header, default). Runs of the default options keep the seed's table shape.
VARIANT_COLUMNS = (("dtype", "Dtype", "float32"), ("reduce_op", "Reduction", "sum"),
                   ("placement", "Placement", None), ("ops_per_round", "Ops per round", 1))


def variant_columns(cases: list[Case]) -> list[tuple[str, str]]:
    """(key, header) of the VARIANT_COLUMNS these cases need: values that vary, or one that is not
    the default (placement: any case not at its op's own, which the default options give)."""
    wanted = []
    for key, header, default in VARIANT_COLUMNS:
        if key == "placement":
            needed = any("placement" in c.extra_info and c.extra_info["placement"] != _own_placement(c)
                         for c in cases)
        else:
            values = {case.extra_info.get(key) for case in cases if key in case.extra_info}
            needed = len(values) > 1 or (len(values) == 1 and values != {default})
        if needed:
            wanted.append((key, header))
    return wanted


def _own_placement(case: Case) -> str | None:
    spec = COLLECTIVES.get(case.extra_info.get("op"))
    return spec.placements[0] if spec else None


def straggler_line(cases: list[Case]) -> str | None:
    """The case whose slowest rank was most often the same rank: which, how often, by how much."""
    known = [c for c in cases if isinstance(c.extra_info.get("straggler_rank"), int)
             and _is_number(c.extra_info.get("straggler_share"))]
    if not known:
        return None
    case = max(known, key=lambda c: (c.extra_info["straggler_share"], c.extra_info.get("straggler_excess_pct") or 0))
    info = case.extra_info
    return (f"_Straggler: in {case.name}, rank {info['straggler_rank']} was the slowest rank in "
            f"{info['straggler_share'] * 100:.0f}% of the rounds, by {_num(info.get('straggler_excess_pct'), '{:.1f}')}% "
            f"over the other ranks (median of those rounds)._")


def _with_straggler(table: str, cases: list[Case]) -> str:
    line = straggler_line(cases)
    return table if line is None else f"{table}\n\n{line}"


def collectives_tables(cases: list[Case]) -> str:
    per_op: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        per_op[case.extra_info["op"]].append(case)
    extra = variant_columns(cases)
    parts = []
    for op in sorted(per_op):
        rows = []
        ordered = sorted(per_op[op], key=lambda c: _sort_key(
            str(c.extra_info.get("backend")), c.extra_info.get("world_size") or 0,
            *[str(c.extra_info.get(key)) for key, _ in extra], c.extra_info["size_bytes"]))
        for case in ordered:
            info = case.extra_info
            mean_s = _mean(case)
            world_size = info.get("world_size")
            if isinstance(world_size, int) and world_size > 0 and op in COLLECTIVES:
                algbw, busbw = bandwidths_gbps(op, int(info["size_bytes"]), world_size, mean_s)
                bus_cell = f"{busbw:.3f}"
            else:
                algbw, bus_cell = info["size_bytes"] / mean_s / 1e9, "n/a"
            rows.append([backend_label(info), str(world_size or "?")]
                        + [str(info.get(key, "-")) for key, _ in extra]
                        + [format_size(int(info["size_bytes"])), f"{mean_s * 1e3:.3f}", f"{algbw:.3f}",
                           bus_cell])
        parts.append(_with_straggler(f"### {op}\n\n" + _table(
            ["Backend", "Processes"] + [header for _, header in extra]
            + ["Size", "Avg Time (ms)", "Effective Bandwidth (GB/s)", "Bus Bandwidth (GB/s)"], rows), per_op[op]))
    return "\n\n".join(parts)


def syncbn_table(cases: list[Case]) -> str:
    variants = sorted({str(c.extra_info["variant"]) for c in cases})
    cells: dict[tuple, dict[str, Case]] = defaultdict(dict)
    for case in cases:
        info = case.extra_info
        key = (info.get("batch_size"), info.get("hidden_dim"), info.get("world_size"), backend_label(info))
        cells[key][str(info["variant"])] = case
    headers = ["batch_size", "hidden_dim", "num_workers", "backend"]
    for v in variants:
        headers += [f"{v} median time (ms)", f"{v} peak memory (census)"]
    rows = []
    for key in sorted(cells, key=lambda k: _sort_key(*k)):
        batch, hidden, workers, backend = key
        row = [str(batch), str(hidden), str(workers), backend]
        for v in variants:
            case = cells[key].get(v)
            row += ["-", "-"] if case is None else [f"{case.median * 1e3:.3f}", _census_peak(case.extra_info)]
        rows.append(row)
    return _with_straggler(_table(headers, rows), cases)


def training_tables(cases: list[Case]) -> str:
    per_impl: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        per_impl[str(case.extra_info["impl"])].append(case)
    parts = []
    for impl in sorted(per_impl):
        rows = []
        for case in sorted(per_impl[impl], key=lambda c: _sort_key(
                str(c.extra_info.get("model")), c.extra_info.get("grad_accum"), c.extra_info.get("batch_size"),
                c.extra_info.get("world_size") or 0)):
            info = case.extra_info
            rows.append([str(info.get("world_size", "?")), str(info.get("model", "-")),
                         str(info.get("grad_accum", "-")), str(info.get("batch_size", "-")),
                         f"{case.median * 1e3:.3f}", _num(info.get("samples_per_second"), "{:.1f}"),
                         _num(info.get("scaling_efficiency"), "{:.2f}"),
                         _num(info.get("final_loss"), "{:.4f}"), _census_peak(info)])
        parts.append(_with_straggler(f"### {impl}\n\n" + _table(
            ["Ranks", "Model", "grad_accum", "batch_size", "Time per round (ms)", "Samples/s",
             "Scaling efficiency", "Final loss", "Peak memory (census)"], rows), per_impl[impl]))
    return "\n\n".join(parts)


def _ms_with_interval(info: dict, key: str) -> str:
    """``key`` in ms with its ``<key>_ci`` interval: '1.250 [0.310, 2.040]'; '-' when not measured."""
    if not _is_number(info.get(key)):
        return "-"
    text = f"{info[key] * 1e3:.3f}"
    interval = info.get(f"{key}_ci")
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and all(_is_number(v) for v in interval):
        text += f" [{interval[0] * 1e3:.3f}, {interval[1] * 1e3:.3f}]"
    return text


def transformer_table(cases: list[Case]) -> str:
    """One row per case: its knobs (the case id's parameters), tokens/s, MFU against the measured
    peak, the step's compute, exposed communication (with its 95% interval) and communication
    alone with the share of it hidden, parameter bytes (whole and held per rank), final loss and
    peak memory ('-' where a case measured no exposed communication)."""
    rows = []
    for case in sorted(cases, key=lambda c: (str(c.extra_info.get("size")), c.extra_info.get("world_size") or 0,
                                             c.name)):
        info = case.extra_info
        overlap = info.get("comm_overlap_pct")
        rows.append([case.name, str(info.get("world_size", "?")), f"{case.median * 1e3:.3f}",
                     _num(info.get("tokens_per_second"), "{:.0f}"), _num(info.get("mfu"), "{:.3f}"),
                     _num(info.get("peak_flops_measured"), "{:.1f}", 1e-9),
                     _ms_with_interval(info, "compute_s"), _ms_with_interval(info, "exposed_comm_s"),
                     _num(info.get("comm_isolated_s"), "{:.3f}", 1e3) if "comm_isolated_s" in info else "-",
                     f"{overlap:.0f}%" if _is_number(overlap) else "-",
                     _mem(info.get("param_bytes")), _mem(info.get("sharded_param_bytes")),
                     _num(info.get("final_loss"), "{:.4f}"), _census_peak(info)])
    return _with_straggler(_table(
        ["Case", "Ranks", "Time per step (ms)", "Tokens/s", "MFU", "Measured peak (GFLOP/s)", "Compute (ms)",
         "Exposed comm (ms)", "Comm alone (ms)", "Comm hidden", "Params", "Params per rank", "Final loss",
         "Peak memory (census)"], rows), cases)


def datasets_table(cases: list[Case]) -> str:
    rows = []

    def key(case):
        info = case.extra_info
        return _sort_key(str(info.get("layout")), info.get("num_samples"), info.get("sample_bytes") or 0,
                         str(info.get("data_source", "handover")), info.get("num_workers") or 0,
                         str(info.get("worker_start")), str(info.get("persistent_workers")),
                         str(info.get("sharing_strategy")))

    for case in sorted(cases, key=key):
        info = case.extra_info
        q1, median, q3 = spread(case)
        rows.append([str(info.get("layout")), str(info.get("num_samples", "-")), sample_size(info),
                     str(info.get("data_source", "handover")), str(info.get("num_workers", "-")),
                     str(info.get("worker_start") or "-"), _yes_no(info.get("persistent_workers")),
                     str(info.get("sharing_strategy", "-")), _num(info.get("share_seconds"), "{:.3f}"),
                     f"{median:.3f}", f"{q3 - q1:.3f}", _num(info.get("open_fds"), "{:.0f}"),
                     _mem(info.get("peak_memory_bytes"))])
    return _with_straggler(_table(
        ["layout", "num_samples", "sample size", "data", "workers", "worker start", "persistent",
         "sharing strategy", "share time (s)", "epoch time (s)", "epoch IQR (s)", "open fds", "memory"], rows),
        cases)


def other_table(cases: list[Case]) -> str:
    rows = [[c.name, f"{c.median * 1e3:.3f}"] for c in sorted(cases, key=lambda c: c.fullname)]
    return _table(["Case", "Median time (ms)"], rows)


SECTIONS = (
    ("collectives", "Collectives", collectives_tables),
    ("syncbn", "SyncBatchNorm", syncbn_table),
    ("training", "Training", training_tables),
    ("transformer", "Transformer training", transformer_table),
    ("datasets", "Dataset sharing", datasets_table),
    ("other", "Other cases", other_table),
)


def _with_provenance(text: str, line: str) -> str:
    """``line`` after every table in ``text`` (tables are separated by blank lines)."""
    blocks = text.split("\n\n")
    return "\n\n".join(block + ("\n\n" + line if block.startswith("|") else "") for block in blocks)


def markdown_report(run: Run) -> str:
    """The run's tables (its cases' figures were checked when it was read)."""
    groups = by_family(run)
    parts = [f"# ddpbench report: {run.label}"]
    if run.datetime:
        parts.append(f"Saved {run.datetime}.")
    line = provenance(run)
    for key, title, render in SECTIONS:
        if groups.get(key):
            parts.append(f"## {title}\n\n{_with_provenance(render(groups[key]), line)}")
    memory = memory_table(list(run.cases.values()))
    if memory:
        parts.append("## Memory\n\nThe memory census: live tensor bytes in one step of each case, at the peak of "
                     "the rank that holds the most, and what held them.\n\n" + _with_provenance(memory, line))
    return "\n\n".join(parts) + "\n"


# ----------------------------------------------------------------------------------------------
# Charts
# ----------------------------------------------------------------------------------------------


def size_ticks(sizes) -> tuple[list[int], list[str]]:
    """Tick positions and labels of a size axis: each distinct size, labelled as the tables label
    it (1048576 -> '1MB', the --dist-sizes spelling), not as powers of two."""
    positions = sorted({int(size) for size in sizes})
    return positions, [format_size(size) for size in positions]


def collectives_series(cases: list[Case], metric: str) -> dict[str, dict[tuple, list[tuple[float, ...]]]]:
    """Per op, per (backend, world size): points ``(size, value, low, high)`` sorted by size, where
    value is the median (``metric`` "time": ms; "bw": bus bandwidth in GB/s) and low / high the
    value at the quartiles of the rounds (for bandwidth, the third quartile gives the low end)."""
    series: dict[str, dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    extra = variant_columns(cases)
    for case in cases:
        info = case.extra_info
        size = int(info["size_bytes"])
        q1, median, q3 = spread(case)
        if metric == "time":
            value, low, high = median * 1e3, q1 * 1e3, q3 * 1e3
        else:
            bus = info.get("busbw_GBps")  # from the median, with the op's bus factor
            at_median = bus if _is_number(bus) else size / median / 1e9
            value, low, high = at_median, at_median * median / q3, at_median * median / q1
        variant = " ".join(str(info.get(key)) for key, _ in extra)
        label = backend_label(info) + (f" {variant}" if variant else "")
        series[info["op"]][(label, info.get("world_size"))].append((size, value, low, high))
    for lines in series.values():
        for points in lines.values():
            points.sort()
    return series


# Throughputs charted against world size: (extra_info key, y-axis label). Each is inversely
# proportional to the step time, so its IQR bars come from the step time's quartiles.
TRAINING_METRICS = (("samples_per_second", "samples/s"),)
TRANSFORMER_METRICS = (("tokens_per_second", "tokens/s"), ("mfu", "MFU (measured peak)"))


def configuration(case: Case) -> tuple[str, ...]:
    """What a case measured but for its world size: its test's name and its id's parts without the
    ``<n>p`` part (``test_training[gloo-2p-mlp-ddp-accum4-b32]`` -> ``('test_training', 'gloo',
    'mlp', 'ddp', 'accum4', 'b32')``). Cases that differ only in world size share it: one line."""
    test, _, params = case.name.partition("[")
    parts = params.rstrip("]").split("-") if params else []
    world = f"{case.extra_info.get('world_size')}p"
    if world in parts:
        parts.remove(world)
    return (test, *parts)


def line_labels(configurations) -> dict[tuple[str, ...], str]:
    """Each configuration's legend label: its parts that not every configuration of the panel
    shares (``ddp-accum4``), or, for a panel of one, all of them."""
    configurations = list(configurations)
    shared = set.intersection(*(set(c) for c in configurations)) if len(configurations) > 1 else set()
    return {c: "-".join(part for part in c if part not in shared) or "-".join(c) for c in configurations}


def scaling_series(cases: list[Case], metric: str) -> dict[str, dict[tuple[str, ...], list[tuple]]]:
    """Per model, per :func:`configuration`: points ``(world size, value, low, high)`` sorted by
    world size, where value is ``extra_info[metric]`` (a throughput, or MFU) at the median step and
    low / high its value at the third / first quartile of the step times. Cases without the metric
    are left out."""
    lines: dict[str, dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    for case in cases:
        info = case.extra_info
        value = info.get(metric)
        if not _is_number(value) or not _positive_whole(info.get("world_size")):
            continue
        q1, median, q3 = spread(case)
        lines[str(info.get("model", ""))][configuration(case)].append(
            (int(info["world_size"]), value, value * median / q3, value * median / q1))
    for per_model in lines.values():
        for points in per_model.values():
            points.sort()
    return {model: dict(per_model) for model, per_model in lines.items()}


def _errorbar(ax, points, **kwargs):
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    # max(0, ...): a quartile equal to the median can land a rounding error on the wrong side
    yerr = [[max(0.0, p[1] - p[2]) for p in points], [max(0.0, p[3] - p[1]) for p in points]]
    return ax.errorbar(xs, ys, yerr=yerr, **{"marker": "o", "capsize": 3, **kwargs})


def collectives_figure(plt, cases: list[Case], metric: str):
    series = collectives_series(cases, metric)
    ops = sorted(series)
    fig, axes = plt.subplots(1, len(ops), figsize=(4.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for (backend, ws), points in sorted(series[op].items(), key=lambda kv: str(kv[0])):
            _errorbar(ax, points, label=f"{backend}, {ws} proc")
        ax.set_xscale("log")
        positions, labels = size_ticks(size for points in series[op].values() for size, *_ in points)
        ax.set_xticks(positions, labels)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        if metric == "time":
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_title(op)
        ax.set_xlabel("message size")
        ax.set_ylabel("median time (ms), IQR bars" if metric == "time" else "bus bandwidth (GB/s), IQR bars")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _world_size_axis(plt, ax, world_sizes) -> None:
    """Ticks at the world sizes the panel has, labelled as whole numbers, nothing in between; a
    base-2 log scale once they span 8x or more."""
    sizes = sorted(set(world_sizes))
    if sizes and sizes[-1] / sizes[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(size) for size in sizes])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    if len(sizes) == 1:
        ax.set_xlim(sizes[0] - 0.5, sizes[0] + 0.5)
    ax.set_xlabel("world size (processes)")


def _sorted_bars(ax, lines: dict[tuple, list[tuple]], labels: dict[tuple, str], style: dict, xlabel: str) -> None:
    """One world size: a horizontal bar per configuration with IQR bars, sorted by value, the
    largest on top, each labelled on the axis (a line through one world size is a column of dots)."""
    rows = sorted(((points[0], labels[config]) for config, points in lines.items()), key=lambda row: (row[0][1], row[1]))
    positions = list(range(len(rows)))
    xerr = [[max(0.0, p[1] - p[2]) for p, _ in rows], [max(0.0, p[3] - p[1]) for p, _ in rows]]
    ax.barh(positions, [p[1] for p, _ in rows], xerr=xerr, capsize=3,
            color=[style[name]["color"] for _, name in rows])
    ax.set_yticks(positions, [name for _, name in rows])
    ax.set_xlim(left=0)
    ax.set_xlabel(f"{xlabel}, IQR bars")
    ax.grid(True, axis="x", alpha=0.3)


def scaling_figure(plt, cases: list[Case], metrics, title: str):
    """One row of panels per model and one column per metric (throughput, MFU...), world size on
    the x axis, one line per configuration with IQR bars; each row's legend to the right of its
    last panel, outside the data. A run of one world size gets a sorted bar per configuration
    instead (:func:`_sorted_bars`). Metrics no case recorded get no column."""
    per_metric = [(key, label, scaling_series(cases, key)) for key, label in metrics]
    per_metric = [m for m in per_metric if m[2]]
    models = sorted({model for _, _, series in per_metric for model in series})
    rows, cols = max(1, len(models)), max(1, len(per_metric))
    labels_of = {model: line_labels({c for _, _, series in per_metric for c in series.get(model, {})})
                 for model in models}
    world_sizes = {point[0] for _, _, series in per_metric for lines in series.values()
                   for points in lines.values() for point in points}
    one_world_size = len(world_sizes) == 1
    if one_world_size:
        most = max((len(labels) for labels in labels_of.values()), default=1)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 1.5, (0.3 * most + 1.2) * rows), squeeze=False,
                                 layout="constrained")
    else:
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 3.2, 3.2 * rows), squeeze=False,
                                 layout="constrained")
    # A label keeps its colour and marker in every panel (ddp-accum4 looks the same for each model).
    cmap = plt.get_cmap("tab20")
    style = {label: dict(color=cmap(i % 20), marker="osD^vPX"[i // 20 % 7])
             for i, label in enumerate(sorted({label for labels in labels_of.values() for label in labels.values()}))}
    for row, model in enumerate(models):
        labels = labels_of[model]
        for col, (key, ylabel, series) in enumerate(per_metric):
            ax = axes[row][col]
            lines = series.get(model, {})
            if one_world_size:
                _sorted_bars(ax, lines, labels, style, ylabel)
                ax.set_title(f"{model or title}: {ylabel}" if cols > 1 else (model or title))
                continue
            for config in sorted(lines, key=lambda c: labels[c]):
                _errorbar(ax, lines[config], label=labels[config], **style[labels[config]])
            _world_size_axis(plt, ax, [p[0] for points in lines.values() for p in points])
            ax.set_ylim(bottom=0)
            ax.set_ylabel(f"{ylabel}, IQR bars")
            ax.set_title(f"{model or title}: {ylabel}" if cols > 1 else (model or title))
            ax.grid(True, alpha=0.3)
        handles, names = [], []
        for ax in axes[row]:  # every configuration of the row once, in label order
            for handle, name in zip(*ax.get_legend_handles_labels()):
                if name not in names:
                    handles.append(handle)
                    names.append(name)
        if handles:
            order = sorted(range(len(names)), key=lambda i: names[i])
            axes[row][-1].legend([handles[i] for i in order], [names[i] for i in order], fontsize=8,
                                 loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle(f"{title} at {next(iter(world_sizes))} processes" if one_world_size else title)
    return fig


def training_figure(plt, cases: list[Case]):
    """Training loops' samples/s against world size: a panel per model, a line per configuration."""
    return scaling_figure(plt, cases, TRAINING_METRICS, "training scaling")


def transformer_figure(plt, cases: list[Case]):
    """Transformer cases' tokens/s and MFU against world size: a row per model size, a line per
    configuration."""
    return scaling_figure(plt, cases, TRANSFORMER_METRICS, "transformer scaling")


def _save(plt, fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_charts(run: Run, out_dir: str | Path) -> list[Path]:
    """Write the run's PNG charts into ``out_dir``; raises :class:`MatplotlibMissing`."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = by_family(run)
    written = []
    if groups.get("collectives"):
        written.append(_save(plt, collectives_figure(plt, groups["collectives"], "time"), out / "collectives_time.png"))
        written.append(_save(plt, collectives_figure(plt, groups["collectives"], "bw"),
                             out / "collectives_bandwidth.png"))
    if groups.get("training"):
        written.append(_save(plt, training_figure(plt, groups["training"]), out / "training_scaling.png"))
    if groups.get("transformer"):
        written.append(_save(plt, transformer_figure(plt, groups["transformer"]), out / "transformer_scaling.png"))
    return written


def compare_chart(result: Comparison, path: str | Path) -> Path:
    """Ratios (current / baseline median) with their intervals, one row per compared case."""
    plt = _pyplot()
    # An unbounded interval (too few rounds to tell) has no bar to draw.
    cases = [c for c in result.cases if c.ratio is not None and c.ci_high is not None and math.isfinite(c.ci_high)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.3 * len(cases) + 1.2)))
    for y, case in enumerate(cases):
        ax.errorbar(case.ratio, y, xerr=[[case.ratio - case.ci_low], [case.ci_high - case.ratio]],
                    fmt="o", color=case.verdict.chart_colour, capsize=3)
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels([c.name for c in cases], fontsize=7)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(1 + result.threshold, color="tab:red", ls="--", lw=0.8, label=f"+{result.threshold * 100:g}%")
    ax.axvline(1 / (1 + result.threshold), color="tab:green", ls="--", lw=0.8)
    ax.set_xlabel("current / baseline median" + (" (CPU cases drift-normalised)" if result.normalised else ""))
    ax.set_title(f"{result.confidence * 100:g}% intervals; red = regression")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
