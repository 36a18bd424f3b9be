"""The records ddpbench writes into a saved run, each shape declared once (a :class:`Shape`: a table
of fields) with its reader. A run read back goes through the readers once (:mod:`.runs`); a field
that does not hold what its shape says is a :class:`RecordError` naming it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..verdict_words import CASE_VERDICTS, TIMING_VERDICTS, Verdict
from . import per_rank

# Where each record is kept. In a case's extra_info:
CENSUS_KEY = "census"  # the case's census (the candidate's in A/B mode)
MEMORY_KEY = "memory"  # the case's memory census (the candidate's in A/B mode)
NUMERICS_KEY = "numerics"  # the case's numerics replay (the candidate's in A/B mode)
POOL_SPLIT_KEY = "pool_split"  # the pools a case's rounds were split across (:func:`read_pool_split`)
AB_KEY = "ab"  # an A/B case's verdict, its figures and the baseline's records
# In extra_info["ab"]:
BASELINE_CENSUS_KEY = "census_baseline"
BASELINE_MEMORY_KEY = "memory_baseline"
BASELINE_NUMERICS_KEY = "numerics_baseline"
# At the run's top level:
RUN_KEY = "ddpbench_run"  # whether the run measured everything it set out to (:func:`run_record`)
LOST_CASES_KEY = "ddpbench_ab_lost"  # the cases an A/B candidate lost: they have no benchmark entry
CALIBRATION_KEY = "ddpbench_calibration"  # the machine-drift calibration (ddpbench.gates.calibration)
# In machine_info:
MACHINE_INFO_KEY = CALIBRATION_KEY  # where runs saved before the calibration moved out kept it
# The run's facts, what decides its cases' measurements (ddpbench.storage.run_facts); the key keeps
# the name it was first saved under.
RUN_FACTS_KEY = FINGERPRINT_KEY = "ddpbench_fingerprint"

READABLE_CENSUS_VERSIONS = (1, 2)  # version 1: entries keyed by kind, dtype and group size only
MEMORY_VERSION = 1
NUMERICS_VERSION = 3
# version 1: each rank's steps as {name: [figures]}, names at every step; version 2: no exact figures, band
# or spread per group (its replays' spread is its band)
READABLE_NUMERICS_VERSIONS = (1, 2, 3)
RUN_FACTS_VERSION = FINGERPRINT_VERSION = 1


class RecordError(ValueError):
    """A record whose field does not hold what its shape says; the message names the field
    (``census.collectives[0].count is -1, expected a number >= 0``). ``side``: which side's record
    it is, when two were compared; ``record``: which of a case's records (its extra_info key)."""

    def __init__(self, message: str, side: str | None = None, record: str | None = None):
        super().__init__(message)
        self.side, self.record = side, record


# ----------------------------------------------------------------------------------------------
# Declaring a shape
# ----------------------------------------------------------------------------------------------


def shown(value: Any) -> str:
    """A value as a message quotes it: its repr, cut short past 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Kind:
    """What a value may hold: ``accepts`` tests it, ``wanted`` says it in a message (``expected a
    number >= 0``), ``hint`` may add a word on the value itself."""

    accepts: Callable[[Any], bool]
    wanted: str
    hint: Callable[[Any], str] = lambda value: ""
    show: Callable[[Any], str] = shown

    def check(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            raise RecordError(f"{where} is {self.show(value)}, {self.wanted}{self.hint(value)}")
        return value


def expect(words: str, accepts: Callable[[Any], bool], **more) -> Kind:
    return Kind(accepts, f"expected {words}", **more)


def one_of(words: tuple[str, ...]) -> Kind:
    return Kind(lambda value: value in words, f"not one of {', '.join(words)}")


@dataclass(frozen=True)
class Field:
    """A field of a record. Absent, it is ``default`` (an error when ``required``); null, it is
    absent when ``nullable``; ``each``: the kind of a list's items."""

    name: str
    kind: Kind
    required: bool = False
    nullable: bool = True
    default: Any = None
    each: Kind | None = None

    def read(self, record: dict, where: str) -> Any:
        """This field of ``record`` (``where`` names the record), checked."""
        if self.name not in record and not self.required:
            return self.default
        return self.check(record.get(self.name), f"{where}.{self.name}")

    def check(self, value: Any, at: str) -> Any:
        if value is None and self.nullable and not self.required:
            return None
        self.kind.check(value, at)
        if self.each is not None:
            for i, item in enumerate(value):
                self.each.check(item, f"{at}[{i}]")
        return value


