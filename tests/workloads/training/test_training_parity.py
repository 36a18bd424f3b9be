"""Training loops compute what they claim: manual all-reduce == DDP == Lightning, on a 2-rank gloo pool.

Every rank trains on different data and starts from different random weights, so a missing
broadcast or a broken gradient reduction changes the result (the negative control shows the
comparison catches one). Named ``test_training_parity`` so it does not clash with
``benchmarks/test_training.py`` when pytest collects both directories (rootdir-style imports).
"""

from __future__ import annotations

import pytest
import torch

from ddpbench.pool import PoolRegistry, PoolSpec, RankPool, TaskFailed
from ddpbench.engine.timing import RoundPlan, combine_rank_metrics, measure_workload
from ddpbench.workloads import training
from ddpbench.workloads.training import lightning, loops
from ddpbench.testing import train_steps
from ddpbench.workloads.training import Training, lightning_unavailable_reason, make_buckets, make_data

from helpers.broken_workloads import MissingDivideTraining, SkippedStepTraining, ZeroedGradsTraining

STEPS = 3
# manual vs ddp: the same float operations in the same order on 2 ranks (sum then /2 is exact).
PARAM_ATOL = 1e-6
# Lightning runs the same DDP reducer and scales the loss by 1/accumulate_grad_batches itself;
# per-step losses must agree within this (observed: bitwise equal with torch 2.13 / PL 2.6.6).
LIGHTNING_LOSS_ATOL = 1e-5


@pytest.fixture(scope="module")
def pool():
    p = RankPool(PoolSpec("gloo", 2, "cpu"))
    yield p
    p.close()


def _run(pool, workload, steps=STEPS):
    return pool.run(train_steps, workload, steps, timeout_s=180)


def _broken_reduction(buckets, world_size):
    """What a gradient "reduction" without the all_reduce does: each rank keeps its own average."""
    for bucket in buckets:
        for p in bucket:
            p.grad.div_(1)


def _train_with_broken_reduction(ctx, workload, steps):
    original = loops.reduce_gradients
    loops.reduce_gradients = _broken_reduction
    try:
        return train_steps(ctx, workload, steps)
    finally:
        loops.reduce_gradients = original


@pytest.mark.parametrize("model,accum", [("mlp", 1), ("mlp", 4), ("lstm", 4)])
def test_manual_and_ddp_reach_the_same_parameters(pool, model, accum):
    kwargs = dict(batch_size=8, grad_accum=accum)
    manual = _run(pool, Training(model, "manual", **kwargs))
    ddp = _run(pool, Training(model, "ddp", **kwargs))
    # The ranks saw different data (different local losses), yet ended with identical weights.
    assert manual[0]["losses"] != manual[1]["losses"]
    torch.testing.assert_close(manual[0]["params"], manual[1]["params"], rtol=0, atol=0)
    for rank in range(2):
        torch.testing.assert_close(manual[rank]["params"], ddp[rank]["params"], rtol=0, atol=PARAM_ATOL)
        assert manual[rank]["losses"] == pytest.approx(ddp[rank]["losses"], abs=1e-6)
    if (model, accum) == ("mlp", 1):  # and training moved the weights (a no-op would also "agree")
        start = _run(pool, Training(model, "manual", **kwargs), steps=0)
        assert not torch.allclose(start[0]["params"], manual[0]["params"], atol=1e-4)


def test_parity_check_catches_a_broken_reduction(pool):
    """Negative control: skip the all_reduce and the same comparison fails."""
    workload = Training("mlp", "manual", batch_size=8, grad_accum=4)
    broken = pool.run(_train_with_broken_reduction, workload, STEPS, timeout_s=180)
    ddp = _run(pool, Training("mlp", "ddp", batch_size=8, grad_accum=4))
    for rank in range(2):
        assert not torch.allclose(broken[rank]["params"], ddp[rank]["params"], rtol=0, atol=PARAM_ATOL)
    assert not torch.allclose(broken[0]["params"], broken[1]["params"], rtol=0, atol=PARAM_ATOL)


def test_benchmark_check_fails_when_ranks_diverge(pool):
    """The workload's own check (run in every benchmark case) rejects diverged ranks."""
    from ddpbench.pool import TaskFailed

    workload = Training("mlp", "manual", batch_size=8)
    with pytest.raises(TaskFailed, match="gradient reduction is broken"):
        pool.run(_measure_with_broken_reduction, workload, timeout_s=180)


# The benchmark check's reference: one more optimizer step against a single-process float64 step
# on the gathered micro-batches of every rank (reduced gradient, parameters moved from their start).
@pytest.mark.parametrize("impl,model,accum", [("manual", "mlp", 4), ("ddp", "cnn", 1), ("ddp", "lstm", 4),
                                              ("manual", "lstm", 1)])
