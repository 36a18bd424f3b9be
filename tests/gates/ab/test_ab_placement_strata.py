"""gates/ab/placement_strata.py (--dist-ab-stratify-cpu-sharing): pairs compared placement by placement, on
synthetic rounds whose time is set by where the ranks ran (1 ms on one CPU, 3 ms apart), the share
moving from block to block as 1 MB rounds do on a 2-vCPU VM."""

import math
import random
import statistics

import pytest

from ddpbench.gates import stats
from ddpbench.gates.ab import placement_strata

SHARED, APART = 1e-3, 3e-3


def _block(rng, apart_share, per_block=20, scale=1.0):
    """(rounds, placement): each round apart with ``apart_share``, slower then."""
    placement = [rng.random() >= apart_share for _ in range(per_block)]
    return [(SHARED if shared else APART) * scale * rng.uniform(0.99, 1.01) for shared in placement], placement


def _case(seed, pairs=24, candidate_scale=1.0, candidate_extra_apart=0.0):
    """Both sides' blocks and placements, pair by pair; each block's share apart drawn anew (0.2-0.8)."""
    rng = random.Random(seed)
    base = [_block(rng, rng.uniform(0.2, 0.8)) for _ in range(pairs)]
    cand = [_block(rng, min(1.0, rng.uniform(0.2, 0.8) + candidate_extra_apart), scale=candidate_scale)
            for _ in range(pairs)]
    return [b for b, _ in base], [c for c, _ in cand], [p for _, p in base], [p for _, p in cand]


def _analyse(base, cand, base_placements=None, cand_placements=None):
    if base_placements is None:
        summaries = [statistics.fmean(b) for b in base], [statistics.fmean(c) for c in cand]
    else:
        summaries = placement_strata.stratified_summaries(base, cand, base_placements, cand_placements)
    return stats.analyse_pairs(*summaries, 0.05, pool_pair_of=[i % 2 for i in range(len(base))],
                               baseline_minima=[min(b) for b in base], candidate_minima=[min(c) for c in cand])


def _log_width(result):
    return math.log(result.ci_high / result.ci_low)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_identical_sides_give_a_much_narrower_interval_stratified(seed):
    base, cand, base_placements, cand_placements = _case(seed)
    plain, stratified = _analyse(base, cand), _analyse(base, cand, base_placements, cand_placements)
    # The shares' noise dominates the plain means; placement by placement only the rounds' own 1% is left.
    assert plain.verdict != "same" and _log_width(plain) > math.log(1.1)
    assert stratified.verdict == "same" and 10 * _log_width(stratified) < _log_width(plain)


def test_a_slowdown_of_every_round_reads_the_same_stratified_however_large():
    for scale in (1.10, 2.0):
        base, cand, base_placements, cand_placements = _case(4, candidate_scale=scale)
        stratified = _analyse(base, cand, base_placements, cand_placements)
        assert stratified.ratio == pytest.approx(scale, rel=0.01) and stratified.verdict == "regression"
    # Negative control, why the strata come from placement and not from the round times: sorted by
    # time (below or above 2 ms), a 2x slower candidate's shared-CPU rounds (2 ms) land among the
    # baseline's slow rounds and the change reads well short of 2x.
    by_time = [[t < 2e-3 for t in block] for block in (*base, *cand)]
    hidden = _analyse(base, cand, by_time[:len(base)], by_time[len(base):])
    assert hidden.ratio < 1.8


def test_stratified_summaries_do_not_see_a_change_in_how_often_the_ranks_share_a_cpu():
    # The reason it is an option: the candidate's blocks have 20 points more rounds apart, which
    # the plain means see as a slowdown and the stratified summaries, by design, do not.
    base, cand, base_placements, cand_placements = _case(5, candidate_extra_apart=0.2)
    plain, stratified = _analyse(base, cand), _analyse(base, cand, base_placements, cand_placements)
    assert plain.ratio > 1.1 and plain.ci_low > 1.0
    assert stratified.ratio == pytest.approx(1.0, abs=0.01) and stratified.verdict == "same"


def test_a_pair_is_summarised_at_its_own_mix_of_placements():
    # Baseline 1 round apart of 4, candidate 3 of 4: at the pair's mix (4 and 4 of 8) both blocks
    # read (1 + 3) / 2 ms, where their plain means read 1.5 and 2.5 ms.
    base, base_at = [SHARED, SHARED, SHARED, APART], [True, True, True, False]
    cand, cand_at = [SHARED, APART, APART, APART], [True, False, False, False]
    assert placement_strata.pair_summaries(base, cand, base_at, cand_at) == pytest.approx((2e-3, 2e-3))
    assert (placement_strata.pair_summaries(base, [t * 1.1 for t in cand], base_at, cand_at)
            == pytest.approx((2e-3, 2.2e-3)))
    # Only the placements both blocks have count; none in common: the plain means.
    assert placement_strata.pair_summaries([SHARED, SHARED, APART], [SHARED, SHARED], [True, True, False],
                                           [True, True]) == pytest.approx((SHARED, SHARED))
    assert placement_strata.pair_summaries([SHARED], [APART], [True], [False]) == pytest.approx((SHARED, APART))
    with pytest.raises(ValueError, match="rounds in both blocks"):
        placement_strata.pair_summaries([], [SHARED], [], [True])
    with pytest.raises(ValueError, match="one entry per round"):
        placement_strata.pair_summaries([SHARED], [SHARED], [True, True], [True])


def test_placement_comes_from_the_ranks_cpus_and_unknown_placement_is_not_stratified():
    assert placement_strata.block_placement([[0, 1, 1], [0, 0, 1]]) == [True, False, True]
    assert placement_strata.block_placement([[0, 1], None]) is None
    assert placement_strata.block_placement([[0, 1]]) is None
    assert placement_strata.stratified_summaries([[SHARED]], [[SHARED]], [[True]], [None]) is None
    with pytest.raises(ValueError, match="one block and one placement per side and pair"):
        placement_strata.stratified_summaries([[SHARED]], [], [[True]], [])
    # Recorded round by round as text, read back block by block.
    text = placement_strata.placement_text([[True, False], [False, False]])
    assert text == "1000" and placement_strata.placements_from_text(text, 2) == [[True, False], [False, False]]
    assert placement_strata.placement_text([[True], None]) is None
    for bad, per_block in (("10x0", 2), ("100", 2)):
        with pytest.raises(ValueError, match="string of 0 and 1"):
            placement_strata.placements_from_text(bad, per_block)