@dataclass(frozen=True)
class Shape:
    """A record's declared fields (it may hold others, unread); ``kind``: the record itself."""

    kind: Kind
    fields: tuple[Field, ...]

    def __getitem__(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def check(self, record: Any, where: str) -> dict:
        """``record`` with every declared field checked, in order."""
        self.kind.check(record, where)
        for item in self.fields:
            item.read(record, where)
        return record


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _count(value: Any) -> bool:
    return _number(value) and math.isfinite(value) and value >= 0


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _object(words: str) -> Kind:
    return expect(words, lambda value: isinstance(value, dict))


TEXT = expect("text", lambda value: isinstance(value, str))
COUNT = expect("a number >= 0", _count)
BYTES = expect("a whole number of bytes >= 0", lambda value: _whole(value) and value >= 0)
VERSION = expect("a whole number (the version of its format)", _whole)


class NotCounted(str):
    """Why a record is not compared (another version, marked incomplete...): read, but not judged.
    ``partial``: the record was taken but misses part of the step (marked incomplete, or varying
    between steps without each step's profile): against a side counted in full, that is a change."""

    partial = False


def partially_counted(why: str) -> NotCounted:
    """A :class:`NotCounted` for a record that misses part of what it counts."""
    out = NotCounted(why)
    out.partial = True
    return out


@dataclass(frozen=True)
class Ranks:
    """A record kept for every rank, read (:mod:`.per_rank`): per group of ranks with one record,
    (those ranks, the record read, a :class:`NotCounted`, or None where they recorded none);
    ``whole``: the record read as a reader of rank 0's alone reads it (the case's figures: the
    largest peak, the measured CUDA figures, ``ranks_disagree``)."""

    groups: tuple[tuple[tuple[int, ...], Any], ...]
    count: int
    whole: Any


def read_ranks(record: dict, where: str, read_one: Callable[[Any, str], Any], case_keys: tuple[str, ...] = ()):
    """``read_one(record)`` when the record kept rank 0's alone (an older run), else :class:`Ranks`
    with each group of ranks' record read by ``read_one`` (named ``where[ranks 1-2]``)."""
    for item in RANK_FIELDS:
        item.read(record, where)
    try:
        groups = per_rank.expand(record, case_keys)
    except ValueError as exc:
        raise RecordError(f"{where}.{exc}") from None
    whole = read_one(record, where)
    if groups is None:
        return whole
    read = []
    for ranks, one in groups:
        at = where if 0 in ranks else f"{where}[ranks {per_rank.ranks_text(ranks)}]"
        read.append((tuple(ranks), None if one is None else read_one(one, at)))
    return Ranks(tuple(read), record[per_rank.RANKS_KEY], whole)


# ----------------------------------------------------------------------------------------------
# The census: what one step launches (extra_info["census"], ddpbench.gates.structure)
# ----------------------------------------------------------------------------------------------

# A case's record keeps every rank's (:mod:`.per_rank`); read_ranks checks each group's ranks.
RANK_FIELDS = (
    Field(per_rank.RANKS_KEY, expect("a whole number of ranks >= 1", lambda value: _whole(value) and value >= 1)),
    Field(per_rank.OTHERS_KEY, expect("a list of groups of ranks (objects: ranks, fields)",
                                      lambda value: isinstance(value, list)), each=_object("an object (ranks, fields)")),
)

CENSUS = Shape(_object("the case's census (an object)"), (
    Field("version", VERSION, required=True),
    Field("incomplete", expect("text (why the census misses collectives)", _text)),
    Field("varies_between_steps", expect("text (how the steps' collectives differ)", _text)),
    Field("method", expect("text (how it was counted)", lambda value: isinstance(value, str)), required=True),
    Field("collectives", expect("a list of collectives", lambda value: isinstance(value, list)), required=True),
    Field("ranks_disagree", expect("true or false", lambda value: isinstance(value, bool)), nullable=False,
          default=False),
    Field("ddp_buckets", expect("a list of byte counts or null", lambda value: isinstance(value, list)),
          each=COUNT),
    Field("graph_breaks", expect("a number >= 0 or null", _count)),
    Field("recompiles", expect("a number >= 0 or null", _count)),
    Field("cuda_kernel_launches", expect("a number >= 0 or null", _count)),
    Field("steps", expect("a list of each step's collectives (lists)",
                          lambda value: isinstance(value, list) and all(isinstance(s, list) for s in value))),
    *RANK_FIELDS,
))
# One entry of census["collectives"]; version 1 records only the first six fields.
CENSUS_ENTRY = Shape(_object("an object (kind, dtype, group_size, count, bytes, call_bytes)"), (
    Field("kind", TEXT, required=True),
    Field("dtype", TEXT, required=True),
    Field("group_size", expect("a whole number >= 1", lambda value: _whole(value) and value >= 1), required=True),
    Field("count", COUNT, required=True),
    Field("bytes", COUNT, required=True),
    Field("call_bytes", expect("a list of byte counts or null", lambda value: isinstance(value, list)), each=COUNT),
    Field("group", expect("text (which process group)", _text), required=True),
    Field("peer", expect('an offset within the group (a whole number), "any" or null',
                         lambda value: value == "any" or _whole(value))),
    Field("data_dependent_bytes", expect("text (why its bytes depend on the data) or null", _text)),
))
_VERSION_1_ENTRY = Shape(CENSUS_ENTRY.kind, CENSUS_ENTRY.fields[:6])


@dataclass(frozen=True)
class Census:
    """One rank's census as read: (kind, dtype, group size, group, peer) -> (count, bytes, call
    sizes, why the bytes depend on the data or None); version 1's group and peer are None. Where
    the steps' collectives vary, ``steps`` holds each counted op's, ``collectives`` their average."""

    version: int
    method: str
    collectives: dict[tuple, tuple[float, float, tuple[float, ...] | None, str | None]]
    buckets: tuple[float, ...] | None
    graph_breaks: float | None
    recompiles: float | None
    kernel_launches: float | None
    ranks_disagree: bool
    steps: tuple[dict, ...] | None = None  # each op's collectives, where they vary between steps


def read_census(census: Any, where: str = CENSUS_KEY) -> Census | Ranks | NotCounted:
    """The census checked: one rank's :class:`Census` (a record that kept rank 0's alone) or
    :class:`Ranks` of them, or why it is not counted (a version this ddpbench does not read, marked
    incomplete, varying between steps without each step's profile); ``where`` names it in
    messages. A census read already is returned as it is."""
    if isinstance(census, (Census, Ranks, NotCounted)):
        return census
    CENSUS.kind.check(census, where)
    version = CENSUS["version"].read(census, where)
    if version not in READABLE_CENSUS_VERSIONS:
        return NotCounted(f"census version {shown(version)} (this ddpbench reads versions "
                          f"{', '.join(map(str, READABLE_CENSUS_VERSIONS))})")
    return read_ranks(census, where, _read_rank_census)


def _read_collectives(entries: list, where: str, version: int) -> dict:
    entry_shape = CENSUS_ENTRY if version >= 2 else _VERSION_1_ENTRY
    collectives: dict = {}
    for i, entry in enumerate(entries):
        entry_shape.check(entry, f"{where}[{i}]")
        calls = None if entry.get("call_bytes") is None else tuple(sorted(entry["call_bytes"]))
        data = entry.get("data_dependent_bytes") if version >= 2 else None
        key = (entry["kind"], entry["dtype"], entry["group_size"], *((entry["group"], entry.get("peer"))
                                                                      if version >= 2 else (None, None)))
        if key in collectives:  # one entry per key by the format; two are added up, not lost
            before = collectives[key]
            merged = None if before[2] is None or calls is None else tuple(sorted(before[2] + calls))
            collectives[key] = (before[0] + entry["count"], before[1] + entry["bytes"], merged, before[3] or data)
        else:
            collectives[key] = (entry["count"], entry["bytes"], calls, data)
    return collectives


def _read_rank_census(census: dict, where: str) -> Census | NotCounted:
    version = CENSUS["version"].read(census, where)
    incomplete = CENSUS["incomplete"].read(census, where)
    if incomplete is not None:  # part of the step escapes the count
        return partially_counted(f"its census is incomplete ({incomplete})")
    varies = CENSUS["varies_between_steps"].read(census, where)
    steps = CENSUS["steps"].read(census, where)
    if varies is not None and steps is None:  # saved before each step's profile was kept
        return partially_counted(f"its collectives vary between steps ({varies})")
    CENSUS.check(census, where)
    collectives = _read_collectives(census["collectives"], f"{where}.collectives", version)
    if steps is not None:
        steps = tuple(_read_collectives(step, f"{where}.steps[{i}]", version) for i, step in enumerate(steps))
    buckets = census.get("ddp_buckets")
    return Census(version, census["method"], collectives, None if buckets is None else tuple(sorted(buckets)),
                  census.get("graph_breaks"), census.get("recompiles"), census.get("cuda_kernel_launches"),
                  census.get("ranks_disagree", False), steps)


# ----------------------------------------------------------------------------------------------
# The memory census: live tensor bytes in one step (extra_info["memory"], ddpbench.gates.memory)
# ----------------------------------------------------------------------------------------------

CATEGORIES = _object("bytes per category (an object)")
BOOLEAN = expect("true or false", lambda value: isinstance(value, bool))
# Every field ddpbench writes into a memory census (ddpbench.engine.memory), each checked on
# reading: a report or a gate reads them as what they say, so "false" as text is not true.
MEMORY = Shape(_object("the case's memory census (an object)"), (
    Field("version", VERSION, required=True),
    Field("method", TEXT, required=True),
    Field("device", TEXT, required=True),
    Field("peak_bytes", BYTES, required=True),  # the largest rank's, max_peak_bytes, where recorded
    Field("max_peak_bytes", BYTES),
    Field("peak_bytes_per_rank", expect("a list of byte counts (null: a rank without a census)",
                                        lambda value: isinstance(value, list)), each=Kind(
        lambda value: value is None or BYTES.accepts(value), BYTES.wanted + " or null")),
    Field("peak_at", _object("an object (module, phase)")),
    Field("at_peak", CATEGORIES, nullable=False, default={}),
    Field("before_step_bytes", BYTES),
    Field("after_step_bytes", BYTES, nullable=False, default=0),
    Field("after_step", CATEGORIES, nullable=False, default={}),
    Field("steps_counted", expect("a whole number of steps >= 1", lambda value: _whole(value) and value >= 1)),
    Field("optimizers", expect("a list of optimizers (objects: name, foreach)", lambda value: isinstance(value, list)),
          each=_object("an object (name, foreach)")),
    Field("other_devices_peak_bytes", _object("bytes per device (an object)")),
    Field("ranks_disagree", BOOLEAN, nullable=False, default=False),
    Field("measured", _object("the measured CUDA figures (an object)")),
    Field("incomplete", expect("text (why the census misses tensors)", _text)),
    # What the census cannot see (threads, tensors it was not told of): said beside every verdict.
    Field("not_counted", expect("a list of texts", lambda value: isinstance(value, list)), nullable=False,
          default=[], each=TEXT),
    *RANK_FIELDS,
))
PEAK_AT = Shape(MEMORY["peak_at"].kind, (
    Field("module", expect("text (a module's name) or null", lambda value: isinstance(value, str))),
    Field("phase", expect("text (forward, backward, optimizer...) or null", lambda value: isinstance(value, str))),
))
OPTIMIZER = Shape(_object("an object (name, foreach)"), (
    Field("name", expect("text (the optimizer's class)", _text), required=True),
    Field("foreach", BOOLEAN),
))
MEASURED = Shape(MEMORY["measured"].kind, (
    Field("max_allocated_bytes", BYTES),
    Field("max_reserved_bytes", BYTES),
    Field("census_over_allocated", COUNT),
))


@dataclass(frozen=True)
class MemoryCensus:
    """The judged figures of a memory census: the peak and what held it (bytes per category),
    where it fell, what stays after the step, and the measured CUDA max allocated (None off CUDA)."""

    method: str
    device: str
    peak: int
    at_peak: dict[str, int]
    after: int
    after_step: dict[str, int]
    module: str | None
    phase: str | None
    ranks_disagree: bool
    allocated: int | None
    not_counted: tuple[str, ...] = ()


def _categories(record: dict, name: str, where: str) -> dict[str, int]:
    value = MEMORY[name].read(record, where)
    return {str(k): BYTES.check(v, f"{where}.{name}.{k}") for k, v in value.items()}


# The fields of a combined memory record that are the case's, not one rank's (ddpbench.engine.memory).
MEMORY_CASE_KEYS = ("peak_bytes_per_rank", "max_peak_bytes", "measured")


def read_memory(record: Any, where: str = MEMORY_KEY) -> MemoryCensus | Ranks | NotCounted:
    """The judged figures of a memory census: one rank's :class:`MemoryCensus` (a record that kept
    rank 0's alone: with the largest rank's peak) or :class:`Ranks` of them, or why it is not
    counted (another version, marked incomplete); ``where`` names it in messages. A record read
    already is returned as it is."""
    if isinstance(record, (MemoryCensus, Ranks, NotCounted)):
        return record
    MEMORY.kind.check(record, where)
    version = MEMORY["version"].read(record, where)
    if version != MEMORY_VERSION:
        return NotCounted(f"memory census version {shown(version)} (this ddpbench reads version {MEMORY_VERSION})")
    read = read_ranks(record, where, _read_rank_memory, MEMORY_CASE_KEYS)
    _check_peaks(record, where)
    return read


def _check_peaks(record: dict, where: str) -> None:
    """The case's peaks agree with the ranks' records (:func:`ddpbench.engine.memory.combine_memory`):
    ``max_peak_bytes`` is the largest of ``peak_bytes_per_rank``, one entry per rank counted, each
    the peak that rank's record holds (null where it recorded none), and never below
    ``peak_bytes``; a record that says otherwise was damaged, and a gate would judge figures no
    census counted."""
    peak, largest = MEMORY["peak_bytes"].read(record, where), MEMORY["max_peak_bytes"].read(record, where)
    per_rank_peaks = MEMORY["peak_bytes_per_rank"].read(record, where)
    if largest is not None and largest < peak:
        raise RecordError(f"{where}.max_peak_bytes is {shown(largest)}, below peak_bytes ({shown(peak)}): the "
                          f"largest rank's peak is at least the record's own")
    if per_rank_peaks is None:
        return
    counted = [p for p in per_rank_peaks if p is not None]
    if largest is not None and counted and largest != max(counted):
        raise RecordError(f"{where}.max_peak_bytes is {shown(largest)}, but the largest of peak_bytes_per_rank is "
                          f"{shown(max(counted))}")
    groups = per_rank.expand(record, MEMORY_CASE_KEYS)  # checked by read_ranks already
    if groups is None:  # rank 0's record alone: its own peak is the first
        if per_rank_peaks and per_rank_peaks[0] is not None and per_rank_peaks[0] != peak:
            raise RecordError(f"{where}.peak_bytes_per_rank[0] is {shown(per_rank_peaks[0])}, but rank 0's "
                              f"peak_bytes is {shown(peak)}")
        return
    if len(per_rank_peaks) != record[per_rank.RANKS_KEY]:
        raise RecordError(f"{where}.peak_bytes_per_rank holds {len(per_rank_peaks)} peaks for "
                          f"{record[per_rank.RANKS_KEY]} ranks counted")
    for ranks, one in groups:
        own = None if one is None else one.get("peak_bytes")
        for rank in ranks:
            if per_rank_peaks[rank] != own:
                raise RecordError(f"{where}.peak_bytes_per_rank[{rank}] is {shown(per_rank_peaks[rank])}, but rank "
                                  f"{rank}'s record holds {shown(own)}")


def _read_rank_memory(record: dict, where: str) -> MemoryCensus | NotCounted:
    incomplete = MEMORY["incomplete"].read(record, where)
    if incomplete is not None:
        return partially_counted(f"its memory census is incomplete ({incomplete})")
    MEMORY.check(record, where)
    method, device = MEMORY["method"].read(record, where), MEMORY["device"].read(record, where)
    peak = record["peak_bytes"] if record.get("max_peak_bytes") is None else record["max_peak_bytes"]
    peak_at = PEAK_AT.check(record.get("peak_at") or {}, f"{where}.peak_at")
    for i, optimizer in enumerate(record.get("optimizers") or []):
        OPTIMIZER.check(optimizer, f"{where}.optimizers[{i}]")
    for name, nbytes in (record.get("other_devices_peak_bytes") or {}).items():
        BYTES.check(nbytes, f"{where}.other_devices_peak_bytes.{name}")
    measured = MEASURED.check(record["measured"], f"{where}.measured") if record.get("measured") is not None else {}
    at_peak = _categories(record, "at_peak", where)
    after = MEMORY["after_step_bytes"].read(record, where)
    return MemoryCensus(method, device, peak, at_peak, after, _categories(record, "after_step", where),
                        peak_at.get("module"), peak_at.get("phase"), MEMORY["ranks_disagree"].read(record, where),
                        measured.get("max_allocated_bytes"), tuple(MEMORY["not_counted"].read(record, where)))


# ----------------------------------------------------------------------------------------------
# The numerics replay: digests and figures of the trainable state per step (extra_info["numerics"],
# ddpbench.gates.numerics)
# ----------------------------------------------------------------------------------------------


def _digest_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_text(v) for v in value)


