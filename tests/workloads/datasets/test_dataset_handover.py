"""Dataset handover to spawned ranks inside the DatasetEpoch workload: fd / shm accounting, the
fd-limit error, the stacked layout's round trip, the loader settings of the reported path, and no
leaks once a case ends."""

import dataclasses
import gc
import os
import resource
import time

import pytest
import torch

from ddpbench.gates.ab import tasks as ab_tasks
from ddpbench.pool import PoolRegistry, PoolSpec, TaskFailed
from ddpbench.engine.timing import RoundPlan, measure_workload
from ddpbench import testing
from ddpbench.workloads import datasets as D
from ddpbench.workloads.datasets import handover

from helpers.broken_workloads import (UnshardedEpoch, moved_boundaries, swapped_rows, swapped_samples, transposed_data,
                              transposed_shapes)

SPEC = PoolSpec("gloo", 2, "cpu")
# Not about the censuses: each of their four epochs would start every loader worker again (a
# spawned worker imports torch), none of which any test here reads. (Datasets take no numerics replay.)
NO_CENSUS = dict(census=False, memory_census=False)
ONE_ROUND = RoundPlan(warmup=0, rounds=1, **NO_CENSUS)


@pytest.fixture(scope="module")
def _pools():
    registry = PoolRegistry()
    yield registry
    registry.close()


@pytest.fixture
def pool(_pools):
    """The module's live pool. A test whose task failed tore its pool down: the next test gets a
    fresh one (warmed up like the first), not a dead pool that fails every later test."""
    started = _pools.started
    pool = _pools.get(SPEC)
    if _pools.started != started:
        # One small handover first: whatever the first one opens for good (on a CUDA machine,
        # torch probing the driver opens ~13 descriptors) is open before any test takes its
        # "before" count.
        with D.DatasetEpoch.handed_over(D.DatasetSpec("list", 4), "file_descriptor") as epoch:
            pool.run(measure_workload, epoch, ONE_ROUND, timeout_s=90)
    return pool


def _rank_states(pool):
    return pool.run(testing.rank_state)


def _shm_files(pool):
    """torch's /dev/shm files belonging to this process and the ranks (other users' are ignored)."""
    return D.torch_shm_files([os.getpid()] + [s["pid"] for s in _rank_states(pool)])


def _sharer_pending():
    cache = handover._resource_sharer_cache()
    return 0 if cache is None else len(cache)


def _measure(pool, epoch, plan=ONE_ROUND, timeout_s=90):
    """Per-rank metrics of one measured case."""
    return [m.metrics for m in pool.run(measure_workload, epoch, plan, timeout_s=timeout_s)]


@pytest.mark.parametrize("layout, per_rank_fds, segments", [
    ("list", 200, 200),  # one descriptor and one segment per tensor
    ("stacked", 1, 1),  # one N x C x H x W tensor
    ("packed", 4, 4),  # data, offsets, shapes, ndims: constant
    ("numpy", 0, 0),  # pickled by value
    ("mmap", 0, 0),  # path + index by value; the file mapping keeps no descriptor
])
def test_handover_counts_descriptors_and_segments_and_leaves_nothing(pool, layout, per_rank_fds, segments):
    before = _rank_states(pool)
    with D.DatasetEpoch.handed_over(D.DatasetSpec(layout, 200), "file_descriptor") as epoch:
        # The epoch workload reads every sample back and checks it by index against the dataset as built.
        for metrics in _measure(pool, epoch):
            assert metrics["received_samples"] == 200
            assert metrics["shm_segments"] == segments
            assert metrics["open_fds"] - metrics["open_fds_before"] == per_rank_fds
        assert epoch.extra_info(2, 0.5)["layout"] == layout
    assert _sharer_pending() == 0
    # The dataset lived as long as the task: the ranks hold no descriptor or segment of it now,
    # and their sharing strategy is back.
    after = _rank_states(pool)
    assert [s["open_fds"] for s in after] == [s["open_fds"] for s in before]
    assert [s["shm_segments"] for s in after] == [s["shm_segments"] for s in before]
    assert [s["strategy"] for s in after] == [s["strategy"] for s in before]


