"""Mode detection and rank placement in extra_info (ddpbench.engine.modes)."""

import math
import random

from ddpbench.engine.modes import placement_info, round_modes, rounds_info


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


def test_rank_aggregates_give_each_ranks_median_their_spread_and_the_straggler():
    from ddpbench.engine.modes import rank_aggregates

    rng = random.Random(3)
    rank0 = [1e-3 * (1 + 0.01 * rng.random()) for _ in range(100)]
    # Rank 1 is the slowest in 80 of 100 rounds, by 10% over rank 0 in those rounds.
    rank1 = [t * (1.10 if i % 5 else 0.95) for i, t in enumerate(rank0)]
    info = rank_aggregates([rank0, rank1])
    assert info["straggler_rank"] == 1 and info["straggler_share"] == 0.8
    assert abs(info["straggler_excess_pct"] - 10.0) < 1e-6
    assert info["rank_median_s"][1] > info["rank_median_s"][0]
    assert info["rank_median_min_s"] == min(info["rank_median_s"]) and info["rank_median_max_s"] == max(info["rank_median_s"])
    assert abs(info["rank_median_avg_s"] - sum(info["rank_median_s"]) / 2) < 1e-12
    assert rank_aggregates([rank0]) == {} and rank_aggregates([]) == {}  # one rank: nothing to aggregate
    assert rank_aggregates([rank0, rank1[:10]]) == {}  # ranks that disagree on the count: no claim