def _figures(value: Any) -> bool:
    """A tensor's ``[digest, l2, l1, sum]`` (a figure may be nan or inf: a step that diverged)."""
    return (isinstance(value, list) and len(value) == 4 and _text(value[0])
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value[1:]))


def _groups(value: Any) -> bool:
    """Per step, ``{tensor group: a relative difference >= 0, or null (from zero)}``."""
    return isinstance(value, list) and all(
        isinstance(step, dict) and all(_text(k) and (v is None or _count(v)) for k, v in step.items()) for step in value)


def _exact(value: Any) -> bool:
    """An exact figure: a number, a bool, a list of numbers."""
    if isinstance(value, list):
        return bool(value) and all(_exact(v) and not isinstance(v, list) for v in value)
    return isinstance(value, (bool, int, float))


NUMERICS = Shape(_object("the case's numerics (an object)"), (
    Field("version", VERSION, required=True),
    Field("incomplete", expect("text (why part of the replay is missing)", _text)),
    Field("not_reproducible", expect("text (why the replays differ from the set-up on)", _text)),
    Field("steps", expect("a whole number of steps >= 0", lambda value: _whole(value) and value >= 0), required=True),
    Field("seed", expect("a whole number (the seed of every replay)", _whole)),
    Field("replays", expect("a whole number of replays >= 1", lambda value: _whole(value) and value >= 1)),
    Field("ranks", expect("a whole number of ranks >= 1", lambda value: _whole(value) and value >= 1)),
    Field("digests", expect("a list of digests (text), one per step and the set-up", _digest_list), required=True),
    Field("rank_digests", expect("per rank, a list of digests (text)", lambda value: isinstance(value, list)
                                 and all(_digest_list(v) for v in value))),
    Field("names", expect("a list of distinct tensor names (text)", lambda value: isinstance(value, list)
                          and all(_text(v) for v in value) and len(set(value)) == len(value))),
    Field("tensors", expect("per rank, per step, the tensors' figures", lambda value: isinstance(value, list)
                            and bool(value) and all(isinstance(r, list) for r in value)), required=True),
    Field("scalars", expect("per rank, per step, {name: an exact figure}", lambda value: isinstance(value, list)
                            and all(isinstance(r, list) and all(isinstance(step, dict) and all(
                                _text(k) and (v is None or _exact(v)) for k, v in step.items()) for step in r)
                                    for r in value))),
    Field("replay_spread", expect("a number >= 0 or null", _count)),
    Field("first_nondeterministic_step", expect("a step (a whole number >= 0) or null",
                                                lambda value: _whole(value) and value >= 0)),
    Field("spread", expect("per step, {tensor group: a number >= 0 or null}", _groups)),
    Field("band", expect("per step, {tensor group: a number >= 0 or null}", _groups)),
    Field("band_replays", expect("a whole number of replays >= 0", lambda value: _whole(value) and value >= 0)),
    Field("band_bits", expect("a whole number of significand bits >= 1", lambda value: _whole(value) and value >= 1)),
    Field("rounding_scalars", expect("a list of names (text)", lambda value: isinstance(value, list)
                                     and all(_text(v) for v in value))),
    Field("compute_dtypes", expect("a list of dtype names (text)", lambda value: isinstance(value, list)
                                   and all(_text(v) for v in value))),
))

