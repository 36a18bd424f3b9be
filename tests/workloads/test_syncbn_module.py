"""Correctness of the hand-written SyncBatchNorm (ddpbench.workloads.syncbn).

The distributed checks run as module-level tasks on one 3-rank pool for the whole module (world
size 3: its default group; world size 2: a process group of ranks 0 and 1). Every rank builds the
same global batch from a fixed seed, runs the module on its own slice, and compares with one torch.nn.BatchNorm1d run on the whole (concatenated) batch:
output and input gradient of its slice, weight / bias gradients summed over ranks (the module's
are local sums, as in torch.nn.SyncBatchNorm; DDP all-reduces them), running mean / var and
num_batches_tracked after two steps, and the eval-mode output. The tasks return relative errors;
the assertions are here.

(Named test_syncbn_module.py: a tests/test_syncbn.py would collide with benchmarks/test_syncbn.py
under pytest's default rootdir-based imports, since neither directory is a package.)
"""

from __future__ import annotations

import pytest
import torch

from ddpbench.pool import PoolRegistry, PoolSpec, TaskFailed
from ddpbench.engine.timing import RoundPlan, measure_workload
from ddpbench.nn.syncbn import FusedSyncBatchNorm, NaiveSyncBatchNorm
from ddpbench.workloads.syncbn import SyncBNCase, build_variant, reference_batch_norm

from helpers.broken_workloads import GradScaledSyncBN, NoXhatTermSyncBN, UnsyncedSyncBN

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
LARGE_MEAN_TOLERANCE = 1e-3  # float32 input with mean 1e3, std 1: about eps32 * mean / std
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "broadcast", "all_to_all_single", "barrier", "reduce", "gather", "scatter")

MODULES = {"fused": FusedSyncBatchNorm, "naive": NaiveSyncBatchNorm}

# Under `pytest -n N --dist loadgroup` every test of this module runs on one worker, so only one
# rank pool is started (a no-op under xdist's default `load` scheduling and without xdist).
pytestmark = pytest.mark.xdist_group("syncbn_pool")


# ----------------------------------------------------------------------------------------------
# Rank tasks (module level, so the ranks can unpickle them)
# ----------------------------------------------------------------------------------------------


def _rel_err(actual, expected) -> float:
    actual, expected = actual.detach().to(torch.float64).cpu(), expected.detach().to(torch.float64).cpu()
    if expected.numel() == 0:
        return 0.0 if actual.numel() == 0 else float("inf")
    return float((actual - expected).abs().max() / max(1.0, float(expected.abs().max())))


def _global_batch(seed, counts, channels, tail, dtype, mean=0.0, std=1.0):
    generator = torch.Generator().manual_seed(seed)
    shape = (sum(counts), channels, *tail)
    x = (torch.randn(shape, generator=generator, dtype=torch.float64) * std + mean).to(dtype)
    g = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return x, g


class _Member:
    """This rank's place in the group a task runs on: the whole pool, or ranks 0..n-1 of it."""

    def __init__(self, ctx, world_size):
        import torch.distributed as dist

        if world_size == ctx.world_size:
            self.group, self.rank = None, ctx.rank
        else:
            # Every rank of the pool must take part in creating a group, members or not.
            key = f"syncbn_test_group_{world_size}"
            if key not in ctx.scratch:
                ctx.scratch[key] = dist.new_group(list(range(world_size)))
            self.group = ctx.scratch[key]
            self.rank = ctx.rank if ctx.rank < world_size else None
        self.device = ctx.device


def _my_slice(me, counts, tensor):
    start = sum(counts[:me.rank])
    return tensor[start:start + counts[me.rank]]


