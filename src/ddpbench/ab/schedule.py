"""The interleaved block order of an A/B case: pairs of blocks, as many baseline-first (AB) as
candidate-first (BA), shuffled, so that a drift or a periodic disturbance hits both sides alike
and neither side always runs second (e.g. in caches warmed by the other)."""

from __future__ import annotations

import random
import zlib

BASELINE, CANDIDATE = "baseline", "candidate"


def balanced_pairs(pairs: int, rng: random.Random) -> list[tuple[str, str]]:
    """``pairs`` (even) pair orders, half (baseline, candidate), half (candidate, baseline), shuffled."""
    if pairs <= 0 or pairs % 2:
        raise ValueError(f"the number of pairs must be even and positive (got {pairs})")
    orders = [(BASELINE, CANDIDATE)] * (pairs // 2) + [(CANDIDATE, BASELINE)] * (pairs // 2)
    rng.shuffle(orders)
    return orders


def case_rng(case_id: str) -> random.Random:
    """A generator seeded by the case's id: the same case gets the same order in every run."""
    return random.Random(zlib.crc32(case_id.encode()))
