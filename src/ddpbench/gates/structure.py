"""The structural verdict: two census records (what one step of a case launches) compared exactly
(docs/design/gates.md#the-structural-verdict)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ..storage.per_rank import ranks_text
from ..storage.records import CENSUS_KEY, Census, Ranks, RecordError, partially_counted, read_census
from .verdict_words import COMPONENT_VERDICTS, Verdict

NOT_COUNTED = Verdict.NOT_COUNTED
STRUCTURE_VERDICTS = COMPONENT_VERDICTS


@dataclass(frozen=True)
class StructureVerdict:
    """A case's structural verdict: one of :data:`STRUCTURE_VERDICTS`, the line naming each
    change (or why it was not counted), and whether a regression was accepted as made on purpose."""

    verdict: Verdict
    line: str = ""
    accepted: bool = False

    def __post_init__(self):
        if self.verdict not in STRUCTURE_VERDICTS:
            raise ValueError(f"unknown structural verdict {self.verdict!r}; expected one of "
                             f"{', '.join(STRUCTURE_VERDICTS)}")
        object.__setattr__(self, "verdict", Verdict(self.verdict))  # the word, as a member

    @property
    def fails(self) -> bool:
        """A structural regression nobody accepted: it fails the gate whatever the timing says."""
        return self.verdict is Verdict.REGRESSION and not self.accepted

    def cell(self) -> str:
        """The report's "structure" column."""
        word = self.verdict + (", accepted" if self.accepted else "")
        return f"{word}: {self.line}" if self.line else word


