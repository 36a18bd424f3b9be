"""Collective workloads: nccl-tests bandwidth formulas and result checking in real ranks, with the
check's negative controls (tests/helpers/broken_workloads.py): a wrong shard and ops that write nothing."""

import pytest
import torch

from ddpbench.pool import PoolRegistry, PoolSpec, TaskFailed
from ddpbench.engine.timing import RoundPlan, measure_workload
from ddpbench.workloads.collectives import (OPS, PATTERN_PERIODS, Collective, bandwidths_gbps,
                                            bus_bandwidth_factor, element_count, fill_pattern,
                                            pattern_tables, summed_tables)

from helpers.broken_workloads import NoOpCollective, WrongShardReduceScatter


@pytest.mark.parametrize("op,n,factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 6, 10 / 6), ("all_reduce", 1, 0.0),
    ("all_gather", 2, 0.5), ("all_gather", 4, 0.75), ("reduce_scatter", 6, 5 / 6),
    ("broadcast", 2, 1.0), ("broadcast", 6, 1.0),
])
def test_busbw_factors_match_nccl_tests(op, n, factor):
    assert bus_bandwidth_factor(op, n) == pytest.approx(factor)


def test_bandwidths_are_bytes_per_second_in_units_of_1e9():
    algbw, busbw = bandwidths_gbps("all_reduce", 10**9, 4, 2.0)
    assert algbw == pytest.approx(0.5) and busbw == pytest.approx(0.75)


def test_unknown_op_is_rejected_in_the_controller():
    with pytest.raises(ValueError, match="unknown collective 'scatter_everywhere'"):
        Collective("scatter_everywhere", 1024)


def test_gather_and_scatter_sizes_divide_by_the_world_size():
    assert element_count("all_gather", 1000 * 4, 3) == 999
    assert element_count("reduce_scatter", 4, 2) == 2
    assert element_count("all_reduce", 1000 * 4 + 3, 3) == 1000


def test_extra_info_reports_the_size_actually_moved():
    info = Collective("all_gather", 1000 * 4).extra_info(3, 1e-3)
    assert info["op"] == "all_gather" and info["size_bytes"] == 999 * 4
    assert info["algbw_GBps"] == pytest.approx(999 * 4 / 1e-3 / 1e9)
    assert info["busbw_GBps"] == pytest.approx(info["algbw_GBps"] * 2 / 3)


@pytest.mark.parametrize("shift", [1, 13, 1300, PATTERN_PERIODS[0], PATTERN_PERIODS[1], 10**7])
def test_the_pattern_never_repeats_at_a_shard_distance(shift):
    # The old pattern repeated every 13 elements: shards 13k apart were identical, so a rank
    # holding another rank's reduce_scatter shard passed. No shift short of ~4.3e9 repeats now.
    tables = pattern_tables(0, "cpu")
    a, b = torch.empty(4096), torch.empty(4096)
    fill_pattern(a, tables, 5)
    fill_pattern(b, tables, 5 + shift)
    assert (a != b).float().mean() > 0.9


def test_pattern_values_are_small_integers_and_ranks_differ():
    r0, r1 = torch.empty(70000), torch.empty(70000)
    fill_pattern(r0, pattern_tables(0, "cpu"))
    fill_pattern(r1, pattern_tables(1, "cpu"))
    assert torch.equal(r0, r0.round()) and r0.min() >= 0 and r0.max() <= 126
    assert (r0 != r1).float().mean() > 0.9
    total = torch.empty(70000)
    fill_pattern(total, summed_tables(2, "cpu"))
    assert torch.equal(total, r0 + r1)  # the expected sum is the tiling of the summed tables


class WrongAllReduce(Collective):
    """Skips the reduction on rank 1: the check must notice."""

    def _run_op(self, state):
        if state["ctx"].rank != 1:
            super()._run_op(state)
        else:
            import torch.distributed as dist

            dist.all_reduce(state["input"] * 0)  # takes part, but keeps its own data


@pytest.fixture(scope="module", params=[2, 3], ids=["2p", "3p"])
def pool(request):
    registry = PoolRegistry()
    yield registry.get(PoolSpec("gloo", request.param, "cpu"))
    registry.close()


@pytest.mark.parametrize("op", OPS)
def test_every_collective_passes_its_own_check(pool, op):
    # 1000 elements + an odd tail: exercises the rounding for all_gather / reduce_scatter.
    results = pool.run(measure_workload, Collective(op, 4003 * 4), RoundPlan(warmup=1, rounds=3, numerics_steps=0))
    assert all(len(r.round_times) == 3 for r in results)


def test_a_wrong_result_fails_the_case(pool):
    with pytest.raises(TaskFailed, match="all_reduce on rank 1 returned a wrong result"):
        pool.run(measure_workload, WrongAllReduce("all_reduce", 4096), RoundPlan(warmup=0, rounds=1, numerics_steps=0))


