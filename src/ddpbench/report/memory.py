"""The memory section, after the families': every case with a memory census, its peak (the
largest rank), the bytes per category at the peak, where it fell and what the step keeps."""

from __future__ import annotations

from ..storage.runs import Case
from .cells import mem, num, table

# The memory table's category columns, in order, with their headers.
MEMORY_COLUMNS = (("parameters", "Parameters"), ("sharded_parameters", "Sharded params"),
                  ("unsharded_parameters", "Unsharded params"), ("buffers", "Buffers"),
                  ("gradients", "Gradients"), ("sharded_gradients", "Sharded grads"),
                  ("unsharded_gradients", "Unsharded grads"), ("optimizer_state", "Optimizer state"),
                  ("activations", "Activations"), ("temporaries", "Temporaries"), ("ddp_buckets", "DDP buckets"),
                  ("collective_buffers", "Collective buffers"), ("all_gather_buffers", "All-gather buffers"),
                  ("reduce_scatter_buffers", "Reduce-scatter buffers"), ("inputs", "Inputs"), ("other", "Other"))

INTRODUCTION = ("The memory census: live tensor bytes in one step of each case, at the peak of the rank that "
                "holds the most, and what held them.")


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
               mem(memory.get("max_peak_bytes", memory.get("peak_bytes")))]
        row += [mem(at[key]) if at.get(key) else "-" for key, _ in present]
        row += [place + (" (ranks disagree)" if memory.get("ranks_disagree") else ""),
                mem(memory.get("after_step_bytes")), optimizers]
        if measured_any:
            measured = memory.get("measured") if isinstance(memory.get("measured"), dict) else {}
            row += [mem(measured.get("max_allocated_bytes")) if measured else "-",
                    num(measured.get("census_over_allocated"), "{:.3f}") if measured else "-"]
        rows.append(row)
    headers = (["Case", "Ranks", "Peak (census)"] + [header for _, header in present]
               + ["Peak at", "Kept after the step", "Optimizer"])
    if measured_any:
        headers += ["Measured max allocated", "Census / measured"]
    return table(headers, rows)