#: Groups read from a record: per step, ``{group: relative difference}`` (inf where a figure moved
#: from zero).
Groups = list


@dataclass(frozen=True)
class Numerics:
    """A numerics record as read: the steps replayed, one digest per step over every rank (step 0:
    the freshly set-up state), per rank per step ``{tensor: [digest, l2, l1, sum]}`` (a later
    rank's filled in from rank 0's), and its replays' spread (0.0: bitwise equal).
    Version 3 adds per rank per step the exact figures (``scalars``: None in older records), per
    step and tensor group the replays' spread and the band perturbed replays grew into (None where
    not measured), and the exact figures rounding did move (``rounding_scalars``)."""

    steps: int
    digests: tuple[str, ...]
    ranks: list[list[dict[str, list]]]
    replay_spread: float
    first_nondeterministic_step: int | None
    seed: int | None = None
    scalars: list[list[dict[str, Any]]] | None = None
    spread: Groups | None = None
    band: Groups | None = None
    band_replays: int = 0
    band_bits: int | None = None
    rounding_scalars: tuple[str, ...] = ()
    compute_dtypes: tuple[str, ...] = ()
    version: int = NUMERICS_VERSION

    @property
    def tensor_count(self) -> int:
        """Tensors it fingerprinted (every name any rank held at any step)."""
        return len({name for rank in self.ranks for step in rank for name in step})


