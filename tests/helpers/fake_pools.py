"""Fake pools for the A/B pairs loop (``gates.ab.pairs_loop.run_case``): each answers the loop's tasks as
a 2-rank pool would, its blocks drawn from seeded lognormal noise, so that what the loop
decides is exact and fast (tests/gates/ab/test_ab_extra_looks.py, tests/gates/ab/test_ab_structure_stop.py)."""

import math
import random

from ddpbench.gates.ab import tasks

RANKS = 2
ROUND_S = 1e-3


class FakePool:
    """Each block's rounds are ROUND_S times ``slower`` times one lognormal draw (``noise``: its
    sigma) shared by the block's rounds; set-up and the metrics at the end carry ``census`` as
    every rank's census (None: a rank that took none, or an engine that predates the census; a
    list: each rank's own)."""

    alive = True

    def __init__(self, rng: random.Random, noise: float, slower: float = 1.0, census: dict | None = None):
        self.rng, self.noise, self.slower, self.census = rng, noise, slower, census
        self.pids = [0] * RANKS
        self.blocks = 0

    def run(self, fn, *args, timeout_s=None):
        if fn is tasks.start:
            return [{"estimate_s": ROUND_S, "ops_per_round": 1, "census": census} for census in self._censuses()]
        if fn is tasks.block:
            rounds = args[1]
            self.blocks += 1
            level = ROUND_S * self.slower * math.exp(self.rng.gauss(0.0, self.noise))
            return [([level] * rounds, None)] * RANKS
        if fn is tasks.finish:
            return [{} if census is None else {"census": census} for census in self._censuses()]
        if fn is tasks.stop:
            return None
        raise AssertionError(f"unexpected task {fn}")

    def _censuses(self) -> list:
        return list(self.census) if isinstance(self.census, list) else [self.census] * RANKS


def fake_pools(seed: int, noise: float, slower: float = 1.0, per_side: int = 2,
               censuses: tuple[dict | None, dict | None] = (None, None)) -> dict[str, list[FakePool]]:
    """``per_side`` fake pools a side, sharing one seeded generator; ``censuses``: the baseline's
    and the candidate's census at set-up."""
    rng = random.Random(seed)
    return {"baseline": [FakePool(rng, noise, census=censuses[0]) for _ in range(per_side)],
            "candidate": [FakePool(rng, noise, slower, census=censuses[1]) for _ in range(per_side)]}
