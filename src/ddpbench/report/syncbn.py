"""The SyncBatchNorm section: a row per (batch_size, hidden_dim, ranks, backend), a median time
and a census peak column per variant, so the variants of one shape sit side by side."""

from __future__ import annotations

from collections import defaultdict

from ..storage.runs import Case
from .cells import backend_label, census_peak, sort_key, table, with_straggler
from .family_table import FamilyTable


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
    for key in sorted(cells, key=lambda k: sort_key(*k)):
        batch, hidden, workers, backend = key
        row = [str(batch), str(hidden), str(workers), backend]
        for v in variants:
            case = cells[key].get(v)
            row += ["-", "-"] if case is None else [f"{case.median * 1e3:.3f}", census_peak(case.extra_info)]
        rows.append(row)
    return with_straggler(table(headers, rows), cases)


TABLE = FamilyTable(name="syncbn", title="SyncBatchNorm", tables=syncbn_table, required=("variant",))