# ----------------------------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------------------------


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def size_text(nbytes: float) -> str:
    """Bytes in binary units: 512 B, 64.0 KiB, 1.0 MiB, 2.5 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{_number(nbytes)} B"


def _delta(nbytes: float) -> str:
    return ("+" if nbytes > 0 else "-") + size_text(abs(nbytes))


def _sizes_text(sizes: tuple[float, ...]) -> str:
    if len(sizes) <= 4:
        return ", ".join(size_text(s) for s in sizes) or "none"
    return f"{size_text(sizes[0])} to {size_text(sizes[-1])}"


class _Changes:
    """What differs, as words, and which way each figure went."""

    def __init__(self):
        self.parts: list[str] = []
        self.up = self.down = self.unranked = False

    def note(self, text: str, more: float = 0, reshaped: bool = False) -> None:
        self.parts.append(text)
        self.up |= more > 0
        self.down |= more < 0
        self.unranked |= reshaped


def _label(key) -> str:
    """An entry's name in the line: ``all_reduce float32 in a group of 2`` (the group's size: a
    collective is keyed by its group), the group named when it is not the default one, and the
    peer: ``send float32 in mesh_tp (a group of 4) to +1``."""
    kind, dtype, size, group, peer = key
    if group is not None and group != "world":
        text = f"{kind} {dtype} in {group} (a group of {size})"
    else:
        text = f"{kind} {dtype} in a group of {size}"
    if peer is not None:
        direction = "from" if kind == "recv" else "to"
        text += f" {direction} any rank" if peer == "any" else f" {direction} {peer:+d}"
    return text


def _collective(changes: _Changes, unjudged: list[str], key, before, after) -> None:
    (count0, bytes0, calls0, data0), (count1, bytes1, calls1, data1) = before, after
    data = data1 or data0
    if data:  # the bytes follow the data: only the calls are judged
        if count0 != count1:
            changes.note(f"{_label(key)}: {_number(count0)} → {_number(count1)} per step "
                         f"({data}: bytes not judged)", more=count1 - count0)
        elif bytes0 != bytes1 or calls0 != calls1:
            unjudged.append(f"{_label(key)}: {_delta(bytes1 - bytes0) if bytes0 != bytes1 else 'other sizes'} "
                            f"({data}: bytes depend on the data, not judged)")
        return
    if (count0, bytes0) == (count1, bytes1) and (calls0 is None or calls1 is None or calls0 == calls1):
        return
    label = f"{_label(key)}: "
    calls = (f"{_number(count0)} → {_number(count1)} per step" if count0 != count1
             else f"{_number(count1)} per step")
    if bytes0 != bytes1:
        text = f"{label}{calls}, {_delta(bytes1 - bytes0)}"
    elif count0 != count1:
        text = f"{label}{calls}, same bytes"
    else:
        text = f"{label}{calls}, same bytes in other sizes ({_sizes_text(calls0)} → {_sizes_text(calls1)})"
    directions = [count1 - count0, bytes1 - bytes0]
    changes.note(text, reshaped=(count0, bytes0) == (count1, bytes1))
    changes.up |= any(d > 0 for d in directions)
    changes.down |= any(d < 0 for d in directions)


def _buckets(changes: _Changes, before: tuple[float, ...], after: tuple[float, ...]) -> None:
    if before == after:
        return
    total = sum(after) - sum(before)
    text = f"buckets {len(before)} → {len(after)}" if len(before) != len(after) else f"buckets {len(after)}"
    if total:
        text += f", {_delta(total)}"
    elif len(before) == len(after):
        text += f" in other sizes ({_sizes_text(before)} → {_sizes_text(after)})"
    changes.note(text, reshaped=not total and len(before) == len(after))
    changes.up |= len(after) > len(before) or total > 0
    changes.down |= len(after) < len(before) or total < 0


def _key_order(key) -> tuple:
    kind, dtype, size, group, peer = key
    return kind, dtype, size, group or "", (0, peer) if isinstance(peer, int) else (1, str(peer))


def _uncounted(sides: dict[str, Any]) -> StructureVerdict:
    """The verdict where a side's record is not counted (``sides``: each side's read record, a
    :class:`NotCounted` or None): a record that misses part of the step against one counted in full
    is a regression until accepted, since nothing counted partially is judged as whole; else
    ``not counted``."""
    other = [f"{name}: {why}" for name, why in sides.items() if isinstance(why, str)]
    counted = [name for name, read in sides.items() if read is not None and not isinstance(read, str)]
    partial = [name for name, read in sides.items() if getattr(read, "partial", False)]
    if len(counted) == 1 and partial:
        return StructureVerdict(Verdict.REGRESSION, f"counted in full on the {counted[0]} only ({'; '.join(other)}): "
                                                    f"a regression until accepted")
    return StructureVerdict(NOT_COUNTED, "; ".join(other))


def read_both(baseline: Any, current: Any, current_label: str, fields: tuple[str, str],
              reader: Callable[[Any, str], Any], what: str):
    """Both sides' records read by ``reader`` (which returns the read record, or a string saying why
    it is not counted; a record read already is returned as it is), as (baseline, current); or the
    ``not counted`` verdict when a side recorded none or cannot be counted (a regression where one
    side's record misses part of the step and the other's does not: :func:`_uncounted`).
    :class:`RecordError` for a malformed record names its side."""
    sides = {"baseline": baseline, current_label: current}
    absent = [name for name, record in sides.items() if record is None]
    if absent:
        return StructureVerdict(NOT_COUNTED, f"the {absent[0]} recorded no {what}" if len(absent) == 1
                                else f"neither side recorded a {what}")
    read = {}
    for (name, record), field in zip(sides.items(), fields):
        try:
            read[name] = reader(record, field)
        except RecordError as exc:
            raise RecordError(str(exc), name) from None
    if any(isinstance(why, str) for why in read.values()):
        return _uncounted(read)
    return read["baseline"], read[current_label]


# ----------------------------------------------------------------------------------------------
# Rank by rank
# ----------------------------------------------------------------------------------------------


def _ranks_label(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ranks_text(ranks)


def by_rank(base: Any, cur: Any, current_label: str, judge: Callable[[Any, Any], StructureVerdict],
            what: str) -> StructureVerdict:
    """Two records judged rank by rank: ``judge(baseline's, current's)`` for each rank's pair of
    records (each pair of groups once, however many ranks share it). Where a side kept rank 0's
    record alone (an older run) rank 0's are judged, as :class:`Ranks`' ``whole``. The verdict: a
    regression on any rank is one, naming the ranks; every rank alike reads as one rank's line."""
    if not (isinstance(base, Ranks) and isinstance(cur, Ranks)):
        base_one, cur_one = (side.whole if isinstance(side, Ranks) else side for side in (base, cur))
        sides = {"baseline": base_one, current_label: cur_one}
        if any(isinstance(read, str) for read in sides.values()):
            return _uncounted(sides)
        verdict = judge(base_one, cur_one)
        if getattr(cur_one, "ranks_disagree", False) and getattr(base_one, "ranks_disagree", False):
            kept = [name for name, side in (("baseline", base), (current_label, cur)) if not isinstance(side, Ranks)]
            return _joined(verdict, f"rank 0's {what} compared: the ranks disagree on both sides and "
                                    f"{'the ' + kept[0] if len(kept) == 1 else 'both'} kept rank 0's alone")
        return verdict
    if base.count != cur.count:
        return StructureVerdict(NOT_COUNTED, f"the baseline kept the {what} of {base.count} ranks, the "
                                             f"{current_label} of {cur.count}")
    pairs: dict[tuple[int, int], list[int]] = {}
    base_at, cur_at = _group_of(base), _group_of(cur)
    for rank in range(base.count):
        pairs.setdefault((base_at[rank], cur_at[rank]), []).append(rank)
    results: dict[StructureVerdict, list[int]] = {}
    for (i, j), ranks in pairs.items():
        b, c = base.groups[i][1], cur.groups[j][1]
        if b is None or c is None or isinstance(b, str) or isinstance(c, str):
            sides = {"baseline": _recorded(b, what), current_label: _recorded(c, what)}
            verdict = _uncounted(sides)
        else:
            verdict = judge(b, c)
        results.setdefault(verdict, []).extend(ranks)
    if len(results) == 1:
        return next(iter(results))
    words = {verdict.verdict for verdict in results}
    word = next(w for w in (Verdict.REGRESSION, NOT_COUNTED, Verdict.IMPROVEMENT, Verdict.SAME) if w in words)
    parts = [f"{_ranks_label(sorted(ranks))}: {verdict.line or verdict.verdict}"
             for verdict, ranks in sorted(results.items(), key=lambda item: min(item[1]))
             if verdict.verdict is not Verdict.SAME or verdict.line]
    return StructureVerdict(word, "; ".join(parts))


