"""The collective census through the engine, on a real 2-rank gloo pool: one untimed round after
warm-up on every rank, rank 0's record in the case's metrics (``extra_info["census"]``), ranks that
disagree flagged, DDP's buckets from the training workloads, the A/B baseline's own census, and the
pytest option that turns it off. The census module alone: tests/engine/test_census_module.py."""

from __future__ import annotations

import functools
import json

import pytest

import ddpbench
from ddpbench.engine.timing import CaseRounds, RoundPlan, combine_rank_metrics, measure_workload
from ddpbench.gates.ab.pairs_loop import ABSettings, run_case
from ddpbench.gates.structure import compare_census
from ddpbench.pool import PoolRegistry, PoolSpec
from ddpbench.workloads.collectives import Collective
from ddpbench.workloads.training import Training
from ddpbench.workloads.training.transformer import TransformerTraining

from helpers.extra_collective import ExtraCollective

MB = 1 << 20
PLAN = RoundPlan(warmup=2, rounds=2)


@pytest.fixture(scope="module")
def registry():
    registry = PoolRegistry()
    yield registry
    registry.close()


@pytest.fixture(scope="module")
def pool(registry):
    return registry.get(PoolSpec("gloo", 2, "cpu"))


def census_of(pool, workload, plan=PLAN):
    rounds = CaseRounds.of(pool.run(measure_workload, workload, plan, timeout_s=120))
    return combine_rank_metrics(rounds.rank_metrics).get("census"), rounds.rank_metrics


def entries(census):
    return {(c["kind"], c["dtype"], c["group_size"]): c for c in census["collectives"]}


# ---- users' own workloads: a planted extra all_reduce -------------------------------------------

def grads_setup(ctx, extra_elements=0):
    import torch

    return {"grads": [torch.ones(1000), torch.ones(3000)], "extra": torch.ones(extra_elements)}


def grads_round(state, planted=False):
    import torch.distributed as dist

    for g in state["grads"]:
        dist.all_reduce(g)
    if planted:
        dist.all_reduce(state["extra"])


def test_a_planted_all_reduce_per_step_moves_the_count_by_one_and_the_bytes_by_its_size(pool):
    plain, _ = census_of(pool, ddpbench.FunctionWorkload(functools.partial(grads_setup, extra_elements=777),
                                                         grads_round))
    planted, _ = census_of(pool, ddpbench.FunctionWorkload(functools.partial(grads_setup, extra_elements=777),
                                                           functools.partial(grads_round, planted=True)))
    key = ("all_reduce", "float32", 2)
    assert entries(planted)[key]["count"] == entries(plain)[key]["count"] + 1 == 3
    assert entries(planted)[key]["bytes"] == entries(plain)[key]["bytes"] + 777 * 4
    assert entries(plain)[key]["call_bytes"] == [4000, 12000]
    assert "ranks_disagree" not in plain and "ranks_disagree" not in planted
    assert plain["graph_breaks"] is None and plain["recompiles"] is None
    assert plain["cuda_kernel_launches"] is None and plain["ddp_buckets"] is None
    # the records are what the structural verdict reads: the planted call is a regression
    assert compare_census(plain, planted).verdict == "regression"
    assert compare_census(plain, plain).verdict == "same"


def test_figures_are_per_op_when_a_round_runs_several(pool):
    census, _ = census_of(pool, ddpbench.FunctionWorkload(grads_setup, grads_round),
                          RoundPlan(warmup=1, rounds=2, ops_per_round=3))
    assert census["ops_per_round"] == 3
    assert entries(census)[("all_reduce", "float32", 2)]["call_bytes"] == [4000, 12000]


# ---- the built-in collectives ---------------------------------------------------------------------

@pytest.mark.parametrize("workload,kind", [
    (Collective("all_reduce", MB), "all_reduce"),
    (Collective("all_gather", MB), "all_gather"),  # its output: the full vector
    (Collective("reduce_scatter", MB), "reduce_scatter"),  # its input: the full vector
    (Collective("broadcast", MB), "broadcast"),
    (ExtraCollective("all_to_all", MB), "all_to_all"),
])
def test_a_collective_case_issues_one_call_of_its_size_per_op(pool, workload, kind):
    census, _ = census_of(pool, workload)
    assert census["collectives"] == [{"kind": kind, "dtype": "float32", "group_size": 2, "group": "world",
                                      "peer": None, "count": 1, "bytes": MB, "call_bytes": [MB],
                                      "data_dependent_bytes": None}]
    assert census["version"] == 2 and census["rounds_counted"] == 1 and census["ops_per_round"] == 1
    assert census["ops_counted"] == 2 and census["sequence_checked"] is True and "incomplete" not in census


# ---- ranks that issue different collectives ---------------------------------------------------

