"""Dataset storage sharing: a list of tensors vs one packed tensor (and numpy, and a memory-mapped
file), handed from the controller to spawned ranks through torch.multiprocessing pickling, then
iterated with a DataLoader in every rank.

Case ids read ``test_dataset_sharing[gloo-2p-<layout>-<strategy>-<workers>-<num_samples>-<sizes>]``,
e.g. ``test_dataset_sharing[gloo-2p-list-file_descriptor-w2-5000-fixed]``. A recorded round is one
DataLoader epoch (batch 64, shuffled) in every rank, max over ranks. extra_info adds ``layout``,
``num_samples``, ``num_workers``, ``sharing_strategy``, ``share_seconds`` (controller wall time of
the handover: pickling + every rank receiving), ``open_fds`` and ``shm_segments`` (in the receiving
rank right after the handover: its open descriptors, and the shared-memory segments the handover
mapped into it), ``peak_memory_bytes`` (peak PSS summed over a rank and its loader workers, max
over ranks; ``peak_uss_bytes`` likewise with USS).

Default grid: 4 layouts x num_workers {0, 2} (forked workers) x 2 strategies x num_samples
{1000, 5000}, fixed 3x32x32 samples. Under ``-m slow``: 20000 samples, variable-size samples
(3 x H x W, H and W in 16..48) and spawned loader workers (the dataset re-pickled to every worker
at every epoch).
"""

import pytest

from ddpbench.workloads.datasets import (DatasetEpoch, DatasetShareError, DatasetSpec, build_dataset,
                                         hand_over, release, sharing_strategy)

SLOW_SAMPLES = 20000

slow = pytest.mark.slow


@pytest.mark.parametrize("sizes", ["fixed", pytest.param("variable", marks=slow)])
@pytest.mark.parametrize("num_samples", [1000, 5000, pytest.param(SLOW_SAMPLES, marks=slow)])
@pytest.mark.parametrize("workers", [(0, "fork"), (2, "fork"), pytest.param((2, "spawn"), marks=slow)],
                         ids=["w0", "w2", "w2spawn"])
@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
@pytest.mark.parametrize("layout", ["list", "packed", "numpy", "mmap"])
def test_dataset_sharing(dist_benchmark, layout, strategy, workers, num_samples, sizes):
    num_workers, worker_start = workers
    built = build_dataset(DatasetSpec(layout, num_samples, variable=(sizes == "variable")))
    pool, timeout_s = dist_benchmark.pool, dist_benchmark.timeout_s
    try:
        try:
            handover = hand_over(pool, built.data, strategy, timeout_s=timeout_s)
        except DatasetShareError as exc:
            if num_samples == SLOW_SAMPLES:  # e.g. 20000 tensors under file_descriptor
                pytest.skip(str(exc))
            raise
        try:
            with sharing_strategy(strategy):
                dist_benchmark(DatasetEpoch(layout, num_samples, num_workers, strategy, built.checksums,
                                            variable=(sizes == "variable"), worker_start=worker_start),
                               warmup=1)
        finally:
            if pool.alive:
                release(pool, timeout_s=timeout_s)
    finally:
        built.cleanup()
    ranks = handover.combined()
    dist_benchmark.extra_info.update({
        "share_seconds": round(handover.share_seconds, 6),
        "receive_seconds": round(ranks["receive_seconds"], 6),
        "open_fds": ranks["open_fds"],
        "shm_segments": ranks["shm_segments"],
        "shm_files_created": handover.shm_files_created,
    })
