"""The memory verdict: two memory census records compared exactly (docs/design/gates.md#the-memory-verdict)."""

from __future__ import annotations

import math
from typing import Any

from ..storage.records import MEMORY_KEY, MemoryCensus, Ranks, read_memory
from .structure import NOT_COUNTED, StructureVerdict, by_rank, read_both, size_text
from .verdict_words import Verdict

# Each category's name in a line (the record's key with spaces).
_LABELS = {"optimizer_state": "optimizer state", "ddp_buckets": "DDP buckets",
           "collective_buffers": "collective buffers", "all_gather_buffers": "all-gather buffers",
           "reduce_scatter_buffers": "reduce-scatter buffers", "sharded_parameters": "sharded parameters",
           "unsharded_parameters": "unsharded parameters", "sharded_gradients": "sharded gradients",
           "unsharded_gradients": "unsharded gradients"}


def _delta(nbytes: int) -> str:
    return ("+" if nbytes > 0 else "-") + size_text(abs(nbytes))


def peak_place(figures: MemoryCensus) -> str:
    """Where the peak fell, as a line says it: "at blocks.0 backward", "in the optimizer step"."""
    module, phase = figures.module, figures.phase
    if module and phase:
        return f"at {module} {phase}"
    if phase == "optimizer":
        return "in the optimizer step"
    if phase in ("forward", "backward"):
        return f"in {phase}"
    return str(phase or module or "at an unknown place")


def _category_changes(before: dict[str, int], after: dict[str, int]) -> list[tuple[str, int]]:
    keys = sorted(set(before) | set(after), key=lambda k: (-abs(after.get(k, 0) - before.get(k, 0)), k))
    return [(k, after.get(k, 0) - before.get(k, 0)) for k in keys if after.get(k, 0) != before.get(k, 0)]


def compare_memory(baseline: Any, current: Any, current_label: str = "current",
                   fields: tuple[str, str] = (MEMORY_KEY, MEMORY_KEY),
                   tolerance: float | None = None) -> StructureVerdict:
    """The memory verdict of ``current`` against ``baseline`` (each a record or None), compared rank
    by rank (:func:`ddpbench.gates.structure.by_rank`), with the line naming what changed, e.g.
    ``peak +8.0 MiB: activations +8.0 MiB, at blocks.0 backward`` (``rank 1: ...`` where ranks
    differ). ``tolerance``: judge the measured CUDA max allocated too, a regression past that share
    above the baseline's (None: shown, not judged)."""
    read = read_both(baseline, current, current_label, fields, read_memory, "memory census")
    if isinstance(read, StructureVerdict):
        return read
    base, cur = read
    verdict = _with_unseen(by_rank(base, cur, current_label, lambda b, c: _compare_rank(b, c, current_label),
                                   "memory census"), base, cur)
    base_allocated, cur_allocated = (getattr(side.whole if isinstance(side, Ranks) else side, "allocated", None)
                                     for side in (base, cur))
    if base_allocated is None or cur_allocated is None or base_allocated == cur_allocated \
            or verdict.verdict is NOT_COUNTED:
        return verdict
    ratio = cur_allocated / base_allocated if base_allocated else math.inf
    text = f"measured max allocated {_delta(cur_allocated - base_allocated)} ({ratio:.3f}x)"
    if tolerance is not None and ratio > 1 + tolerance:
        parts = [verdict.line] if verdict.line else []
        if verdict.verdict is Verdict.IMPROVEMENT:
            parts.append("mixed: some figures up, some down (a regression)")
        return StructureVerdict(Verdict.REGRESSION, "; ".join(parts + [f"{text}, past the {tolerance * 100:g}% "
                                                                      f"tolerance"]))
    note = text + (" (shown, not judged)" if tolerance is None else f", within {tolerance * 100:g}%")
    return StructureVerdict(verdict.verdict, "; ".join(filter(None, [verdict.line, note])))


def _with_unseen(verdict: StructureVerdict, *sides: Any) -> StructureVerdict:
    """``verdict`` with what neither census counts named (the records' ``not_counted``), so that a
    `same` is read as far as it goes."""
    unseen = list(dict.fromkeys(item for side in sides
                                for item in getattr(side.whole if isinstance(side, Ranks) else side, "not_counted", ())))
    if not unseen or verdict.verdict is NOT_COUNTED:
        return verdict
    return StructureVerdict(verdict.verdict, "; ".join(filter(None, [verdict.line, "not counted: " + "; ".join(unseen)])))


def _compare_rank(base: MemoryCensus, cur: MemoryCensus, current_label: str) -> StructureVerdict:
    """One rank's memory censuses compared (or, for records that kept rank 0's alone, the case's).
    The totals decide (the peak, what stays after the step, whether the ranks agree); what held them
    is shown, not judged: the same bytes under another category (DDP's gradient_as_bucket_view turns
    the bucket copy into the gradients) are neither more nor less memory."""
    for fact in ("method", "device"):
        if getattr(base, fact) != getattr(cur, fact):
            return StructureVerdict(NOT_COUNTED, f"counted differently (baseline {fact} {getattr(base, fact)}, "
                                                 f"{current_label} {getattr(cur, fact)})")
    parts: list[str] = []
    peak_change = cur.peak - base.peak
    at_peak = _category_changes(base.at_peak, cur.at_peak)
    moved = peak_place(base) != peak_place(cur)
    up, down = peak_change > 0, peak_change < 0
    what = ", ".join(f"{_LABELS.get(k, k)} {_delta(d)}" for k, d in at_peak)
    if (peak_change or at_peak) and not moved:
        head = f"peak {_delta(peak_change)}" if peak_change else "peak same"
        parts.append(f"{head}: {what + ', ' if what else ''}{peak_place(cur)}")
    elif peak_change or at_peak:
        # Two peaks at different moments: a category's change is what held this peak against what
        # held the baseline's, not a change of that category in the step (gradients may be fewer
        # at an earlier moment of backward while the step holds as many).
        head = f"peak {_delta(peak_change)}" if peak_change else "peak same"
        held = f"; held at this peak against the baseline's: {what}" if what else ""
        parts.append(f"{head}, now {peak_place(cur)} (was {peak_place(base)}){held}")
    elif moved:
        parts.append(f"peak same, now {peak_place(cur)} (was {peak_place(base)})")
    after_change = cur.after - base.after
    kept = _category_changes(base.after_step, cur.after_step)
    what = ", ".join(f"{_LABELS.get(k, k)} {_delta(d)}" for k, d in kept)
    if after_change:
        parts.append(f"kept after the step {_delta(after_change)}" + (f" ({what})" if what else ""))
        up |= after_change > 0
        down |= after_change < 0
    elif kept:
        parts.append(f"kept after the step same ({what})")
    if base.ranks_disagree != cur.ranks_disagree:
        parts.append("the ranks' memory censuses disagree" if cur.ranks_disagree
                     else "the ranks' memory censuses agree again")
        up |= cur.ranks_disagree
        down |= not cur.ranks_disagree
    if up and down:
        parts.append("mixed: some figures up, some down (a regression)")
    elif not (up or down) and (at_peak or kept):
        parts.append("the same bytes held otherwise (shown, not judged)")
    verdict = Verdict.REGRESSION if up else Verdict.IMPROVEMENT if down else Verdict.SAME
    return StructureVerdict(verdict, "; ".join(parts))