def own_group_setup(ctx):
    import torch
    import torch.distributed as dist

    groups = [dist.new_group([r]) for r in range(ctx.world_size)]  # every rank creates every group
    return {"rank": ctx.rank, "group": groups[ctx.rank], "t": torch.ones(8)}


def rank1_extra_round(state):
    """Rank 1 alone all_reduces within its own one-rank group: no rank waits on another."""
    import torch.distributed as dist

    if state["rank"] == 1:
        dist.all_reduce(state["t"], group=state["group"])


def rank1_twice_round(state):
    rank1_extra_round(state)
    rank1_extra_round(state)


def test_ranks_that_issue_different_collectives_are_kept_and_compared_rank_by_rank(pool):
    census, per_rank = census_of(pool, ddpbench.FunctionWorkload(own_group_setup, rank1_extra_round))
    assert census["ranks_disagree"] is True and census["ranks_counted"] == 2
    assert census["collectives"] == []  # rank 0's own record...
    assert entries(per_rank[1]["census"])[("all_reduce", "float32", 1)]["count"] == 1
    (rank1,) = census["other_ranks"]  # ... and rank 1's, where it differs
    assert rank1["ranks"] == "1" and rank1["fields"]["collectives"] == per_rank[1]["census"]["collectives"]
    # Rank 1 alone issues one more: the ranks disagree on both sides, and rank 1's change is judged.
    twice, _ = census_of(pool, ddpbench.FunctionWorkload(own_group_setup, rank1_twice_round))
    verdict = compare_census(json.loads(json.dumps(census)), json.loads(json.dumps(twice)))
    assert verdict.verdict == "regression" and verdict.line == "rank 1: all_reduce float32 in ranks 1 (a group of 1): 1 → 2 per " \
                                                              "step, +32 B"


# ---- DDP training: its buckets are its all_reduce calls -----------------------------------------

@pytest.mark.parametrize("warmup", [2, 1], ids=["rebuilt-before", "rebuilt-in-the-census-round"])
def test_a_ddp_training_case_s_buckets_are_its_all_reduce_calls(pool, warmup):
    """DDP rebuilds its buckets in its second step; its logging data shows them a step later, so
    with one warm-up round the sizes come from the reducer's buckets themselves."""
    census, _ = census_of(pool, Training("mlp", "ddp", bucket_cap_mb=0.05),
                          RoundPlan(warmup=warmup, rounds=1))
    all_reduce = entries(census)[("all_reduce", "float32", 2)]
    assert census["ddp_buckets"] is not None and len(census["ddp_buckets"]) > 1
    assert (all_reduce["count"], all_reduce["bytes"]) == (len(census["ddp_buckets"]), sum(census["ddp_buckets"]))
    if warmup == 2:  # after the rebuild (whose bucket order DDP broadcasts once) only all_reduces
        assert [c["kind"] for c in census["collectives"]] == ["all_reduce"]
        assert sorted(census["ddp_buckets"]) == all_reduce["call_bytes"]
    else:  # the census's first op is the rebuild step, its second a steady one: not judged
        first_op = census["varies_between_steps"].split("; ")[0]
        assert first_op.startswith("op 1 of 2: ") and "broadcast" in first_op


@pytest.mark.parametrize("knobs", [dict(bucket_cap_mb=1), dict(bucket_cap_mb=1, comm_hook="fp16")],
                         ids=["fp32", "fp16-hook"])
