"""The structural verdict: two census records (what one step of a case launches) compared exactly
(docs/design/gates.md#the-structural-verdict)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..storage.records import CENSUS_KEY, RecordError, read_census
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


def read_both(baseline: Any, current: Any, current_label: str, fields: tuple[str, str],
              reader: Callable[[Any, str], Any], what: str):
    """Both sides' records read by ``reader`` (which returns the read record, or a string saying why
    it is not counted; a record read already is returned as it is), as (baseline, current); or the
    ``not counted`` verdict when a side recorded none or cannot be counted. :class:`RecordError`
    for a malformed record names its side."""
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
    other = [f"{name}: {why}" for name, why in read.items() if isinstance(why, str)]
    if other:
        return StructureVerdict(NOT_COUNTED, "; ".join(other))
    return read["baseline"], read[current_label]


def compare_census(baseline: Any, current: Any, current_label: str = "current",
                   fields: tuple[str, str] = (CENSUS_KEY, CENSUS_KEY)) -> StructureVerdict:
    """The structural verdict of ``current`` against ``baseline`` (each a census, read or not, or
    None) with the line naming each change, e.g. ``all_reduce float32 in a group of 2: 3 → 4 per
    step, +1.0 MiB; buckets 2 → 4``; :class:`RecordError` for a malformed one, naming its side and its field
    (``fields``: how each side's census is named in a message, baseline's first)."""
    read = read_both(baseline, current, current_label, fields, read_census, "census")
    if isinstance(read, StructureVerdict):
        return read
    base, cur = read
    if base.version != cur.version:
        return StructureVerdict(NOT_COUNTED, f"census versions differ (baseline {base.version}, {current_label} "
                                             f"{cur.version}): version 1 tells neither process groups nor "
                                             f"peers apart and never checked for unseen collectives; "
                                             f"record both sides with one ddpbench to compare them")
    if base.method != cur.method:
        return StructureVerdict(NOT_COUNTED, f"counted differently (baseline {base.method}, "
                                             f"{current_label} {cur.method})")
    changes, unjudged = _Changes(), []
    for key in sorted(set(base.collectives) | set(cur.collectives), key=_key_order):
        before, after = base.collectives.get(key), cur.collectives.get(key)
        none = (0, 0, (), (before or after)[3])
        _collective(changes, unjudged, key, before or none, after or none)
    if base.buckets is not None and cur.buckets is not None:
        _buckets(changes, base.buckets, cur.buckets)
    for name, before, after in (("graph breaks", base.graph_breaks, cur.graph_breaks),
                                ("recompiles", base.recompiles, cur.recompiles)):
        if before is not None and after is not None and before != after:
            changes.note(f"{name} {_number(before)} → {_number(after)}", more=after - before)
    if base.ranks_disagree != cur.ranks_disagree:
        changes.note("the ranks disagree on the collectives" if cur.ranks_disagree
                     else "the ranks agree on the collectives again", more=1 if cur.ranks_disagree else -1)
    elif cur.ranks_disagree:
        unjudged.append("rank 0's census compared; the ranks disagree on both sides")
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


def accept(verdict: StructureVerdict) -> StructureVerdict:
    """The verdict with a regression accepted as made on purpose (an option of the gate)."""
    if verdict.verdict is not Verdict.REGRESSION:
        return verdict
    return StructureVerdict(verdict.verdict, verdict.line, accepted=True)
