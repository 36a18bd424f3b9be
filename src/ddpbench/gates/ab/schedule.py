"""The interleaved block order of an A/B case: pairs of blocks, as many baseline-first (AB) as
candidate-first (BA), shuffled, so that a drift or a periodic disturbance hits both sides alike
and neither side always runs second (e.g. in caches warmed by the other). With several pools per
side, the pool pairs take turns pair by pair, each with its own balanced order."""

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


def pairs_over_pools(pairs_per_pool_pair: int, pool_pairs: int, rng: random.Random) -> list[tuple[str, str, int]]:
    """(first side, second side, pool pair) for ``pairs_per_pool_pair`` (even) pairs on each of
    ``pool_pairs`` pool pairs: every pool pair gets as many AB as BA, and the pool pairs take
    turns (in a shuffled order within each turn), so that each one spans the whole stage."""
    if pool_pairs <= 0:
        raise ValueError(f"the number of pool pairs must be positive (got {pool_pairs})")
    orders = [balanced_pairs(pairs_per_pool_pair, rng) for _ in range(pool_pairs)]
    out = []
    for turn in range(pairs_per_pool_pair):
        pools = list(range(pool_pairs))
        rng.shuffle(pools)
        out += [(*orders[k][turn], k) for k in pools]
    return out


def case_rng(case_id: str, seed: int) -> random.Random:
    """The case's generator: the run's ``seed`` (drawn anew each run, recorded, repeatable with
    --dist-ab-seed) with the case's id, so cases of one run get orders of their own."""
    return random.Random(zlib.crc32(f"{seed}:{case_id}".encode()))


def new_seed() -> int:
    """A run's seed: different in every run, so no case keeps one order (and whatever that order
    happens to favour) run after run."""
    return random.SystemRandom().randrange(2**32)