def test_benchmark_check_passes_the_real_loops(pool, impl, model, accum):
    workload = Training(model, impl, batch_size=8, grad_accum=accum)
    pool.run(measure_workload, workload, RoundPlan(warmup=0, rounds=2, numerics_steps=0), timeout_s=180)


def test_benchmark_check_passes_once_the_model_fits_its_data(pool):
    """100 steps fit the mlp's own few batches to a loss of ~1e-7; checked on those batches, float32
    rounding alone put the tiny gradient 6% off the float64 reference (and the cnn's on an H100
    after a default-length case). The check's step now trains on fresh batches."""
    workload = Training("mlp", "manual", batch_size=8, grad_accum=2)
    results = pool.run(measure_workload, workload, RoundPlan(warmup=0, rounds=100, numerics_steps=0), timeout_s=180)
    assert results[0].metrics["final_loss"] < 1e-4  # the model did fit its data


def test_the_reference_pools_the_elements_the_float32_step_picked(pool):
    """After 2 + 49 steps of the default cnn/ddp case (batch 32), one pooling window held two values
    within float32 rounding: the float64 reference picked the other and sent that window's gradient
    elsewhere, 0.6% off on the first convolution (make bench failed there 1 run in 8). The reference
    now follows the step's own routing."""
    workload = Training("cnn", "ddp", batch_size=32, grad_accum=1)  # as the benchmark builds it
    pool.run(measure_workload, workload, RoundPlan(warmup=2, rounds=49, numerics_steps=0), timeout_s=180)


def test_max_pool_routing_records_and_replays_the_picked_elements():
    import torch

    from ddpbench.workloads.training.step_check import _RoutedMaxPool, max_pool_routing

    model = torch.nn.Sequential(torch.nn.MaxPool2d(2), torch.nn.Flatten())
    x = torch.randn(3, 2, 4, 4)
    with max_pool_routing(model) as routes:
        expected = model(x)
        model(x[:1])  # a second micro-batch
    assert [len(calls) for calls in routes] == [2] and routes[0][0].shape == (3, 2, 2, 2)
    routed = _RoutedMaxPool(torch.cat(routes[0])[:3])
    x64 = x.double().requires_grad_()
    assert torch.equal(routed(x64).flatten(1).float(), expected)
    routed(x64).sum().backward()
    assert int(x64.grad.sum()) == 3 * 2 * 2 * 2  # one picked element per window
    # Outside the block the hooks are gone.
    model(x)
    assert [len(calls) for calls in routes] == [2]


CHECK_FAILS = "one optimizer step differs from a single-process float64 step on the {} gathered samples of that step"


@pytest.mark.parametrize("broken, samples, message", [
    (MissingDivideTraining, 32, r"the reduced gradient differs in 4 of 4 parameters .* the gradient is 2 x the "
                                r"reference's \(= the world size: a reduction that sums over the 2 ranks "
                                r"without dividing by the world size\)"),
    (ZeroedGradsTraining, 16, r"every gradient is zero after the step"),
    (SkippedStepTraining, 16, r"the parameters did not move in the optimizer step .*: the step was skipped"),
], ids=["missing-divide", "zeroed-grads", "skipped-step"])
def test_benchmark_check_catches_a_broken_loop(pool, broken, samples, message):
    # Every one of these keeps the ranks equal, which is all the old check compared.
    workload = broken("mlp", "manual", batch_size=8, grad_accum=2 if samples == 32 else 1)
    with pytest.raises(TaskFailed, match=r"manual/mlp on rank 0: " + CHECK_FAILS.format(samples) + ": " + message):
        pool.run(measure_workload, workload, RoundPlan(warmup=0, rounds=2, numerics_steps=0), timeout_s=180)


@pytest.mark.pool
def test_benchmark_check_at_world_size_1_catches_a_skipped_step():
    # At world size 1 the old check tested only that the loss was finite.
    single = RankPool(PoolSpec("gloo", 1, "cpu"))
    try:
        single.run(measure_workload, Training("mlp", "manual", batch_size=8),
                   RoundPlan(warmup=0, rounds=1, numerics_steps=0), timeout_s=180)
        with pytest.raises(TaskFailed, match=CHECK_FAILS.format(8) + ": the parameters did not move"):
            single.run(measure_workload, SkippedStepTraining("mlp", "manual", batch_size=8),
                       RoundPlan(warmup=0, rounds=1, numerics_steps=0), timeout_s=180)
    finally:
        single.close()


def _measure_with_broken_reduction(ctx, workload):
    original = loops.reduce_gradients
    loops.reduce_gradients = _broken_reduction
    try:
        return measure_workload(ctx, workload, RoundPlan(warmup=0, rounds=2, numerics_steps=0))
    finally:
        loops.reduce_gradients = original


