"""Exposed communication on a GPU: DDP's default buckets (25 MB) against one bucket
(``bucket_cap_mb`` 1000, above GPT-2 124M's ~500 MB of fp32 gradients), GPT-2 124M in bf16.

With the default buckets DDP all-reduces each bucket while the backward pass still computes the
earlier layers' gradients; one bucket can start only after the last gradient, so it should expose
more communication (``exposed_comm_s``) while compute (``compute_s``) stays within its spread. The
CPU could not show it (two cores: gloo's communication competes with the backward for them;
lab/reference/exposed_comm_offcore.py stands in for an idle core). On one GPU:

* ``nccl-1p``: NCCL at world size 1 moves nothing (an in-place all-reduce of one rank returns at
  once), so both should expose ~0: the null check.
* ``gloo-cuda-2p``: two gloo ranks sharing the GPU (as benchmarks/test_training.py's
  ``*_shared_gpu`` cases): the gradients really cross gloo's transport while the GPU computes.

Run by lab/gpu/check.sh's ``exposed_comm`` part; not collected by ``pytest tests/`` or
``benchmarks/`` (its name does not start with ``test_``), so name it:

    python3 -m pytest lab/gpu/bench_exposed_comm.py --benchmark-json=exposed.json
"""

from __future__ import annotations

import os

import pytest

from ddpbench.pool import PoolSpec
from ddpbench.workloads.training import TransformerTraining
from ddpbench.workloads.training.metrics import add_exposed_communication

# Rounds of each variant (step, compute-only, communication-only) after the case's own rounds, as
# benchmarks/test_transformer.py's EXPOSED_COMM_ROUNDS.
EXPOSED_COMM_ROUNDS = 8
ONE_BUCKET_CAP_MB = 1000

SPECS = [pytest.param(PoolSpec("nccl", 1, "cuda"), id="nccl-1p", marks=pytest.mark.gpu),
         pytest.param(PoolSpec("gloo", 2, "cuda"), id="gloo-cuda-2p", marks=pytest.mark.gpu)]
CASES = [TransformerTraining(size="gpt2-124m", precision="bf16"),
         TransformerTraining(size="gpt2-124m", precision="bf16", bucket_cap_mb=ONE_BUCKET_CAP_MB)]
if os.environ.get("DDPBENCH_GPU_CHECK_REHEARSAL") == "1":
    # check.sh --cpu-rehearsal: the same pair on the CPU (cpu-small, gloo), so its plumbing runs
    SPECS = [pytest.param(PoolSpec("gloo", 2, "cpu"), id="gloo-2p")]
    CASES = [TransformerTraining(), TransformerTraining(bucket_cap_mb=ONE_BUCKET_CAP_MB)]


@pytest.mark.parametrize("workload", [pytest.param(w, id=w.case_id) for w in CASES])
@pytest.mark.parametrize("dist_spec", SPECS)
def test_exposed_comm_buckets(dist_benchmark, workload):
    result = dist_benchmark(workload, variant_rounds=EXPOSED_COMM_ROUNDS)
    dist_benchmark.extra_info.update(add_exposed_communication(result.extra_info))
    memory_keys = ("peak_memory_allocated_bytes", "peak_memory_reserved_bytes")
    dist_benchmark.extra_info["rank_peak_memory"] = [{k: m[k] for k in memory_keys if k in m}
                                                     for m in result.rank_metrics]
