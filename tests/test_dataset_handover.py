"""Dataset handover to spawned ranks: fd / shm accounting, the fd-limit error, no leaks."""

import gc
import os
import resource
import time

import pytest
import torch

from ddpbench.pool import PoolRegistry, PoolSpec, TaskFailed
from ddpbench.timing import RoundPlan, measure_workload
from ddpbench.workloads import datasets as D

from broken_workloads import moved_boundaries, swapped_samples, transposed_data, transposed_shapes

SPEC = PoolSpec("gloo", 2, "cpu")


@pytest.fixture(scope="module")
def pool():
    registry = PoolRegistry()
    yield registry.get(SPEC)
    registry.close()


def _rank_pids(pool):
    return [state["pid"] for state in pool.run(D.rank_state)]


def _shm_files(pool):
    """torch's /dev/shm files belonging to this process and the ranks (other users' are ignored)."""
    return D.torch_shm_files([os.getpid()] + _rank_pids(pool))


def _sharer_pending():
    cache = D._resource_sharer_cache()
    return 0 if cache is None else len(cache)


@pytest.mark.parametrize("layout, per_rank_fds, segments", [
    ("list", 200, 200),  # one descriptor and one segment per tensor
    ("packed", 4, 4),  # data, offsets, shapes, ndims: constant
    ("numpy", 0, 0),  # pickled by value
    ("mmap", 0, 0),  # path + index by value; the file mapping keeps no descriptor
])
def test_handover_counts_descriptors_and_segments(pool, layout, per_rank_fds, segments):
    built = D.build_dataset(D.DatasetSpec(layout, 200))
    try:
        result = D.hand_over(pool, built.data, "file_descriptor", timeout_s=60)
        try:
            for metrics in result.rank_metrics:
                assert metrics["received_samples"] == 200
                assert metrics["shm_segments"] == segments
                assert metrics["open_fds"] - metrics["open_fds_before"] == per_rank_fds
            states = pool.run(D.rank_state)
            assert all(s["strategy"] == "file_descriptor" and s["has_dataset"] for s in states)
            # The epoch workload reads every sample back and checks the sum.
            pool.run(measure_workload, D.DatasetEpoch(layout, 200, 0, "file_descriptor", built.checksums),
                     RoundPlan(warmup=0, rounds=1), timeout_s=60)
        finally:
            D.release(pool, timeout_s=60)
    finally:
        built.cleanup()
    assert _sharer_pending() == 0
    assert not any(s["has_dataset"] for s in pool.run(D.rank_state))


def test_file_system_strategy_forked_workers_and_no_shm_leak(pool):
    fds_before = [s["open_fds"] for s in pool.run(D.rank_state)]
    shm_before = _shm_files(pool)
    strategy_before = torch.multiprocessing.get_sharing_strategy()
    built = D.build_dataset(D.DatasetSpec("list", 100, variable=True))
    try:
        result = D.hand_over(pool, built.data, "file_system", timeout_s=60)
        try:
            assert result.shm_files_created == 100  # one /dev/shm file per tensor, by the controller
            for metrics in result.rank_metrics:
                assert metrics["shm_segments"] == 100
                assert metrics["open_fds"] - metrics["open_fds_before"] <= 2  # no descriptor per tensor
            assert [s["strategy"] for s in pool.run(D.rank_state)] == ["file_system"] * 2
            with D.sharing_strategy("file_system"):
                [m0, _] = pool.run(measure_workload,
                                   D.DatasetEpoch("list", 100, 2, "file_system", built.checksums, variable=True),
                                   RoundPlan(warmup=0, rounds=1), timeout_s=90)
            assert m0.metrics["peak_memory_bytes"] > 0 and m0.metrics["peak_uss_bytes"] > 0
        finally:
            D.release(pool, timeout_s=60)
    finally:
        built.cleanup()
    del built, result
    gc.collect()
    assert torch.multiprocessing.get_sharing_strategy() == strategy_before
    assert [s["strategy"] for s in pool.run(D.rank_state)] == [strategy_before] * 2
    deadline = time.monotonic() + 10
    while _shm_files(pool) - shm_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _shm_files(pool) - shm_before == set()
    # At most one descriptor more per rank: its (persistent) connection to torch_shm_manager,
    # opened the first time the rank uses file_system, whatever the sample count.
    after = [s["open_fds"] for s in pool.run(D.rank_state)]
    assert all(a - b <= 1 for a, b in zip(after, fds_before)), (after, fds_before)