def _step_v1(tensors: Any, names: None, base: dict[str, list] | None, where: str) -> dict[str, list]:
    """A version 1 step: ``{name: figures}``; a later rank's holds only what differs from rank 0's."""
    if not isinstance(tensors, dict):
        raise RecordError(f"{where} is {shown(tensors)}, expected an object of tensors")
    for name, figures in tensors.items():
        if not _figures(figures):
            raise RecordError(f"{where}.{name} is {shown(figures)}, expected [digest, l2, l1, sum]")
    return tensors if base is None else {**base, **tensors}


def _figures_of_text(cell: Any) -> list | None:
    """``"<digest> <l2> <l1> <sum>"`` read as ``[digest, l2, l1, sum]``, or None if it is not one."""
    parts = cell.split(" ") if isinstance(cell, str) else []
    if len(parts) != 4 or not parts[0]:
        return None
    try:
        return [parts[0], *(float(p) for p in parts[1:])]
    except ValueError:
        return None


def _step_v2(cells: Any, names: list[str], base: dict[str, list] | None, where: str) -> dict[str, list]:
    """A version 2 step: rank 0's a list along ``names`` of figures as text or null (absent); a
    later rank's (``base``: rank 0's step) ``{name: text or null}`` of what differs from rank 0's."""
    if base is None and (not isinstance(cells, list) or len(cells) != len(names)):
        raise RecordError(f"{where} is {shown(cells)}, expected a list of {len(names)} cells, one per name")
    if base is not None and not isinstance(cells, dict):
        raise RecordError(f"{where} is {shown(cells)}, expected an object of the tensors that differ from rank 0's")
    pairs = zip(names, cells) if base is None else cells.items()
    step: dict[str, list] = {} if base is None else dict(base)
    for name, cell in pairs:
        label = f"{where}[{names.index(name)}] ({name})" if base is None else f"{where}.{name}"
        if base is not None and name not in names:
            raise RecordError(f"{label} is not one of its names")
        if cell is None:
            step.pop(name, None)
        elif (figures := _figures_of_text(cell)) is not None:
            step[name] = figures
        else:
            raise RecordError(f"{label} is {shown(cell)}, expected '<digest> <l2> <l1> <sum>' or null")
    return step