def _group_of(ranks: Ranks) -> list[int]:
    at = [0] * ranks.count
    for i, (members, _) in enumerate(ranks.groups):
        for rank in members:
            at[rank] = i
    return at


def _recorded(read: Any, what: str) -> Any:
    """A rank's record as :func:`_uncounted` weighs it: one a rank did not record misses part of the case."""
    return partially_counted(f"that rank recorded no {what}") if read is None else read


def _joined(verdict: StructureVerdict, note: str) -> StructureVerdict:
    return StructureVerdict(verdict.verdict, "; ".join(filter(None, [verdict.line, note])), verdict.accepted)


# ----------------------------------------------------------------------------------------------
# One rank's censuses
# ----------------------------------------------------------------------------------------------


def _judged(collectives: dict) -> frozenset:
    """What the verdict judges of a step's collectives: per entry its calls, and its bytes and
    sizes unless they depend on the data."""
    return frozenset((key, count) + ((None, None) if data else (nbytes, calls))
                     for key, (count, nbytes, calls, data) in collectives.items())


def _compare_collectives(changes: _Changes, unjudged: list[str], before: dict, after: dict, prefix: str = "") -> None:
    step_changes, step_unjudged = _Changes(), []
    for key in sorted(set(before) | set(after), key=_key_order):
        b, a = before.get(key), after.get(key)
        none = (0, 0, (), (b or a)[3])
        _collective(step_changes, step_unjudged, key, b or none, a or none)
    changes.parts.extend(prefix + part for part in step_changes.parts)
    changes.up |= step_changes.up
    changes.down |= step_changes.down
    changes.unranked |= step_changes.unranked
    unjudged.extend(prefix + part for part in step_unjudged)


def _compare_steps(changes: _Changes, unjudged: list[str], base: Census, cur: Census, current_label: str) -> None:
    """Each step's collectives, where a side's vary between steps: the census's first op may fall
    in another phase of the cycle on each side, so the steps are lined up at the rotation that
    leaves the fewest steps differing (no rotation needed: the same)."""
    n = len(base.steps or cur.steps)
    if base.steps is not None and cur.steps is not None and len(base.steps) != len(cur.steps):
        unjudged.append(f"steps counted: {len(base.steps)} on the baseline, {len(cur.steps)} on the "
                        f"{current_label}; their average per step compared")
        _compare_collectives(changes, unjudged, base.collectives, cur.collectives)
        return
    before = base.steps or (base.collectives,) * n
    after = cur.steps or (cur.collectives,) * n
    judged_before, judged_after = [_judged(step) for step in before], [_judged(step) for step in after]
    shift = min(range(n), key=lambda k: sum(judged_before[i] != judged_after[(i + k) % n] for i in range(n)))
    for i in range(n):
        _compare_collectives(changes, unjudged, before[i], after[(i + shift) % n], f"step {i + 1} of {n}: ")


