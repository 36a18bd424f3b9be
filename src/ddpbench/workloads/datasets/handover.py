"""Where a rank's dataset comes from: handed over by the controller inside the workload (pickled
with ForkingPickler under the case's sharing strategy, with the descriptor budget checked on both
sides and unfetched duplicates closed), or built by the rank itself."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import pickle
import time
import weakref
from typing import Any

from .layouts import DatasetSpec, MappedPackedDataset, build_dataset, remove_mapped_file
from .resources import (FD_MARGIN, DatasetShareError, check_strategy, fd_limit_message, mapped_shm_segments,
                        open_fd_count, sharing_strategy, soft_fd_limit, torch_shm_files)


def shared_storage_count(obj) -> int:
    """Distinct tensor storages in ``obj`` (a list/tuple/dict of tensors, a PackedTensorDataset...):
    under ``file_descriptor`` each is one descriptor in every receiver."""
    import torch

    seen: set = set()
    stack = [obj]
    visited_ids: set = set()
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            seen.add(item.untyped_storage().data_ptr() if item.untyped_storage().nbytes() else id(item))
            continue
        if id(item) in visited_ids:
            continue
        visited_ids.add(id(item))
        if isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, MappedPackedDataset):
            continue  # pickles by value
        elif hasattr(item, "__dict__"):
            stack.extend(vars(item).values())
    return len(seen)




def _resource_sharer_cache() -> dict | None:
    """The sender's pending descriptor duplicates (multiprocessing private state; None if absent)."""
    from multiprocessing import resource_sharer

    sharer = getattr(resource_sharer, "_resource_sharer", None)
    cache = getattr(sharer, "_cache", None)
    return cache if isinstance(cache, dict) else None


def _close_unfetched(registered: set) -> int:
    """Close the descriptor duplicates among ``registered`` (resource-sharer keys) that no
    receiver fetched (a refused or failed handover); returns how many."""
    cache = _resource_sharer_cache()
    closed = 0
    if cache is not None:
        for key in registered:
            entry = cache.pop(key, None)
            if entry is not None:
                _, close = entry
                with contextlib.suppress(Exception):
                    close()
                closed += 1
    registered.clear()
    return closed


def _release_controller_side(registered: set, path: str | None) -> None:
    _close_unfetched(registered)
    remove_mapped_file(path)


def _errno_in_chain(exc: BaseException, code: int) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == code:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _Handover:
    """The controller's side of a handover. The pool pickles the workload once per receiving rank,
    and each time this pickles the dataset afresh with ``ForkingPickler`` under the case's sharing
    strategy (under ``file_descriptor``: one descriptor duplicate per storage per rank), checks
    this process's descriptor budget first, and remembers which resource-sharer entries it
    registered, so that unfetched ones can be closed. What travels is a :class:`_Sealed`."""

    def __init__(self, data, strategy: str, preflight: bool = True, path: str | None = None):
        check_strategy(strategy)
        self.data, self.strategy, self.preflight = data, strategy, preflight
        self.storages = shared_storage_count(data)
        self.copies = 0  # pickled so far (one per receiving rank, per pool)
        self.registered: set = set()
        self.shm_files: set[str] = set()  # /dev/shm files this process created for it (file_system)
        self._release = weakref.finalize(self, _release_controller_side, self.registered, path)

    def _check_sender_budget(self) -> None:
        # The first copy also moves every storage to shared memory, which keeps one descriptor
        # per storage open here; every copy adds one duplicate per storage until it is fetched.
        needed = self.storages * (1 if self.copies else 2)
        limit, open_now = soft_fd_limit(), open_fd_count()
        if open_now + needed + FD_MARGIN > limit:
            _close_unfetched(self.registered)
            raise DatasetShareError(fd_limit_message(
                "sender (this process)", self.storages, needed, limit, open_now))

    def __reduce__(self):
        from multiprocessing.reduction import ForkingPickler

        if self.data is None:
            raise DatasetShareError("ddpbench: this DatasetEpoch was closed (DatasetEpoch.close()); its "
                                    "dataset can no longer be handed over. Build a new one for each case.")
        pickled_at = time.time()
        if self.preflight and self.strategy == "file_descriptor" and self.storages:
            self._check_sender_budget()
        cache = _resource_sharer_cache()
        before = set(cache) if cache is not None else set()
        shm_before = torch_shm_files([os.getpid()])
        try:
            with sharing_strategy(self.strategy):
                payload = bytes(ForkingPickler.dumps(self.data))
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                _close_unfetched(self.registered)
                raise DatasetShareError(fd_limit_message(
                    "sender (this process)", self.storages, self.storages, soft_fd_limit(),
                    open_fd_count())) from exc
            raise
        finally:
            if cache is not None:
                self.registered |= set(cache) - before
            self.shm_files |= torch_shm_files([os.getpid()]) - shm_before
        self.copies += 1
        return (_Sealed, (payload, self.storages, self.preflight, pickled_at))

    def open(self, ctx, strategy: str | None = None):
        raise RuntimeError("ddpbench: a handed-over DatasetEpoch opens its dataset in the ranks: pass it "
                           "to dist_benchmark (or pool.run(measure_workload, ...)), which pickles it "
                           "to every rank")

    def close(self) -> None:
        """Drop the dataset here, close unfetched descriptor duplicates, delete the mmap file."""
        self.data = None
        self._release()

    def controller_info(self) -> dict[str, Any]:
        return {"shm_files_created": len(self.shm_files)}