@pytest.mark.parametrize("preflight", [True, False], ids=["preflight", "real-EMFILE"])
def test_fd_limit_is_a_clear_error_not_a_hang(pool, preflight):
    n = 300
    rank_fds = [s["open_fds"] for s in pool.run(D.rank_state)]
    limit = max(rank_fds) + 100  # room for 100 descriptors: the 300 tensors cannot fit
    from multiprocessing import resource_sharer

    # The sender's resource-sharer thread keeps one listening socket once it has started.
    sharer_listening = getattr(resource_sharer._resource_sharer, "_listener", None) is not None
    controller_fds = D.open_fd_count() + (0 if sharer_listening else 1)
    built = D.build_dataset(D.DatasetSpec("list", n))
    old = pool.run(D.set_fd_limit, limit)
    try:
        start = time.monotonic()
        with pytest.raises(TaskFailed) as info:
            D.hand_over(pool, built.data, "file_descriptor", timeout_s=60, preflight=preflight)
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
        del info  # its traceback references the dataset
    finally:
        pool.run(D.set_fd_limit, old[0])
    # Nothing stays pending in the controller's resource sharer, nothing stays open in the ranks.
    assert _sharer_pending() == 0
    assert [s["open_fds"] for s in pool.run(D.rank_state)] == rank_fds
    built.cleanup()
    del built
    gc.collect()
    assert D.open_fd_count() <= controller_fds
    # The next handover on the same pool works (packed: far below the limit).
    old = pool.run(D.set_fd_limit, limit)
    try:
        packed = D.build_dataset(D.DatasetSpec("packed", n))
        result = D.hand_over(pool, packed.data, "file_descriptor", timeout_s=60, preflight=preflight)
        assert [m["received_samples"] for m in result.rank_metrics] == [n, n]
        D.release(pool, timeout_s=60)
    finally:
        pool.run(D.set_fd_limit, old[0])


def test_controller_side_fd_limit_is_checked_before_sending(pool):
    built = D.build_dataset(D.DatasetSpec("list", 300))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (D.open_fd_count() + 200, hard))
    try:
        with pytest.raises(D.DatasetShareError, match=r"sender .*300 tensors need 300 descriptors"):
            D.hand_over(pool, built.data, "file_descriptor", timeout_s=60)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert _sharer_pending() == 0
    assert not any(s["has_dataset"] for s in pool.run(D.rank_state))


def test_bad_input_is_a_clear_error(pool):
    with pytest.raises(ValueError, match="unknown dataset layout 'tuple'"):
        D.DatasetSpec("tuple", 10)
    with pytest.raises(ValueError, match="positive integer"):
        D.DatasetSpec("list", 0)
    with pytest.raises(ValueError, match="unknown sharing strategy 'fd'"):
        D.hand_over(pool, [torch.zeros(1)], "fd")
    with pytest.raises(ValueError, match="worker start method"):
        D.DatasetEpoch("list", 10, 2, "file_system", D.SampleChecksums.of([torch.zeros(1)] * 10),
                       worker_start="thread")
    with pytest.raises(ValueError, match="expected must be the SampleChecksums of the 10 samples"):
        D.DatasetEpoch("list", 10, 2, "file_system", 0.0)


def test_sample_checksums_tell_apart_what_a_total_sum_cannot():
    samples = D.DatasetSpec("list", 6, variable=True).samples()
    reference = D.SampleChecksums.of(samples)
    assert len(reference) == 6 and reference.total == float(sum(t.double().sum() for t in samples))
    for corrupted in (swapped_samples(samples), transposed_data(samples)):
        other = D.SampleChecksums.of(corrupted)
        assert other.total == reference.total  # what the old check compared
        assert (other.sums != reference.sums).any() or (other.weighted != reference.weighted).any()
    # batching does not change a fingerprint
    batched = D.SampleChecksums.of(samples, batch=4)
    assert (batched.sums == reference.sums).all() and (batched.weighted == reference.weighted).all()


# Negative controls of DatasetEpoch.check: the dataset handed over is corrupted in a way that keeps
# the sample count and the total sum (all the old check compared); the check compares every sample
# by index with the checksums of the dataset as built.
@pytest.mark.parametrize("layout, variable, corrupt, workers, message", [
    ("list", False, swapped_samples, 0, r"sample [01] holds sample [10]'s data: samples swapped or reordered"),
    ("packed", False, moved_boundaries, 2, r"1000 of 1000 samples differ .* sample \d+ has the right shape but "
                                           r"other values .*: shifted boundaries or corrupted data"),
    ("packed", True, transposed_shapes, 0, r"sample \d+ has shape \(3, \d+, \d+\), expected \(3, \d+, \d+\): its "
                                           r"shape is transposed"),
    ("list", True, transposed_data, 0, r"sample \d+ has the right shape and sum but its elements are in another "
                                       r"order .*: transposed or permuted data"),
], ids=["swapped-samples", "moved-boundaries", "transposed-shapes", "transposed-data"])
def test_the_epoch_check_catches_a_corrupted_dataset(pool, layout, variable, corrupt, workers, message):
    built = D.build_dataset(D.DatasetSpec(layout, 1000, variable=variable))
    try:
        D.hand_over(pool, corrupt(built.data), "file_system", timeout_s=60)
        try:
            with D.sharing_strategy("file_system"), pytest.raises(
                    TaskFailed, match=rf"rank 0: the {layout} dataset's check epoch .* found .*" + message):
                pool.run(measure_workload, D.DatasetEpoch(layout, 1000, workers, "file_system", built.checksums,
                                                          variable=variable),
                         RoundPlan(warmup=0, rounds=1), timeout_s=90)
        finally:
            D.release(pool, timeout_s=60)
    finally:
        built.cleanup()
