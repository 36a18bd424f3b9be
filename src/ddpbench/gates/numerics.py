"""The numerics verdict: two numerics records (seeded replays of a few steps) compared bitwise, a
difference measured against the baseline's own replay-to-replay band (docs/design/gates.md#the-numerics-verdict)."""

from __future__ import annotations

import math
from typing import Any

from ..engine.numerics import relative_difference
from ..storage.records import NUMERICS_KEY, Numerics, read_numerics
from .structure import NOT_COUNTED, StructureVerdict, read_both
from .verdict_words import Verdict

#: The words a numerics line starts with.
SAME_BITWISE, WITHIN_NOISE, CHANGED = "same (bitwise)", "within noise", "changed"
#: The default relative tolerance: none. Every difference the baseline's own replays do not show is
#: a change (docs/results.md, "Numerics": CPU gloo replays are bitwise equal, and a bucket size or a
#: compression hook that only reorders sums moves figures by 1e-8 to 1e-3, which a team decides on).
DEFAULT_TOLERANCE = 0.0


def _relative(value: float) -> str:
    if not math.isfinite(value):
        return "inf (a figure moved from zero or stopped being finite)"
    return f"{value:.3g}" if value < 0.01 else f"{value:.3g} ({value * 100:.3g}%)"


def _loss(ranks: list[list[dict[str, list]]], step: int) -> float | None:
    figures = ranks[0][step].get("loss") if ranks and step < len(ranks[0]) else None
    return None if figures is None else figures[3]


def _tensor_sets(base: Numerics, cur: Numerics, steps: int) -> tuple[int, list[str], list[str]] | None:
    """The first step where the two sides fingerprinted other tensors: (step, only the baseline's,
    only the current's), or None."""
    for s in range(steps):
        for r in range(min(len(base.ranks), len(cur.ranks))):
            before, after = set(base.ranks[r][s]), set(cur.ranks[r][s])
            if before != after:
                return s, sorted(before - after), sorted(after - before)
    return None


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def compare_numerics(baseline: Any, current: Any, current_label: str = "current",
                     fields: tuple[str, str] = (NUMERICS_KEY, NUMERICS_KEY),
                     tolerance: float | None = None) -> StructureVerdict:
    """The numerics verdict of ``current`` against ``baseline`` (each a record, read or not, or
    None): ``same`` with a line starting ``same (bitwise)`` when every step's digest over every
    rank is equal; ``same`` starting ``within noise`` when they differ by no more than the
    baseline's own replay-to-replay band or ``tolerance`` (relative; None: the default, none);
    else ``regression`` starting ``changed``, naming the first step that differs, the largest
    relative difference and the tensor that moved most."""
    read = read_both(baseline, current, current_label, fields, read_numerics, "numerics replay")
    if isinstance(read, StructureVerdict):
        return read
    base, cur = read
    tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    if len(base.ranks) != len(cur.ranks):
        return StructureVerdict(NOT_COUNTED, f"replayed on other ranks (baseline {len(base.ranks)}, "
                                             f"{current_label} {len(cur.ranks)})")
    steps = min(len(base.digests), len(cur.digests))
    note = "" if base.steps == cur.steps else f" (the first {steps - 1} of {base.steps} and {cur.steps} steps)"
    of = f"{steps - 1} step{'s' if steps != 2 else ''} on {len(cur.ranks)} rank{'s' if len(cur.ranks) != 1 else ''}"
    differing = [s for s in range(steps) if base.digests[s] != cur.digests[s]]
    if not differing:
        return StructureVerdict(Verdict.SAME, f"{SAME_BITWISE}: {of}{note}")
    first = differing[0]
    where = "the freshly set-up state" if first == 0 else f"step {first} of {steps - 1}"
    sets = _tensor_sets(base, cur, steps)
    if sets is not None:
        step, only_base, only_cur = sets
        what = "; ".join(part for part in (only_base and f"only the baseline holds {_names(only_base)}",
                                           only_cur and f"only the {current_label} holds {_names(only_cur)}") if part)
        return StructureVerdict(Verdict.REGRESSION, f"{CHANGED} from {where}: other tensors at "
                                                    f"{'the set-up' if step == 0 else f'step {step}'} ({what})")
    worst, at, first_worst, first_at = 0.0, None, 0.0, None
    for r in range(len(cur.ranks)):
        for s in range(first, steps):
            for name, figures in cur.ranks[r][s].items():
                before = base.ranks[r][s][name]
                if before[0] == figures[0]:
                    continue
                diff = relative_difference(before, figures)
                if at is None or diff > worst:
                    worst, at = diff, (s, r, name)
                if s == first and (first_at is None or diff > first_worst):
                    first_worst, first_at = diff, name
    band = max(base.replay_spread, tolerance)
    if band > 0 and worst <= band:
        why = (f"the baseline's own replays differ by up to {_relative(base.replay_spread)}"
               if base.replay_spread >= tolerance else f"tolerance {tolerance * 100:g}%")
        return StructureVerdict(Verdict.SAME, f"{WITHIN_NOISE}: bits differ from {where}, largest relative "
                                              f"difference {_relative(worst)} ({why}){note}")
    line = f"{CHANGED} from {where}"
    if at is not None:
        s, r, name = at
        if first_at is not None and (s, name) != (first, first_at):
            line += f" (there most in {first_at}, {_relative(first_worst)})"
        line += (f": largest relative difference {_relative(worst)} in {name} at step {s}"
                 + (f" on rank {r}" if len(cur.ranks) > 1 else ""))
    else:
        line += ": the bits differ, every figure is equal (elements moved)"
    before_loss, after_loss = _loss(base.ranks, max(first, 1)), _loss(cur.ranks, max(first, 1))
    if before_loss is not None and after_loss is not None and before_loss != after_loss:
        line += f"; loss at step {max(first, 1)} {before_loss:.6g} → {after_loss:.6g}"
    if band > 0:
        line += (f"; past the baseline's own replay band {_relative(base.replay_spread)}"
                 if base.replay_spread >= tolerance else f"; past tolerance {tolerance * 100:g}%")
    return StructureVerdict(Verdict.REGRESSION, line + note)