def _shard_multiple_size(n, multiple):
    """Bytes of a reduce_scatter whose per-rank shard is a multiple of ``multiple`` elements."""
    return n * multiple * 4 * (1 if multiple > 1000 else 100)


@pytest.mark.parametrize("multiple", [13, PATTERN_PERIODS[0]], ids=["shard-13k", "shard-65521k"])
def test_a_reduce_scatter_handing_out_the_wrong_shard_fails_the_case(pool, multiple):
    # Shards a multiple of 13 elements long: the old period-13 pattern passed this bug.
    size = _shard_multiple_size(pool.spec.world_size, multiple)
    with pytest.raises(TaskFailed, match=r"reduce_scatter on rank 0 returned a wrong result: .* it holds "
                                         r"rank 1's shard of the sum .* instead of its own, shard 0"):
        pool.run(measure_workload, WrongShardReduceScatter("reduce_scatter", size), RoundPlan(warmup=0, rounds=1, numerics_steps=0))


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "broadcast"])
def test_an_op_that_writes_nothing_fails_the_case(pool, op):
    # Before the check's op its output is poisoned with NaN: the timed rounds' correct result,
    # still in the buffer, can no longer pass for this op's (rank 1: broadcast's root keeps its data).
    with pytest.raises(TaskFailed, match=rf"{op} on rank 1 returned a wrong result: .*got nan.* the op "
                                         r"wrote nothing: the buffer still holds the NaN"):
        pool.run(measure_workload, NoOpCollective(op, 4003 * 4), RoundPlan(warmup=0, rounds=2, numerics_steps=0))


def test_an_all_reduce_that_reduces_nothing_fails_the_case(pool):
    with pytest.raises(TaskFailed, match=r"all_reduce on rank 0 returned a wrong result: .* it is this "
                                         r"rank's own input: nothing was reduced"):
        pool.run(measure_workload, NoOpCollective("all_reduce", 4003 * 4), RoundPlan(warmup=0, rounds=2, numerics_steps=0))


# ----------------------------------------------------------------------------------------------
# Data types, reductions, placements (nccl-tests' -d, -o and its two column groups)
# ----------------------------------------------------------------------------------------------

from ddpbench.workloads.collectives import (DTYPES, FLOAT_DTYPES, REDUCE_OPS, pattern_values,  # noqa: E402
                                            reduced_pattern)

from helpers.broken_workloads import (AveragedOverTooMany, DroppedRankOne, InPlaceGatherWithoutOwnChunk,  # noqa: E402
                              WrongReduction)

SPEC_2P = PoolSpec("gloo", 2, "cpu")
ONE_ROUND = RoundPlan(warmup=0, rounds=1, numerics_steps=0)


def _cases():
    """Every (op, dtype, reduction, placement) gloo can run, as Collective workloads."""
    for op in OPS:
        for dtype in DTYPES:
            for reduce_op in (REDUCE_OPS if Collective(op, 4096).spec.reduces else ("sum",)):
                for placement in Collective(op, 4096).spec.placements:
                    case = Collective(op, 4003 * DTYPES[dtype][0], dtype, reduce_op, placement)
                    if case.skip_reason(SPEC_2P) is None:
                        yield case


def test_every_dtype_reduction_and_placement_passes_its_own_check(pool):
    # One task per case would take minutes; one task runs them all on the ranks.
    cases = list(_cases())
    assert len(cases) == (8 * 4 - 4) * 3 + 8 * 2 + 8  # avg: floating types only on gloo
    assert all(len(r) == len(cases) for r in pool.run(_measure_all, cases, timeout_s=300))


def _measure_all(ctx, cases):
    return [measure_workload(ctx, case, RoundPlan(warmup=1, rounds=2, numerics_steps=0)).round_times for case in cases]


def test_values_keep_every_sum_exact_in_its_type():
    for dtype in FLOAT_DTYPES:
        for n in (2, 6, 64):
            values = pattern_values(dtype, n)
            assert 2 <= values <= 64 and 2 * n * (values - 1) <= DTYPES[dtype][1]
    assert pattern_values("bfloat16", 2) == 64 and pattern_values("bfloat16", 6) == 22
    assert pattern_values("bfloat16", 6, "max") == 64  # max and min never grow
    out = torch.empty(70000, dtype=torch.bfloat16)
    reduced_pattern(out, 6, 5, "sum", "bfloat16", pattern_values("bfloat16", 6))
    exact = torch.empty(70000, dtype=torch.float64)
    reduced_pattern(exact, 6, 5, "sum", "float64", pattern_values("bfloat16", 6))
    assert torch.equal(out.double(), exact)  # the bfloat16 sum of six ranks' data is exact


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "uint8"])
@pytest.mark.parametrize("reduce_op", ["sum", "max", "min"])
def test_leaving_a_rank_out_of_the_reduction_fails_for_every_type(pool, dtype, reduce_op):
    case = DroppedRankOne("all_reduce", 4003 * DTYPES[dtype][0], dtype, reduce_op)
    described = "" if (dtype, reduce_op) == ("float32", "sum") else rf" \({dtype}, {reduce_op}, in-place\)"
    with pytest.raises(TaskFailed, match=rf"all_reduce{described} on rank \d returned a wrong result"):
        pool.run(measure_workload, case, ONE_ROUND)


