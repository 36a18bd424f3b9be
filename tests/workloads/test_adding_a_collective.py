"""Adding a collective op is one entry in COLLECTIVES (tests/helpers/extra_collective.py adds all_to_all):
the engine runs it and its check, extra_info carries its bandwidths, and the report tables it;
a planted bug in the same entry's op fails its check."""

import pytest

from helpers.benchjson import bench, run_doc, write
from ddpbench import report
from ddpbench.engine.timing import RoundPlan, measure_workload
from ddpbench.storage.runs import load_run
from ddpbench.pool import PoolRegistry, PoolSpec, TaskFailed
from ddpbench.workloads.collectives import COLLECTIVES, bus_bandwidth_factor

from helpers.extra_collective import ExtraCollective


@pytest.fixture(scope="module", params=[2, 3], ids=["2p", "3p"])
def pool(request):
    registry = PoolRegistry()
    yield registry.get(PoolSpec("gloo", request.param, "cpu"))
    registry.close()


def test_the_added_op_runs_and_passes_its_own_check(pool):
    results = pool.run(measure_workload, ExtraCollective("all_to_all", 4003 * 4), RoundPlan(warmup=1, rounds=3, numerics_steps=0))
    assert all(len(r.round_times) == 3 for r in results)


def test_the_added_ops_check_catches_a_planted_bug(pool):
    with pytest.raises(TaskFailed, match="all_to_all_without_exchange on rank 1 returned a wrong result"):
        pool.run(measure_workload, ExtraCollective("all_to_all_without_exchange", 4096), RoundPlan(warmup=0, rounds=1, numerics_steps=0))


def test_the_added_op_gets_bandwidths_and_a_report_table(tmp_path):
    assert "all_to_all" in COLLECTIVES and bus_bandwidth_factor("all_to_all", 4) == pytest.approx(0.75)
    workload = ExtraCollective("all_to_all", 1000 * 4)
    info = workload.extra_info(4, 1e-3)
    assert info["size_bytes"] == 1000 * 4 and info["busbw_GBps"] == pytest.approx(info["algbw_GBps"] * 0.75)
    info.update(backend="gloo", world_size=4, device="cpu", ops_per_round=1)
    doc = run_doc([bench("test_all_to_all[gloo-4p-4KB]", [1e-3, 1e-3, 2e-3], info)])
    table = report.collectives_tables(list(load_run(write(tmp_path / "r.json", doc)).cases.values()))
    assert "### all_to_all" in table
    row = next(line for line in table.splitlines() if line.startswith("| gloo"))
    assert row.rstrip(" |").split("|")[-1].strip() != "n/a"  # the bus bandwidth is computed
