"""What the dataset check epoch found wrong, from what it gathered per index (how often each came,
its shape and fingerprints) against the sampler's counts and the dataset as built: a list of
problems, empty when every sample came as often as it should and matches. It reads tensors only;
the epoch that gathers them is ddpbench.workloads.datasets.epoch's."""

from __future__ import annotations

from .checksums import SampleChecksums


def count_problems(counts, expected_counts) -> list[str]:
    """Indices that never came, and indices that came more often than this rank's sampler yields them."""
    problems = []
    missing = ((counts == 0) & (expected_counts > 0)).nonzero().flatten()
    repeated = (counts > expected_counts).nonzero().flatten()
    if missing.numel():
        problems.append(f"{missing.numel()} samples never came (first: index {int(missing[0])})")
    if repeated.numel():
        first = int(repeated[0])
        problems.append(f"{repeated.numel()} samples came more often than the sampler yields them "
                        f"(first: index {first}, {int(counts[first])} times, expected "
                        f"{int(expected_counts[first])})")
    return problems


def sample_problems(expected: SampleChecksums, counts, shapes, sums, weighted) -> list[str]:
    """The samples that came and differ from the dataset as built (shape, sum or weighted sum), the
    first three described."""
    import torch

    exp_shapes = torch.from_numpy(expected.shapes)
    exp_sums, exp_weighted = torch.from_numpy(expected.sums), torch.from_numpy(expected.weighted)
    seen = counts > 0
    bad = seen & ((shapes != exp_shapes).any(1) | (sums != exp_sums) | (weighted != exp_weighted))
    wrong = bad.nonzero().flatten()
    if not wrong.numel():
        return []
    shown = [describe_sample(int(i), shapes, sums, weighted, exp_shapes, exp_sums, exp_weighted) for i in wrong[:3]]
    more = f"; and {wrong.numel() - 3} more" if wrong.numel() > 3 else ""
    return [f"{wrong.numel()} of {int(seen.sum())} samples differ from the dataset as built: "
            + "; ".join(shown) + more]


def describe_sample(i, shapes, sums, weighted, exp_shapes, exp_sums, exp_weighted) -> str:
    """What is wrong with sample ``i`` (runs for a few wrong samples only)."""
    import torch

    def dims(row):
        return tuple(int(d) for d in row if d >= 0)

    got, want = dims(shapes[i]), dims(exp_shapes[i])
    if got != want:
        numel = lambda shape: int(torch.tensor(shape).prod()) if shape else 1  # noqa: E731
        if sorted(got) == sorted(want):
            return f"sample {i} has shape {got}, expected {want}: its shape is transposed"
        if numel(got) != numel(want):
            return (f"sample {i} has shape {got} ({numel(got)} elements), expected {want} "
                    f"({numel(want)}): the boundaries between samples moved")
        return f"sample {i} has shape {got}, expected {want}"
    same = ((exp_sums == sums[i]) & (exp_weighted == weighted[i])
            & (exp_shapes == shapes[i]).all(1)).nonzero().flatten()
    others = [int(j) for j in same if int(j) != i]
    if others:
        return f"sample {i} holds sample {others[0]}'s data: samples swapped or reordered"
    if sums[i] == exp_sums[i]:
        return (f"sample {i} has the right shape and sum but its elements are in another order "
                f"(weighted sum {float(weighted[i]):.17g}, expected {float(exp_weighted[i]):.17g}): "
                f"transposed or permuted data")
    return (f"sample {i} has the right shape but other values (sum {float(sums[i]):.17g}, expected "
            f"{float(exp_sums[i]):.17g}): shifted boundaries or corrupted data")
