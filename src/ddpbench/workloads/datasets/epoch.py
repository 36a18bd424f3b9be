"""The dataset-sharing workload: one DataLoader epoch per round over a dataset handed to the ranks
(or built in them)."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

from ..base import Workload
from .checksums import SHAPE_WIDTH, SampleChecksums, fingerprints
from .handover import _BuiltInRank, _Handover
from .layouts import BuiltDataset, DatasetSpec, build_dataset
from .loader import _Indexed, _MemorySampler, as_map_dataset, flat_collate, indexed_collate
from .resources import check_strategy
from .sample_check import count_problems, sample_problems

WORKER_START_METHODS = ("fork", "spawn")
SAMPLERS = ("shuffle", "distributed")
COLLATES = ("flat", "stack")
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

    # No trainable state: the untimed check epoch verifies every sample's checksum instead, and a
    # replay would hand the dataset over twice more and run six more epochs with their workers.
    numerics_replay = False

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
    def handed_over(cls, dataset: "DatasetSpec | BuiltDataset", sharing_strategy: str, *,
                    preflight: bool = True, **loader) -> "DatasetEpoch":
        """Build ``dataset`` (a :class:`DatasetSpec`; or pass a :class:`BuiltDataset`) here, in
        the controller, to be handed to every rank this workload runs on; the check compares what
        the ranks receive with the built dataset's checksums. ``preflight=False`` skips both
        descriptor checks, so the fd limit shows up as a real EMFILE. ``loader``: the loader
        fields (``num_workers=2``...).

        Use it as a context manager (or call :meth:`close`) to let go of the controller's side at
        the end of the case; garbage collection does the same."""
        built = build_dataset(dataset) if isinstance(dataset, DatasetSpec) else dataset
        if not isinstance(built, BuiltDataset) or built.checksums is None:
            raise TypeError(f"DatasetEpoch.handed_over needs a DatasetSpec or a BuiltDataset with checksums, "
                            f"got {dataset!r}")
        handover = _Handover(built.data, sharing_strategy, preflight, built.path)
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
        """What the handover measured in this rank: share / receive seconds, open descriptors, shm
        segments."""
        return dict(self.source.metrics)

    def check(self, state) -> dict[str, Any]:
        """Every timed epoch yielded the samples the sampler yields, and one more (untimed) epoch
        with the same loader settings, over ``(index, sample)`` pairs, brings every index this
        rank's sampler yields as often as it yields it, each sample matching the dataset as built
        (:class:`SampleChecksums` by index: shape, sum, position-weighted sum). Returns the peak
        memory of this rank (and its loader workers) during that epoch."""
        rank, expected_counts = state["ctx"].rank, state["expected_counts"]
        per_epoch = int(expected_counts.sum())
        if state["samples"] != per_epoch:
            raise AssertionError(f"rank {rank}: a timed epoch yielded {state['samples']} samples, expected {per_epoch}")
        (counts, shapes, sums, weighted), memory = self._check_epoch(state)
        problems = count_problems(counts, expected_counts) + sample_problems(self.expected, counts, shapes, sums,
                                                                             weighted)
        if problems:
            raise AssertionError(f"rank {rank}: the {self.spec.layout} dataset's check epoch (every sample "
                                 f"by index: shape, sum and position-weighted sum) found "
                                 + "; ".join(problems))
        return memory

    def _check_epoch(self, state):
        """The check's epoch: per index, how often it came and its fingerprints; and the peak
        memory sampled meanwhile."""
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
        return (counts, shapes, sums, weighted), {"peak_memory_bytes": sampler.peak_pss,
                                                  "peak_uss_bytes": sampler.peak_uss}

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
            "family": "datasets",  # its section of the report: ddpbench/report/datasets.py
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