class _Sealed:
    """What a rank receives: the dataset's own ForkingPickler pickle, opened by the first
    ``setup`` (after the rank's descriptor budget is checked) and kept for later ones (A/B mode
    sets a workload up anew before each block)."""

    def __init__(self, payload: bytes, storages: int, preflight: bool, pickled_at: float):
        self.payload, self.storages, self.preflight, self.pickled_at = payload, storages, preflight, pickled_at
        self.data = None
        self.metrics: dict[str, Any] = {}

    def open(self, ctx, strategy: str):
        if self.data is not None:
            return self.data
        if self.payload is None:
            raise RuntimeError(f"rank {ctx.rank}: this dataset's handover already failed once")
        fd_strategy = strategy == "file_descriptor"
        limit, fds_before = soft_fd_limit(), open_fd_count()
        payload, self.payload = self.payload, None  # a descriptor can be fetched only once
        if self.preflight and fd_strategy and fds_before + self.storages + FD_MARGIN > limit:
            raise DatasetShareError(fd_limit_message(
                f"rank {ctx.rank}", self.storages, self.storages, limit, fds_before))
        shm_before = mapped_shm_segments()
        start = time.perf_counter()
        try:
            data = pickle.loads(payload)
        except Exception as exc:
            gc.collect()  # close the descriptors received before the failure
            if fd_strategy and (_errno_in_chain(exc, errno.EMFILE) or fds_before + self.storages >= limit):
                raise DatasetShareError(fd_limit_message(
                    f"rank {ctx.rank}", self.storages, self.storages, limit, fds_before)) from exc
            raise
        received = time.perf_counter()
        self.metrics = {
            # from the controller starting to pickle this rank's copy to the rank holding it
            "share_seconds": round(time.time() - self.pickled_at, 6),
            "receive_seconds": round(received - start, 6),
            "open_fds": open_fd_count(),
            "open_fds_before": fds_before,
            "shm_segments": len(mapped_shm_segments() - shm_before),
            "received_samples": len(data),
        }
        self.data = data
        return data


class _BuiltInRank:
    """The control without a handover: every rank builds the same samples itself, in its own
    memory (once per case; kept across A/B mode's per-block set-ups)."""

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        self.data = None
        self.metrics: dict[str, Any] = {}

    def open(self, ctx, strategy: str):
        if self.data is None:
            start = time.perf_counter()
            self.data = build_dataset(self.spec, checksums=False).data
            self.metrics = {"build_seconds": round(time.perf_counter() - start, 6), "open_fds": open_fd_count()}
        return self.data

    def __getstate__(self):
        return {"spec": self.spec, "data": None, "metrics": {}}

    def close(self) -> None:
        self.data = None

    def controller_info(self) -> dict[str, Any]:
        return {}
