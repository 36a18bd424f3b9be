"""The dataset-sharing section: a row per case (layout, samples, sample size, where the data came
from, loader workers and how they start, sharing strategy, share time, epoch time and its IQR,
open descriptors, memory)."""

from __future__ import annotations

from ..storage.runs import Case
from .cells import mem, num, sort_key, spread, table, with_straggler, yes_no
from .family_table import FamilyTable


def sample_size(info: dict) -> str:
    """A dataset case's sample: '3x224x224 (588.0 KiB)', 'variable', or 'n/a' (not recorded)."""
    shape, nbytes = info.get("sample_shape"), info.get("sample_bytes")
    if isinstance(shape, list) and shape:
        label = "x".join(str(d) for d in shape)
        return f"{label} ({mem(nbytes)})" if nbytes is not None else label
    if info.get("variable_size"):
        return "variable"
    return "n/a"


def datasets_table(cases: list[Case]) -> str:
    rows = []

    def key(case):
        info = case.extra_info
        return sort_key(str(info.get("layout")), info.get("num_samples"), info.get("sample_bytes") or 0,
                        str(info.get("data_source", "handover")), info.get("num_workers") or 0,
                        str(info.get("worker_start")), str(info.get("persistent_workers")),
                        str(info.get("sharing_strategy")))

    for case in sorted(cases, key=key):
        info = case.extra_info
        q1, median, q3 = spread(case)
        rows.append([str(info.get("layout")), str(info.get("num_samples", "-")), sample_size(info),
                     str(info.get("data_source", "handover")), str(info.get("num_workers", "-")),
                     str(info.get("worker_start") or "-"), yes_no(info.get("persistent_workers")),
                     str(info.get("sharing_strategy", "-")), num(info.get("share_seconds"), "{:.3f}"),
                     f"{median:.3f}", f"{q3 - q1:.3f}", num(info.get("open_fds"), "{:.0f}"),
                     mem(info.get("peak_memory_bytes"))])
    return with_straggler(table(
        ["layout", "num_samples", "sample size", "data", "workers", "worker start", "persistent",
         "sharing strategy", "share time (s)", "epoch time (s)", "epoch IQR (s)", "open fds", "memory"], rows),
        cases)


TABLE = FamilyTable(name="datasets", title="Dataset sharing", tables=datasets_table)
