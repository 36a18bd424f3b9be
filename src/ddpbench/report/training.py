"""The training loops' section: one table per implementation (ranks, model, accumulation, batch,
step time, samples/s, scaling efficiency, final loss, census peak), and samples/s against world
size, a panel per model."""

from __future__ import annotations

from collections import defaultdict

from ..shown_text import markdown_text
from ..storage.runs import Case
from .cells import census_peak, num, sort_key, table, with_straggler
from .charts import scaling_figure
from .family_table import Chart, FamilyTable

# Throughputs charted against world size: (extra_info key, y-axis label). Each is inversely
# proportional to the step time, so its IQR bars come from the step time's quartiles.
TRAINING_METRICS = (("samples_per_second", "samples/s"),)


def training_tables(cases: list[Case]) -> str:
    per_impl: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        per_impl[str(case.extra_info["impl"])].append(case)
    parts = []
    for impl in sorted(per_impl):
        rows = []
        for case in sorted(per_impl[impl], key=lambda c: sort_key(
                str(c.extra_info.get("model")), c.extra_info.get("grad_accum"), c.extra_info.get("batch_size"),
                c.extra_info.get("world_size") or 0)):
            info = case.extra_info
            rows.append([str(info.get("world_size", "?")), str(info.get("model", "-")),
                         str(info.get("grad_accum", "-")), str(info.get("batch_size", "-")),
                         f"{case.median * 1e3:.3f}", num(info.get("samples_per_second"), "{:.1f}"),
                         num(info.get("scaling_efficiency"), "{:.2f}"),
                         num(info.get("final_loss"), "{:.4f}"), census_peak(info)])
        parts.append(with_straggler(f"### {markdown_text(impl)}\n\n" + table(
            ["Ranks", "Model", "grad_accum", "batch_size", "Time per round (ms)", "Samples/s",
             "Scaling efficiency", "Final loss", "Peak memory (census)"], rows), per_impl[impl]))
    return "\n\n".join(parts)


def training_figure(plt, cases: list[Case]):
    """Training loops' samples/s against world size: a panel per model, a line per configuration."""
    return scaling_figure(plt, cases, TRAINING_METRICS, "training scaling")


TABLE = FamilyTable(name="training", title="Training", tables=training_tables, required=("impl",),
                    charts=(Chart("training_scaling.png", training_figure),))
