"""The DataLoader side of an epoch: any layout as a map-style dataset, the collate functions, and
the memory sampler of the check epoch."""

from __future__ import annotations

import threading
import time

from .checksums import _flatten


class _ListDataset:
    """A list of tensors or numpy arrays, or a stacked tensor, as a map-style dataset (numpy
    arrays become tensors): ``self.items[index]``, as a user's own Dataset would do it."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        item = self.items[index]
        if not hasattr(item, "untyped_storage"):
            import torch

            item = torch.from_numpy(item)
        return item


def as_map_dataset(data):
    if isinstance(data, list) or hasattr(data, "untyped_storage"):  # a list, or a stacked tensor
        return _ListDataset(data)
    return data


def flat_collate(batch):
    """Variable-size samples cannot be stacked: concatenate them flat, with their lengths."""
    import torch

    return torch.cat([t.reshape(-1) for t in batch]), torch.tensor([t.numel() for t in batch])


class _Indexed:
    """``dataset[i]`` as ``(i, dataset[i])``: the check's epoch knows which sample it got."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return index, self.dataset[index]


def indexed_collate(batch):
    """(indices, flat elements, lengths, shapes) of a batch of ``(index, sample)`` pairs."""
    import torch

    flat, lengths, rows = _flatten([sample for _, sample in batch])
    return torch.tensor([index for index, _ in batch], dtype=torch.int64), flat, lengths, rows


class _MemorySampler:
    """Samples the summed PSS and USS of this process and its children (loader workers), every
    ``interval_s`` or, when a sample itself takes long (reading /proc/<pid>/smaps of processes
    that map thousands of shared tensors), every ``BUSY_FACTOR`` x its duration, so the sampler
    keeps at most about a fifth of a core."""

    BUSY_FACTOR = 5.0

    def __init__(self, interval_s: float = 0.02):
        import psutil

        self._proc = psutil.Process()
        self.interval_s = interval_s
        self.peak_pss = self.peak_uss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddpbench-mem", daemon=True)

    def sample(self) -> None:
        import psutil

        pss = uss = 0
        for proc in [self._proc] + self._proc.children(recursive=True):
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                continue
            pss += info.pss
            uss += info.uss
        self.peak_pss, self.peak_uss = max(self.peak_pss, pss), max(self.peak_uss, uss)

    def _loop(self):
        wait_s = self.interval_s
        while not self._stop.wait(wait_s):
            start = time.perf_counter()
            self.sample()
            wait_s = max(self.interval_s, self.BUSY_FACTOR * (time.perf_counter() - start))

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()
