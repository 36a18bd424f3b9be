"""A record kept for every rank, small at any world size: rank 0's record whole, and each rank whose
record differs from it as only the fields that differ, ranks with identical records named once
(docs/design/census-and-memory.md#every-ranks-record). A census compared on rank 0 alone misses a change on any
other rank (a pipeline's middle stage), and a list of N whole records would grow with N."""

from __future__ import annotations

import json
from typing import Any

RANKS_KEY = "ranks_counted"  # how many ranks' records were kept (absent: rank 0's only, an older run)
OTHERS_KEY = "other_ranks"  # [{"ranks": "1-3,7", "fields": {field: that rank's value} or null}]
DISAGREE_KEY = "ranks_disagree"  # true when some rank's record differs from rank 0's
#: The keys a combined record adds, which no single rank's record holds.
COMBINED_KEYS = (RANKS_KEY, OTHERS_KEY, DISAGREE_KEY)


def ranks_text(ranks: list[int]) -> str:
    """Ranks as runs: [1, 2, 3, 7] -> "1-3,7"."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def parse_ranks(text: Any) -> list[int] | None:
    """The ranks "1-3,7" names, ascending; None when ``text`` is not such runs."""
    if not isinstance(text, str) or not text:
        return None
    ranks: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        first, last = int(low), int(high or low)
        if last < first or (ranks and first <= ranks[-1]):
            return None
        ranks.extend(range(first, last + 1))
    return ranks


def combine(records: list[dict[str, Any] | None], case_keys: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """Every rank's record in one: rank 0's (the first present where rank 0 recorded none) with
    ``ranks_counted``, and, where some rank's record differs, ``ranks_disagree: true`` and
    ``other_ranks``: per group of ranks with one record, the fields that differ from rank 0's (a
    field rank 0 has and that rank lacks is null), or ``fields: null`` for ranks that recorded none.
    ``case_keys``: fields of the case, not of a rank (combined by the caller), never compared."""
    present = [r for r in records if r is not None]
    if not present:
        return None
    skip = set(COMBINED_KEYS) | set(case_keys)
    base = {k: v for k, v in (records[0] if records[0] is not None else present[0]).items() if k not in skip}
    groups: dict[str, tuple[list[int], Any]] = {}
    for rank, record in enumerate(records):
        if record is None:
            fields = None
        else:
            own = {k: v for k, v in record.items() if k not in skip}
            if own == base:
                continue
            fields = {k: own.get(k) for k in sorted(set(own) | set(base)) if own.get(k) != base.get(k)}
        key = json.dumps(fields, sort_keys=True, default=repr)
        groups.setdefault(key, ([], fields))[0].append(rank)
    combined = dict(base, **{RANKS_KEY: len(records)})
    if groups:
        combined[DISAGREE_KEY] = True
        combined[OTHERS_KEY] = [{"ranks": ranks_text(ranks), "fields": fields}
                                for ranks, fields in sorted(groups.values(), key=lambda g: g[0][0])]
    return combined


def expand(record: dict[str, Any], case_keys: tuple[str, ...] = ()) -> list[tuple[list[int], dict | None]] | None:
    """The records of a combined ``record`` as (ranks, that record or None where they recorded
    none), rank 0's group first; None for a record that kept rank 0's only (saved before every
    rank's was kept). :class:`ValueError` names a malformed field (``other_ranks[0].ranks``)."""
    if RANKS_KEY not in record:
        return None
    count = record[RANKS_KEY]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"{RANKS_KEY} is {count!r}, expected a whole number of ranks >= 1")
    others = record.get(OTHERS_KEY) or []
    if not isinstance(others, list):
        raise ValueError(f"{OTHERS_KEY} is {type(others).__name__}, expected a list of groups of ranks")
    skip = set(COMBINED_KEYS) | set(case_keys)
    base = {k: v for k, v in record.items() if k not in skip}
    groups: list[tuple[list[int], dict | None]] = []
    seen: set[int] = set()
    for i, group in enumerate(others):
        where = f"{OTHERS_KEY}[{i}]"
        if not isinstance(group, dict):
            raise ValueError(f"{where} is {type(group).__name__}, expected an object (ranks, fields)")
        ranks = parse_ranks(group.get("ranks"))
        if ranks is None or ranks[-1] >= count or seen & set(ranks):
            raise ValueError(f"{where}.ranks is {group.get('ranks')!r}, expected ranks as ascending runs "
                             f"(\"1-3,7\"), each below {RANKS_KEY} ({count}) and named once")
        fields = group.get("fields")
        if fields is not None and not isinstance(fields, dict):
            raise ValueError(f"{where}.fields is {type(fields).__name__}, expected an object or null")
        if ranks[0] == 0 and fields is not None:  # rank 0's record is the record itself
            raise ValueError(f"{where}.ranks is {group.get('ranks')!r}: rank 0's record is the record itself "
                             f"(rank 0 is named here only with fields null, when it recorded none)")
        seen.update(ranks)
        groups.append((ranks, None if fields is None else dict(base, **fields)))
    first = [r for r in range(count) if r not in seen]
    if not first:  # combine() keeps the first rank that recorded something as the record itself
        raise ValueError(f"{OTHERS_KEY} names all {count} ranks: the record itself is no rank's")
    return [(first, base)] + groups