def test_stacked_layout_round_trip():
    """The stacked layout holds the same samples as the list (same spec), in one tensor; its
    fingerprints equal the list's, so a rank's check epoch compares it with the same reference."""
    spec = D.DatasetSpec("list", 12, shape=(3, 5, 7), seed=3)
    listed = D.build_dataset(spec)
    stacked = D.build_dataset(D.DatasetSpec("stacked", 12, shape=(3, 5, 7), seed=3))
    assert isinstance(stacked.data, torch.Tensor) and stacked.data.shape == (12, 3, 5, 7)
    assert stacked.elements == listed.elements == 12 * 105
    for i, sample in enumerate(listed.data):
        assert torch.equal(stacked.data[i], sample)
    for field in ("shapes", "sums", "weighted"):
        assert (getattr(stacked.checksums, field) == getattr(listed.checksums, field)).all()
    assert D.SampleChecksums.of_spec(spec).sums.tolist() == listed.checksums.sums.tolist()
    assert D.shared_storage_count(stacked.data) == 1 and D.shared_storage_count(listed.data) == 12


def test_stacked_layout_refuses_variable_sizes():
    with pytest.raises(ValueError, match=r"'stacked' layout is one N x C x H x W tensor.*'packed'.*variable=True"):
        D.DatasetSpec("stacked", 10, variable=True)


def test_stacked_handover_with_spawned_workers_and_the_reported_loader(pool):
    """The reported path's loader on the stacked layout: DistributedSampler shards, torch's default
    collate, 2 spawned workers started anew each epoch (the dataset is pickled to every worker);
    the check epoch verifies every sample of this rank's shard by index."""
    spec = D.DatasetSpec("stacked", 64, shape=(3, 16, 16))
    with D.DatasetEpoch.handed_over(spec, "file_descriptor", num_workers=2, worker_start="spawn",
                                    batch_size=8, sampler="distributed", collate="stack") as epoch:
        metrics = _measure(pool, epoch, RoundPlan(warmup=0, rounds=2, **NO_CENSUS), timeout_s=120)
        info = epoch.extra_info(2, 0.5)
    assert [m["received_samples"] for m in metrics] == [64, 64]
    assert info["samples_per_rank"] == 32 and info["samples_per_second"] == 64.0
    assert info["sample_shape"] == [3, 16, 16] and info["sample_bytes"] == 3 * 16 * 16 * 4
    assert info["worker_start"] == "spawn" and info["persistent_workers"] is False


@pytest.mark.parametrize("layout", ["list", "stacked"])
def test_ranks_build_their_own_data_with_persistent_workers(pool, layout):
    """The no-handover control: every rank builds the samples itself (nothing shared), and the
    check epoch compares them with the checksums the controller computed from the spec."""
    spec = D.DatasetSpec(layout, 48, shape=(3, 8, 8))
    with D.DatasetEpoch.built_in_ranks(spec, "file_descriptor", num_workers=2, persistent_workers=True,
                                       sampler="distributed", collate="stack", batch_size=8) as epoch:
        metrics = _measure(pool, epoch, RoundPlan(warmup=1, rounds=2, **NO_CENSUS))
        info = epoch.extra_info(2, 1.0)
    assert all(m["build_seconds"] > 0 and "share_seconds" not in m for m in metrics)
    assert info["data_source"] == "rank" and info["persistent_workers"] is True
    assert "shm_files_created" not in info