@pytest.mark.parametrize("op,dtype", [("all_reduce", "float32"), ("all_reduce", "int32"),
                                      ("reduce_scatter", "float16")])
def test_the_wrong_reduction_fails_and_is_named(pool, op, dtype):
    case = WrongReduction(op, 4003 * DTYPES[dtype][0], dtype, "sum", actually="max")
    described = "" if (op, dtype) == ("all_reduce", "float32") else rf" \({dtype}, sum, .*\)"
    message = rf"{op}{described} on rank \d returned a wrong result"
    if op == "all_reduce":
        message += r".* it is the max over the ranks, not the sum"
    with pytest.raises(TaskFailed, match=message):
        pool.run(measure_workload, case, ONE_ROUND)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_an_average_over_the_wrong_count_is_outside_the_types_rounding(pool, dtype):
    case = AveragedOverTooMany("all_reduce", 4003 * DTYPES[dtype][0], dtype, "avg")
    with pytest.raises(TaskFailed, match=rf"all_reduce \({dtype}, avg, in-place\) on rank \d returned a wrong"):
        pool.run(measure_workload, case, ONE_ROUND)


def test_an_in_place_gather_that_skips_the_ranks_own_chunk_fails(pool):
    case = InPlaceGatherWithoutOwnChunk("all_gather", 4003 * 4, placement="in-place")
    with pytest.raises(TaskFailed, match=r"all_gather \(float32, in-place\) on rank \d returned a wrong result: "
                                         r".*elements were never written \(still the NaN\).*wrong in the chunk"):
        pool.run(measure_workload, case, ONE_ROUND)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_integer_outputs_are_poisoned_too(pool, op):
    # No NaN in an integer type: a value no rank's data takes marks what the op must overwrite.
    with pytest.raises(TaskFailed, match=rf"{op} \(int32, .*\) on rank 1 returned a wrong result: .*the op wrote "
                                         r"nothing: the buffer still holds the value -1"):
        pool.run(measure_workload, NoOpCollective(op, 4003 * 4, "int32"), ONE_ROUND)


def test_what_a_backend_or_op_lacks_is_a_skip_with_the_reason():
    assert Collective("all_reduce", 4096, "int32", "avg").skip_reason(SPEC_2P) == \
        "gloo averages floating types only (ReduceOp.AVG on int32 is refused)"
    assert Collective("all_reduce", 4096, "int32", "avg").skip_reason(PoolSpec("nccl", 1, "cuda")) is None
    assert "exists only in-place" in Collective("all_reduce", 4096, placement="out-of-place").skip_reason(SPEC_2P)
    assert "exists only in-place" in Collective("broadcast", 4096, placement="out-of-place").skip_reason(SPEC_2P)
    assert "does not reduce" in Collective("all_gather", 4096, reduce_op="max").skip_reason(SPEC_2P)
    for bad, message in [({"dtype": "float8"}, "unknown data type 'float8'"),
                         ({"reduce_op": "product"}, "unknown reduction 'product'"),
                         ({"placement": "sideways"}, "unknown placement 'sideways'")]:
        with pytest.raises(ValueError, match=message):
            Collective("all_reduce", 4096, **bad)


def test_extra_info_names_the_type_reduction_and_placement_and_counts_bytes_by_type():
    info = Collective("reduce_scatter", 4000 * 2, "bfloat16", "max", "in-place").extra_info(2, 1e-3)
    assert info["dtype"] == "bfloat16" and info["reduce_op"] == "max" and info["placement"] == "in-place"
    assert info["size_bytes"] == 4000 * 2
    gathered = Collective("all_gather", 4096 * 8, "float64").extra_info(2, 1e-3)
    assert gathered["placement"] == "out-of-place" and "reduce_op" not in gathered


class _OneRankOfTwo:
    rank, world_size, backend, device_type, core = 0, 2, "gloo", "cpu", None

    device = torch.device("cpu")


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_a_set_up_state_does_not_depend_on_what_the_memory_held_before(op):
    # The numerics replay sets up twice and compares the fresh states bitwise: a buffer left as
    # torch.empty gave all_gather 1 MB / 10 MB "not reproducible under fixed seeds" in ab.yml's run.
    workload = Collective(op, 4096)
    first = workload.setup(_OneRankOfTwo())
    tensors = {k: v for k, v in first.items() if isinstance(v, torch.Tensor)}
    kept = {k: v.clone() for k, v in tensors.items()}
    for v in tensors.values():
        v.fill_(7)  # what the allocator hands out next, if it reuses these blocks
    del first, tensors
    second = workload.setup(_OneRankOfTwo())
    for k, v in kept.items():
        assert torch.equal(second[k], v), f"{op}: {k} differs between two set-ups"

