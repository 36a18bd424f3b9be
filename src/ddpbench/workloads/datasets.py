"""Dataset storage sharing: how a dataset's layout decides the cost of handing it to spawned ranks.

The controller builds a dataset in one of these layouts:

* ``list``    -- a Python list of tensors (the reported case: one shared storage per sample);
* ``stacked`` -- one N x C x H x W tensor (the reports' baseline; fixed-size samples only);
* ``packed``  -- :class:`ddpbench.PackedTensorDataset`: one storage + offsets/shapes index;
* ``numpy``   -- a Python list of numpy arrays (pickled by value: no shared memory, one copy per rank);
* ``mmap``    -- the packed layout written to a file and memory-mapped by every rank (only the path
  and the small index travel; the page cache is shared).

:class:`DatasetEpoch` is the case's descriptor. ``DatasetEpoch.handed_over(spec, strategy, ...)``
builds the dataset in the controller and carries it to the ranks inside the workload itself, the
way ``mp.spawn`` carries its arguments: when the pool pickles the task for a rank, the dataset is
pickled with ``ForkingPickler`` under the chosen sharing strategy (torch.multiprocessing's
shared-memory reductions), and the rank opens it in ``setup``. Every pool that runs the workload
gets it that way, so A/B mode's two sides each receive their own copy, and nothing is left in the
ranks once the task ends. ``DatasetEpoch.built_in_ranks(spec, ...)`` is the control without a
handover: each rank builds the same samples itself.

File-descriptor budget. Under ``file_descriptor`` every shared storage is one descriptor: the
receiver keeps one per storage, and the sender keeps one per storage plus one duplicate per
storage per receiver until the receiver fetches it from the sender's ``multiprocessing``
resource-sharer thread. Running out of descriptors on either side used to end in EMFILE and a
receiver blocked forever; here both sides check before any descriptor moves
(:class:`DatasetShareError` names the cause and the fixes), an EMFILE that happens anyway is turned
into the same error, and the sender closes every duplicate a receiver did not fetch
(:meth:`DatasetEpoch.close`, also run when the workload is garbage-collected).
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
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..pool import SendRefused
from . import Workload

LAYOUTS = ("list", "stacked", "packed", "numpy", "mmap")
STRATEGIES = ("file_descriptor", "file_system")
WORKER_START_METHODS = ("fork", "spawn")
SAMPLERS = ("shuffle", "distributed")
COLLATES = ("flat", "stack")
# Descriptors kept free for what else happens during a transfer (the connection to the sender's
# resource sharer, DataLoader pipes): a handover that would leave fewer is refused up front.
FD_MARGIN = 32
FIXED_SHAPE = (3, 32, 32)  # CIFAR-sized float32 images (the default grid)
REPORT_SHAPE = (3, 224, 224)  # the reports' samples (Lightning #1925, pytorch#39443): 602 KB of float32
SHAPE_WIDTH = 8  # dimensions a sample's recorded shape holds (padded with -1)
POSITION_WEIGHTS = 4093  # element k of a sample weighs (k mod 4093) + 1 in its weighted sum
VARIABLE_SIDE = (16, 48)  # variable-size samples: 3 x H x W with H, W uniform in this range
CHECKSUM_BATCH_ELEMENTS = 1 << 23  # elements fingerprinted at a time (64 MiB as float64)


class DatasetShareError(SendRefused):
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
    def of_spec(cls, spec: DatasetSpec) -> "SampleChecksums":
        """The fingerprints of ``spec``'s samples, generated a batch at a time (never all held)."""
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

    from ..data.packed import PackedTensorDataset

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

            from ..data.packed import PackedTensorDataset

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
# Where a rank's dataset comes from: handed over by the controller, or built by the rank itself
# ----------------------------------------------------------------------------------------------


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


def rank_state(ctx) -> dict[str, Any]:
    """Open descriptors, mapped shm segments and sharing strategy of a rank (tests use it)."""
    import torch.multiprocessing as tmp

    return {"open_fds": open_fd_count(), "shm_segments": len(mapped_shm_segments()),
            "strategy": tmp.get_sharing_strategy(), "pid": os.getpid()}


