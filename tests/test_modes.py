"""Mode detection and rank placement in extra_info (ddpbench.modes)."""

import math
import random

from ddpbench.modes import placement_info, round_modes, rounds_info


def _lognormal(rng, n, centre, sigma):
    return [centre * math.exp(rng.gauss(0, sigma)) for _ in range(n)]


def test_two_separated_groups_are_reported_as_modes_with_their_shares():
    rng = random.Random(0)
    times = _lognormal(rng, 150, 1e-3, 0.08) + _lognormal(rng, 50, 3e-3, 0.08)
    modes = round_modes(times)
    assert modes is not None and len(modes) == 2
    assert abs(modes[0]["median_s"] - 1e-3) < 1e-4 and abs(modes[1]["median_s"] - 3e-3) < 3e-4
    assert modes[0]["share"] == 0.75 and modes[1]["share"] == 0.25


def test_one_wide_mode_a_long_tail_or_few_rounds_are_not_multimodal():
    rng = random.Random(1)
    assert round_modes(_lognormal(rng, 300, 1e-3, 0.5)) is None  # wide but one mode
    assert round_modes([1e-3 + rng.expovariate(1000) for _ in range(300)]) is None  # tail
    assert round_modes(_lognormal(rng, 280, 1e-3, 0.05) + [5e-3] * 20) is None  # under 10%: outliers
    assert round_modes([1e-3] * 10 + [3e-3] * 9) is None  # too few rounds to judge


def test_placement_splits_rounds_by_whether_the_ranks_shared_a_cpu():
    times = [1.0, 1.0, 3.0, 3.0]
    cpus = [[0, 0, 0, 1], [0, 0, 1, 0]]  # rounds 0-1 together on CPU 0, rounds 2-3 apart
    info = placement_info(times, cpus)
    assert info == {"ranks_shared_cpu_share": 0.5, "median_s_ranks_shared_cpu": 1.0,
                    "median_s_ranks_apart": 3.0}
    assert placement_info(times, [None, None]) == {}  # platform could not tell
    assert placement_info(times, [[0, 0, 0, 0]]) == {}  # one rank: nothing to share
    assert "ranks_shared_cpu_share" not in rounds_info(times, cpus, nodes=2)  # other hosts' CPUs
