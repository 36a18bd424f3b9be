"""Exposed communication: the engine's variant rounds (the step, its compute-only variant and its
collectives replayed alone, interleaved), the arithmetic behind compute_s / exposed_comm_s /
comm_isolated_s / comm_overlap_pct, and the compute-only variants themselves: they send nothing
(the profiler sees no collective) while recording what the real step sends, which the replay
issues. No timing is asserted: constructed numbers test the arithmetic, real runs the mechanics."""

from __future__ import annotations

import argparse
import json

import pytest

from ddpbench.engine.timing import STEP, CaseRounds, RoundPlan, measure_workload
from ddpbench.options import parse_exposed_comm
from ddpbench.pool import PoolSpec, RankPool
from ddpbench.workloads import COMMUNICATION_ONLY, COMPUTE_ONLY
from ddpbench.workloads.training import Training, TransformerTraining
from ddpbench.workloads.training.metrics import (add_exposed_communication, comm_overlap_pct,
                                                 exposed_communication)
from ddpbench.workloads.training.replay import CollectiveReplay, replay_calls

from helpers import rank_tasks

MS = 1e-3
COMPUTE = [100 * MS, 102 * MS, 98 * MS, 101 * MS, 99 * MS, 103 * MS, 97 * MS, 100 * MS]


def _times(gaps_ms, isolated_ms=None):
    times = {STEP: [c + g * MS for c, g in zip(COMPUTE, gaps_ms)], COMPUTE_ONLY: list(COMPUTE)}
    if isolated_ms is not None:
        times[COMMUNICATION_ONLY] = [t * MS for t in isolated_ms]
    return times


# -- the arithmetic -------------------------------------------------------------------------------

def test_nothing_exposed_gives_an_interval_holding_zero():
    # World size 1: the step and its compute-only variant differ by noise alone.
    info = exposed_communication(_times([0.4, -0.3, 0.1, -0.5, 0.2, -0.1, 0.3, -0.2], [0.1] * 8))
    low, high = info["exposed_comm_s_ci"]
    assert low <= 0 <= high
    assert info["compute_s"] == pytest.approx(100 * MS)
    assert info["compute_s_ci"][0] <= info["compute_s"] <= info["compute_s_ci"][1]
    assert info["variant_rounds"] == 8


def test_communication_serialised_after_backward_shows_as_exposed_with_compute_unchanged():
    # The planted change: every step waits ~5 ms more, the compute-only rounds are the same.
    info = exposed_communication(_times([5.1, 4.9, 5.0, 5.2, 4.8, 5.0, 5.1, 4.9], [20] * 8))
    low, high = info["exposed_comm_s_ci"]
    assert 0 < low <= 5 * MS <= high  # the negative control of the test above: 0 is outside
    assert info["exposed_comm_s"] == pytest.approx(5.0 * MS)
    assert info["compute_s"] == pytest.approx(100 * MS)
    assert info["comm_isolated_s"] == pytest.approx(20 * MS)
    assert info["comm_overlap_pct"] == pytest.approx(75.0)


def test_overlap_is_held_within_0_and_100_and_needs_communication():
    assert comm_overlap_pct(-1 * MS, 10 * MS) == 100.0  # noise put exposed below 0
    assert comm_overlap_pct(12 * MS, 10 * MS) == 0.0
    assert comm_overlap_pct(2.5 * MS, 10 * MS) == 75.0
    assert comm_overlap_pct(0.0, 0.0) is None


def test_what_the_arithmetic_needs():
    assert exposed_communication({STEP: [1.0]}) == {}  # no compute-only rounds: nothing to say
    assert "comm_isolated_s" not in exposed_communication(_times([1] * 8))  # no replay: no isolated time
    with pytest.raises(ValueError, match="differ in number \\(2 and 1\\)"):
        exposed_communication({STEP: [1.0, 2.0], COMPUTE_ONLY: [1.0]})
    assert add_exposed_communication({"variant_round_times": _times([1] * 8)})["exposed_comm_s"] == pytest.approx(MS)
    assert add_exposed_communication({"backend": "gloo"}) == {}


