"""Dataset storage sharing: a list of tensors vs one stacked tensor vs one packed tensor (and numpy,
and a memory-mapped file), handed from the controller to spawned ranks through torch.multiprocessing
pickling, then iterated with a DataLoader in every rank.

A case is a :class:`~ddpbench.workloads.datasets.DatasetEpoch`: ``DatasetEpoch.handed_over`` builds
the dataset here and it travels to the ranks inside the workload, as ``mp.spawn`` arguments do
(``with`` lets go of the controller's side when the case ends). A recorded round is one DataLoader
epoch in every rank, max over ranks. extra_info adds ``layout``, ``num_samples``, ``sample_shape``,
``sample_bytes``, ``num_workers``, ``worker_start``, ``persistent_workers``, ``sharing_strategy``,
``data_source``, ``share_seconds`` (from the controller starting to pickle a rank's copy to that
rank holding the dataset, max over ranks), ``receive_seconds``, ``open_fds`` and ``shm_segments``
(in the receiving rank right after the handover), ``shm_files_created`` (file_system, in the
controller), ``peak_memory_bytes`` (peak PSS summed over a rank and its loader workers, max over
ranks; ``peak_uss_bytes`` likewise with USS). benchmarks/conftest.py turns a ``DatasetShareError``
(this machine's open-file limit cannot hold the handover) into a skip for ``slow`` cases.

``test_dataset_sharing[gloo-2p-<layout>-<strategy>-<workers>-<num_samples>-<sizes>]``: 4 layouts
(list, packed, numpy, mmap) x num_workers {0, 2} (forked workers) x 2 strategies x num_samples {1000,
5000}, fixed 3x32x32 samples, batch 64, every rank iterating every sample. Under ``-m slow``: the
stacked layout, 20000 samples, variable-size samples (3 x H x W, H and W in 16..48; not stacked) and
spawned loader workers.

``test_reported_path[gloo-2p-<layout>-<source>-<loader>-<num_samples>x602KB]``: the path of the
reports behind this family (Lightning #1925, pytorch#39443): 3x224x224 float32 samples (602 KB),
list vs stacked, handed over under torch's default ``file_descriptor`` strategy, each rank iterating
its ``DistributedSampler`` shard in batches of 128 with torch's default collate, and DataLoader
workers started anew every epoch (``w2fork-fresh``: 2 forked workers, not persistent). Default run:
that configuration with 256 samples. Under ``-m slow``, 2048 samples (1.2 GB): workers {2, 4} x
{fork, spawn} started anew each epoch, and the controls: ``persistent`` workers, ``w0`` (no
workers), and ``rank`` (every rank builds its own data: no handover); these cases get a
--dist-timeout of at least 600 s (minutes per case with spawned workers on 2 cores).
"""

import pytest

from ddpbench.workloads.datasets import LAYOUTS, REPORT_SHAPE, DatasetEpoch, DatasetSpec

slow = pytest.mark.slow


def _sharing_grid():
    for layout in LAYOUTS:
        for strategy in ("file_descriptor", "file_system"):
            for workers, start, wid in ((0, "fork", "w0"), (2, "fork", "w2"), (2, "spawn", "w2spawn")):
                for num_samples in (1000, 5000, 20000):
                    for sizes in ("fixed", "variable"):
                        if layout == "stacked" and sizes == "variable":
                            continue  # one N x C x H x W tensor holds fixed-size samples only
                        heavy = layout == "stacked" or wid == "w2spawn" or num_samples == 20000 or sizes == "variable"
                        yield pytest.param(DatasetSpec(layout, num_samples, variable=sizes == "variable"),
                                           strategy, dict(num_workers=workers, worker_start=start),
                                           id=f"{layout}-{strategy}-{wid}-{num_samples}-{sizes}",
                                           marks=slow if heavy else ())


@pytest.mark.parametrize("spec, strategy, loader", list(_sharing_grid()))
def test_dataset_sharing(dist_benchmark, spec, strategy, loader):
    with DatasetEpoch.handed_over(spec, strategy, **loader) as epoch:
        dist_benchmark(epoch, warmup=1)


REPORTED = dict(batch_size=128, sampler="distributed", collate="stack")
DEFAULT_SAMPLES, SLOW_SAMPLES = 256, 2048
# 1.2 GB with workers spawned anew each epoch takes minutes per case on a 2-core machine (each
# spawned worker imports torch and receives the dataset), past the default --dist-timeout.
SLOW_TIMEOUT_S = 600  # under pytest.ini's 900 s backstop for the whole test


def _reported_path():
    def case(layout, source, num_samples, workers=0, start="fork", persistent=False):
        loader = "w0" if not workers else f"w{workers}{start}-{'persistent' if persistent else 'fresh'}"
        default = num_samples == DEFAULT_SAMPLES
        return pytest.param(DatasetSpec(layout, num_samples, shape=REPORT_SHAPE), source,
                            dict(REPORTED, num_workers=workers, worker_start=start, persistent_workers=persistent),
                            id=f"{layout}-{source}-{loader}-{num_samples}x602KB", marks=() if default else slow)

    for layout in ("list", "stacked"):
        yield case(layout, "handover", DEFAULT_SAMPLES, 2, "fork")
    for layout in ("list", "stacked"):
        for start in ("fork", "spawn"):
            for workers in (2, 4):
                yield case(layout, "handover", SLOW_SAMPLES, workers, start)
            yield case(layout, "handover", SLOW_SAMPLES, 2, start, persistent=True)
            yield case(layout, "rank", SLOW_SAMPLES, 2, start)
        yield case(layout, "handover", SLOW_SAMPLES)


@pytest.mark.parametrize("spec, source, loader", list(_reported_path()))
def test_reported_path(dist_benchmark, pytestconfig, spec, source, loader):
    timeout_s = pytestconfig.getoption("dist_timeout")
    if spec.num_samples == SLOW_SAMPLES:
        timeout_s = max(timeout_s, SLOW_TIMEOUT_S)
    make = DatasetEpoch.handed_over if source == "handover" else DatasetEpoch.built_in_ranks
    with make(spec, "file_descriptor", **loader) as epoch:
        dist_benchmark(epoch, warmup=1, timeout_s=timeout_s)
