"""Fingerprints of every sample by index (shape, sum, position-weighted sum): what the check epoch
compares against the dataset as built."""

from __future__ import annotations

SHAPE_WIDTH = 8  # dimensions a sample's recorded shape holds (padded with -1)
POSITION_WEIGHTS = 4093  # element k of a sample weighs (k mod 4093) + 1 in its weighted sum
CHECKSUM_BATCH_ELEMENTS = 1 << 23  # elements fingerprinted at a time (64 MiB as float64)


class SampleChecksums:
    """Fingerprints of a dataset's samples, by index: each sample's shape, the sum of its elements
    and their position-weighted sum (element k weighs ``k mod 4093 + 1``), in float64 -- exact
    for the suite's samples (small integers). A swapped or reordered sample, a moved boundary, a
    transposed shape or transposed data changes at least one of them.

    Numpy arrays, so the workload that carries them pickles them by value (torch tensors would
    travel to the ranks through shared memory and show up in the handover's descriptor counts).
    """

    def __init__(self, shapes, sums, weighted):
        self.shapes, self.sums, self.weighted = shapes, sums, weighted

    def __len__(self) -> int:
        return len(self.sums)

    def __repr__(self) -> str:
        return f"SampleChecksums({len(self)} samples)"

    @classmethod
    def of(cls, samples, batch_elements: int = CHECKSUM_BATCH_ELEMENTS) -> "SampleChecksums":
        """The fingerprints of ``samples`` (an iterable of tensors or numpy arrays: a list, the
        rows of a stacked tensor, a generator), a batch of about ``batch_elements`` at a time."""
        import torch

        shapes, sums, weighted = [], [], []
        items: list = []
        pending = 0

        def flush():
            flat, lengths, rows = _flatten(items)
            s, w = fingerprints(flat, lengths)
            shapes.append(rows)
            sums.append(s)
            weighted.append(w)
            items.clear()

        for sample in samples:
            items.append(torch.as_tensor(sample))
            pending += items[-1].numel()
            if pending >= batch_elements:
                flush()
                pending = 0
        if items or not shapes:
            flush()
        return cls(torch.cat(shapes).numpy(), torch.cat(sums).numpy(), torch.cat(weighted).numpy())

    @classmethod
    def of_spec(cls, spec) -> "SampleChecksums":
        """The fingerprints of ``spec``'s samples (a ``layouts.DatasetSpec``, or anything whose
        ``iter_samples()`` yields them), generated a batch at a time (never all held)."""
        return cls.of(spec.iter_samples())

    @property
    def total(self) -> float:
        """The sum of every element of the dataset."""
        return float(self.sums.sum())


def shape_rows(items):
    """(len(items), SHAPE_WIDTH) int64: each item's shape, padded with -1."""
    import torch

    rows = []
    for i, t in enumerate(items):
        if t.dim() > SHAPE_WIDTH:
            raise ValueError(f"sample {i} has {t.dim()} dimensions; fingerprints record at most {SHAPE_WIDTH}")
        rows.append(list(t.shape) + [-1] * (SHAPE_WIDTH - t.dim()))
    return torch.tensor(rows, dtype=torch.int64).reshape(len(items), SHAPE_WIDTH)


def _flatten(items):
    import torch

    flat = torch.cat([t.reshape(-1) for t in items]) if items else torch.empty(0)
    return flat, torch.tensor([t.numel() for t in items], dtype=torch.int64), shape_rows(items)


def fingerprints(flat, lengths):
    """Per-sample (sum, position-weighted sum) in float64 of samples stored back to back in
    ``flat`` with ``lengths`` elements each. Vectorised: the samples become the rows of a
    zero-padded matrix (a plain view when they are all one size), summed and multiplied by the
    weights. For integer-valued samples (the suite's) every partial sum is an exact float64
    integer, so the result does not depend on the batching or the summation order."""
    import torch

    lengths = lengths.to(torch.int64)
    count = lengths.numel()
    width = int(lengths.max()) if count else 0
    values = flat.reshape(-1).to(torch.float64)
    if count and bool((lengths == width).all()):
        rows = values.view(count, width)
    else:
        rows = torch.zeros(count, width, dtype=torch.float64)
        rows[torch.arange(width) < lengths[:, None]] = values
    weights = torch.arange(width, dtype=torch.int64).remainder_(POSITION_WEIGHTS).add_(1).to(torch.float64)
    return rows.sum(1), rows @ weights


