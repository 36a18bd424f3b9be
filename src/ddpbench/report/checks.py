"""A saved run's cases checked for what the report's tables and charts cannot show: a damaged or
hand-edited run is named (case, field, what it holds), never a traceback."""

from __future__ import annotations

from ..gates.compare import Case, Run
from .cells import is_number, positive_whole, whole
from .families import TABLE_OF, family


class ReportError(ValueError):
    """A run whose figures the tables cannot show: the message names the case and the field."""


# extra_info keys the tables group, sort or label by: each must be one plain value.
PLAIN_KEYS = ("family", "backend", "device", "variant", "impl", "model", "layout", "data_source", "worker_start",
              "sharing_strategy", "dtype", "reduce_op", "placement", "persistent_workers", "batch_size",
              "hidden_dim", "grad_accum", "num_samples", "num_workers", "ops_per_round")


def case_problem(case: Case) -> str | None:
    """What in a case the report could not show, or None."""
    info = case.extra_info
    for key in PLAIN_KEYS:
        if key in info and not (info[key] is None or isinstance(info[key], (str, int, float, bool))):
            return f"extra_info.{key} is {type(info[key]).__name__} {info[key]!r:.60}, expected one plain value"
    if "op" in info and not (isinstance(info["op"], str) and info["op"]):
        return f"extra_info.op is {info['op']!r:.60}, expected a collective's name"
    if "size_bytes" in info and not positive_whole(info["size_bytes"]):
        return f"extra_info.size_bytes is {info['size_bytes']!r:.60}, expected a whole number of bytes above 0"
    if info.get("world_size") is not None and not positive_whole(info["world_size"]):
        return f"extra_info.world_size is {info['world_size']!r:.60}, expected a whole number of ranks above 0"
    table = TABLE_OF[family(case)]
    missing = [key for key in table.required if key not in info]
    if missing:
        return f"extra_info has no {missing[0]}, which every case of the {table.name} family records"
    memory = info.get("memory")
    if memory is not None and not (isinstance(memory, dict) and (memory.get("incomplete") is not None or (
            whole(memory.get("max_peak_bytes", memory.get("peak_bytes")))
            and isinstance(memory.get("at_peak", {}), dict)
            and all(whole(v) for v in memory.get("at_peak", {}).values())))):
        return f"extra_info.memory is {memory!r:.60}, expected a memory census (peak_bytes, at_peak bytes)"
    if not case.data:
        for key in ("mean", "q1", "q3"):  # the tables and charts divide by them
            value = case.stats.get(key)
            if value is not None and not (is_number(value) and value > 0):
                return f"stats.{key} is {value!r:.60}, expected a time in seconds above 0"
    return None


def check_run(run: Run) -> None:
    """Raise :class:`ReportError` naming each case (up to five) whose figures the tables cannot
    show, with the field and what it holds: a damaged or hand-edited run is named, not a
    traceback. (Medians above 0 and round times are checked when the run is read.)"""
    problems = [f"{case.fullname}: {problem}" for case in run.cases.values()
                for problem in [case_problem(case)] if problem]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ReportError(f"{run.path}: " + "; ".join(problems[:5]) + more
                          + ". The file is damaged or was edited: restore it or rerun those cases")
