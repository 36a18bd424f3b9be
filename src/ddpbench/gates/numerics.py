"""The numerics verdict: two numerics records (seeded replays of a few steps) compared bitwise, a
difference judged against the band rounding-level perturbations of the baseline grow into, step by
step and per tensor group, and the figures rounding cannot move compared exactly
(docs/design/gates.md#the-numerics-verdict)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..engine.numerics import BACKWARD_GRAD, relative_difference, tensor_group, with_backward_grads
from ..storage.records import NUMERICS_KEY, Numerics, read_numerics
from .structure import NOT_COUNTED, StructureVerdict, read_both
from .verdict_words import Verdict

#: The words a numerics line starts with: its three outcomes (``not counted`` is the fourth answer).
SAME_BITWISE, ROUNDING, CHANGED = "same (bitwise)", "rounding", "changed"
#: The default relative tolerance: none beyond the measured band.
DEFAULT_TOLERANCE = 0.0
#: The band is this many times the largest difference the baseline's perturbed replays grew into:
#: a few replays' maximum understates what another draw of the same rounding reaches
#: (docs/results.md, "Numerics: the band", measures the spread of one draw against the others').
BAND_MARGIN = 4.0


@dataclass(frozen=True)
class NumericsVerdict(StructureVerdict):
    """The numerics verdict: ``outcome`` (same (bitwise), rounding, changed, not counted); where the
    bits differ, the tensors' largest relative difference, the band at the step and tensor group
    that decided, their ratio (difference / band: at most 1 is rounding; inf where only an exact
    figure moved), the first step whose difference the band resolves, and the exact figure that
    moved (``exact``: changed whatever the ratio); the tensors compared."""

    outcome: str = NOT_COUNTED
    difference: float | None = None
    band: float | None = None
    ratio: float | None = None
    resolving_step: int | None = None
    tensors: int | None = None
    exact: str | None = None  # the exact figure that moved, where one did

    def to_record(self) -> dict[str, Any]:
        """What a saved A/B record keeps beside ``numerics_verdict`` and ``numerics_line``."""
        out: dict[str, Any] = {"numerics_outcome": self.outcome}
        for key, value in (("numerics_difference", self.difference), ("numerics_band", self.band),
                           ("numerics_ratio", self.ratio), ("numerics_resolving_step", self.resolving_step),
                           ("numerics_tensors", self.tensors), ("numerics_exact", self.exact)):
            if value is not None:
                out[key] = value if not isinstance(value, float) or math.isfinite(value) else None
        return out


def _not_counted(line: str, tensors: int | None = None) -> NumericsVerdict:
    return NumericsVerdict(NOT_COUNTED, line, outcome=NOT_COUNTED, tensors=tensors)


def _relative(value: float) -> str:
    if not math.isfinite(value):
        return "inf (a figure moved from zero or stopped being finite)"
    return f"{value:.3g}" if value < 0.01 else f"{value:.3g} ({value * 100:.3g}%)"


def _ratio(value: float) -> str:
    if not math.isfinite(value):
        return "outside the band"
    return f"{value:.3g}x the band" if value >= 1 else f"{value:.2g} of the band"


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


def _scalar_text(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _exact_change(base: Numerics, cur: Numerics, steps: int, label: str) -> tuple[int, str] | None:
    """The first exact figure (a learning rate, a parameter count, what the workload names) that
    differs: (its step, a line's part), or None. Figures the baseline's perturbed replays moved are
    not exact."""
    if base.scalars is None or cur.scalars is None:
        return None
    moved = set(base.rounding_scalars)
    for s in range(steps):
        for r in range(min(len(base.ranks), len(cur.ranks))):
            before, after = base.scalars[r][s], cur.scalars[r][s]
            for name in sorted(set(before) | set(after)):
                if name in moved or before.get(name) == after.get(name):
                    continue
                old = "absent" if name not in before else _scalar_text(before[name])
                new = "absent" if name not in after else _scalar_text(after[name])
                where = f"step {s}" if s else "the set-up"
                return s, (f"{name} {old} → {new} at {where}" + (f" on rank {r}" if len(cur.ranks) > 1 else "")
                           + " (exact: rounding cannot move it)")
    return None


def _differs(base: Numerics, cur: Numerics, s: int) -> bool:
    for r in range(len(cur.ranks)):
        before, after = base.ranks[r][s], cur.ranks[r][s]
        if set(before) != set(after) or any(before[name][0] != figures[0] for name, figures in after.items()):
            return True
        if base.scalars is not None and cur.scalars is not None and base.scalars[r][s] != cur.scalars[r][s]:
            return True
    return False


def _band_at(base: Numerics, s: int, group: str, tolerance: float) -> tuple[float, str]:
    """The band at step ``s`` for ``group`` and what set it: what the baseline's perturbed replays
    grew into, at least one unit roundoff, times :data:`BAND_MARGIN`; or the tolerance. A record
    without a band (version 2) has its replays' spread for every step and group."""
    if base.band is None:
        spread = base.replay_spread
        return (spread, "its replays' spread") if spread >= tolerance and spread else (tolerance, "tolerance")
    # Never below one unit roundoff of the compute dtype: one rounding moves a figure that far, and the
    # few perturbed replays of a one-element group (the loss) may all land on the same value by chance.
    roundoff = 2.0 ** -(base.band_bits or 24)
    groups = base.band[s] if s < len(base.band) else {}
    # a gradient as the backward left it, where the baseline's replays kept none apart: its grad's band
    measured = BAND_MARGIN * max(groups.get(group, groups.get("grad", 0.0) if group == BACKWARD_GRAD else 0.0),
                                 roundoff)
    return (tolerance, "tolerance") if tolerance > measured else (measured, "band")


def compare_numerics(baseline: Any, current: Any, current_label: str = "current",
                     fields: tuple[str, str] = (NUMERICS_KEY, NUMERICS_KEY),
                     tolerance: float | None = None) -> NumericsVerdict:
    """The numerics verdict of ``current`` against ``baseline`` (each a record, read or not, or
    None). ``same`` with a line starting ``same (bitwise)`` when every tensor's digest and every
    exact figure is equal at every step on every rank; ``same`` starting ``rounding`` when the
    difference at each step and tensor group is within the baseline's band there (or
    ``tolerance``, relative; None: the default, none); else ``regression`` starting ``changed``,
    naming the first step that differs, the largest relative difference, the tensor that moved most
    and its ratio to the band. An exact figure that differs is ``changed`` whatever the band.
    ``not counted``: nothing to compare (no tensor, no step, other seeds or ranks), or steps whose
    replays differ by more than rounding (a step drawing numbers no seed reaches)."""
    read = read_both(baseline, current, current_label, fields, read_numerics, "numerics replay")
    if isinstance(read, StructureVerdict):
        outcome = CHANGED if read.verdict is Verdict.REGRESSION else NOT_COUNTED
        return NumericsVerdict(read.verdict, read.line, outcome=outcome)
    tensors = max(side.tensor_count for side in read)  # as recorded: a backward-grad left out is its grad
    recorded = read
    base, cur = (dataclasses.replace(side, ranks=[[with_backward_grads(step) for step in rank] for rank in side.ranks])
                 for side in read)
    tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    if len(base.ranks) != len(cur.ranks):
        return _not_counted(f"replayed on other ranks (baseline {len(base.ranks)}, {current_label} {len(cur.ranks)})")
    if base.seed is not None and cur.seed is not None and base.seed != cur.seed:
        return _not_counted(f"replayed from other seeds (baseline {base.seed}, {current_label} {cur.seed})")
    steps = min(len(base.digests), len(cur.digests))
    if steps < 2:
        return _not_counted("the replay ran no step (--dist-numerics-steps 0 or a record of none)", tensors)
    if not tensors:
        return _not_counted("the replays compared no tensor: the state the replay sees holds none (a workload's "
                            "numerics_targets names what to fingerprint)", 0)
    note = "" if base.steps == cur.steps else f" (the first {steps - 1} of {base.steps} and {cur.steps} steps)"
    ranks = len(cur.ranks)
    of = (f"{steps - 1} step{'s' if steps != 2 else ''} on {ranks} rank{'s' if ranks != 1 else ''}, "
          f"{tensors} tensor{'s' if tensors != 1 else ''}")
    differing = [s for s in range(steps) if _differs(base, cur, s)]
    if not differing:
        return NumericsVerdict(Verdict.SAME, f"{SAME_BITWISE}: {of}{note}", outcome=SAME_BITWISE, tensors=tensors)
    first = differing[0]
    where = "the freshly set-up state" if first == 0 else f"step {first} of {steps - 1}"
    sets = _tensor_sets(*recorded, steps)
    nondeterministic = [x for x in (base.first_nondeterministic_step, cur.first_nondeterministic_step) if x is not None]
    exact = _exact_change(base, cur, min(nondeterministic, default=steps), current_label)
    if sets is not None and (exact is None or sets[0] < exact[0]):
        step, only_base, only_cur = sets
        what = "; ".join(part for part in (only_base and f"only the baseline holds {_names(only_base)}",
                                           only_cur and f"only the {current_label} holds {_names(only_cur)}") if part)
        return NumericsVerdict(Verdict.REGRESSION, f"{CHANGED} from {where}: other tensors at "
                                                   f"{'the set-up' if step == 0 else f'step {step}'} ({what})",
                               outcome=CHANGED, resolving_step=step, tensors=tensors)
    # Steps whose replays differ within one run decide nothing: a band from a few replays of a step
    # that draws numbers no seed reaches (or runs nondeterministic kernels) cannot bound a change.
    cutoff = steps
    if nondeterministic:
        cutoff = min(nondeterministic)
        spread = max(base.replay_spread, cur.replay_spread)
        why = (f"its replays differ from step {cutoff}, by up to {_relative(spread)}: the step draws numbers no "
               f"seed reaches (np.random.default_rng(), the clock) or runs nondeterministic kernels "
               f"(torch.use_deterministic_algorithms)")
        if first >= cutoff and exact is None:
            return _not_counted(f"bits differ from {where}, but {why}; from there nothing is counted{note}", tensors)
        note += f"; steps from {cutoff} not counted ({why})"
    judged = _judge_tensors(base, cur, first, cutoff, tolerance)  # over the tensors both sides hold
    if exact is not None:  # changed whatever the band; the tensors' own ratio beside it
        step, what = exact
        line = f"{CHANGED} from {where}: {what}"
        fields_: dict[str, Any] = dict(ratio=math.inf, resolving_step=step)
        if judged is not None:
            line += f"; tensors: {judged['largest']}, {_ratio(judged['ratio'])} ({judged['against']})"
            fields_.update(difference=judged["difference"], band=judged["band"], ratio=judged["ratio"],
                           resolving_step=min(step, judged["resolving"] if judged["resolving"] is not None else step))
        return NumericsVerdict(Verdict.REGRESSION, line + note, outcome=CHANGED, exact=what, tensors=tensors,
                               **fields_)
    if judged is None:  # every figure equal, the bits not: elements moved
        return NumericsVerdict(Verdict.REGRESSION, f"{CHANGED} from {where}: the bits differ, every figure is "
                                                   f"equal (elements moved){note}", outcome=CHANGED,
                               resolving_step=first, tensors=tensors)
    fields_ = dict(difference=judged["difference"], band=judged["band"], ratio=judged["ratio"], tensors=tensors)
    if judged["ratio"] <= 1:
        return NumericsVerdict(Verdict.SAME, f"{ROUNDING}: bits differ from {where}, {judged['largest']}; at most "
                                             f"{_ratio(judged['ratio'])} ({judged['against']}){note}",
                               outcome=ROUNDING, **fields_)
    line = f"{CHANGED} from {where}"
    if judged["first_at"] is not None and judged["at"] != (first, judged["first_at"]):
        line += f" (there most in {judged['first_at']}, {_relative(judged['first_worst'])})"
    line += f": {judged['largest']}; {_ratio(judged['ratio'])} ({judged['against']})"
    if judged["resolving"] is not None and judged["resolving"] != judged["band_step"]:
        line += f", first past it at step {judged['resolving']}"
    before_loss, after_loss = _loss(base.ranks, max(first, 1)), _loss(cur.ranks, max(first, 1))
    if before_loss is not None and after_loss is not None and before_loss != after_loss:
        line += f"; loss at step {max(first, 1)} {before_loss:.6g} → {after_loss:.6g}"
    return NumericsVerdict(Verdict.REGRESSION, line + note, outcome=CHANGED, resolving_step=judged["resolving"],
                           **fields_)


def _judge_tensors(base: Numerics, cur: Numerics, first: int, cutoff: int, tolerance: float) -> dict[str, Any] | None:
    """The tensors' differences from step ``first`` to before ``cutoff`` against the band, step by step
    and per group: the largest difference (and where), the worst ratio (difference / band), the band
    and what set it there, the first step past its band; None where no tensor's figures differ."""
    ranks = len(cur.ranks)
    worst, at = 0.0, None  # the largest difference: (step, rank, tensor)
    first_worst, first_at = 0.0, None  # the largest at the first differing step
    per_group: dict[tuple[int, str], float] = {}
    for r in range(ranks):
        for s in range(first, cutoff):
            for name, figures in cur.ranks[r][s].items():
                before = base.ranks[r][s].get(name)
                if before is None or before[0] == figures[0]:  # one only the current holds: named elsewhere
                    continue
                diff = relative_difference(before, figures)
                key = (s, tensor_group(name))
                per_group[key] = max(per_group.get(key, 0.0), diff)
                if at is None or diff > worst:
                    worst, at = diff, (s, r, name)
                if s == first and (first_at is None or diff > first_worst):
                    first_worst, first_at = diff, name
    decided = None  # (ratio, step, group, difference, band, what set the band)
    resolving = None
    # step by step; at a tie the gradient the step received is named before the backward's copy of it
    for (s, group), diff in sorted(per_group.items(), key=lambda item: (item[0][0], item[0][1] == BACKWARD_GRAD,
                                                                        item[0][1])):
        band, source = _band_at(base, s, group, tolerance)
        ratio = diff / band if band else (math.inf if diff else 0.0)
        if ratio > 1 and resolving is None:
            resolving = s
        if decided is None or ratio > decided[0]:
            decided = (ratio, s, group, diff, band, source)
    if at is None or decided is None:
        return None
    ratio, s_band, group, diff_band, band, source = decided
    s, r, name = at
    largest = (f"largest relative difference {_relative(worst)} in {name} at step {s}"
               + (f" on rank {r}" if ranks > 1 else ""))
    if source == "tolerance" and tolerance:
        against = f"tolerance {tolerance * 100:g}%"
    elif base.band is None:
        against = (f"the baseline's own replays differ by up to {_relative(base.replay_spread)}" if band else
                   "the baseline measured no band and its replays are bitwise equal: any bit counts")
    elif band:
        against = f"{group} at step {s_band}: {_relative(diff_band)} against a band of {_relative(band)}"
    else:  # a record whose band is none at all
        against = f"{group} at step {s_band}: no band"
    return {"difference": worst, "at": (s, name), "largest": largest, "first_at": first_at,
            "first_worst": first_worst, "ratio": ratio, "band": band, "band_step": s_band, "against": against,
            "resolving": resolving}
