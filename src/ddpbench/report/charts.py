"""The chart pieces the families share: matplotlib on demand, median points with IQR bars, and
the scaling figure (a throughput against world size, a line per configuration)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ..storage.runs import Case
from .cells import is_number, positive_whole, spread


class MatplotlibMissing(RuntimeError):
    pass


def pyplot():
    """matplotlib.pyplot on the Agg backend; :class:`MatplotlibMissing` says how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MatplotlibMissing(
            "charts need matplotlib, which is not installed: pip install 'ddpbench[plot]' "
            "(or pass --no-chart for the tables only)") from None
    return plt


def save(plt, fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def errorbar(ax, points, **kwargs):
    """``points`` ``(x, median, low, high)`` as markers with their IQR as error bars."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    # max(0, ...): a quartile equal to the median can land a rounding error on the wrong side
    yerr = [[max(0.0, p[1] - p[2]) for p in points], [max(0.0, p[3] - p[1]) for p in points]]
    return ax.errorbar(xs, ys, yerr=yerr, **{"marker": "o", "capsize": 3, **kwargs})


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
        if not is_number(value) or not positive_whole(info.get("world_size")):
            continue
        q1, median, q3 = spread(case)
        lines[str(info.get("model", ""))][configuration(case)].append(
            (int(info["world_size"]), value, value * median / q3, value * median / q1))
    for per_model in lines.values():
        for points in per_model.values():
            points.sort()
    return {model: dict(per_model) for model, per_model in lines.items()}


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
                errorbar(ax, lines[config], label=labels[config], **style[labels[config]])
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
