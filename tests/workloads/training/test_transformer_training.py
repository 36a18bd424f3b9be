"""The transformer training workload: every implementation and knob passes its float64 check on a
2-rank gloo pool, planted bugs fail it, and the case ids / validation / skip reasons read as
documented. Small on purpose: the cpu-small model with 2 sequences per micro-batch, 2 rounds."""

from __future__ import annotations

import pytest

from ddpbench.engine.timing import RoundPlan, measure_workload
from ddpbench.pool import PoolSpec, RankPool, TaskFailed
from ddpbench.workloads.training.transformer import TransformerTraining, gradient_rtol

from helpers.broken_workloads import DroppedBucketTransformer, SummingFSDPTransformer, SummingHookTransformer

# Not about the numerics replay (tests/engine/test_numerics.py is): none, two set-ups and four steps less.
PLAN = RoundPlan(warmup=0, rounds=2, numerics_steps=0)


@pytest.fixture(scope="module")
def pool():
    p = RankPool(PoolSpec("gloo", 2, "cpu"))
    yield p
    p.close()


def _measure(pool, workload):
    return pool.run(measure_workload, workload, PLAN, timeout_s=300)


@pytest.mark.parametrize("knobs", [
    dict(),
    dict(bucket_cap_mb=1, find_unused_parameters=True),
    dict(gradient_as_bucket_view=True, static_graph=True),
    dict(gradient_as_bucket_view=True, grad_accum=2),
    dict(comm_hook="fp16"),
    dict(comm_hook="powersgd"),
    dict(precision="bf16", activation_checkpointing=True),
    dict(impl="fsdp2"),
    dict(impl="fsdp2", reshard_after_forward=False, grad_accum=2, activation_checkpointing=True),
    dict(impl="fsdp2", precision="bf16"),
], ids=lambda knobs: TransformerTraining(batch_size=2, measure_peak=False, **knobs).case_id)
def test_every_impl_and_knob_passes_its_check(pool, knobs):
    workload = TransformerTraining(batch_size=2, measure_peak=False, **knobs)
    results = _measure(pool, workload)
    metrics = results[0].metrics
    assert metrics["optimizer_steps"] >= 2 and metrics["final_loss"] > 0
    if workload.impl == "fsdp2":
        assert metrics["sharded_param_bytes"] == metrics["param_bytes"] // 2
    else:
        assert metrics["sharded_param_bytes"] == metrics["param_bytes"]
    memory = metrics["memory"]  # the memory census: FSDP2's own tracker for a sharded model
    assert memory["method"] == ("FSDPMemTracker" if workload.impl == "fsdp2" else "MemTracker")
    assert memory["peak_bytes"] > metrics["sharded_param_bytes"]


CHECK = (r"transformer cpu-small-ddp-{}b2 on rank 0: the averaged gradients of one optimizer step differ "
         r"from a single-process float64 step on the 4 gathered sequences of that step: ")


def test_a_hook_that_sums_without_dividing_fails_the_check(pool):
    with pytest.raises(TaskFailed, match=CHECK.format("") + r"\d+ of \d+ parameters off \(worst .*: off by 1 of its "
                       r"norm.*the gradient is 2 x the reference's \(= the world size"):
        _measure(pool, SummingHookTransformer(batch_size=2, measure_peak=False))


def test_a_dropped_bucket_fails_the_check(pool):
    # bucket_cap_mb=1: several buckets, the first (the last parameters) never reduced.
    with pytest.raises(TaskFailed, match=CHECK.format("cap1-") + r"\d+ of \d+ parameters off \(worst "):
        _measure(pool, DroppedBucketTransformer(batch_size=2, bucket_cap_mb=1, measure_peak=False))


def test_fsdp2_reducing_with_a_sum_fails_the_check(pool):
    # Gradient divide factor 1: FSDP2's reduce-scatter sums over the ranks instead of averaging.
    with pytest.raises(TaskFailed, match=r"transformer cpu-small-fsdp2-b2 on rank 0: the averaged gradients .* "
                       r"the gradient is 2 x the reference's \(= the world size"):
        _measure(pool, SummingFSDPTransformer(impl="fsdp2", batch_size=2, measure_peak=False))


def test_tolerances_follow_precision_and_hook():
    assert gradient_rtol("fp32", "none", "cpu") == (1e-3, 1e-3)
    assert gradient_rtol("fp32", "none", "cuda") == (1e-2, 1e-2)
    assert gradient_rtol("bf16", "none", "cpu") == (0.25, 5e-2)
    assert gradient_rtol("bf16", "none", "cuda") == (0.25, 1e-1)
    assert gradient_rtol("fp32", "fp16", "cpu") == pytest.approx((1e-3 + 8 * 2**-11,) * 2)
    assert gradient_rtol("fp32", "bf16", "cuda") == pytest.approx((1e-2 + 8 * 2**-8,) * 2)


