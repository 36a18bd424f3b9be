"""Training-loop benchmarks: hand-written all-reduce vs torch DDP vs PyTorch Lightning, with scaling.

Case ids read ``test_training[<backend>-<world size>p-<model>-<impl>-accum<k>-b<batch>]``. A round
is one optimizer step (``grad_accum`` micro-batches of ``batch`` samples on every rank). World
sizes are ``--dist-world-sizes`` plus 1, the scaling reference; world-size-1 cases run first
(benchmarks/conftest.py orders them), and a case at world size N > 1 gets
``scaling_efficiency = samples_per_second(N) / (N * samples_per_second(1))`` when the matching
world-size-1 case (same backend, device, model, impl, accumulation and batch) ran in this session.

Default run: batch 32, accumulation 1 and 4. ``-m slow`` adds batch 64.
DataParallel (single process, every GPU) runs under ``gpu`` + ``multi_gpu``.
``test_training_bucket_view``: DDP with ``gradient_as_bucket_view=True`` (mlp), for the memory census.

``test_training_shared_gpu`` (``gpu``): two gloo ranks with CUDA tensors on ONE GPU
(``gloo-cuda-2p``), so a single-GPU runner still measures a step whose gradients really cross
processes (NCCL refuses two ranks on one GPU): compute on the GPU, the reduction through host memory.
"""

from __future__ import annotations

import pytest

from ddpbench.pool import PoolSpec
from ddpbench.workloads.training import MODELS, Training, lightning_unavailable_reason
from ddpbench.workloads.training.metrics import add_exposed_communication

IMPLS = ("manual", "ddp", "lightning")
ACCUMS = (1, 4)
BATCHES = [pytest.param(32, id="b32"), pytest.param(64, id="b64", marks=pytest.mark.slow)]


@pytest.fixture(scope="session")
def training_reference() -> dict:
    """samples_per_second of the world-size-1 cases run so far, by (backend, device, model, impl,
    grad_accum, batch_size)."""
    return {}


@pytest.mark.dist_extra_world_sizes(1)
@pytest.mark.parametrize("batch_size", BATCHES)
@pytest.mark.parametrize("grad_accum", ACCUMS, ids=lambda k: f"accum{k}")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("model", MODELS)
def test_training(dist_benchmark, dist_spec, training_reference, model, impl, grad_accum, batch_size):
    if impl == "lightning":
        reason = lightning_unavailable_reason()
        if reason:
            pytest.skip(reason)
    workload = Training(model, impl, batch_size=batch_size, grad_accum=grad_accum)
    result = dist_benchmark(workload)
    # per-rank view (the seed reports' "Rank | Time | Max Memory Allocated" table): the engine records
    # each rank's median round as rank_median_s and its census peak in memory.peak_bytes_per_rank
    # With --dist-exposed-comm N (manual and ddp): compute_s, exposed_comm_s, comm_isolated_s, comm_overlap_pct.
    dist_benchmark.extra_info.update(add_exposed_communication(result.extra_info))
    key = (dist_spec.backend, dist_spec.device, model, impl, grad_accum, batch_size)
    samples_per_second = result.extra_info["samples_per_second"]
    if dist_spec.world_size == 1:
        training_reference[key] = samples_per_second
    elif key in training_reference:
        efficiency = samples_per_second / (dist_spec.world_size * training_reference[key])
        dist_benchmark.extra_info["scaling_efficiency"] = round(efficiency, 4)


@pytest.mark.parametrize("model", ["mlp"])
def test_training_bucket_view(dist_benchmark, model):
    """DDP with ``gradient_as_bucket_view=True`` beside test_training's ``ddp`` and ``manual`` cases
    (batch 32, no accumulation): the report's Memory table shows DDP's bucket copy (``DDP
    buckets`` = the parameters' bytes) in the ``ddp`` case and gone here (seed 004's finding)."""
    dist_benchmark(Training(model, "ddp", batch_size=32, gradient_as_bucket_view=True))


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("grad_accum", ACCUMS, ids=lambda k: f"accum{k}")
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dist_spec", [pytest.param(PoolSpec("nccl", 1, "cuda"), id="nccl-1p")])
def test_training_dataparallel(dist_benchmark, model, grad_accum):
    """torch.nn.DataParallel in one process (a world of one rank) over every GPU (per-GPU batch
    32), for the GIL comparison with the ddp cases at the same world size."""
    dist_benchmark(Training(model, "dataparallel", batch_size=32, grad_accum=grad_accum))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dist_spec", [PoolSpec("gloo", 2, "cuda")], ids=["gloo-cuda-2p"])
def test_training_shared_gpu(dist_benchmark, model, impl):
    """One optimizer step (batch 32, no accumulation) on two ranks sharing one GPU."""
    if impl == "lightning":
        reason = lightning_unavailable_reason()
        if reason:
            pytest.skip(reason)
    dist_benchmark(Training(model, impl, batch_size=32, grad_accum=1))
