"""The dataset a case hands over: its spec (layout, sample count and shape; the same spec always
gives the same samples) and how the controller builds it in each layout."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from .checksums import SampleChecksums

LAYOUTS = ("list", "stacked", "packed", "numpy", "mmap")
FIXED_SHAPE = (3, 32, 32)  # CIFAR-sized float32 images (the default grid)
REPORT_SHAPE = (3, 224, 224)  # the reports' samples (Lightning #1925, pytorch#39443): 602 KB of float32
VARIABLE_SIDE = (16, 48)  # variable-size samples: 3 x H x W with H, W uniform in this range


@dataclass(frozen=True)
class DatasetSpec:
    """What to build: layout, sample count, and float32 samples of small integers, either all of
    ``shape`` (default 3x32x32) or, with ``variable``, 3 x H x W with H and W drawn from
    :data:`VARIABLE_SIDE`. The same spec always gives the same samples, whatever the layout."""

    layout: str
    num_samples: int
    variable: bool = False
    seed: int = 0
    shape: tuple[int, ...] = FIXED_SHAPE

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown dataset layout {self.layout!r}; expected one of {', '.join(LAYOUTS)}")
        if not isinstance(self.num_samples, int) or isinstance(self.num_samples, bool) or self.num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {self.num_samples!r}")
        shape = tuple(self.shape) if isinstance(self.shape, (tuple, list)) else None
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise ValueError(f"shape must be a tuple of positive integers, e.g. (3, 224, 224), got {self.shape!r}")
        object.__setattr__(self, "shape", shape)
        if self.layout == "stacked" and self.variable:
            raise ValueError(
                "the 'stacked' layout is one N x C x H x W tensor, so every sample must have the same "
                "shape, and variable=True asks for samples of different sizes. Use the 'packed' layout "
                "(ddpbench.PackedTensorDataset: one storage for samples of any shape) or 'list' for "
                "variable-size samples, or drop variable=True to stack fixed-size samples.")

    def shapes(self) -> list[tuple[int, ...]]:
        if not self.variable:
            return [self.shape] * self.num_samples
        import random

        rng = random.Random(self.seed)
        lo, hi = VARIABLE_SIDE
        return [(3, rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(self.num_samples)]

    def iter_samples(self):
        """The samples one at a time, as fresh float32 tensors of small integers (sums are exact
        in float64)."""
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        for shape in self.shapes():
            yield torch.randint(0, 256, shape, generator=gen).to(torch.float32)

    def samples(self):
        """The samples as a list of fresh float32 tensors."""
        return list(self.iter_samples())

    @property
    def sample_bytes(self) -> int | None:
        """Bytes of one sample (float32), or None for variable-size samples."""
        if self.variable:
            return None
        count = 1
        for d in self.shape:
            count *= d
        return 4 * count


@dataclass
class BuiltDataset:
    spec: DatasetSpec
    data: Any  # what is handed over
    checksums: SampleChecksums | None  # of the samples as built, by index (DatasetEpoch checks against them)
    elements: int
    path: str | None = None  # the mmap layout's file

    def cleanup(self) -> None:
        self.data = None
        remove_mapped_file(self.path)
        self.path = None


def remove_mapped_file(path: str | None) -> None:
    """Delete the mmap layout's file and its private directory (nothing if ``path`` is None)."""
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def build_dataset(spec: DatasetSpec, *, checksums: bool = True) -> BuiltDataset:
    """Build ``spec``'s dataset in this process (fresh storages: nothing shared yet); with
    ``checksums``, fingerprint every sample as built."""
    import torch

    from ...data.packed import PackedTensorDataset

    if spec.layout == "stacked":
        data = torch.empty((spec.num_samples,) + spec.shape, dtype=torch.float32)
        for i, sample in enumerate(spec.iter_samples()):
            data[i].copy_(sample)
        return BuiltDataset(spec, data, SampleChecksums.of(data) if checksums else None, data.numel())
    samples = spec.samples()
    sums = SampleChecksums.of(samples) if checksums else None
    elements = sum(t.numel() for t in samples)
    if spec.layout == "list":
        return BuiltDataset(spec, samples, sums, elements)
    if spec.layout == "numpy":
        return BuiltDataset(spec, [t.numpy() for t in samples], sums, elements)
    packed = PackedTensorDataset.from_tensors(samples)
    del samples
    if spec.layout == "packed":
        return BuiltDataset(spec, packed, sums, elements)
    directory = tempfile.mkdtemp(prefix="ddpbench-mmap-")
    path = os.path.join(directory, "samples.bin")
    try:
        packed.data.numpy().tofile(path)
    except BaseException as exc:
        remove_mapped_file(path)  # a partial file must not stay behind in the temporary folder
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"writing the mmap layout's {packed.data.numel() * packed.data.element_size()} "
                                     f"bytes to {path} failed ({exc.strerror or exc}); nothing was left "
                                     f"behind. Free space there or point TMPDIR at a larger disk") from exc
        raise
    data = MappedPackedDataset(path, str(packed.data.dtype).removeprefix("torch."), packed.data.numel(),
                               packed.offsets.numpy(), packed.shapes.numpy(), packed.ndims.numpy())
    return BuiltDataset(spec, data, sums, elements, path=path)


class MappedPackedDataset:
    """The packed layout backed by a file: ranks map it (``torch.from_file``) instead of receiving
    shared memory. Pickles as path + index (numpy, by value), so no storage is shared."""

    def __init__(self, path, dtype: str, numel: int, offsets, shapes, ndims):
        self.path, self.dtype, self.numel = path, dtype, numel
        self.offsets, self.shapes, self.ndims = offsets, shapes, ndims
        self._packed = None

    def packed(self):
        if self._packed is None:
            import torch

            from ...data.packed import PackedTensorDataset

            data = torch.from_file(self.path, shared=False, size=self.numel, dtype=getattr(torch, self.dtype))
            self._packed = PackedTensorDataset(data, torch.from_numpy(self.offsets),
                                               torch.from_numpy(self.shapes), torch.from_numpy(self.ndims))
        return self._packed

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, index):
        return self.packed()[index]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_packed"] = None
        return state