def test_cpu_peak_memory_is_counted_by_the_memory_census(pool):
    results = pool.run(measure_workload, Training("mlp", "manual", batch_size=8),
                       RoundPlan(warmup=0, rounds=1, numerics_steps=0), timeout_s=180)
    param_bytes = sum(p.numel() * 4 for p in training.build_model("mlp").parameters())
    for measurement in results:
        memory = measurement.metrics["memory"]
        # parameters + gradients + momentum buffers are all live at the peak
        assert memory["peak_bytes"] >= 3 * param_bytes
        assert memory["at_peak"]["parameters"] == param_bytes
        assert measurement.metrics["optimizer_steps"] == 5  # the census's 2, the memory census's 2, 1 round


lightning_missing = lightning_unavailable_reason()


@pytest.mark.skipif(lightning_missing is not None, reason=lightning_missing or "")
@pytest.mark.parametrize("accum", [1, 4])
def test_lightning_follows_the_ddp_loss_trajectory(pool, accum):
    kwargs = dict(batch_size=8, grad_accum=accum)
    ddp = _run(pool, Training("mlp", "ddp", **kwargs))
    lit = _run(pool, Training("mlp", "lightning", **kwargs))
    for rank in range(2):
        assert len(lit[rank]["losses"]) == STEPS
        assert lit[rank]["losses"] == pytest.approx(ddp[rank]["losses"], abs=LIGHTNING_LOSS_ATOL)
        torch.testing.assert_close(lit[rank]["params"], ddp[rank]["params"], rtol=0, atol=1e-5)


@pytest.mark.skipif(lightning_missing is not None, reason=lightning_missing or "")
def test_benchmark_check_passes_lightning(pool):
    # The reference step reads the micro-batches Lightning's training_step received (it prefetches,
    # so the data cursor runs ahead) and the gradients it leaves until the next step's backward.
    workload = Training("mlp", "lightning", batch_size=8, grad_accum=4)
    pool.run(measure_workload, workload, RoundPlan(warmup=0, rounds=2, numerics_steps=0), timeout_s=180)


@pytest.mark.skipif(lightning_missing is not None, reason=lightning_missing or "")
def test_the_census_counts_lightnings_step_whole(pool):
    """Its Trainer steps on a thread of its own, under the round's dispatch modes: the census sees
    one all-reduce of every gradient a step, as for ``ddp``, and beside it only Lightning's own
    per-batch broadcast of its SIGTERM flag (one int64); no parameter broadcast, no barrier."""
    plan = RoundPlan(warmup=2, rounds=2, memory_census=False, numerics_steps=0)
    ranks = pool.run(measure_workload, Training("mlp", "lightning", batch_size=8), plan, timeout_s=180)
    census = combine_rank_metrics([r.metrics for r in ranks])["census"]
    gradients = 4 * sum(p.numel() for p in training.build_model("mlp").parameters())
    assert census.get("incomplete") is None and not census.get("other_ranks")
    assert [(e["kind"], e["dtype"], e["count"], e["bytes"]) for e in census["collectives"]] == [
        ("all_reduce", "float32", 1, gradients), ("broadcast", "int64", 1, 8)]
    assert census["ddp_buckets"] == [gradients]


def _lightning_attachment(ctx):
    """Train with Lightning; report what changed in the rank's process group and sockets."""
    import os

    import psutil
    import torch.distributed as dist

    def listeners():
        return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN}

    group_before, listen_before = dist.group.WORLD, listeners()
    env_before = {k: os.environ.get(k) for k in lightning.LIGHTNING_ENV_KEYS}
    train_steps(ctx, Training("mlp", "lightning", batch_size=8), 1)
    return {
        "same_group": dist.group.WORLD is group_before and dist.is_initialized(),
        "new_listeners": sorted(listeners() - listen_before),
        "env_restored": env_before == {k: os.environ.get(k) for k in lightning.LIGHTNING_ENV_KEYS},
    }


@pytest.mark.skipif(lightning_missing is not None, reason=lightning_missing or "")
def test_lightning_attaches_to_the_existing_group_without_listening(pool):
    for result in pool.run(_lightning_attachment, timeout_s=180):
        assert result["same_group"]
        assert result["new_listeners"] == []
        assert result["env_restored"]


def _lightning_thread_count(ctx):
    """Train with Lightning in a rank whose environment has no OMP_NUM_THREADS (a fresh process)."""
    import os

    import torch

    saved = os.environ.pop("OMP_NUM_THREADS", None)
    try:
        workload = Training("mlp", "lightning", batch_size=8)
        state = workload.setup(ctx)
        try:
            workload.run_round(state)
            trainer_threads = state["loop"].trainer_num_threads
        finally:
            workload.teardown(state)
        return {"rank_threads": torch.get_num_threads(), "trainer_threads": trainer_threads,
                "omp_env_after": os.environ.get("OMP_NUM_THREADS")}
    finally:
        if saved is not None:
            os.environ["OMP_NUM_THREADS"] = saved