def test_the_option_reads_auto_off_or_a_count():
    assert parse_exposed_comm("auto") == "auto" and parse_exposed_comm("off") == 0 and parse_exposed_comm("8") == 8
    for bad in ("-1", "0x", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_exposed_comm(bad)


def test_the_option_overrides_the_cases_choice_and_off_turns_the_variants_off():
    from ddpbench.fixture import DistBenchmark

    class Benchmark:
        disabled, extra_info = False, {}

    def plan(setting, asked):
        bench = DistBenchmark(Benchmark(), None, PoolSpec("gloo", 2, "cpu"), RoundPlan(), 60.0, exposed_comm=setting)
        return bench._plan(None, None, asked).variant_rounds

    assert plan("auto", 8) == 8 and plan("auto", None) == 0
    assert plan(0, 8) == 0 and plan(3, None) == 3 and plan(3, 8) == 3
    with pytest.raises(ValueError, match=r"variant_rounds=-1\): give a whole number of rounds, 0 or more"):
        plan("auto", -1)


def test_which_workloads_have_variants():
    ddp = TransformerTraining(batch_size=2)
    variants = ddp.variants()
    assert set(variants) == {COMPUTE_ONLY, COMMUNICATION_ONLY}
    assert variants[COMPUTE_ONLY].compute_only and variants[COMPUTE_ONLY].case_id == "cpu-small-ddp-b2-compute-only"
    assert isinstance(variants[COMMUNICATION_ONLY], CollectiveReplay)
    assert variants[COMPUTE_ONLY].variants() == {}  # no variants of a variant
    assert TransformerTraining(comm_hook="powersgd").variants() == {}
    assert set(TransformerTraining(impl="fsdp2").variants()) == {COMPUTE_ONLY, COMMUNICATION_ONLY}
    assert set(Training("mlp", "manual").variants()) == {COMPUTE_ONLY, COMMUNICATION_ONLY}
    assert Training("mlp", "lightning").variants() == {}
    with pytest.raises(ValueError, match="PowerSGD's exchanges are interleaved"):
        TransformerTraining(comm_hook="powersgd", compute_only=True)
    with pytest.raises(ValueError, match="impl 'lightning' has no compute-only form"):
        Training("mlp", "lightning", compute_only=True)


def test_the_replay_refuses_what_it_cannot_issue():
    with pytest.raises(ValueError, match="cannot replay a 'broadcast'"):
        replay_calls([{"kind": "broadcast", "dtype": "float32", "group_size": 2, "call_bytes": [4]}], 2, "cpu")
    with pytest.raises(ValueError, match="all_reduce over 4 ranks: the replay uses the default group of 2"):
        replay_calls([{"kind": "all_reduce", "dtype": "float32", "group_size": 4, "call_bytes": [4]}], 2, "cpu")



@pytest.mark.parametrize("has_single", [True, False], ids=["torch-2.13", "torch-2.11"])
def test_the_replay_issues_the_single_tensor_collectives_this_torch_has(monkeypatch, has_single):
    # torch 2.11 and 2.12 lack all_gather_single / reduce_scatter_single: the replay (of every FSDP2
    # step's exposed communication) takes the same ops under their older names there.
    import torch.distributed as dist

    if not has_single:
        monkeypatch.delattr(dist, "all_gather_single", raising=False)
        monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    elif not hasattr(dist, "all_gather_single"):
        pytest.skip("this torch has no all_gather_single")
    record = [{"kind": kind, "dtype": "float32", "group_size": 2, "call_bytes": [64, 32]}
              for kind in ("all_gather", "reduce_scatter")]
    calls = replay_calls(record, 2, "cpu")
    expected = ([dist.all_gather_single] * 2 + [dist.reduce_scatter_single] * 2 if has_single else
                [dist.all_gather_into_tensor] * 2 + [dist.reduce_scatter_tensor] * 2)
    assert [call.func for call in calls] == expected
    assert [(call.args[0].numel(), call.args[1].numel()) for call in calls] == [(32, 16), (16, 8), (8, 16), (4, 8)]

# -- on ranks -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool():
    p = RankPool(PoolSpec("gloo", 2, "cpu"))
    yield p
    p.close()


def _in_steps(pool, workload, steps=2):
    return pool.run(rank_tasks.collectives_in_steps, workload, steps, timeout_s=300)



def _param_bytes():
    from ddpbench.workloads.training.gpt import build_gpt, gpt_config

    return sum(p.numel() * 4 for p in build_gpt(gpt_config("cpu-small")).parameters())


@pytest.mark.parametrize("workload, kinds", [
    (TransformerTraining(batch_size=2, measure_peak=False), {"all_reduce"}),
    (TransformerTraining(batch_size=2, comm_hook="fp16", measure_peak=False), {"all_reduce"}),
    (TransformerTraining(impl="fsdp2", batch_size=2, measure_peak=False), {"all_gather", "reduce_scatter"}),
    (Training("mlp", "manual", batch_size=8), {"all_reduce"}),
    (Training("mlp", "ddp", batch_size=8), {"all_reduce"}),
], ids=["ddp", "ddp-fp16", "fsdp2", "manual", "training-ddp"])
def test_a_compute_only_step_sends_nothing_and_records_what_the_step_sends(pool, workload, kinds):
    real = _in_steps(pool, workload)
    assert real[0]["collectives"], "the real step's collectives must show in the profiler (the control)"
    compute_only = workload.variants()[COMPUTE_ONLY]
    ranks = _in_steps(pool, compute_only)
    for rank in ranks:
        assert rank["collectives"] == {}, f"a compute-only step sent data: {rank['collectives']}"
        assert {entry["kind"] for entry in rank["skipped"]} == kinds  # the variant's exchanges ran
        assert all(entry["group_size"] == 2 and entry["call_bytes"] for entry in rank["skipped"])
    replay = _in_steps(pool, workload.variants()[COMMUNICATION_ONLY], steps=1)
    recorded = sum(len(entry["call_bytes"]) for entry in ranks[0]["skipped"])
    assert replay[0]["replay_calls"] == recorded
    assert sum(replay[0]["collectives"].values()) >= recorded  # the replay really sends them


def test_one_bucket_holding_every_gradient_is_one_all_reduce_after_backward(pool):
    # The planted serialisation: bucket_cap_mb=100 holds every gradient of cpu-small in one bucket,
    # reduced once the whole backward is done; bucket_cap_mb=1 splits them (the control).
    single = _in_steps(pool, TransformerTraining(batch_size=2, bucket_cap_mb=100, measure_peak=False,
                                                 compute_only=True))[0]["skipped"]
    split = _in_steps(pool, TransformerTraining(batch_size=2, bucket_cap_mb=1, measure_peak=False,
                                                compute_only=True))[0]["skipped"]
    total = _param_bytes()
    assert single == [{"kind": "all_reduce", "dtype": "float32", "group_size": 2, "call_bytes": [total]}]
    assert len(split[0]["call_bytes"]) > 1 and sum(split[0]["call_bytes"]) == total


def test_the_engine_interleaves_the_variants_after_the_recorded_rounds(pool):
    workload = rank_tasks.LoggedRounds("step", ("compute_only", "communication_only"))
    ranks = pool.run(measure_workload, workload, RoundPlan(warmup=1, rounds=2, variant_rounds=3), timeout_s=60)
    log = ranks[0].metrics["round_log"]
    assert log == ["step", "step", "step", "step", "step", "step", "step",  # warm-up, the census's 2 ops, the
                   # memory census's 2 steps and the recorded rounds
                   "compute_only", "communication_only",  # one warm-up round each
                   "step", "compute_only", "communication_only",  # round groups, rotated by one
                   "compute_only", "communication_only", "step",
                   "communication_only", "step", "compute_only",
                   "teardown compute_only", "teardown communication_only"]
    rounds = CaseRounds.of(ranks)
    assert len(rounds.round_times) == 2
    assert {name: len(times) for name, times in rounds.variant_times.items()} == {
        "step": 3, "compute_only": 3, "communication_only": 3}
    assert "engine_variants_s" in ranks[0].metrics
    # The control: no variant rounds asked for, none run.
    plain = pool.run(measure_workload, workload, RoundPlan(warmup=1, rounds=2), timeout_s=60)
    assert plain[0].metrics["round_log"] == ["step"] * 7 and CaseRounds.of(plain).variant_times is None


ONE_RANK = """
import pytest
from ddpbench.pool import PoolSpec
from ddpbench.workloads.training import TransformerTraining
from ddpbench.workloads.training.metrics import add_exposed_communication

@pytest.mark.parametrize("dist_spec", [PoolSpec("gloo", 1, "cpu")], ids=["gloo-1p"])
def test_one_rank(dist_benchmark):
    result = dist_benchmark(TransformerTraining(batch_size=2, measure_peak=False), variant_rounds=3)
    dist_benchmark.extra_info.update(add_exposed_communication(result.extra_info))
"""


@pytest.mark.exposed_comm
def test_a_one_rank_transformer_case_records_its_exposed_communication(pytester):
    pytester.makepyfile(test_one=ONE_RANK)
    result = pytester.runpytest_subprocess("--dist-rounds=2", "--dist-warmup=1", "--benchmark-json=out.json",
                                           "-p", "no:cacheprovider", "-q", timeout=300)
    result.assert_outcomes(passed=1)
    info = json.loads((pytester.path / "out.json").read_text())["benchmarks"][0]["extra_info"]
    assert info["world_size"] == 1
    assert {len(times) for times in info["variant_round_times"].values()} == {3}
    for key in ("compute_s", "exposed_comm_s", "comm_isolated_s", "comm_overlap_pct"):
        assert key in info, key
    low, high = info["exposed_comm_s_ci"]
    assert low <= info["exposed_comm_s"] <= high
