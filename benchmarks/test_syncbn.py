"""SyncBatchNorm benchmarks: forward + backward of torch_bn, torch_syncbn, fused and naive over
batch_size x hidden_dim and --dist-world-sizes.

Case ids read ``test_syncbn[<backend>-<world size>p-<variant>-bs<batch>-h<hidden>]``, e.g.
``test_syncbn[gloo-2p-fused-bs64-h1024]``; each case's extra_info carries variant, batch_size
(per rank), hidden_dim, the memory census (``memory``) and on CUDA peak_memory_bytes (max over ranks). Cases of one shape share a
pytest-benchmark group (``syncbn-bs64-h1024``), so the variants print side by side.

torch_syncbn skips on CPU: torch.nn.SyncBatchNorm rejects CPU tensors. At world size 1 (the GPU
``gpu`` case) torch falls back to plain batch norm; extra_info then says
``torch_syncbn_falls_back_to_batchnorm``.

``test_syncbn_shared_gpu`` (``gpu``): two ranks on ONE GPU, synchronised through gloo with CUDA
tensors (``test_syncbn_shared_gpu[gloo-cuda-2p-...]``). NCCL refuses two ranks on one GPU, so on a
single-GPU runner this is the case where torch.nn.SyncBatchNorm, the fused and the naive module
really exchange statistics: compute and memory on the GPU, the exchange through host memory.
"""

import pytest

from ddpbench.pool import PoolSpec
from ddpbench.workloads.syncbn import TORCH_SYNCBN_CPU_SKIP_REASON, VARIANTS, SyncBNCase

BATCH_SIZES = (32, 64)
HIDDEN_DIMS = (128, 256, 512, 1024)


@pytest.mark.parametrize("hidden_dim", HIDDEN_DIMS, ids=lambda h: f"h{h}")
@pytest.mark.parametrize("batch_size", BATCH_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("variant", VARIANTS)
def test_syncbn(request, dist_spec, variant, batch_size, hidden_dim):
    if variant == "torch_syncbn" and dist_spec.device == "cpu":
        pytest.skip(TORCH_SYNCBN_CPU_SKIP_REASON)
    # Requested only now, so a skipped case never starts a rank pool.
    dist_benchmark = request.getfixturevalue("dist_benchmark")
    dist_benchmark(SyncBNCase(variant, batch_size, hidden_dim))


@pytest.mark.gpu
@pytest.mark.parametrize("hidden_dim", HIDDEN_DIMS, ids=lambda h: f"h{h}")
@pytest.mark.parametrize("batch_size", BATCH_SIZES, ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dist_spec", [PoolSpec("gloo", 2, "cuda")], ids=["gloo-cuda-2p"])
def test_syncbn_shared_gpu(dist_benchmark, dist_spec, variant, batch_size, hidden_dim):
    dist_benchmark(SyncBNCase(variant, batch_size, hidden_dim))