@pytest.mark.pool
@pytest.mark.skipif(lightning_missing is not None, reason=lightning_missing or "")
def test_lightning_keeps_the_rank_intra_op_thread_count():
    """Lightning's launcher sets torch.set_num_threads(cpu_count // world_size) on the fit thread
    when OMP_NUM_THREADS is unset (and writes the variable). At world size 1 that is every core
    (here: > 1 when the machine has 2+ CPUs), which made the first Lightning case of a rank
    process ~40x slower on a busy 2-core machine; the trainer must run with the rank's count."""
    single = RankPool(PoolSpec("gloo", 1, "cpu"))
    try:
        (result,) = single.run(_lightning_thread_count, timeout_s=180)
    finally:
        single.close()
    assert result["trainer_threads"] == result["rank_threads"] == 1
    assert result["omp_env_after"] is None  # not leaked into the rank's environment


# ---- controller-side, no pool -----------------------------------------------------------------


def test_synthetic_data_is_deterministic_and_differs_per_rank():
    for model in ("cnn", "lstm"):
        x0, y0 = make_data(model, 4, 2, seed=3, rank=0)
        x0b, y0b = make_data(model, 4, 2, seed=3, rank=0)
        x1, _ = make_data(model, 4, 2, seed=3, rank=1)
        assert torch.equal(x0, x0b) and torch.equal(y0, y0b)
        assert not torch.equal(x0, x1)
    x, y = make_data("cnn", 4, 2, seed=0, rank=0)
    assert x.shape == (2, 4, 3, 32, 32) and y.shape == (2, 4) and int(y.max()) < 100
    x, y = make_data("lstm", 4, 2, seed=0, rank=0)
    assert x.shape == y.shape == (2, 4, training.SEQ_LEN) and torch.equal(x[..., 1:], y[..., :-1])


def test_buckets_respect_the_cap_and_cover_every_parameter():
    params = list(training.build_model("cnn").parameters())
    cap = 16 * 1024
    buckets = make_buckets(params, cap)
    assert sorted(map(id, (p for b in buckets for p in b))) == sorted(map(id, params))
    for bucket in buckets:
        assert len(bucket) == 1 or sum(p.numel() * 4 for p in bucket) <= cap
    assert buckets[0][0] is params[-1]  # reverse registration order, as DDP


@pytest.mark.parametrize("kwargs,message", [
    (dict(model="resnet", impl="ddp"), "unknown model 'resnet'"),
    (dict(model="mlp", impl="horovod"), "unknown training implementation 'horovod'"),
    (dict(model="mlp", impl="ddp", batch_size=0), "batch_size must be a positive integer"),
    (dict(model="mlp", impl="ddp", grad_accum=2.5), "grad_accum must be a positive integer"),
    (dict(model="mlp", impl="ddp", lr=0), "lr must be > 0"),
])
def test_bad_configuration_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Training(**kwargs)


def test_dataparallel_needs_a_cuda_pool(pool):
    from ddpbench.pool import TaskFailed

    with pytest.raises(TaskFailed, match="needs a CUDA pool of world size 1"):
        _run(pool, Training("mlp", "dataparallel"), steps=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loops_agree_and_pass_their_checks_on_cuda_with_two_ranks_sharing_a_gpu():
    """On CUDA with real cross-rank reduction on a single GPU (gloo with CUDA tensors): manual ==
    ddp (== lightning when installed) over 3 steps, every loop's benchmark check passes, and the
    broken-reduction control still fails the check."""
    registry = PoolRegistry()
    try:
        gpu_pool = registry.get(PoolSpec("gloo", 2, "cuda"))
        kwargs = dict(batch_size=8, grad_accum=2)
        manual = _run(gpu_pool, Training("mlp", "manual", **kwargs))
        impls = ["ddp"] + ([] if lightning_missing else ["lightning"])
        for impl in impls:
            other = _run(gpu_pool, Training("mlp", impl, **kwargs))
            for rank in range(2):
                # cuBLAS may sum in another order than the CPU: looser than PARAM_ATOL.
                torch.testing.assert_close(other[rank]["params"], manual[rank]["params"], rtol=0, atol=1e-5)
        assert manual[0]["losses"] != manual[1]["losses"]
        for impl in ["manual"] + impls:
            for model in ("mlp", "cnn", "lstm"):
                gpu_pool.run(measure_workload, Training(model, impl, batch_size=8, grad_accum=2),
                             RoundPlan(warmup=0, rounds=2, numerics_steps=0), timeout_s=180)
        with pytest.raises(TaskFailed, match="gradient reduction is broken"):
            gpu_pool.run(_measure_with_broken_reduction, Training("mlp", "manual", batch_size=8,
                                                                   ), timeout_s=180)
    finally:
        registry.close()