def parity_task(ctx, world_size, variant, counts, dtype_name, tail=(), momentum=0.1, affine=True,
                track_running_stats=True, steps=2, channels=6):
    """Errors of ``variant`` vs torch.nn.BatchNorm1d on the concatenated batch, per quantity."""
    import torch.distributed as dist

    me = _Member(ctx, world_size)
    if me.rank is None:
        return None  # not in the group this case runs on
    dtype = getattr(torch, dtype_name)
    device = ctx.device
    module = MODULES[variant](channels, momentum=momentum, affine=affine, process_group=me.group,
                              track_running_stats=track_running_stats, dtype=dtype, device=device)
    reference = torch.nn.BatchNorm1d(channels, momentum=momentum, affine=affine,
                                     track_running_stats=track_running_stats, dtype=torch.float64)
    if affine:
        generator = torch.Generator().manual_seed(7)
        weight = torch.rand(channels, generator=generator, dtype=torch.float64) + 0.5
        bias = torch.randn(channels, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            module.weight.copy_(weight)
            module.bias.copy_(bias)
            reference.weight.copy_(weight)
            reference.bias.copy_(bias)
    errors: dict[str, float] = {}

    def record(name, actual, expected):
        errors[name] = max(errors.get(name, 0.0), _rel_err(actual, expected))

    for step in range(steps):
        x_all, g_all = _global_batch(100 + step, counts, channels, tail, dtype)
        x = _my_slice(me, counts, x_all).clone().to(device).requires_grad_()
        g = _my_slice(me, counts, g_all).to(device)
        module.zero_grad(set_to_none=True)
        out = module(x)
        out.backward(g)

        reference.zero_grad(set_to_none=True)
        x_ref = x_all.to(torch.float64).requires_grad_()
        out_ref = reference(x_ref)
        out_ref.backward(g_all.to(torch.float64))

        record("output", out, _my_slice(me, counts, out_ref))
        record("input_grad", x.grad, _my_slice(me, counts, x_ref.grad))
        if affine:
            grads = torch.cat([module.weight.grad, module.bias.grad]).to(torch.float64)
            dist.all_reduce(grads, group=me.group)  # local sums -> global, as DDP would (with SUM)
            record("weight_grad", grads[:channels], reference.weight.grad)
            record("bias_grad", grads[channels:], reference.bias.grad)
        if track_running_stats:
            record("running_mean", module.running_mean, reference.running_mean)
            record("running_var", module.running_var, reference.running_var)
            if int(module.num_batches_tracked) != int(reference.num_batches_tracked):
                errors["num_batches_tracked"] = float("inf")

    if track_running_stats:
        module.eval()
        reference.eval()
        x_all, _ = _global_batch(999, counts, channels, tail, dtype)
        with torch.no_grad():
            record("eval_output", module(_my_slice(me, counts, x_all).to(device)),
                   _my_slice(me, counts, reference(x_all.to(torch.float64))))
    return errors


def large_mean_task(ctx, counts, channels=16, mean=1e3):
    """float32 input with mean 1e3, std 1: errors of the fused module vs a float64 reference."""
    me = _Member(ctx, len(counts))
    if me.rank is None:
        return None
    x_all, g_all = _global_batch(5, counts, channels, (), torch.float32, mean=mean)
    module = FusedSyncBatchNorm(channels, process_group=me.group)
    reference = torch.nn.BatchNorm1d(channels, dtype=torch.float64)
    x = _my_slice(me, counts, x_all).clone().requires_grad_()
    out = module(x)
    out.backward(_my_slice(me, counts, g_all))
    x_ref = x_all.to(torch.float64).requires_grad_()  # the same float32 values, exactly
    out_ref = reference(x_ref)
    out_ref.backward(g_all.to(torch.float64))
    return {
        "output": _rel_err(out, _my_slice(me, counts, out_ref)),
        "input_grad": _rel_err(x.grad, _my_slice(me, counts, x_ref.grad)),
        "running_mean": _rel_err(module.running_mean, reference.running_mean),
        "running_var": _rel_err(module.running_var, reference.running_var),
    }


class _CollectiveCounter:
    """Counts calls of torch.distributed's collectives while installed (then calls through)."""

    def __init__(self):
        self.calls: list[str] = []
        self._saved = {}

    def __enter__(self):
        import torch.distributed as dist

        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:
                continue
            self._saved[name] = original

            def counted(*args, _name=name, _original=original, **kwargs):
                self.calls.append(_name)
                return _original(*args, **kwargs)

            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        for name, original in self._saved.items():
            setattr(dist, name, original)
        return False

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


def communication_task(ctx, variant):
    """Collectives issued by a training forward, its backward, and (rank 0 only) eval mode.

    In eval mode only rank 0 runs the module while the other ranks return at once: a module that
    communicated there would block until the pool's timeout.
    """
    module = MODULES[variant](8)  # the default group: every rank of the pool
    x = torch.randn(5 + ctx.rank, 8, requires_grad=True)
    counts = {}
    with _CollectiveCounter() as counter:
        out = module(x)
        counts["train_forward"] = counter.take()
        out.backward(torch.randn_like(out))
        counts["train_backward"] = counter.take()
        if ctx.rank == 0:
            module.eval()
            x_eval = torch.randn(4, 8, requires_grad=True)
            module(x_eval).sum().backward()
            no_stats = MODULES[variant](8, track_running_stats=False).eval()
            no_stats(x_eval).sum().backward()
            counts["eval"] = counter.take()
    return counts


def too_small_task(ctx, variant, counts):
    module = MODULES[variant](3)  # the default group: every rank of the pool
    module(torch.randn(counts[ctx.rank], 3))


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------


POOL_SIZE = 3


@pytest.fixture(scope="module")
def pool():
    """One 3-rank gloo pool for the module: world size 3 is its default group, world size 2 a
    process group of ranks 0 and 1 (so the process_group argument is exercised too)."""
    registry = PoolRegistry()
    yield registry.get(PoolSpec("gloo", POOL_SIZE, "cpu"))
    registry.close()


def _assert_within(results, tolerance, what):
    for rank, errors in enumerate(results):
        if errors is None:  # a rank outside the case's group
            continue
        bad = {name: err for name, err in errors.items() if not err <= tolerance}
        assert not bad, f"{what}: rank {rank} differs from the reference beyond {tolerance:g}: {bad}"


PARITY_CASES = {
    # name: (counts for world size 2, counts for world size 3, kwargs)
    "f64-equal": ([8, 8], [8, 8, 8], dict(dtype_name="float64")),
    "f64-unequal-NCL-cma": ([9, 4], [9, 7, 3], dict(dtype_name="float64", tail=(3,), momentum=None)),
    "f64-empty-rank": ([11, 0], [6, 0, 5], dict(dtype_name="float64")),
    "f32-unequal": ([16, 5], [16, 16, 5], dict(dtype_name="float32")),
    "f64-no-affine-no-stats": ([7, 3], [4, 3, 2], dict(dtype_name="float64", affine=False,
                                                    track_running_stats=False)),
}


# ----------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("variant", ["fused", "naive"])
def test_parity_with_batchnorm_on_the_global_batch(pool, world_size, variant):
    for name, (counts2, counts3, kwargs) in PARITY_CASES.items():
        counts = counts2 if world_size == 2 else counts3
        results = pool.run(parity_task, world_size, variant, counts, timeout_s=120, **kwargs)
        assert [r is not None for r in results] == [rank < world_size for rank in range(POOL_SIZE)]
        expected_keys = {"output", "input_grad"}
        assert expected_keys <= set(results[0]), results[0]
        _assert_within(results, TOLERANCE[kwargs["dtype_name"]],
                       f"{variant}, {world_size} ranks, case {name} (per-rank batches {counts})")


def test_large_mean_matches_float64_reference(pool):
    counts = [70, 58]
    results = pool.run(large_mean_task, counts, timeout_s=120)
    _assert_within(results, LARGE_MEAN_TOLERANCE, "fused, float32 input with mean 1e3 and std 1")


def test_large_mean_data_defeats_the_naive_sum_of_squares():
    """The large-mean data really is hard: float32 E[x^2] - E[x]^2 misses the variance by far more
    than the tolerance the fused module meets (so the test above can tell the two apart)."""
    x, _ = _global_batch(5, [70, 58], 16, (), torch.float32, mean=1e3)
    naive_var = (x * x).mean(0) - x.mean(0) ** 2
    true_var = x.to(torch.float64).var(0, unbiased=False)
    assert _rel_err(naive_var, true_var) > 100 * LARGE_MEAN_TOLERANCE


@pytest.mark.parametrize("variant, forward_calls, backward_calls",
                         [("fused", 1, 1), ("naive", 3, 2)])
def test_collectives_per_step_and_none_in_eval(pool, variant, forward_calls, backward_calls):
    results = pool.run(communication_task, variant, timeout_s=60)
    for rank, counts in enumerate(results):
        assert len(counts["train_forward"]) == forward_calls, (rank, counts)
        assert len(counts["train_backward"]) == backward_calls, (rank, counts)
        if variant == "fused":
            assert set(counts["train_forward"] + counts["train_backward"]) == {"all_reduce"}, counts
    assert results[0]["eval"] == [], f"eval mode communicated: {results[0]['eval']}"


@pytest.mark.parametrize("variant", ["fused", "naive"])
def test_global_batch_of_one_fails_cleanly_on_every_rank(pool, variant):
    with pytest.raises(TaskFailed) as failure:
        pool.run(too_small_task, variant, [1, 0, 0], timeout_s=120)
    assert sorted(failure.value.errors) == [0, 1, 2]
    assert all("more than 1 value per channel" in tb for tb in failure.value.errors.values())
    assert not failure.value.pool_torn_down and pool.alive


@pytest.mark.parametrize("cls", [FusedSyncBatchNorm, NaiveSyncBatchNorm])
def test_without_a_process_group_it_is_plain_batchnorm(cls):
    torch.manual_seed(0)
    x = torch.randn(12, 5, 3, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    module, reference = cls(5, dtype=torch.float64), torch.nn.BatchNorm1d(5, dtype=torch.float64)
    g = torch.randn_like(x)
    out, out_ref = module(x), reference(x_ref)
    out.backward(g)
    out_ref.backward(g)
    for actual, expected in [(out, out_ref), (x.grad, x_ref.grad), (module.weight.grad, reference.weight.grad),
                             (module.running_var, reference.running_var)]:
        assert _rel_err(actual, expected) <= 1e-10


@pytest.mark.parametrize("cls", [FusedSyncBatchNorm, NaiveSyncBatchNorm])
def test_bad_inputs_raise_clear_errors(cls):
    module = cls(4)
    with pytest.raises(ValueError, match="has 3 channels .* num_features=4"):
        module(torch.randn(8, 3))
    with pytest.raises(ValueError, match=r"expected an \(N, C\) or \(N, C, \*\) input, got a 1-D"):
        module(torch.randn(8))
    with pytest.raises(ValueError, match="num_features must be a positive int"):
        cls(0)
    with pytest.raises(ValueError, match="momentum must be None or in"):
        cls(4, momentum=1.5)


def test_benchmark_case_rejects_bad_parameters():
    with pytest.raises(ValueError, match="unknown SyncBatchNorm variant 'fast'"):
        SyncBNCase("fast", 32, 128)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        SyncBNCase("fused", 0, 128)
    with pytest.raises(ValueError, match="rejects CPU tensors"):
        build_variant("torch_syncbn", 8, "cpu")


def test_reference_batch_norm_is_torch_batch_norm_in_float64():
    torch.manual_seed(3)
    x = torch.randn(40, 6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(40, 6, dtype=torch.float64)
    reference = torch.nn.BatchNorm1d(6, dtype=torch.float64)
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
        reference.bias.normal_()
    out = reference(x)
    out.backward(g)
    ref_out, ref_grad = reference_batch_norm(x, g, reference.weight, reference.bias, reference.eps)
    assert _rel_err(ref_out, out) <= 1e-12 and _rel_err(ref_grad, x.grad) <= 1e-12


# The benchmark case's own check (SyncBNCase.check, run after every case's timed rounds) against a
# float64 batch norm on the all-gathered global batch; 3 ranks, equal batch sizes, so an
# unsynchronised module still gives each rank's output mean 0 / variance 1.
@pytest.mark.parametrize("variant", ["fused", "naive", "torch_bn"])
def test_benchmark_check_passes_the_real_variants(pool, variant):
    pool.run(measure_workload, SyncBNCase(variant, 32, 128), RoundPlan(warmup=0, rounds=2, numerics_steps=0), timeout_s=120)


@pytest.mark.parametrize("broken, message", [
    (UnsyncedSyncBN, r"the output is off by .* it matches a batch norm over this rank's own 32 samples: "
                     r"the statistics were not synchronised across ranks"),
    (GradScaledSyncBN, r"the input gradient is off by .* it is 2 x the reference: the gradient has the "
                       r"wrong scale"),
    (NoXhatTermSyncBN, r"the input gradient is off by .* it matches the gradient without the "
                       r"x_hat \* mean\(dy \* x_hat\) term"),
], ids=["unsynchronised", "grad-scale", "no-xhat-term"])
def test_benchmark_check_catches_a_broken_syncbn(pool, broken, message):
    with pytest.raises(TaskFailed, match=r"fused on rank 0 differs from a float64 batch norm over the "
                                         r"all-gathered global batch of 96 samples: " + message):
        pool.run(measure_workload, broken("fused", 32, 128), RoundPlan(warmup=0, rounds=1, numerics_steps=0), timeout_s=120)


# NCCL: one rank per GPU (1 rank on a single-GPU machine); gloo with CUDA tensors: 2 ranks that may
# share one GPU, so the statistics really cross ranks on a single-GPU machine too.
CUDA_SPECS = [pytest.param("nccl", id="nccl"), pytest.param("gloo", id="gloo-cuda-2p")]


def _cuda_spec(backend: str) -> PoolSpec:
    return PoolSpec("nccl", min(2, torch.cuda.device_count()), "cuda") if backend == "nccl" \
        else PoolSpec("gloo", 2, "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", CUDA_SPECS)
@pytest.mark.parametrize("variant", ["fused", "naive"])
def test_parity_on_cuda(variant, backend):
    spec = _cuda_spec(backend)
    world_size = spec.world_size
    registry = PoolRegistry()
    try:
        pool = registry.get(spec)
        for name, (counts2, _, kwargs) in PARITY_CASES.items():
            counts = counts2[:world_size] if world_size == 2 else [sum(counts2)]
            results = pool.run(parity_task, world_size, variant, counts, timeout_s=120, **kwargs)
            _assert_within(results, TOLERANCE[kwargs["dtype_name"]] * 10,
                           f"{variant} on CUDA ({spec.backend}), {world_size} ranks, case {name}")
    finally:
        registry.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", CUDA_SPECS)
def test_benchmark_check_on_cuda(backend):
    spec = _cuda_spec(backend)
    world_size = spec.world_size
    registry = PoolRegistry()
    try:
        pool = registry.get(spec)
        for variant in ("torch_bn", "torch_syncbn", "fused", "naive"):
            pool.run(measure_workload, SyncBNCase(variant, 32, 128), RoundPlan(warmup=0, rounds=1, numerics_steps=0), timeout_s=120)
        if world_size > 1:
            with pytest.raises(TaskFailed, match="the statistics were not synchronised across ranks"):
                pool.run(measure_workload, UnsyncedSyncBN("fused", 32, 128), RoundPlan(warmup=0, rounds=1, numerics_steps=0),
                         timeout_s=120)
    finally:
        registry.close()