def test_dataset_survives_a_fresh_setup_per_block(pool):
    """A/B mode sets a workload up anew before each block: the dataset received with the first
    set-up stays (a descriptor can be fetched only once), and is gone when the session ends."""
    before = _rank_states(pool)
    key = "test-refresh"
    with D.DatasetEpoch.handed_over(D.DatasetSpec("list", 50), "file_system", num_workers=2) as epoch:
        pool.run(ab_tasks.start, key, epoch, ONE_ROUND, timeout_s=90)
        for _ in range(2):
            [(times, _), _] = pool.run(ab_tasks.block, key, 1, True, timeout_s=90)
            assert len(times) == 1
        states = _rank_states(pool)
        assert all(s["strategy"] == "file_system" for s in states)  # the case's, while it is set up
        metrics = pool.run(ab_tasks.finish, key, timeout_s=90)
    assert [m["received_samples"] for m in metrics] == [50, 50]
    after = _rank_states(pool)
    assert [s["strategy"] for s in after] == [s["strategy"] for s in before]
    # At most one descriptor more per rank: its (persistent) connection to torch_shm_manager.
    assert all(a["open_fds"] - b["open_fds"] <= 1 for a, b in zip(after, before)), (after, before)


def test_file_system_strategy_forked_workers_and_no_shm_leak(pool):
    fds_before = [s["open_fds"] for s in _rank_states(pool)]
    shm_before = _shm_files(pool)
    strategy_before = torch.multiprocessing.get_sharing_strategy()
    with D.DatasetEpoch.handed_over(D.DatasetSpec("list", 100, variable=True), "file_system",
                                    num_workers=2) as epoch:
        metrics = _measure(pool, epoch)
        assert epoch.extra_info(2, 1.0)["shm_files_created"] == 100  # one /dev/shm file per tensor, by the controller
        for m in metrics:
            assert m["shm_segments"] == 100
            assert m["open_fds"] - m["open_fds_before"] <= 2  # no descriptor per tensor
            assert m["peak_memory_bytes"] > 0 and m["peak_uss_bytes"] > 0
    del epoch
    gc.collect()
    assert torch.multiprocessing.get_sharing_strategy() == strategy_before
    assert [s["strategy"] for s in _rank_states(pool)] == [strategy_before] * 2
    deadline = time.monotonic() + 10
    while _shm_files(pool) - shm_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _shm_files(pool) - shm_before == set()
    # At most one descriptor more per rank: its (persistent) connection to torch_shm_manager,
    # opened the first time the rank uses file_system, whatever the sample count.
    after = [s["open_fds"] for s in _rank_states(pool)]
    assert all(a - b <= 1 for a, b in zip(after, fds_before)), (after, fds_before)


@pytest.mark.parametrize("preflight", [True, False], ids=["preflight", "real-EMFILE"])
def test_fd_limit_is_a_clear_error_not_a_hang(pool, preflight):
    n = 300
    rank_fds = [s["open_fds"] for s in _rank_states(pool)]
    limit = max(rank_fds) + 100  # room for 100 descriptors: the 300 tensors cannot fit
    from multiprocessing import resource_sharer

    # The sender's resource-sharer thread keeps one listening socket once it has started.
    sharer_listening = getattr(resource_sharer._resource_sharer, "_listener", None) is not None
    controller_fds = D.open_fd_count() + (0 if sharer_listening else 1)
    old = pool.run(testing.set_fd_limit, limit)
    try:
        with D.DatasetEpoch.handed_over(D.DatasetSpec("list", n), "file_descriptor", preflight=preflight) as epoch:
            start = time.monotonic()
            with pytest.raises(TaskFailed) as info:
                _measure(pool, epoch, timeout_s=60)
            assert time.monotonic() - start < 30
        message = str(info.value)
        assert sorted(info.value.errors) == [0, 1] and not info.value.stuck and not info.value.dead
        assert "DatasetShareError" in message
        assert f"{n} tensors need {n} descriptors" in message
        assert f"soft limit) is {limit}" in message
        assert "PackedTensorDataset" in message and "'file_system'" in message and "ulimit -n" in message
        if not preflight:
            # The real failure is chained: EMFILE on the socket, or the kernel dropping the passed
            # descriptor (recvmsg truncates the ancillary data at the limit).
            assert "Too many open files" in message or "received 0 items of ancdata" in message
        assert pool.alive
        del info, epoch
    finally:
        pool.run(testing.set_fd_limit, old[0])
    # Nothing stays pending in the controller's resource sharer, nothing stays open in the ranks.
    assert _sharer_pending() == 0
    assert [s["open_fds"] for s in _rank_states(pool)] == rank_fds
    gc.collect()
    assert D.open_fd_count() <= controller_fds
    # The next handover on the same pool works (packed: far below the limit).
    old = pool.run(testing.set_fd_limit, limit)
    try:
        with D.DatasetEpoch.handed_over(D.DatasetSpec("packed", n), "file_descriptor", preflight=preflight) as epoch:
            assert [m["received_samples"] for m in _measure(pool, epoch)] == [n, n]
    finally:
        pool.run(testing.set_fd_limit, old[0])


