"""Dataset storage sharing: how a dataset's layout decides the cost of handing it to spawned ranks.

The controller builds a dataset in one of these layouts:

* ``list``   -- a Python list of tensors (the reported case: one shared storage per sample);
* ``packed`` -- :class:`ddpbench.PackedTensorDataset`: one storage + offsets/shapes index;
* ``numpy``  -- a Python list of numpy arrays (pickled by value: no shared memory, one copy per rank);
* ``mmap``   -- the packed layout written to a file and memory-mapped by every rank (only the path
  and the small index travel; the page cache is shared).

:func:`hand_over` gives it to every rank the way launchers do (mp.spawn arguments, an mp.Queue):
``ForkingPickler`` pickling, i.e. torch.multiprocessing's shared-memory reductions under the chosen
sharing strategy. Each rank keeps what it received in ``ctx.scratch``; :class:`DatasetEpoch` then
times one DataLoader epoch over it per round, and :func:`release` frees it and restores the rank's
sharing strategy.

File-descriptor budget. Under ``file_descriptor`` every shared storage is one descriptor: the
receiver keeps one per storage, and the sender keeps one per storage plus one duplicate per
storage per receiver until the receiver fetches it from the sender's ``multiprocessing``
resource-sharer thread. Running out of descriptors on either side used to end in EMFILE and a
receiver blocked forever; here both sides check before any descriptor moves
(:class:`DatasetShareError` names the cause and the fixes), an EMFILE that happens anyway is turned
into the same error, and the sender closes every duplicate a receiver did not fetch.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import pickle
import resource
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import Workload

LAYOUTS = ("list", "packed", "numpy", "mmap")
STRATEGIES = ("file_descriptor", "file_system")
WORKER_START_METHODS = ("fork", "spawn")
SCRATCH_KEY = "ddpbench.dataset"
# Descriptors kept free for what else happens during a transfer (the connection to the sender's
# resource sharer, DataLoader pipes): a handover that would leave fewer is refused up front.
FD_MARGIN = 32
FIXED_SHAPE = (3, 32, 32)  # the reported case: CIFAR-sized float32 images
SHAPE_WIDTH = 8  # dimensions a sample's recorded shape holds (padded with -1)
POSITION_WEIGHTS = 4093  # element k of a sample weighs (k mod 4093) + 1 in its weighted sum
VARIABLE_SIDE = (16, 48)  # variable-size samples: 3 x H x W with H, W uniform in this range


class DatasetShareError(RuntimeError):
    """A handover cannot happen (the open-file limit would be exceeded)."""


def fd_limit_message(side: str, tensors: int, needed: int, limit: int, open_now: int) -> str:
    """The message of the fd-limit error: the cause and the three fixes."""
    return (
        f"ddpbench: {side}: handing over this dataset needs {needed} file descriptors under the "
        f"'file_descriptor' sharing strategy ({tensors} tensors need {tensors} descriptors, one "
        f"shared-memory segment each), but the open-file limit (RLIMIT_NOFILE soft limit) is "
        f"{limit} with {open_now} already open. Fixes: pack the samples into one tensor "
        f"(ddpbench.PackedTensorDataset, layout 'packed': 4 descriptors whatever the sample count); "
        f"or torch.multiprocessing.set_sharing_strategy('file_system') in the sender and the "
        f"receivers (no descriptor per tensor); or raise the limit "
        f"(ulimit -n {_suggested_limit(needed + open_now)})."
    )


def _suggested_limit(needed: int) -> int:
    limit = 1024
    while limit < needed + FD_MARGIN:
        limit *= 2
    return limit


def open_fd_count() -> int:
    """Open file descriptors of this process (psutil's num_fds)."""
    import psutil

    return psutil.Process().num_fds()


def soft_fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def mapped_shm_segments() -> set[str]:
    """The shared-memory segments (/dev/shm files, unlinked or not) mapped into this process."""
    segments = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            at = line.find("/dev/shm/")
            if at >= 0:
                segments.add(line[at:].rstrip("\n").removesuffix(" (deleted)"))
    return segments


def torch_shm_files(pids) -> set[str]:
    """/dev/shm files torch created for the given pids (``torch_<pid>_...``; file_system strategy)."""
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefixes)}
    except OSError:
        return set()


@contextlib.contextmanager
def sharing_strategy(strategy: str):
    """Set torch.multiprocessing's sharing strategy in this process; restore it afterwards."""
    import torch.multiprocessing as tmp

    check_strategy(strategy)
    previous = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy(strategy)
    try:
        yield
    finally:
        tmp.set_sharing_strategy(previous)


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sharing strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


