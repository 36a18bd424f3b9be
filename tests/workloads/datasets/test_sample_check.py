"""The dataset check epoch's judgement, read from tensors alone (no ranks, no loader): each kind of
wrong sample gets its own words, and a dataset that came whole and as built gets none."""

from __future__ import annotations

import torch

from ddpbench.workloads.datasets.checksums import SampleChecksums, fingerprints, shape_rows
from ddpbench.workloads.datasets.sample_check import count_problems, sample_problems

SAMPLES = [torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * i for i in range(5)]
EXPECTED = SampleChecksums.of(SAMPLES)


def _gathered(samples):
    """What the check epoch gathers when every index came once, holding ``samples``."""
    flat = torch.cat([s.reshape(-1) for s in samples])
    sums, weighted = fingerprints(flat, torch.tensor([s.numel() for s in samples]))
    return torch.ones(len(samples), dtype=torch.int64), shape_rows(samples), sums, weighted


def test_a_dataset_that_came_whole_and_as_built_has_no_problem():
    counts, shapes, sums, weighted = _gathered(SAMPLES)
    assert count_problems(counts, torch.ones(5, dtype=torch.int64)) == []
    assert sample_problems(EXPECTED, counts, shapes, sums, weighted) == []


def test_missing_and_repeated_indices_are_counted_against_the_sampler():
    problems = count_problems(torch.tensor([1, 0, 3, 1, 1]), torch.ones(5, dtype=torch.int64))
    assert problems == ["1 samples never came (first: index 1)",
                        "1 samples came more often than the sampler yields them (first: index 2, 3 times, expected 1)"]
    assert count_problems(torch.tensor([0, 2]), torch.tensor([0, 2])) == []  # another rank's shard: not expected


def test_each_kind_of_wrong_sample_is_named():
    swapped = [SAMPLES[1], SAMPLES[0], *SAMPLES[2:]]
    (problem,) = sample_problems(EXPECTED, *_gathered(swapped))
    assert problem.startswith("2 of 5 samples differ from the dataset as built: sample 0 holds sample 1's data")
    transposed = [SAMPLES[0].t().contiguous(), *SAMPLES[1:]]
    assert "sample 0 has shape (4, 3), expected (3, 4): its shape is transposed" in sample_problems(
        EXPECTED, *_gathered(transposed))[0]
    permuted = [SAMPLES[0].t().contiguous().view(3, 4), *SAMPLES[1:]]
    assert "elements are in another order" in sample_problems(EXPECTED, *_gathered(permuted))[0]
    shifted = [SAMPLES[0] + 1, *SAMPLES[1:]]
    assert "right shape but other values" in sample_problems(EXPECTED, *_gathered(shifted))[0]
