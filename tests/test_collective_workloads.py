"""Collective workloads: nccl-tests bandwidth formulas and result checking in real ranks."""

import pytest

from ddpbench.pool import PoolRegistry, PoolSpec, TaskFailed
from ddpbench.timing import RoundPlan, measure_workload
from ddpbench.workloads.collectives import (OPS, Collective, bandwidths_gbps, bus_bandwidth_factor,
                                            element_count)


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
    with pytest.raises(ValueError, match="unknown collective 'all_to_all'"):
        Collective("all_to_all", 1024)


def test_gather_and_scatter_sizes_divide_by_the_world_size():
    assert element_count("all_gather", 1000 * 4, 3) == 999
    assert element_count("reduce_scatter", 4, 2) == 2
    assert element_count("all_reduce", 1000 * 4 + 3, 3) == 1000


def test_extra_info_reports_the_size_actually_moved():
    info = Collective("all_gather", 1000 * 4).extra_info(3, 1e-3)
    assert info["op"] == "all_gather" and info["size_bytes"] == 999 * 4
    assert info["algbw_GBps"] == pytest.approx(999 * 4 / 1e-3 / 1e9)
    assert info["busbw_GBps"] == pytest.approx(info["algbw_GBps"] * 2 / 3)


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
    results = pool.run(measure_workload, Collective(op, 4003 * 4), RoundPlan(warmup=1, rounds=3))
    assert all(len(r.round_times) == 3 for r in results)


def test_a_wrong_result_fails_the_case(pool):
    with pytest.raises(TaskFailed, match="all_reduce on rank 1 returned a wrong result"):
        pool.run(measure_workload, WrongAllReduce("all_reduce", 4096), RoundPlan(warmup=0, rounds=1))