def set_fd_limit(ctx, soft: int | None) -> int:
    """Set this rank's soft RLIMIT_NOFILE (None: back to the hard limit); returns the old soft."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if soft is None else soft, hard))
    return old_soft


# ----------------------------------------------------------------------------------------------
# The timed workload: one DataLoader epoch per round
# ----------------------------------------------------------------------------------------------


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


LOADER_BATCH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DatasetEpoch(Workload):
    """One round = one epoch of a DataLoader over the dataset on every rank.

    Make it with :meth:`handed_over` (the dataset built in the controller travels to the ranks
    inside this workload, as ``mp.spawn`` arguments do) or :meth:`built_in_ranks` (each rank
    builds the same samples itself). Loader settings: ``num_workers``, ``worker_start`` ("fork"
    inherits the dataset; "spawn" pickles it to every worker whenever workers start, through the
    same sharing path), ``persistent_workers`` (False: workers are started anew every epoch, as
    before torch 1.7), ``batch_size``, ``sampler`` ("shuffle": every rank iterates every sample in
    its own order; "distributed": ``DistributedSampler``, each rank its shard, as a DDP script
    does) and ``collate`` ("flat": samples concatenated flat, any shapes; "stack": torch's
    ``default_collate``, fixed-size samples). The rank's sharing strategy is the case's while the
    workload is set up.

    After the timed rounds, one more (untimed) epoch, during which the peak memory is sampled,
    goes through the same loader settings over ``(index, sample)`` pairs; every index this rank's
    sampler yields must come as often as the sampler yields it, and every sample must match
    ``expected`` (:class:`SampleChecksums` of the dataset as built, before the handover) by index:
    shape, sum and position-weighted sum.
    """

    spec: DatasetSpec
    sharing_strategy: str
    expected: SampleChecksums = field(repr=False)
    source: Any = field(repr=False, compare=False)  # _Handover here; _Sealed or _BuiltInRank in a rank
    num_workers: int = 0
    worker_start: str = "fork"
    persistent_workers: bool = False
    batch_size: int = 64
    sampler: str = "shuffle"
    collate: str = "flat"
    group: str | None = "dataset_sharing"
    # Loader workers must be free to run on the other cores, as in a real job.
    pin_to_core = False

    def __post_init__(self):
        check_strategy(self.sharing_strategy)
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {self.num_workers!r}")
        if self.worker_start not in WORKER_START_METHODS:
            raise ValueError(f"unknown worker start method {self.worker_start!r}; expected one of "
                             f"{', '.join(WORKER_START_METHODS)}")
        if self.persistent_workers and not self.num_workers:
            raise ValueError("persistent_workers=True needs num_workers > 0 (DataLoader refuses it "
                             "otherwise); pass num_workers=2, or drop persistent_workers")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.sampler!r}; expected one of {', '.join(SAMPLERS)}")
        if self.collate not in COLLATES:
            raise ValueError(f"unknown collate {self.collate!r}; expected one of {', '.join(COLLATES)}")
        if self.collate == "stack" and self.spec.variable:
            raise ValueError("collate='stack' (torch's default_collate) cannot batch variable-size "
                             "samples; use collate='flat'")
        if not isinstance(self.expected, SampleChecksums) or len(self.expected) != self.spec.num_samples:
            raise ValueError(f"expected must be the SampleChecksums of the {self.spec.num_samples} samples "
                             f"handed over (BuiltDataset.checksums), got {self.expected!r}")

    # -- making one -------------------------------------------------------------------------------

    @classmethod
    def handed_over(cls, dataset: "DatasetSpec | BuiltDataset", sharing_strategy: str, *, data: Any = None,
                    preflight: bool = True, **loader) -> "DatasetEpoch":
        """Build ``dataset`` (a :class:`DatasetSpec`; or pass a :class:`BuiltDataset`) here, in
        the controller, to be handed to every rank this workload runs on. ``data`` replaces what
        is handed over (tests hand over corrupted copies; the check still compares with the
        dataset as built). ``preflight=False`` skips both descriptor checks, so the fd limit
        shows up as a real EMFILE. ``loader``: the loader fields (``num_workers=2``...).

        Use it as a context manager (or call :meth:`close`) to let go of the controller's side at
        the end of the case; garbage collection does the same."""
        built = build_dataset(dataset) if isinstance(dataset, DatasetSpec) else dataset
        if not isinstance(built, BuiltDataset) or built.checksums is None:
            raise TypeError(f"DatasetEpoch.handed_over needs a DatasetSpec or a BuiltDataset with checksums, "
                            f"got {dataset!r}")
        handover = _Handover(built.data if data is None else data, sharing_strategy, preflight, built.path)
        built.path = None  # the handover deletes the mmap layout's file when it is released
        return cls(built.spec, sharing_strategy, built.checksums, handover, **loader)

    @classmethod
    def built_in_ranks(cls, spec: DatasetSpec, sharing_strategy: str, **loader) -> "DatasetEpoch":
        """The control without a handover: each rank builds ``spec``'s samples itself (the
        checksums are computed here, a batch at a time)."""
        if spec.layout == "mmap":
            raise ValueError("built_in_ranks: the 'mmap' layout is a file the controller writes and the "
                             "ranks map; hand it over (DatasetEpoch.handed_over) or pick an in-memory layout")
        return cls(spec, sharing_strategy, SampleChecksums.of_spec(spec), _BuiltInRank(spec), **loader)

    def close(self) -> None:
        """Let go of what the controller holds for this case: the dataset, descriptor duplicates
        no rank fetched, the mmap layout's file."""
        self.source.close()

    def __enter__(self) -> "DatasetEpoch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- on every rank ----------------------------------------------------------------------------

    def setup(self, ctx) -> dict[str, Any]:
        import torch.multiprocessing as tmp

        previous = tmp.get_sharing_strategy()
        tmp.set_sharing_strategy(self.sharing_strategy)
        try:
            data = as_map_dataset(self.source.open(ctx, self.sharing_strategy))
            if len(data) != self.spec.num_samples:
                raise AssertionError(f"rank {ctx.rank} holds {len(data)} samples, expected {self.spec.num_samples}")
            loader = self._loader(ctx, data, flat_collate if self.collate == "flat" else None,
                                  self.persistent_workers)
        except BaseException:
            tmp.set_sharing_strategy(previous)
            raise
        return {"ctx": ctx, "loader": loader, "data": data, "samples": 0, "previous_strategy": previous,
                "expected_counts": self._expected_counts(ctx, data)}

    def _sampler(self, ctx, data):
        if self.sampler == "shuffle":
            return None
        from torch.utils.data.distributed import DistributedSampler

        return DistributedSampler(data, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0)

    def _expected_counts(self, ctx, data):
        """How often each index comes in one of this rank's epochs."""
        import torch

        sampler = self._sampler(ctx, data)
        if sampler is None:
            return torch.ones(self.spec.num_samples, dtype=torch.int64)
        return torch.bincount(torch.tensor(list(sampler), dtype=torch.int64), minlength=self.spec.num_samples)

    def _loader(self, ctx, data, collate_fn, persistent: bool):
        import torch
        from torch.utils.data import DataLoader

        sampler = self._sampler(ctx, data)
        return DataLoader(data, batch_size=self.batch_size, shuffle=sampler is None, sampler=sampler,
                          generator=torch.Generator().manual_seed(ctx.rank),
                          num_workers=self.num_workers, collate_fn=collate_fn,
                          multiprocessing_context=self.worker_start if self.num_workers else None,
                          persistent_workers=persistent,
                          # A batch takes milliseconds: a worker silent for a minute is stuck
                          # (seen once with 5000 shared tensors and forked workers), and the
                          # case then fails with torch's "DataLoader timed out" instead of
                          # waiting for --dist-timeout.
                          timeout=LOADER_BATCH_TIMEOUT_S if self.num_workers else 0)

    def run_round(self, state) -> None:
        samples = 0
        if self.collate == "flat":
            for _, lengths in state["loader"]:
                samples += len(lengths)
        else:
            for batch in state["loader"]:
                samples += len(batch)
        state["samples"] = samples

    def rank_metrics(self, state) -> dict[str, Any]:
        """The check's epoch (same loader settings, samples tagged with their index), with the
        memory sampled; the fingerprints are compared in :meth:`check`. Also what the handover
        measured in this rank (share/receive seconds, open descriptors, shm segments)."""
        import torch

        n = self.spec.num_samples
        counts = torch.zeros(n, dtype=torch.int64)
        sums = torch.full((n,), float("nan"), dtype=torch.float64)
        weighted = torch.full((n,), float("nan"), dtype=torch.float64)
        shapes = torch.full((n, SHAPE_WIDTH), -2, dtype=torch.int64)
        loader = self._loader(state["ctx"], _Indexed(state["data"]), indexed_collate, False)
        with _MemorySampler() as sampler:
            for indices, flat, lengths, rows in loader:
                s, w = fingerprints(flat, lengths)
                counts.index_add_(0, indices, torch.ones_like(indices))
                sums[indices], weighted[indices], shapes[indices] = s, w, rows
        del loader
        state["check"] = (counts, shapes, sums, weighted)
        return {**self.source.metrics, "peak_memory_bytes": sampler.peak_pss, "peak_uss_bytes": sampler.peak_uss}

    def check(self, state) -> None:
        import torch

        rank, expected_counts = state["ctx"].rank, state["expected_counts"]
        per_epoch = int(expected_counts.sum())
        if state["samples"] != per_epoch:
            raise AssertionError(f"rank {rank}: a timed epoch yielded {state['samples']} samples, expected {per_epoch}")
        counts, shapes, sums, weighted = state["check"]
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
            problems.append(f"{wrong.numel()} of {int(seen.sum())} samples differ from the dataset as built: "
                            + "; ".join(shown) + more)
        if problems:
            raise AssertionError(f"rank {rank}: the {self.spec.layout} dataset's check epoch (every sample "
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
        import torch.multiprocessing as tmp

        previous = state.get("previous_strategy")
        state.clear()  # the loader (and any persistent workers) goes first
        gc.collect()  # finished loader iterators sit in reference cycles holding worker pipes
        if previous is not None:
            tmp.set_sharing_strategy(previous)

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        spec = self.spec
        per_rank = spec.num_samples if self.sampler == "shuffle" else -(-spec.num_samples // world_size)
        info = {
            "layout": spec.layout,
            "num_samples": spec.num_samples,
            "sample_shape": None if spec.variable else list(spec.shape),
            "sample_bytes": spec.sample_bytes,
            "num_workers": self.num_workers,
            "sharing_strategy": self.sharing_strategy,
            "variable_size": spec.variable,
            "batch_size": self.batch_size,
            "worker_start": self.worker_start if self.num_workers else None,
            "persistent_workers": self.persistent_workers if self.num_workers else None,
            "data_source": "rank" if isinstance(self.source, _BuiltInRank) else "handover",
            "sampler": self.sampler,
            "collate": self.collate,
            "samples_per_rank": per_rank,
            "samples_per_second": round(per_rank / median_s, 3),
        }
        info.update(self.source.controller_info())
        return info