# ----------------------------------------------------------------------------------------------
# Building the dataset (controller)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """What to build: layout, sample count, fixed (3x32x32) or variable-size float32 samples."""

    layout: str
    num_samples: int
    variable: bool = False
    seed: int = 0

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown dataset layout {self.layout!r}; expected one of {', '.join(LAYOUTS)}")
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {self.num_samples!r}")

    def shapes(self) -> list[tuple[int, ...]]:
        if not self.variable:
            return [FIXED_SHAPE] * self.num_samples
        import random

        rng = random.Random(self.seed)
        lo, hi = VARIABLE_SIDE
        return [(3, rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(self.num_samples)]

    def samples(self):
        """The samples as fresh float32 tensors of small integers (sums are exact in float64)."""
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        return [torch.randint(0, 256, shape, generator=gen).to(torch.float32) for shape in self.shapes()]


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
    def of(cls, samples, batch: int = 1024) -> "SampleChecksums":
        """The fingerprints of ``samples`` (tensors or numpy arrays), a batch at a time."""
        import torch

        shapes, sums, weighted = [], [], []
        for start in range(0, len(samples), batch):
            items = [torch.as_tensor(t) for t in samples[start:start + batch]]
            flat, lengths, rows = _flatten(items)
            s, w = fingerprints(flat, lengths)
            shapes.append(rows)
            sums.append(s)
            weighted.append(w)
        return cls(torch.cat(shapes).numpy(), torch.cat(sums).numpy(), torch.cat(weighted).numpy())

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


@dataclass
class BuiltDataset:
    spec: DatasetSpec
    data: Any  # what is handed over
    checksums: SampleChecksums  # of the samples as built, by index (DatasetEpoch checks against them)
    elements: int
    path: str | None = None  # the mmap layout's file

    def cleanup(self) -> None:
        self.data = None
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self.path))
            self.path = None


def build_dataset(spec: DatasetSpec) -> BuiltDataset:
    """Build ``spec``'s dataset in this process (fresh storages: nothing shared yet)."""
    from ..packed import PackedTensorDataset

    samples = spec.samples()
    checksums = SampleChecksums.of(samples)
    elements = sum(t.numel() for t in samples)
    if spec.layout == "list":
        return BuiltDataset(spec, samples, checksums, elements)
    if spec.layout == "numpy":
        return BuiltDataset(spec, [t.numpy() for t in samples], checksums, elements)
    packed = PackedTensorDataset.from_tensors(samples)
    if spec.layout == "packed":
        return BuiltDataset(spec, packed, checksums, elements)
    directory = tempfile.mkdtemp(prefix="ddpbench-mmap-")
    path = os.path.join(directory, "samples.bin")
    packed.data.numpy().tofile(path)
    data = MappedPackedDataset(path, str(packed.data.dtype).removeprefix("torch."), packed.data.numel(),
                               packed.offsets.numpy(), packed.shapes.numpy(), packed.ndims.numpy())
    return BuiltDataset(spec, data, checksums, elements, path=path)


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

            from ..packed import PackedTensorDataset

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


# ----------------------------------------------------------------------------------------------
# Counting what a handover shares
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# The handover: controller side
# ----------------------------------------------------------------------------------------------


def _resource_sharer_cache() -> dict | None:
    """The sender's pending descriptor duplicates (multiprocessing private state; None if absent)."""
    from multiprocessing import resource_sharer

    sharer = getattr(resource_sharer, "_resource_sharer", None)
    cache = getattr(sharer, "_cache", None)
    return cache if isinstance(cache, dict) else None


class _Sealed:
    """What a rank receives: the dataset's own ForkingPickler pickle, not yet opened.

    The rank checks its descriptor budget before ``pickle.loads`` fetches any descriptor.
    """

    def __init__(self, payload: bytes, storages: int, strategy: str):
        self.payload, self.storages, self.strategy = payload, storages, strategy


