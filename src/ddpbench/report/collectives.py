"""The collectives' section, nccl-tests' columns: one table per op (Backend | Processes | Size |
Avg Time | Effective and Bus Bandwidth, from the average time), and time and bus bandwidth
against message size, one panel per op."""

from __future__ import annotations

from collections import defaultdict

from ..shown_text import markdown_text
from ..storage.runs import Case
from ..options import format_size
from ..workloads.collectives import COLLECTIVES, bandwidths_gbps
from .cells import backend_label, is_number, mean, sort_key, spread, table, with_straggler
from .charts import errorbar
from .family_table import Chart, FamilyTable

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


def collectives_tables(cases: list[Case]) -> str:
    per_op: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        per_op[case.extra_info["op"]].append(case)
    extra = variant_columns(cases)
    parts = []
    for op in sorted(per_op):
        rows = []
        ordered = sorted(per_op[op], key=lambda c: sort_key(
            str(c.extra_info.get("backend")), c.extra_info.get("world_size") or 0,
            *[str(c.extra_info.get(key)) for key, _ in extra], c.extra_info["size_bytes"]))
        for case in ordered:
            info = case.extra_info
            mean_s = mean(case)
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
        parts.append(with_straggler(f"### {markdown_text(op)}\n\n" + table(
            ["Backend", "Processes"] + [header for _, header in extra]
            + ["Size", "Avg Time (ms)", "Effective Bandwidth (GB/s)", "Bus Bandwidth (GB/s)"], rows), per_op[op]))
    return "\n\n".join(parts)


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
            at_median = bus if is_number(bus) else size / median / 1e9
            value, low, high = at_median, at_median * median / q3, at_median * median / q1
        variant = " ".join(str(info.get(key)) for key, _ in extra)
        label = backend_label(info) + (f" {variant}" if variant else "")
        series[info["op"]][(label, info.get("world_size"))].append((size, value, low, high))
    for lines in series.values():
        for points in lines.values():
            points.sort()
    return series


def collectives_figure(plt, cases: list[Case], metric: str):
    series = collectives_series(cases, metric)
    ops = sorted(series)
    fig, axes = plt.subplots(1, len(ops), figsize=(4.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for (backend, ws), points in sorted(series[op].items(), key=lambda kv: str(kv[0])):
            errorbar(ax, points, label=f"{backend}, {ws} proc")
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


TABLE = FamilyTable(
    name="collectives", title="Collectives", tables=collectives_tables, required=("op", "size_bytes"),
    charts=(Chart("collectives_time.png", lambda plt, cases: collectives_figure(plt, cases, "time")),
            Chart("collectives_bandwidth.png", lambda plt, cases: collectives_figure(plt, cases, "bw"))))