def test_gradient_comparison_per_parameter_and_whole():
    import torch

    from ddpbench.workloads.training.transformer import compare_gradients

    ref = [torch.ones(100, dtype=torch.float64), torch.ones(1, dtype=torch.float64)]
    small_off = [ref[0] * 1.01, ref[1] * 1.2]  # 20% on the small parameter, ~1% overall
    assert compare_gradients(["w", "b"], small_off, ref, 0.25, 2, 0.05) == []
    assert compare_gradients(["w", "b"], small_off, ref, 1e-3, 2)[0].startswith("2 of 2 parameters off (worst b: off by 0.2")
    spread = [ref[0] * 1.1, ref[1]]  # each within 0.25, the whole 10% off
    assert compare_gradients(["w", "b"], spread, ref, 0.25, 2, 0.05)[0].startswith("the whole gradient is off by 0.0995")
    doubled = [r * 2 for r in ref]
    assert "= the world size" in compare_gradients(["w", "b"], doubled, ref, 0.25, 2, 0.05)[0]


@pytest.mark.parametrize("knobs, case_id", [
    (dict(), "cpu-small-ddp"),
    (dict(bucket_cap_mb=1), "cpu-small-ddp-cap1"),
    (dict(gradient_as_bucket_view=True, static_graph=True), "cpu-small-ddp-gbv-static"),
    (dict(comm_hook="powersgd", grad_accum=2), "cpu-small-ddp-hook-powersgd-accum2"),
    (dict(precision="bf16", activation_checkpointing=True, compile=True), "cpu-small-ddp-bf16-ckpt-compiled"),
    (dict(impl="fsdp2", reshard_after_forward=False), "cpu-small-fsdp2-noreshard"),
    (dict(size="gpt2-124m", impl="fsdp2", precision="bf16", batch_size=4), "gpt2-124m-fsdp2-bf16-b4"),
])
def test_case_ids_name_each_knob(knobs, case_id):
    assert TransformerTraining(**knobs).case_id == case_id


@pytest.mark.parametrize("knobs, message", [
    (dict(impl="fsdp"), "unknown transformer implementation 'fsdp'"),
    (dict(size="tiny"), "unknown GPT size 'tiny'"),
    (dict(precision="fp16"), "unknown precision 'fp16'"),
    (dict(comm_hook="int8"), "unknown comm_hook 'int8'"),
    (dict(impl="fsdp2", bucket_cap_mb=1), "bucket_cap_mb: DDP knobs, not FSDP2's"),
    (dict(reshard_after_forward=False), "reshard_after_forward is an FSDP2 knob"),
    (dict(grad_accum=0), "grad_accum must be a positive integer"),
])
def test_bad_configurations_are_rejected(knobs, message):
    with pytest.raises(ValueError, match=message):
        TransformerTraining(**knobs)


def test_skip_reasons():
    gloo, nccl = PoolSpec("gloo", 2, "cpu"), PoolSpec("nccl", 2, "cuda")
    assert "needs NCCL" in TransformerTraining(comm_hook="bf16").skip_reason(gloo)
    assert TransformerTraining(comm_hook="bf16").skip_reason(nccl) is None
    assert "static_graph" in TransformerTraining(static_graph=True, grad_accum=2).skip_reason(gloo)
    assert TransformerTraining().skip_reason(gloo) is None


def test_compile_skip_reason_names_the_failure(monkeypatch):
    import torch

    from ddpbench.workloads.training import transformer

    def broken(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    transformer.compile_unavailable_reason.cache_clear()
    monkeypatch.setattr(torch, "compile", broken)
    try:
        reason = TransformerTraining(compile=True).skip_reason(PoolSpec("gloo", 2, "cpu"))
    finally:
        transformer.compile_unavailable_reason.cache_clear()
    assert reason == ("torch.compile cannot build on this machine: RuntimeError: InvalidCxxCompiler: "
                      "No working C++ compiler found")


def test_workload_is_picklable():
    import pickle

    workload = TransformerTraining(impl="fsdp2", precision="bf16")
    assert pickle.loads(pickle.dumps(workload)) == workload


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["ddp", "fsdp2"])
def test_compiled_cases_pass_their_check(pool, impl):
    """torch.compile (inductor, a C++ build on the CPU: minutes on 2 cores, hence slow)."""
    workload = TransformerTraining(impl=impl, compile=True, batch_size=2, measure_peak=False)
    reason = workload.skip_reason(PoolSpec("gloo", 2, "cpu"))
    if reason:
        pytest.skip(reason)
    _measure(pool, workload)