def _compare_one(base: Census, cur: Census, current_label: str) -> StructureVerdict:
    if base.version != cur.version:
        return StructureVerdict(NOT_COUNTED, f"census versions differ (baseline {base.version}, {current_label} "
                                             f"{cur.version}): version 1 tells neither process groups nor "
                                             f"peers apart and never checked for unseen collectives; "
                                             f"record both sides with one ddpbench to compare them")
    if base.method != cur.method:
        return StructureVerdict(NOT_COUNTED, f"counted differently (baseline {base.method}, "
                                             f"{current_label} {cur.method})")
    changes, unjudged = _Changes(), []
    if base.steps is None and cur.steps is None:
        _compare_collectives(changes, unjudged, base.collectives, cur.collectives)
    else:
        _compare_steps(changes, unjudged, base, cur, current_label)
    if base.buckets is not None and cur.buckets is not None:
        _buckets(changes, base.buckets, cur.buckets)
    for name, before, after in (("graph breaks", base.graph_breaks, cur.graph_breaks),
                                ("recompiles", base.recompiles, cur.recompiles)):
        if before is not None and after is not None and before != after:
            changes.note(f"{name} {_number(before)} → {_number(after)}", more=after - before)
    if base.ranks_disagree != cur.ranks_disagree:
        changes.note("the ranks disagree on the collectives" if cur.ranks_disagree
                     else "the ranks agree on the collectives again", more=1 if cur.ranks_disagree else -1)
    for name, before, after in (("DDP buckets", base.buckets, cur.buckets),
                                ("graph breaks", base.graph_breaks, cur.graph_breaks),
                                ("recompiles", base.recompiles, cur.recompiles)):
        if (before is None) != (after is None):
            unjudged.append(f"{name} counted in the {'baseline' if after is None else current_label} only")
    if base.kernel_launches is not None and cur.kernel_launches is not None \
            and base.kernel_launches != cur.kernel_launches:
        unjudged.append(f"CUDA kernel launches {_number(base.kernel_launches)} → "
                        f"{_number(cur.kernel_launches)} (reported, not judged)")
    if changes.up and changes.down:
        changes.parts.append("mixed: some figures up, some down (a regression)")
    elif changes.unranked and not changes.up and not changes.down:
        changes.parts.append("neither more nor fewer (a regression until accepted)")
    verdict = (Verdict.REGRESSION if changes.up or changes.unranked else Verdict.IMPROVEMENT if changes.down
               else Verdict.SAME)
    return StructureVerdict(verdict, "; ".join(changes.parts + unjudged))


def compare_census(baseline: Any, current: Any, current_label: str = "current",
                   fields: tuple[str, str] = (CENSUS_KEY, CENSUS_KEY)) -> StructureVerdict:
    """The structural verdict of ``current`` against ``baseline`` (each a census, read or not, or
    None) with the line naming each change, e.g. ``all_reduce float32 in a group of 2: 3 → 4 per step,
    +1.0 MiB; buckets 2 → 4``, compared rank by rank (``rank 1: send float32 in a group of 3 to +1: 1 →
    2 per step, ...``
    where ranks differ) and, where the steps' collectives vary, step by step; :class:`RecordError`
    for a malformed one, naming its side and its field (``fields``: how each side's census is named
    in a message, baseline's first)."""
    read = read_both(baseline, current, current_label, fields, read_census, "census")
    if isinstance(read, StructureVerdict):
        return read
    return by_rank(*read, current_label, lambda base, cur: _compare_one(base, cur, current_label), "census")


def accept(verdict: StructureVerdict) -> StructureVerdict:
    """The verdict with a regression accepted as made on purpose (an option of the gate)."""
    if verdict.verdict is not Verdict.REGRESSION:
        return verdict
    return dataclasses.replace(verdict, accepted=True)  # a subclass (the numerics verdict) keeps its figures