def test_controller_side_fd_limit_is_checked_before_sending(pool):
    before = _rank_states(pool)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with D.DatasetEpoch.handed_over(D.DatasetSpec("list", 300), "file_descriptor") as epoch:
        resource.setrlimit(resource.RLIMIT_NOFILE, (D.open_fd_count() + 200, hard))
        try:
            # The pool lets the workload's own refusal through (not "does not pickle").
            with pytest.raises(D.DatasetShareError, match=r"sender .*300 tensors need 300 descriptors"):
                _measure(pool, epoch, timeout_s=60)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert _sharer_pending() == 0
    assert [s["open_fds"] for s in _rank_states(pool)] == [s["open_fds"] for s in before]


def test_bad_input_is_a_clear_error(pool):
    with pytest.raises(ValueError, match="unknown dataset layout 'tuple'"):
        D.DatasetSpec("tuple", 10)
    with pytest.raises(ValueError, match="positive integer"):
        D.DatasetSpec("list", 0)
    with pytest.raises(ValueError, match=r"shape must be a tuple of positive integers.*got \(3, 0\)"):
        D.DatasetSpec("list", 4, shape=(3, 0))
    spec = D.DatasetSpec("list", 10)
    with pytest.raises(ValueError, match="unknown sharing strategy 'fd'"):
        D.DatasetEpoch.handed_over(spec, "fd")
    with pytest.raises(ValueError, match="worker start method"):
        D.DatasetEpoch.built_in_ranks(spec, "file_system", num_workers=2, worker_start="thread")
    with pytest.raises(ValueError, match="persistent_workers=True needs num_workers > 0"):
        D.DatasetEpoch.built_in_ranks(spec, "file_system", persistent_workers=True)
    with pytest.raises(ValueError, match="unknown sampler 'random'"):
        D.DatasetEpoch.built_in_ranks(spec, "file_system", sampler="random")
    with pytest.raises(ValueError, match="collate='stack'.*variable-size"):
        D.DatasetEpoch.built_in_ranks(D.DatasetSpec("list", 10, variable=True), "file_system", collate="stack")
    with pytest.raises(ValueError, match="'mmap' layout is a file the controller writes"):
        D.DatasetEpoch.built_in_ranks(D.DatasetSpec("mmap", 10), "file_system")
    with pytest.raises(ValueError, match="expected must be the SampleChecksums of the 10 samples"):
        D.DatasetEpoch(spec, "file_system", 0.0, None)
    epoch = D.DatasetEpoch.handed_over(spec, "file_system")
    epoch.close()
    with pytest.raises(D.DatasetShareError, match="was closed"):
        _measure(pool, epoch)
    with pytest.raises(RuntimeError, match="opens its dataset in the ranks"):
        D.DatasetEpoch.handed_over(spec, "file_system").setup(None)


