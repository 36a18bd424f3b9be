"""``ddpbench report``: markdown tables and PNG charts of one saved run, a section per family,
each family's table in its own module here, then the memory census and the numerics replay
(docs/design/storage-and-report.md#report)."""

from __future__ import annotations

from pathlib import Path

from ..shown_text import markdown_text
from ..storage.runs import Run
from .cells import backend_label, gpus_label, provenance, spread, with_provenance
from .charts import MatplotlibMissing, configuration, line_labels, pyplot, save
from .checks import ReportError, check_run
from .collectives import collectives_figure, collectives_series, collectives_tables, size_ticks
from .comparison_chart import compare_chart
from .families import FAMILY_TABLES, by_family, family
from .memory import INTRODUCTION, memory_table
from .numerics import INTRODUCTION as NUMERICS_INTRODUCTION
from .numerics import numerics_table
from .training import training_figure
from .transformer import transformer_figure

__all__ = ["FAMILY_TABLES", "MatplotlibMissing", "ReportError", "backend_label", "by_family", "check_run",
           "collectives_figure", "collectives_series", "collectives_tables", "compare_chart", "configuration",
           "family", "gpus_label", "line_labels", "markdown_report", "pyplot", "size_ticks", "spread",
           "training_figure", "transformer_figure", "write_charts"]


def markdown_report(run: Run) -> str:
    """The run's tables; :class:`ReportError` when a case holds what they cannot show."""
    check_run(run)
    groups = by_family(run)
    parts = [f"# ddpbench report: {markdown_text(run.label)}"]
    if run.datetime:
        parts.append(f"Saved {markdown_text(run.datetime)}.")
    line = provenance(run)
    for table in FAMILY_TABLES:
        if groups.get(table.name):
            parts.append(f"## {table.title}\n\n{with_provenance(table.tables(groups[table.name]), line)}")
    memory = memory_table(list(run.cases.values()))
    if memory:
        parts.append(f"## Memory\n\n{INTRODUCTION}\n\n" + with_provenance(memory, line))
    numerics = numerics_table(list(run.cases.values()))
    if numerics:
        parts.append(f"## Numerics\n\n{NUMERICS_INTRODUCTION}\n\n" + with_provenance(numerics, line))
    return "\n\n".join(parts) + "\n"


def write_charts(run: Run, out_dir: str | Path) -> list[Path]:
    """Write the run's PNG charts into ``out_dir``; raises :class:`MatplotlibMissing`, and
    :class:`ReportError` when a case holds what they cannot show."""
    check_run(run)
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = by_family(run)
    return [save(plt, chart.figure(plt, groups[table.name]), out / chart.file_name)
            for table in FAMILY_TABLES if groups.get(table.name) for chart in table.charts]