class _Handover:
    """Pickled by the pool once per rank: each time, pickles the dataset afresh with
    ForkingPickler (one descriptor duplicate per storage per rank under file_descriptor) and
    remembers which resource-sharer entries it registered, so unfetched ones can be closed."""

    def __init__(self, data, storages: int, strategy: str):
        self.data, self.storages, self.strategy = data, storages, strategy
        self.registered: set = set()
        self.pickle_seconds = 0.0

    def __reduce__(self):
        from multiprocessing.reduction import ForkingPickler

        cache = _resource_sharer_cache()
        before = set(cache) if cache is not None else set()
        start = time.perf_counter()
        try:
            payload = bytes(ForkingPickler.dumps(self.data))
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                raise DatasetShareError(fd_limit_message(
                    "sender (this process)", self.storages, self.storages, soft_fd_limit(),
                    open_fd_count())) from exc
            raise
        finally:
            self.pickle_seconds += time.perf_counter() - start
            if cache is not None:
                self.registered |= set(cache) - before
        return (_Sealed, (payload, self.storages, self.strategy))

    def close_unfetched(self) -> int:
        """Close the descriptor duplicates no rank fetched (a refused or failed handover)."""
        cache = _resource_sharer_cache()
        closed = 0
        if cache is None:
            return closed
        for key in self.registered:
            entry = cache.pop(key, None)
            if entry is not None:
                _, close = entry
                with contextlib.suppress(Exception):
                    close()
                closed += 1
        self.registered.clear()
        return closed


@dataclass
class HandoverResult:
    share_seconds: float  # controller wall time: pickling + every rank receiving
    rank_metrics: list[dict[str, Any]]
    shm_files_created: int  # /dev/shm files the controller created for it (file_system)

    def combined(self) -> dict[str, Any]:
        """Numbers as the max over ranks."""
        out: dict[str, Any] = {}
        for metrics in self.rank_metrics:
            for key, value in metrics.items():
                out[key] = max(out.get(key, value), value)
        return out


def hand_over(pool, data, strategy: str, *, timeout_s: float = 120.0, preflight: bool = True,
              key: str = SCRATCH_KEY) -> HandoverResult:
    """Give ``data`` to every rank of ``pool`` through torch.multiprocessing pickling.

    Sets ``strategy`` in the ranks (kept until :func:`release`) and, for the pickling, in this
    process (restored on return). ``preflight=False`` skips both descriptor checks, so the fd
    limit shows up as a real EMFILE (tests use it to check that path too).
    """
    check_strategy(strategy)
    storages = shared_storage_count(data)
    world = pool.spec.world_size
    if preflight and strategy == "file_descriptor" and storages:
        # This process keeps one descriptor per storage plus one duplicate per storage per rank
        # until the rank fetches it.
        needed = storages * (world + 1)
        limit, open_now = soft_fd_limit(), open_fd_count()
        if open_now + needed + FD_MARGIN > limit:
            raise DatasetShareError(fd_limit_message(
                f"sender (this process, {world} receiving ranks)", storages, needed, limit, open_now))
    handover = _Handover(data, storages, strategy)
    shm_before = torch_shm_files([os.getpid()])
    try:
        with sharing_strategy(strategy):
            start = time.perf_counter()
            try:
                metrics = pool.run(_receive, handover, key, preflight, timeout_s=timeout_s)
            finally:
                share_seconds = time.perf_counter() - start
    finally:
        handover.close_unfetched()
        handover.data = None  # a failure's traceback must not pin the dataset through it
    created = len(torch_shm_files([os.getpid()]) - shm_before)
    return HandoverResult(share_seconds, metrics, created)


def release(pool, *, timeout_s: float = 120.0, key: str = SCRATCH_KEY) -> None:
    """Drop the ranks' dataset and restore their sharing strategy."""
    pool.run(_release, key, timeout_s=timeout_s)


# ----------------------------------------------------------------------------------------------
# The handover: rank side
# ----------------------------------------------------------------------------------------------


def _errno_in_chain(exc: BaseException, code: int) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == code:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _receive(ctx, sealed: _Sealed, key: str, preflight: bool) -> dict[str, Any]:
    import torch.multiprocessing as tmp

    _release(ctx, key)  # a previous dataset (a failed case) goes first
    ctx.scratch[key + ".previous_strategy"] = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy(sealed.strategy)
    fd_strategy = sealed.strategy == "file_descriptor"
    limit, fds_before = soft_fd_limit(), open_fd_count()
    if preflight and fd_strategy and fds_before + sealed.storages + FD_MARGIN > limit:
        raise DatasetShareError(fd_limit_message(
            f"rank {ctx.rank}", sealed.storages, sealed.storages, limit, fds_before))
    shm_before = mapped_shm_segments()
    start = time.perf_counter()
    try:
        data = pickle.loads(sealed.payload)
    except Exception as exc:
        gc.collect()  # close the descriptors received before the failure
        if fd_strategy and (_errno_in_chain(exc, errno.EMFILE)
                            or fds_before + sealed.storages >= limit):
            raise DatasetShareError(fd_limit_message(
                f"rank {ctx.rank}", sealed.storages, sealed.storages, limit, fds_before)) from exc
        raise
    receive_seconds = time.perf_counter() - start
    sealed.payload = b""
    ctx.scratch[key] = data
    return {
        "receive_seconds": receive_seconds,
        "open_fds": open_fd_count(),
        "open_fds_before": fds_before,
        "shm_segments": len(mapped_shm_segments() - shm_before),
        "received_samples": len(data),
    }


