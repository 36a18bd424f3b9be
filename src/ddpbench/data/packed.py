"""``PackedTensorDataset``: many variable-size tensors in one storage plus an offsets index, so handing
it to another process costs four storages whatever the sample count (docs/design/families.md#packedtensordataset)."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch.utils.data import Dataset

__all__ = ["PackedTensorDataset", "pack_tensors"]


class PackedTensorDataset(Dataset):
    """Samples stored back to back in one 1-D tensor; ``self[i]`` is a view of sample ``i``.

    ``data``: 1-D tensor holding every sample's elements in order; ``offsets``: int64 tensor of
    length N+1 (sample i is ``data[offsets[i]:offsets[i+1]]``); ``shapes``: int64 tensor (N, D)
    with each sample's shape left-aligned and padded with zeros; ``ndims``: int64 tensor (N,)
    with each sample's number of dimensions.
    """

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor, shapes: torch.Tensor,
                 ndims: torch.Tensor):
        if not isinstance(data, torch.Tensor) or data.dim() != 1:
            raise ValueError("PackedTensorDataset: data must be a 1-D tensor")
        if offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.numel() < 1:
            raise ValueError("PackedTensorDataset: offsets must be a 1-D int64 tensor of length N+1")
        n = offsets.numel() - 1
        if shapes.dtype != torch.int64 or shapes.dim() != 2 or shapes.shape[0] != n:
            raise ValueError(f"PackedTensorDataset: shapes must be an int64 tensor of shape ({n}, D)")
        if ndims.dtype != torch.int64 or ndims.shape != (n,):
            raise ValueError(f"PackedTensorDataset: ndims must be an int64 tensor of shape ({n},)")
        if int(offsets[0]) != 0 or int(offsets[-1]) != data.numel():
            raise ValueError(
                f"PackedTensorDataset: offsets must start at 0 and end at data.numel() "
                f"({data.numel()}); got {int(offsets[0])} .. {int(offsets[-1])}")
        self.data = data
        self.offsets = offsets
        self.shapes = shapes
        self.ndims = ndims
        self._views = self._make_views()

    @classmethod
    def from_tensors(cls, tensors: Iterable[torch.Tensor]) -> "PackedTensorDataset":
        """Pack ``tensors`` (one dtype, any shapes) into one contiguous storage (copies them)."""
        tensors = list(tensors)
        if not tensors:
            raise ValueError("PackedTensorDataset.from_tensors: need at least one tensor")
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"PackedTensorDataset.from_tensors: item {i} is a "
                                f"{type(t).__name__}, not a tensor")
        dtype, device = tensors[0].dtype, tensors[0].device
        for i, t in enumerate(tensors):
            if t.dtype != dtype:
                raise ValueError(f"PackedTensorDataset.from_tensors: item {i} has dtype {t.dtype}, "
                                 f"item 0 has {dtype}; pack each dtype separately")
            if t.device != device:
                raise ValueError(f"PackedTensorDataset.from_tensors: item {i} is on {t.device}, "
                                 f"item 0 on {device}")
        sizes = [t.numel() for t in tensors]
        offsets = torch.zeros(len(tensors) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)
        max_ndim = max(t.dim() for t in tensors)
        shapes = torch.zeros(len(tensors), max_ndim, dtype=torch.int64)
        for i, t in enumerate(tensors):
            if t.dim():
                shapes[i, : t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        ndims = torch.tensor([t.dim() for t in tensors], dtype=torch.int64)
        data = torch.empty(int(offsets[-1]), dtype=dtype, device=device)
        for i, t in enumerate(tensors):
            if sizes[i]:
                data[int(offsets[i]): int(offsets[i + 1])].copy_(t.reshape(-1))
        return cls(data, offsets, shapes, ndims)

    def _make_views(self) -> list[torch.Tensor]:
        """Every sample as a view of ``data``, in order (made once; ``__getitem__`` only indexes)."""
        n = len(self)
        if n == 0:
            return []
        ndims = self.ndims.tolist()
        shapes = [tuple(row[:nd]) for row, nd in zip(self.shapes.tolist(), ndims)]
        first = shapes[0]
        if all(shape == first for shape in shapes):  # one shape: a single reshape and unbind
            return list(self.data.view((n,) + first).unbind(0))
        sizes = (self.offsets[1:] - self.offsets[:-1]).tolist()
        return [part.view(shape) for part, shape in zip(self.data.split(sizes), shapes)]

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def __getitem__(self, index: int) -> torch.Tensor:
        try:
            return self._views[index]
        except IndexError:
            raise IndexError(f"PackedTensorDataset index {index} out of range for "
                             f"{len(self._views)} samples") from None
        except TypeError:
            raise TypeError(f"PackedTensorDataset indices must be integers, got "
                            f"{type(index).__name__}") from None

    def to_list(self) -> list[torch.Tensor]:
        """Every sample as its own (copied) tensor: the inverse of :meth:`from_tensors`."""
        return [self[i].clone() for i in range(len(self))]

    def share_memory_(self) -> "PackedTensorDataset":
        """Move the four tensors to shared memory (torch.multiprocessing does it when pickling)."""
        for t in (self.data, self.offsets, self.shapes, self.ndims):
            t.share_memory_()
        return self

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_views"]  # rebuilt by the receiver: the pickle carries the four tensors only
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._views = self._make_views()

    def __repr__(self) -> str:
        return (f"PackedTensorDataset({len(self)} samples, dtype={self.data.dtype}, "
                f"{self.nbytes} bytes)")


def pack_tensors(tensors: Sequence[torch.Tensor]) -> PackedTensorDataset:
    """Pack a list of variable-size tensors of one dtype; see :class:`PackedTensorDataset`."""
    return PackedTensorDataset.from_tensors(tensors)
