"""The timing engine: cross-rank max, round-count choice, metric combination, in real ranks."""

import pytest

from ddpbench.pool import PoolRegistry, PoolSpec
from ddpbench.timing import RoundPlan, combine_rank_metrics, max_over_ranks, measure_workload
from ddpbench.workloads import Workload


def test_round_time_is_the_slowest_rank_per_round():
    assert max_over_ranks([[1.0, 5.0, 2.0], [3.0, 4.0, 2.5]]) == [3.0, 5.0, 2.5]
    assert max_over_ranks([[0.1, 0.2]]) == [0.1, 0.2]
    with pytest.raises(ValueError, match="different numbers of rounds"):
        max_over_ranks([[1.0], [1.0, 2.0]])
    with pytest.raises(ValueError):
        max_over_ranks([])


def test_round_count_fills_min_time_within_bounds():
    plan = RoundPlan(min_time_s=1.0, min_rounds=5, max_rounds=1000)
    assert plan.rounds_for(0.01) == 100
    assert plan.rounds_for(0.5) == 5  # at least min_rounds
    assert plan.rounds_for(1e-7) == 1000  # at most max_rounds
    assert plan.rounds_for(0.0) == 1000
    assert RoundPlan(rounds=7).rounds_for(0.01) == 7  # an explicit count wins


def test_numeric_metrics_take_the_max_over_ranks():
    combined = combine_rank_metrics([{"peak_memory_bytes": 10, "layout": "list", "ok": True},
                                     {"peak_memory_bytes": 30, "layout": "other", "ok": False}])
    assert combined == {"peak_memory_bytes": 30, "layout": "list", "ok": True}


class SlowRankOne(Workload):
    """Rank 1 sleeps 30 ms a round, rank 0 nothing: every recorded round must show rank 1's time."""

    def setup(self, ctx):
        return {"rank": ctx.rank, "rounds": 0}

    def run_round(self, state):
        import time

        state["rounds"] += 1
        if state["rank"] == 1:
            time.sleep(0.03)

    def rank_metrics(self, state):
        return {"rounds_run": state["rounds"]}

    def check(self, state):
        assert state["rounds"] > 0


class FailingCheck(SlowRankOne):
    def check(self, state):
        raise AssertionError("wrong result on purpose")


@pytest.fixture(scope="module")
def pool():
    registry = PoolRegistry()
    yield registry.get(PoolSpec("gloo", 2, "cpu"))
    registry.close()


def test_engine_records_planned_rounds_and_max_is_taken_over_ranks(pool):
    plan = RoundPlan(warmup=2, rounds=6)
    results = pool.run(measure_workload, SlowRankOne(), plan)
    assert [len(r.round_times) for r in results] == [6, 6]
    assert [r.metrics["rounds_run"] for r in results] == [8, 8]  # warm-up ran but is not recorded
    assert min(results[1].round_times) >= 0.03
    combined = max_over_ranks([r.round_times for r in results])
    assert combined == results[1].round_times
    assert all(t >= 0.03 for t in combined)


def test_engine_picks_the_same_round_count_on_every_rank(pool):
    results = pool.run(measure_workload, SlowRankOne(), RoundPlan(warmup=1, rounds=0, min_time_s=0.2))
    counts = {len(r.round_times) for r in results}
    assert len(counts) == 1 and 5 <= counts.pop() <= 8  # ~0.2 s / 0.03 s per round


def test_a_failing_check_fails_the_task(pool):
    from ddpbench.pool import TaskFailed

    with pytest.raises(TaskFailed, match="wrong result on purpose"):
        pool.run(measure_workload, FailingCheck(), RoundPlan(warmup=0, rounds=1))
    assert pool.alive


class ReportAffinity(Workload):
    """Reports the CPUs of all of the rank's threads while it measures."""

    def __init__(self, pin):
        self.pin_to_core = pin

    def setup(self, ctx):
        return None

    def run_round(self, state):
        pass

    def rank_metrics(self, state):
        import os

        cpus = {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")}
        return {"cpus": sorted(cpus)}


def current_affinity(ctx):
    import os

    return sorted(os.sched_getaffinity(0))


def test_pinned_pools_keep_each_rank_on_its_own_core_while_measuring(pool):
    import os

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 CPUs to pin 2 ranks")
    assert pool.pinned
    plan = RoundPlan(warmup=0, rounds=2)
    pinned = pool.run(measure_workload, ReportAffinity(True), plan)
    assert [m.metrics["cpus"] for m in pinned] == [[(cores[0],)], [(cores[1],)]]  # every thread
    assert all(m.metrics["pinned_cores"] for m in pinned)
    assert pool.run(current_affinity) == [cores, cores]  # restored afterwards
    free = pool.run(measure_workload, ReportAffinity(False), plan)  # a workload that opts out
    assert [m.metrics["cpus"] for m in free] == [[tuple(cores)], [tuple(cores)]]
    assert not any(m.metrics["pinned_cores"] for m in free)