def _read_groups(value: list | None, steps: int, key: str, where: str) -> Groups | None:
    if value is None:
        return None
    if len(value) != steps:
        raise RecordError(f"{where}.{key} holds {len(value)} steps, expected {steps}")
    return [{g: (math.inf if v is None else float(v)) for g, v in step.items()} for step in value]


def _read_scalars(value: list | None, ranks: int, steps: int, where: str) -> list[list[dict[str, Any]]] | None:
    """Per rank per step the exact figures, a later rank's filled in from rank 0's."""
    if value is None:
        return None
    if len(value) != ranks:
        raise RecordError(f"{where}.scalars holds {len(value)} ranks, expected {ranks}")
    out: list[list[dict[str, Any]]] = []
    for r, rank in enumerate(value):
        if len(rank) != steps:
            raise RecordError(f"{where}.scalars[{r}] holds {len(rank)} steps, expected {steps}")
        if r == 0:
            out.append([dict(step) for step in rank])
            continue
        filled = []
        for s, step in enumerate(rank):
            one = {**out[0][s], **step}
            filled.append({k: v for k, v in one.items() if v is not None})
        out.append(filled)
    return out


def read_numerics(record: Any, where: str = NUMERICS_KEY) -> Numerics | NotCounted:
    """The numerics record checked, or why it is not counted (another version, marked incomplete,
    a set-up not reproducible under fixed seeds); ``where`` names it in messages. A record read
    already is returned as it is."""
    if isinstance(record, (Numerics, NotCounted)):
        return record
    NUMERICS.kind.check(record, where)
    version = NUMERICS["version"].read(record, where)
    if version not in READABLE_NUMERICS_VERSIONS:
        return NotCounted(f"numerics version {version!r} (this ddpbench reads versions "
                          f"{', '.join(map(str, READABLE_NUMERICS_VERSIONS))})")
    incomplete = NUMERICS["incomplete"].read(record, where)
    if incomplete is not None:
        return NotCounted(f"its numerics replay is incomplete ({incomplete})")
    NUMERICS.check(record, where)
    first_nondeterministic = NUMERICS["first_nondeterministic_step"].read(record, where)
    if first_nondeterministic is not None and first_nondeterministic > record["steps"]:
        raise RecordError(f"{where}.first_nondeterministic_step is {first_nondeterministic}, past its "
                          f"{record['steps']} steps")
    why = record.get("not_reproducible")
    if why is not None:
        return partially_counted(f"its set-up is not reproducible under fixed seeds ({why})")
    digests = record["digests"]
    if len(digests) != record["steps"] + 1:
        raise RecordError(f"{where}.digests holds {len(digests)} digests, expected {record['steps'] + 1} "
                          f"(the set-up and each of its {record['steps']} steps)")
    for key in ("tensors", "rank_digests") if "ranks" in record else ():
        if key in record and len(record[key]) != record["ranks"]:
            raise RecordError(f"{where}.{key} holds {len(record[key])} ranks, expected {record['ranks']} (its ranks)")
    read_step = _step_v1 if version == 1 else _step_v2
    names = None if version == 1 else NUMERICS["names"].read(record, where)
    if version != 1 and names is None:
        raise RecordError(f"{where}.names is missing, expected a list of tensor names (text)")
    ranks: list[list[dict[str, list]]] = []
    for r, steps in enumerate(record["tensors"]):
        if len(steps) != len(digests):
            raise RecordError(f"{where}.tensors[{r}] holds {len(steps)} steps, expected {len(digests)}")
        ranks.append([read_step(tensors, names, ranks[0][s] if r else None, f"{where}.tensors[{r}][{s}]")
                      for s, tensors in enumerate(steps)])
    spread = NUMERICS["replay_spread"].read(record, where)
    if spread is None and first_nondeterministic is not None:
        return NotCounted("its replays differ by an amount that cannot be stated")
    return Numerics(record["steps"], tuple(digests), ranks, float(spread or 0.0), first_nondeterministic,
                    seed=NUMERICS["seed"].read(record, where),
                    scalars=_read_scalars(record.get("scalars"), len(ranks), len(digests), where),
                    spread=_read_groups(record.get("spread"), len(digests), "spread", where),
                    band=_read_groups(record.get("band"), len(digests), "band", where),
                    band_replays=int(record.get("band_replays") or 0),
                    band_bits=record.get("band_bits"),
                    rounding_scalars=tuple(record.get("rounding_scalars") or ()),
                    compute_dtypes=tuple(record.get("compute_dtypes") or ()), version=version)