def test_sample_checksums_tell_apart_what_a_total_sum_cannot():
    samples = D.DatasetSpec("list", 6, variable=True).samples()
    reference = D.SampleChecksums.of(samples)
    assert len(reference) == 6 and reference.total == float(sum(t.double().sum() for t in samples))
    for corrupted in (swapped_samples(samples), transposed_data(samples)):
        other = D.SampleChecksums.of(corrupted)
        assert other.total == reference.total  # what the old check compared
        assert (other.sums != reference.sums).any() or (other.weighted != reference.weighted).any()
    # batching does not change a fingerprint
    batched = D.SampleChecksums.of(samples, batch_elements=1000)
    assert (batched.sums == reference.sums).all() and (batched.weighted == reference.weighted).all()


# Negative controls of DatasetEpoch.check: the dataset handed over is corrupted in a way that keeps
# the sample count and the total sum (all the old check compared); the check compares every sample
# by index with the checksums of the dataset as built.
@pytest.mark.parametrize("layout, variable, corrupt, workers, message", [
    ("list", False, swapped_samples, 0, r"sample [01] holds sample [10]'s data: samples swapped or reordered"),
    ("stacked", False, swapped_rows, 2, r"sample [01] holds sample [10]'s data: samples swapped or reordered"),
    ("packed", False, moved_boundaries, 2, r"1000 of 1000 samples differ .* sample \d+ has the right shape but "
                                           r"other values .*: shifted boundaries or corrupted data"),
    ("packed", True, transposed_shapes, 0, r"sample \d+ has shape \(3, \d+, \d+\), expected \(3, \d+, \d+\): its "
                                           r"shape is transposed"),
    ("list", True, transposed_data, 0, r"sample \d+ has the right shape and sum but its elements are in another "
                                       r"order .*: transposed or permuted data"),
], ids=["swapped-samples", "swapped-rows", "moved-boundaries", "transposed-shapes", "transposed-data"])
def test_the_epoch_check_catches_a_corrupted_dataset(pool, layout, variable, corrupt, workers, message):
    built = D.build_dataset(D.DatasetSpec(layout, 1000, variable=variable))
    corrupted = dataclasses.replace(built, data=corrupt(built.data))  # the checksums stay the built data's
    with D.DatasetEpoch.handed_over(corrupted, "file_system", num_workers=workers) as epoch:
        with pytest.raises(TaskFailed, match=rf"rank 0: the {layout} dataset's check epoch .* found .*" + message):
            _measure(pool, epoch)


def test_the_epoch_check_catches_a_loader_that_ignores_its_shard(pool):
    spec = D.DatasetSpec("stacked", 40, shape=(3, 4, 4))
    with UnshardedEpoch.handed_over(spec, "file_system", sampler="distributed", batch_size=8) as epoch:
        with pytest.raises(TaskFailed, match=r"rank 0: a timed epoch yielded 40 samples, expected 20"):
            _measure(pool, epoch)


def test_a_failed_mmap_write_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    import errno
    import tempfile

    from ddpbench.data.packed import PackedTensorDataset

    real_from_tensors = PackedTensorDataset.from_tensors

    class DiskFull:
        """The packed data, whose numpy view fills the disk half-way through tofile."""

        def __init__(self, data):
            self._data = data

        def __getattr__(self, name):
            return getattr(self._data, name)

        def numpy(self):
            class Array:
                def tofile(self, path):
                    with open(path, "wb") as fh:
                        fh.write(b"\0" * 4096)  # what got written before the disk filled up
                    raise OSError(errno.ENOSPC, "No space left on device")

            return Array()

    def from_tensors(samples):
        packed = real_from_tensors(samples)
        packed.data = DiskFull(packed.data)
        return packed

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(PackedTensorDataset, "from_tensors", staticmethod(from_tensors))
    with pytest.raises(OSError, match=r"writing the mmap layout's \d+ bytes to .* failed \(No space left on "
                                      r"device\); nothing was left behind\. Free space there or point TMPDIR"):
        D.build_dataset(D.DatasetSpec("mmap", 50))
    assert list(tmp_path.iterdir()) == []