def test_a_transformer_ddp_case_s_buckets_are_its_all_reduce_calls(pool, knobs):
    census, _ = census_of(pool, TransformerTraining(batch_size=2, measure_peak=False, **knobs))
    buckets = census["ddp_buckets"]
    assert buckets is not None and len(buckets) > 1
    if knobs.get("comm_hook") == "fp16":  # the hook sends each bucket compressed to half its bytes
        assert entries(census)[("all_reduce", "float16", 2)]["call_bytes"] == sorted(b // 2 for b in buckets)
    else:
        assert entries(census)[("all_reduce", "float32", 2)]["call_bytes"] == sorted(buckets)


def test_a_transformer_fsdp2_case_gathers_and_scatters_and_has_no_buckets(pool):
    workload = TransformerTraining(batch_size=2, measure_peak=False, impl="fsdp2")
    census, per_rank = census_of(pool, workload)
    kinds = {c["kind"] for c in census["collectives"]}
    assert {"all_gather", "reduce_scatter"} <= kinds and census["ddp_buckets"] is None
    assert "ranks_disagree" not in census
    # every parameter is gathered (forward, and again in backward after resharding) and every
    # gradient reduce-scattered once: the scattered inputs are the whole model's float32 bytes
    param_bytes = per_rank[0]["param_bytes"]
    assert entries(census)[("reduce_scatter", "float32", 2)]["bytes"] >= param_bytes


def test_the_manual_training_loop_has_no_ddp_buckets_but_its_all_reduces_are_counted(pool):
    census, _ = census_of(pool, Training("mlp", "manual", bucket_cap_mb=0.05))
    assert census["ddp_buckets"] is None
    assert entries(census)[("all_reduce", "float32", 2)]["count"] >= 1


# ---- torch.compile: graph breaks and recompiles ---------------------------------------------------

def _compiled_step(x):
    import torch
    import torch.distributed as dist

    y = torch.relu(x) * 2
    print("", end="")  # a graph break
    dist.all_reduce(y)
    return y + 1


def compiled_setup(ctx):
    import torch

    return {"fn": torch.compile(_compiled_step, backend="eager"), "x": torch.ones(16)}


def compiled_round(state):
    state["fn"](state["x"])


def test_a_compiled_case_counts_its_graph_breaks_and_no_recompile(pool):
    census, _ = census_of(pool, ddpbench.FunctionWorkload(compiled_setup, compiled_round))
    assert census["graph_breaks"] >= 1 and census["recompiles"] == 0
    assert entries(census)[("all_reduce", "float32", 2)]["count"] == 1


# ---- A/B: each side's engine takes its own census -----------------------------------------------

def test_ab_carries_the_baseline_side_s_census(registry):
    spec = PoolSpec("gloo", 2, "cpu")
    pools = {"baseline": [registry.get(spec, None, 1)], "candidate": [registry.get(spec, None, 0)]}
    settings = ABSettings(block_time_s=0.005, max_time_s=1.0, pools_per_side=1, first_pairs=2, more_pairs=2, max_pairs=2,
                          min_block_rounds=2, max_block_rounds=3)
    workload = ddpbench.FunctionWorkload(grads_setup, grads_round)
    outcome = run_case(pools, workload, RoundPlan(warmup=1), settings, 120, "census-ab")
    summary = outcome.summary({})
    candidate = combine_rank_metrics(outcome.candidate_metrics)["census"]
    assert summary["census_baseline"] == candidate
    assert entries(candidate)[("all_reduce", "float32", 2)]["count"] == 2
    # negative control: sides that take no census (as an engine that predates it) carry none
    outcome = run_case(pools, workload, RoundPlan(warmup=1, census=False), settings, 120, "census-ab-off")
    assert "census_baseline" not in outcome.summary({})
    assert "census" not in combine_rank_metrics(outcome.candidate_metrics)


# ---- the pytest option ----------------------------------------------------------------------------

BENCH = '''
import torch
import torch.distributed as dist

import ddpbench


def setup(ctx):
    return torch.ones(256)


def one_all_reduce(t):
    dist.all_reduce(t)


def test_user_step(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, one_all_reduce), rounds=2, warmup=1)
'''


def test_the_census_is_in_extra_info_and_none_turns_it_off(pytester):
    pytester.makepyfile(test_bench=BENCH)
    for flag, name in (("collectives", "on.json"), ("none", "off.json")):
        result = pytester.runpytest_subprocess(f"--dist-census={flag}", f"--benchmark-json={name}",
                                               "-p", "no:cacheprovider", timeout=300)
        assert result.ret == 0, result.stdout.str()
    (on,) = json.loads((pytester.path / "on.json").read_text())["benchmarks"]
    (off,) = json.loads((pytester.path / "off.json").read_text())["benchmarks"]
    assert on["extra_info"]["census"]["collectives"] == [
        {"kind": "all_reduce", "dtype": "float32", "group_size": 2, "group": "world", "peer": None, "count": 1,
         "bytes": 1024, "call_bytes": [1024], "data_dependent_bytes": None}]
    assert "engine_census_s" in on["extra_info"]
    assert "census" not in off["extra_info"] and "engine_census_s" not in off["extra_info"]
    result = pytester.runpytest_subprocess("--dist-census=maybe", "-p", "no:cacheprovider", timeout=120)
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--dist-census*'maybe': name the censuses to take, collectives and memory*"])


def test_a_powersgd_case_s_census_is_marked_incomplete_so_no_gate_judges_it(pool):
    # PowerSGD's later all_reduces run from future callbacks, on gloo's threads: a count that varies.
    from ddpbench.gates.structure import compare_census

    census, _ = census_of(pool, TransformerTraining(batch_size=2, measure_peak=False, comm_hook="powersgd"))
    assert "future callbacks" in census["incomplete"]
    fewer = dict(census, collectives=[])
    assert compare_census(fewer, census).verdict == "not counted"


# ---- collectives on a workload's own threads, and what the census cannot see ----------------------

def thread_setup(ctx, extra_elements=0, worker=False):
    """1 MB to all_reduce (and a planted extra); with ``worker``, a thread started here, at set-up,
    that all_reduces whatever the round hands it: it runs outside the census's sight."""
    import queue
    import threading

    import torch
    import torch.distributed as dist

    state = {"grad": torch.ones(MB // 4), "extra": torch.ones(extra_elements), "worker": None}
    if worker:
        jobs, done = queue.Queue(), queue.Queue()

        def serve():
            while (tensor := jobs.get()) is not None:
                dist.all_reduce(tensor)
                done.put(True)

        state["worker"] = (threading.Thread(target=serve, daemon=True), jobs, done)
        state["worker"][0].start()
    return state


def all_reduce_on_a_thread(state):
    """The round's collectives run on another thread: one the round starts, or the set-up's worker."""
    import threading

    import torch.distributed as dist

    tensors = [state["grad"]] + ([state["extra"]] if state["extra"].numel() else [])
    if state["worker"] is not None:
        _, jobs, done = state["worker"]
        for tensor in tensors:
            jobs.put(tensor)
            done.get()
        return
    thread = threading.Thread(target=lambda: [dist.all_reduce(t) for t in tensors])
    thread.start()
    thread.join()


def stop_worker(state):
    if state["worker"] is not None:
        state["worker"][1].put(None)
        state["worker"][0].join()


def direct_backend_all_reduce(state):
    import torch
    import torch.distributed as dist

    dist.all_reduce(state["grad"])
    dist.group.WORLD._get_backend(torch.device("cpu")).allreduce([state["extra"]]).wait()


def test_a_thread_the_step_starts_is_counted_and_one_out_of_sight_makes_the_census_incomplete(pool):
    def workload(**knobs):
        return ddpbench.FunctionWorkload(functools.partial(thread_setup, **knobs), all_reduce_on_a_thread,
                                         teardown=stop_worker)

    # A baseline all_reducing 1 MB on a thread the step starts, a candidate adding 4 KB there
    # (b862717 counted neither and read `same`): both counted, the 4 KB a regression.
    base, _ = census_of(pool, workload())
    cand, _ = census_of(pool, workload(extra_elements=1024))
    assert compare_census(base, cand).verdict == "regression"
    assert entries(base)[("all_reduce", "float32", 2)]["call_bytes"] == [MB]
    assert entries(cand)[("all_reduce", "float32", 2)]["call_bytes"] == [4096, MB]
    assert "incomplete" not in base and base["sequence_checked"] is True
    # A worker thread started at set-up, before the census: not counted, but the process group's
    # sequence number moved, so the census is incomplete (the two ops counted: 2 and 4 calls).
    base, _ = census_of(pool, workload(worker=True))
    cand, _ = census_of(pool, workload(worker=True, extra_elements=1024))
    assert compare_census(base, cand).verdict == "not counted"
    assert base["collectives"] == []
    assert "process group world's sequence number moved 2 in the counted ops where the census counted 0" \
        in base["incomplete"]
    assert "moved 4 in the counted ops where the census counted 0" in cand["incomplete"]
    # A call straight to the backend (no dispatch) is unseen too; the dispatched one is counted.
    direct, _ = census_of(pool, ddpbench.FunctionWorkload(functools.partial(thread_setup, extra_elements=16),
                                                          direct_backend_all_reduce))
    assert entries(direct)[("all_reduce", "float32", 2)]["count"] == 1
    assert "moved 4 in the counted ops where the census counted 2" in direct["incomplete"]


def every_other_step_setup(ctx):
    import torch

    return {"step": 0, "t": torch.ones(256)}


def all_reduce_every_other_step(state):
    import torch.distributed as dist

    state["step"] += 1
    if state["step"] % 2:
        dist.all_reduce(state["t"])


def all_reduce_twice_every_other_step(state):
    import torch.distributed as dist

    state["step"] += 1
    if state["step"] % 2:
        dist.all_reduce(state["t"])
        dist.all_reduce(state["t"])


@pytest.mark.parametrize("ops_per_round", [1, 3])
def test_a_step_with_a_collective_every_other_step_is_marked_as_varying_and_compared_step_by_step(
        pool, ops_per_round):
    plan = RoundPlan(warmup=1, rounds=2, ops_per_round=ops_per_round)
    census, _ = census_of(pool, ddpbench.FunctionWorkload(every_other_step_setup, all_reduce_every_other_step), plan)
    assert census["ops_counted"] == max(ops_per_round, 2) == len(census["steps"])
    assert "op 1 of" in census["varies_between_steps"] and "none" in census["varies_between_steps"]
    assert compare_census(census, census).verdict == "same"  # each step's profile, compared
    # gradient accumulation whose sync step all_reduces once more: it read `not counted`, exit 0
    twice, _ = census_of(pool, ddpbench.FunctionWorkload(every_other_step_setup, all_reduce_twice_every_other_step),
                         plan)
    verdict = compare_census(census, twice)
    assert verdict.verdict == "regression" and verdict.line.endswith("all_reduce float32 in a group of 2: 1 → 2 per step, +1.0 KiB")
