"""The transformer section: a row per case (tokens/s, MFU, compute and exposed communication with
their intervals, parameter bytes, final loss, census peak), and tokens/s and MFU against world
size, a row of panels per model size."""

from __future__ import annotations

from ..storage.runs import Case
from .cells import census_peak, is_number, mem, num, table, with_straggler
from .charts import scaling_figure
from .family_table import Chart, FamilyTable

TRANSFORMER_METRICS = (("tokens_per_second", "tokens/s"), ("mfu", "MFU (measured peak)"))


def _ms_with_interval(info: dict, key: str) -> str:
    """``key`` in ms with its ``<key>_ci`` interval: '1.250 [0.310, 2.040]'; '-' when not measured."""
    if not is_number(info.get(key)):
        return "-"
    text = f"{info[key] * 1e3:.3f}"
    interval = info.get(f"{key}_ci")
    if isinstance(interval, (list, tuple)) and len(interval) == 2 and all(is_number(v) for v in interval):
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
                     num(info.get("tokens_per_second"), "{:.0f}"), num(info.get("mfu"), "{:.3f}"),
                     num(info.get("peak_flops_measured"), "{:.1f}", 1e-9),
                     _ms_with_interval(info, "compute_s"), _ms_with_interval(info, "exposed_comm_s"),
                     num(info.get("comm_isolated_s"), "{:.3f}", 1e3) if "comm_isolated_s" in info else "-",
                     f"{overlap:.0f}%" if is_number(overlap) else "-",
                     mem(info.get("param_bytes")), mem(info.get("sharded_param_bytes")),
                     num(info.get("final_loss"), "{:.4f}"), census_peak(info)])
    return with_straggler(table(
        ["Case", "Ranks", "Time per step (ms)", "Tokens/s", "MFU", "Measured peak (GFLOP/s)", "Compute (ms)",
         "Exposed comm (ms)", "Comm alone (ms)", "Comm hidden", "Params", "Params per rank", "Final loss",
         "Peak memory (census)"], rows), cases)


def transformer_figure(plt, cases: list[Case]):
    """Transformer cases' tokens/s and MFU against world size: a row per model size, a line per
    configuration."""
    return scaling_figure(plt, cases, TRANSFORMER_METRICS, "transformer scaling")


TABLE = FamilyTable(name="transformer", title="Transformer training", tables=transformer_table,
                    charts=(Chart("transformer_scaling.png", transformer_figure),))