# ----------------------------------------------------------------------------------------------
# An A/B case's record (extra_info["ab"], ddpbench.gates.verdicts)
# ----------------------------------------------------------------------------------------------


def _figure(positive: bool) -> Kind:
    return expect("a positive number" if positive else "a number",
                  lambda value: _number(value) and math.isfinite(value) and value >= 0 and (value > 0 or not positive))


def _interval(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2 and all(_number(v) for v in value)
            and value[0] <= value[1])


SIDE_FIGURES = Shape(_object("the side's figures (an object)"), (
    Field("median_s", expect("a time above 0 s", lambda value: _number(value) and 0 < value < math.inf,
                             hint=lambda value: " (a round cannot take no time)" if value == 0 else "")),
))
AB = Shape(_object("the A/B record (an object)"), (
    Field("verdict", one_of(CASE_VERDICTS), nullable=False, default=Verdict.INCONCLUSIVE),
    Field("timing_verdict", one_of(TIMING_VERDICTS)),  # beside the decided verdict (verdicts.record_decision)
    Field("ratio", _figure(positive=True)),
    Field("p_value", _figure(positive=False)),
    Field("threshold", _figure(positive=False)),
    Field("wall_s", _figure(positive=False)),
    Field("ratio_of_block_minima", _figure(positive=True)),
    Field("pairs", _figure(positive=False)),
    Field("stop_bound", _figure(positive=True)),
    Field("stop_level", _figure(positive=False)),
    Field("ratio_ci", expect("[low, high] numbers or null", _interval)),
    Field("ratio_per_pool_pair", expect("a list of numbers",
                                        lambda value: isinstance(value, list) and all(_number(v) for v in value))),
    Field("baseline", SIDE_FIGURES.kind),
    Field("candidate", SIDE_FIGURES.kind),
    Field("sides", expect("each side's description (objects)",
                          lambda value: isinstance(value, dict) and all(isinstance(d, dict) for d in value.values()))),
    Field("reason", TEXT),
))


@dataclass(frozen=True)
class ABRecord:
    """An A/B case's record as read: the record itself (its figures, read by key) and the
    baseline's census and memory census (None where the run recorded none)."""

    summary: dict[str, Any]
    baseline_census: Census | Ranks | NotCounted | None
    baseline_memory: MemoryCensus | Ranks | NotCounted | None
    baseline_numerics: Numerics | NotCounted | None = None


def read_ab(record: Any, where: str = AB_KEY) -> ABRecord:
    """An A/B case's record checked; a record read already is returned as it is."""
    if isinstance(record, ABRecord):
        return record
    AB.check(record, where)
    for side in ("baseline", "candidate"):
        if record.get(side) is not None:
            SIDE_FIGURES.check(record[side], f"{where}.{side}")
    census, memory = record.get(BASELINE_CENSUS_KEY), record.get(BASELINE_MEMORY_KEY)
    numerics = record.get(BASELINE_NUMERICS_KEY)
    return ABRecord(record, None if census is None else read_census(census, f"{where}.{BASELINE_CENSUS_KEY}"),
                    None if memory is None else read_memory(memory, f"{where}.{BASELINE_MEMORY_KEY}"),
                    None if numerics is None else read_numerics(numerics, f"{where}.{BASELINE_NUMERICS_KEY}"))


# ----------------------------------------------------------------------------------------------
# A case's extra_info: the keys the report groups, sorts and labels by, and the records above
# ----------------------------------------------------------------------------------------------

PLAIN = Kind(lambda value: isinstance(value, (str, int, float, bool)), "expected one plain value",
             show=lambda value: f"{type(value).__name__} {shown(value)}")
_PLAIN_KEYS = ("family", "backend", "device", "variant", "impl", "model", "layout", "data_source", "worker_start",
               "sharing_strategy", "dtype", "reduce_op", "placement", "persistent_workers", "batch_size",
               "hidden_dim", "grad_accum", "num_samples", "num_workers", "ops_per_round")


def _positive_whole(value: Any) -> bool:
    return _number(value) and value > 0 and float(value).is_integer()


EXTRA_INFO = Shape(Kind(lambda value: isinstance(value, dict), "not an object of keys",
                        show=lambda value: type(value).__name__), (
    *(Field(key, PLAIN) for key in _PLAIN_KEYS),
    Field("op", expect("a collective's name", _text), nullable=False),
    Field("size_bytes", expect("a whole number of bytes above 0", _positive_whole), nullable=False),
    Field("world_size", expect("a whole number of ranks above 0", _positive_whole)),
))


@dataclass(frozen=True)
class PoolSplit:
    """The fresh pools a case was measured in, its rounds split across them in turn
    (``extra_info["pool_split"]``): each pool's round count (the raw rounds hold pool 0's first)
    and median round time."""

    rounds: tuple[int, ...]
    medians_s: tuple[float, ...]

    def of_rounds(self, data: list[float] | None) -> list[list[float]] | None:
        """The raw rounds cut into each pool's, or None when they are not those rounds (saved
        without them, or another count)."""
        if not data or sum(self.rounds) != len(data):
            return None
        out, start = [], 0
        for n in self.rounds:
            out.append(list(data[start:start + n]))
            start += n
        return out