def _release(ctx, key: str) -> None:
    import torch.multiprocessing as tmp

    ctx.scratch.pop(key, None)
    previous = ctx.scratch.pop(key + ".previous_strategy", None)
    if previous is not None:
        tmp.set_sharing_strategy(previous)
    gc.collect()


def rank_state(ctx, key: str = SCRATCH_KEY) -> dict[str, Any]:
    """Open descriptors, mapped shm segments and sharing strategy of a rank (tests use it)."""
    import torch.multiprocessing as tmp

    return {"open_fds": open_fd_count(), "shm_segments": len(mapped_shm_segments()),
            "strategy": tmp.get_sharing_strategy(), "has_dataset": key in ctx.scratch,
            "pid": os.getpid()}


def set_fd_limit(ctx, soft: int | None) -> int:
    """Set this rank's soft RLIMIT_NOFILE (None: back to the hard limit); returns the old soft."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if soft is None else soft, hard))
    return old_soft


# ----------------------------------------------------------------------------------------------
# The timed workload: one DataLoader epoch per round
# ----------------------------------------------------------------------------------------------


class _ListDataset:
    """A list of tensors or numpy arrays as a map-style dataset (numpy arrays become tensors)."""

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
    if isinstance(data, list):
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
    """Samples the summed PSS and USS of this process and its children (loader workers)."""

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
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


LOADER_BATCH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DatasetEpoch(Workload):
    """One round = one epoch of a DataLoader over the dataset this rank received by hand_over.

    ``layout``, ``variable`` and ``sharing_strategy`` describe what was handed over (extra_info).
    After the timed rounds, one more (untimed) epoch, during which the peak memory is sampled,
    goes through the same DataLoader settings over ``(index, sample)`` pairs; every index must come
    exactly once and every sample must match ``expected`` (:class:`SampleChecksums` of the dataset
    as built, before the handover) by index: shape, sum and position-weighted sum.
    """

    layout: str
    num_samples: int
    num_workers: int
    sharing_strategy: str
    expected: SampleChecksums
    variable: bool = False
    batch_size: int = 64
    # How the rank starts its loader workers: "fork" inherits the dataset; "spawn" (what a spawned
    # rank defaults to) pickles it to every worker at every epoch, through the same sharing path.
    worker_start: str = "fork"
    key: str = SCRATCH_KEY
    group: str | None = "dataset_sharing"
    # Loader workers must be free to run on the other cores, as in a real job.
    pin_to_core = False

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown dataset layout {self.layout!r}; expected one of {', '.join(LAYOUTS)}")
        check_strategy(self.sharing_strategy)
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.worker_start not in WORKER_START_METHODS:
            raise ValueError(f"unknown worker start method {self.worker_start!r}; expected one of "
                             f"{', '.join(WORKER_START_METHODS)}")
        if not isinstance(self.expected, SampleChecksums) or len(self.expected) != self.num_samples:
            raise ValueError(f"expected must be the SampleChecksums of the {self.num_samples} samples "
                             f"handed over (BuiltDataset.checksums), got {self.expected!r}")

    def setup(self, ctx) -> dict[str, Any]:
        if self.key not in ctx.scratch:
            raise RuntimeError(f"rank {ctx.rank} holds no dataset: call hand_over() before DatasetEpoch")
        data = as_map_dataset(ctx.scratch[self.key])
        if len(data) != self.num_samples:
            raise AssertionError(f"rank {ctx.rank} holds {len(data)} samples, expected {self.num_samples}")
        loader = self._loader(ctx, data, flat_collate)
        return {"ctx": ctx, "loader": loader, "data": data, "samples": 0}

    def _loader(self, ctx, data, collate_fn):
        import torch
        from torch.utils.data import DataLoader

        return DataLoader(data, batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(ctx.rank),
                          num_workers=self.num_workers, collate_fn=collate_fn,
                          multiprocessing_context=self.worker_start if self.num_workers else None,
                          # A batch takes milliseconds: a worker silent for a minute is stuck
                          # (seen once with 5000 shared tensors and forked workers), and the
                          # case then fails with torch's "DataLoader timed out" instead of
                          # waiting for --dist-timeout.
                          timeout=LOADER_BATCH_TIMEOUT_S if self.num_workers else 0)

    def run_round(self, state) -> None:
        samples = 0
        for _, lengths in state["loader"]:
            samples += len(lengths)
        state["samples"] = samples

    def rank_metrics(self, state) -> dict[str, Any]:
        """The check's epoch (same loader settings, samples tagged with their index), with the
        memory sampled; the fingerprints are compared in :meth:`check`."""
        import torch

        n = self.num_samples
        counts = torch.zeros(n, dtype=torch.int64)
        sums = torch.full((n,), float("nan"), dtype=torch.float64)
        weighted = torch.full((n,), float("nan"), dtype=torch.float64)
        shapes = torch.full((n, SHAPE_WIDTH), -2, dtype=torch.int64)
        loader = self._loader(state["ctx"], _Indexed(state["data"]), indexed_collate)
        with _MemorySampler() as sampler:
            for indices, flat, lengths, rows in loader:
                s, w = fingerprints(flat, lengths)
                counts.index_add_(0, indices, torch.ones_like(indices))
                sums[indices], weighted[indices], shapes[indices] = s, w, rows
        state["check"] = (counts, shapes, sums, weighted)
        return {"peak_memory_bytes": sampler.peak_pss, "peak_uss_bytes": sampler.peak_uss}

    def check(self, state) -> None:
        import torch

        rank, n = state["ctx"].rank, self.num_samples
        if state["samples"] != n:
            raise AssertionError(f"rank {rank}: a timed epoch yielded {state['samples']} samples, expected {n}")
        counts, shapes, sums, weighted = state["check"]
        problems = []
        missing, repeated = (counts == 0).nonzero().flatten(), (counts > 1).nonzero().flatten()
        if missing.numel():
            problems.append(f"{missing.numel()} samples never came (first: index {int(missing[0])})")
        if repeated.numel():
            problems.append(f"{repeated.numel()} samples came more than once (first: index "
                            f"{int(repeated[0])}, {int(counts[repeated[0]])} times)")
        expected = self.expected
        exp_shapes = torch.from_numpy(expected.shapes)
        exp_sums, exp_weighted = torch.from_numpy(expected.sums), torch.from_numpy(expected.weighted)
        seen = counts > 0
        bad = seen & ((shapes != exp_shapes).any(1) | (sums != exp_sums) | (weighted != exp_weighted))
        wrong = bad.nonzero().flatten()
        if wrong.numel():
            shown = [self._describe(int(i), shapes, sums, weighted, exp_shapes, exp_sums, exp_weighted)
                     for i in wrong[:3]]
            more = f"; and {wrong.numel() - 3} more" if wrong.numel() > 3 else ""
            problems.append(f"{wrong.numel()} of {n} samples differ from the dataset as built: "
                            + "; ".join(shown) + more)
        if problems:
            raise AssertionError(f"rank {rank}: the {self.layout} dataset's check epoch (every sample "
                                 f"by index: shape, sum and position-weighted sum) found "
                                 + "; ".join(problems))

    @staticmethod
    def _describe(i, shapes, sums, weighted, exp_shapes, exp_sums, exp_weighted) -> str:
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
            return (f"sample {i} holds sample {others[0]}'s data: samples swapped or reordered")
        if sums[i] == exp_sums[i]:
            return (f"sample {i} has the right shape and sum but its elements are in another order "
                    f"(weighted sum {float(weighted[i]):.17g}, expected {float(exp_weighted[i]):.17g}): "
                    f"transposed or permuted data")
        return (f"sample {i} has the right shape but other values (sum {float(sums[i]):.17g}, expected "
                f"{float(exp_sums[i]):.17g}): shifted boundaries or corrupted data")

    def teardown(self, state) -> None:
        state.clear()

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "num_samples": self.num_samples,
            "num_workers": self.num_workers,
            "sharing_strategy": self.sharing_strategy,
            "variable_size": self.variable,
            "batch_size": self.batch_size,
            "worker_start": self.worker_start if self.num_workers else None,
            "samples_per_second": round(self.num_samples / median_s, 3),
        }