_POSITIVE_SECONDS = expect("a time in seconds above 0", lambda value: _number(value) and math.isfinite(value)
                           and value > 0)
POOL_SPLIT = Shape(expect("an object", lambda value: isinstance(value, dict)), (
    Field("count", expect("a whole number of pools, 2 or more", lambda value: _whole(value) and value >= 2),
          required=True),
    Field("rounds", expect("a list", lambda value: isinstance(value, list)), required=True,
          each=expect("a whole number of rounds above 0", lambda value: _whole(value) and value > 0)),
    Field("medians_s", expect("a list", lambda value: isinstance(value, list)), required=True, each=_POSITIVE_SECONDS),
))


def read_pool_split(record: Any, where: str = POOL_SPLIT_KEY) -> PoolSplit:
    """A case's pool split, checked: one round count and one median per pool."""
    POOL_SPLIT.check(record, where)
    if not len(record["rounds"]) == len(record["medians_s"]) == record["count"]:
        raise RecordError(f"{where} holds {len(record['rounds'])} round counts and {len(record['medians_s'])} "
                          f"medians for {record['count']} pools, expected one of each per pool")
    return PoolSplit(tuple(record["rounds"]), tuple(float(m) for m in record["medians_s"]))


@dataclass(frozen=True)
class CaseRecords:
    """What ddpbench recorded in a case's extra_info, read: its census, memory census, A/B record,
    numerics record and pool split (None where it recorded none)."""

    census: Census | NotCounted | None = None
    memory: MemoryCensus | NotCounted | None = None
    ab: ABRecord | None = None
    numerics: Numerics | NotCounted | None = None
    pool_split: PoolSplit | None = None


def read_extra_info(info: dict) -> CaseRecords:
    """A case's extra_info checked, and its records read. :class:`RecordError` names the field as
    ``extra_info.size_bytes`` or, inside a record, ``extra_info census.ddp_buckets``. An ``ab``
    that is not an object is another tool's, not an A/B record."""
    EXTRA_INFO.check(info, "extra_info")

    def read(key: str, reader):
        if info.get(key) is None or (key == AB_KEY and not isinstance(info[key], dict)):
            return None
        try:
            return reader(info[key], key)
        except RecordError as exc:
            raise RecordError(f"extra_info {exc}", record=key) from None

    return CaseRecords(read(CENSUS_KEY, read_census), read(MEMORY_KEY, read_memory), read(AB_KEY, read_ab),
                       read(NUMERICS_KEY, read_numerics), read(POOL_SPLIT_KEY, read_pool_split))


# ----------------------------------------------------------------------------------------------
# The run's own records, read leniently: runs saved before them, or by other tools, lack them
# ----------------------------------------------------------------------------------------------

_NAMED_FAILURES = 20


def run_record(exitstatus: int, failed: int, stopped: str | None, failed_cases: list[str]) -> dict[str, Any]:
    """What a run says about itself when saved (under :data:`RUN_KEY`): ``complete``, pytest's
    ``exitstatus``, the number of ``failed`` reports (failures and errors), the first failing cases,
    and why it ``stopped`` early (``-x`` / ``--maxfail``), if it did."""
    complete = int(exitstatus) == 0 and failed == 0 and not stopped
    return {"complete": complete, "exitstatus": int(exitstatus), "failed": int(failed),
            "failed_cases": list(failed_cases)[:_NAMED_FAILURES], "stopped": stopped or None}


@dataclass(frozen=True)
class Completeness:
    """Whether a saved run measured everything it set out to: a partial run is never a default
    baseline (docs/design/gates.md#a-partial-run-is-never-a-default-baseline)."""

    complete: bool
    recorded: bool  # False: saved before ddpbench recorded it (or by another tool)
    why: str = ""  # for an incomplete run: what happened

    def describe(self) -> str:
        if not self.recorded:
            return "completeness not recorded (saved by an older ddpbench or another tool)"
        return "complete" if self.complete else f"incomplete: {self.why}"


def completeness_of(doc: Any) -> Completeness:
    """The run record of a run document (a pytest-benchmark JSON run); complete and not recorded
    without one."""
    rec = doc.get(RUN_KEY) if isinstance(doc, dict) else None
    if not isinstance(rec, dict) or not isinstance(rec.get("complete"), bool):
        return Completeness(True, False)
    if rec["complete"]:
        return Completeness(True, True)
    parts = []
    failed = rec.get("failed")
    if isinstance(failed, int) and failed:
        names = [str(n) for n in rec.get("failed_cases") or []]
        shown_names = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        parts.append(f"{failed} failed or erroring case(s)" + (f" ({shown_names})" if shown_names else ""))
    if rec.get("stopped"):
        parts.append(f"stopped early ({rec['stopped']})")
    status = rec.get("exitstatus")
    if isinstance(status, int) and status not in (0, 1):
        parts.append(f"pytest exit status {status}" + (" (internal error)" if status == 3 else ""))
    return Completeness(False, True, "; ".join(parts) or "pytest did not finish cleanly")


def probe_of(doc: dict | None) -> dict | None:
    """The calibration probe a run document recorded, at its top level or (runs saved before the
    probe left machine_info) in its ``machine_info``; None without a usable one (other tools, a
    failed probe)."""
    if not isinstance(doc, dict):
        return None
    probe = doc.get(CALIBRATION_KEY)
    if probe is None and isinstance(doc.get("machine_info"), dict):
        probe = doc["machine_info"].get(MACHINE_INFO_KEY)
    if not isinstance(probe, dict):
        return None
    value = probe.get("min_s")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        return None
    return probe
