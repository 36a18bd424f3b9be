"""The timing engine: cross-rank max, round-count choice, metric combination, in real ranks."""

import pytest

from ddpbench.pool import PoolRegistry, PoolSpec
from ddpbench.engine.timing import RoundPlan, combine_rank_metrics, max_over_ranks, measure_workload
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
    registry = PoolRegistry(pin_cores=True)  # --dist-pin-cores=auto (the pinning test needs it)
    yield registry.get(PoolSpec("gloo", 2, "cpu"))
    registry.close()


def test_engine_records_planned_rounds_and_max_is_taken_over_ranks(pool):
    plan = RoundPlan(warmup=2, rounds=6)
    results = pool.run(measure_workload, SlowRankOne(), plan)
    assert [len(r.round_times) for r in results] == [6, 6]
    # warm-up, the census round (two ops) and the memory census's two steps ran but are not recorded
    assert [r.metrics["rounds_run"] for r in results] == [2 + 2 + 2 + 6] * 2
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
    assert pool.pin_cores
    plan = RoundPlan(warmup=0, rounds=2)
    pinned = pool.run(measure_workload, ReportAffinity(True), plan)
    assert [m.metrics["cpus"] for m in pinned] == [[(cores[0],)], [(cores[1],)]]  # every thread
    assert all(m.metrics["pinned_cores"] for m in pinned)
    assert pool.run(current_affinity) == [cores, cores]  # restored afterwards
    free = pool.run(measure_workload, ReportAffinity(False), plan)  # a workload that opts out
    assert [m.metrics["cpus"] for m in free] == [[tuple(cores)], [tuple(cores)]]
    assert not any(m.metrics["pinned_cores"] for m in free)


# ----------------------------------------------------------------------------------------------
# The stopping rule (--dist-precision): fake rounds, no process group
# ----------------------------------------------------------------------------------------------

from ddpbench.engine.timing import RankSession, median_interval, median_is_precise  # noqa: E402


class _FakeCtx:
    rank, world_size, backend, device_type, core = 0, 1, "gloo", "cpu", None


class _Nothing(Workload):
    def setup(self, ctx):
        return None

    def run_round(self, state):
        pass


def _session(plan, round_times):
    session = RankSession(_FakeCtx(), _Nothing(), plan)
    ticks = iter(round_times)
    session._time_round = lambda ctx, run_round, state: next(ticks)
    session._agree = lambda ctx, values: list(values)  # one rank: the max over ranks is itself
    session.start()
    return session


def test_median_interval_uses_order_statistics_around_the_middle():
    values = list(range(1, 101))
    low, high = median_interval(values)
    assert 38 <= low <= 42 and 59 <= high <= 63  # n=100: ranks ~40 and ~61
    assert median_is_precise([1.0] * 20, 0.01)
    assert not median_is_precise([1.0] * 19, 0.01)  # fewer than 20 rounds: never judged
    assert not median_is_precise([1.0] * 40, 0.0)  # 0 turns the rule off


def test_steady_rounds_stop_once_the_median_is_precise():
    plan = RoundPlan(warmup=1, rounds=0, min_time_s=10.0, precision=0.01)
    session = _session(plan, [0.001] * 100000)
    cap = plan.rounds_for(session.round_estimate_s)
    assert cap == 1000
    times, _ = session.record(cap, stop_when_precise=True)
    assert len(times) == 20  # first look: a constant median is exact


def test_noisy_rounds_keep_going_until_the_cap():
    import random

    rng = random.Random(0)
    noisy = [0.001 * (1 + rng.random()) for _ in range(100000)]  # uniform 1-2 ms: +-1% needs >1000 rounds
    plan = RoundPlan(warmup=1, rounds=0, min_time_s=0.75, precision=0.01)
    session = _session(plan, noisy)
    cap = plan.rounds_for(session.round_estimate_s)
    times, _ = session.record(cap, stop_when_precise=True)
    assert len(times) == cap


def test_looks_grow_geometrically_and_stop_at_a_looser_precision():
    import random

    rng = random.Random(1)
    noisy = [0.001 * (1 + 0.1 * rng.random()) for _ in range(100000)]
    plan = RoundPlan(warmup=1, rounds=0, min_time_s=10.0, precision=0.02)
    session = _session(plan, noisy)
    times, _ = session.record(1000, stop_when_precise=True)
    looks = [20]
    while looks[-1] < 1000:
        looks.append(min(1000, -(-looks[-1] * 3 // 2)))
    assert len(times) in looks and len(times) < 1000
    assert median_is_precise(times, 0.02)


class _Counting(Workload):
    """Counts set-ups, teardowns and rounds in a shared dict (the fake rank runs in-process)."""

    def __init__(self, log):
        self.log = log

    def setup(self, ctx):
        self.log["setup"] += 1
        return {"generation": self.log["setup"]}

    def run_round(self, state):
        self.log.setdefault("rounds_by_generation", []).append(state["generation"])

    def teardown(self, state):
        self.log["teardown"] += 1


def test_refresh_builds_the_state_anew_and_warms_it_up_untimed():
    log = {"setup": 0, "teardown": 0}
    session = RankSession(_FakeCtx(), _Counting(log), RoundPlan(warmup=1, rounds=3, numerics_steps=0))
    session._time_round = lambda ctx, run_round, state: (run_round(state), 0.001)[1]
    session._agree = lambda ctx, values: list(values)
    session.start()
    session.record(3)
    session.refresh()
    times, _ = session.record(3)
    assert (log["setup"], log["teardown"]) == (2, 1)
    # generation 1: 1 warm-up + the census round (two ops) + the memory census's two steps + 3 recorded;
    # generation 2: 1 warm-up after the refresh + 3 recorded (the case's censuses are taken once)
    assert log["rounds_by_generation"] == [1] * 8 + [2, 2, 2, 2]
    assert len(times) == 3
    session.finish(check=False)
    assert log["teardown"] == 2  # the last state is torn down once


def test_the_numerics_replay_runs_after_everything_timed_on_states_of_its_own():
    log = {"setup": 0, "teardown": 0}
    session = RankSession(_FakeCtx(), _Counting(log), RoundPlan(warmup=1, rounds=3, numerics_steps=2))
    session._time_round = lambda ctx, run_round, state: (run_round(state), 0.001)[1]
    session._agree = lambda ctx, values: list(values)
    session.start()
    session.record(3)
    assert (log["setup"], log["teardown"]) == (1, 0)  # nothing of it before or between the timed rounds
    metrics = session.finish(check=False)
    # the timed state is torn down first; then two replays, each a set-up of its own, 2 steps, a teardown
    assert (log["setup"], log["teardown"]) == (3, 3)
    # generation 1: 1 warm-up, the census's 2 ops, the memory census's 2 steps, 3 recorded
    assert log["rounds_by_generation"] == [1] * 8 + [2, 2, 3, 3]
    assert metrics["numerics"]["steps"] == 2 and metrics["numerics"]["replays"] == 2
    assert metrics["engine_numerics_s"] >= 0


def test_in_ab_mode_the_replay_comes_before_the_blocks_and_the_state_is_built_anew():
    log = {"setup": 0, "teardown": 0}
    session = RankSession(_FakeCtx(), _Counting(log), RoundPlan(warmup=1, rounds=3, numerics_steps=1))
    session._time_round = lambda ctx, run_round, state: (run_round(state), 0.001)[1]
    session._agree = lambda ctx, values: list(values)
    session.start()
    session.replay_numerics(rebuild=True)  # what the A/B task start does
    assert (log["setup"], log["teardown"]) == (4, 3)  # never two states alive at once
    session.record(2)
    assert log["rounds_by_generation"][-3:] == [4, 4, 4]  # the rebuilt state's warm-up, then the block
    session.finish(check=False)
    assert (log["setup"], log["teardown"]) == (4, 4)  # no second replay at the end


# ----------------------------------------------------------------------------------------------
# Ops per round (--dist-ops-per-round): several ops between the timers, recorded per op
# ----------------------------------------------------------------------------------------------

from ddpbench.engine.timing import AUTO_MAX_OPS, choose_ops_per_round  # noqa: E402


def _linear(fixed_s, per_op_s):
    return lambda k: fixed_s + k * per_op_s


@pytest.mark.parametrize("fixed_s,per_op_s,expected", [
    (20e-6, 10e-6, 256),  # a small NCCL message: 20 us of launch and timer dwarf a 10 us op
    (20e-6, 1e-3, 2),  # 1 ms ops: two of them put 20 us under 1% of the round
    (5e-6, 10e-3, 1),  # a long op: one is enough
    (0.0, 1e-3, 1),  # nothing fixed (gloo's synchronous ops, noise aside)
    (1e-3, 1e-9, AUTO_MAX_OPS),  # never more than the cap
])
def test_auto_ops_per_round_puts_the_fixed_cost_under_one_percent(fixed_s, per_op_s, expected):
    ops, fixed, per_op = choose_ops_per_round(_linear(fixed_s, per_op_s))
    assert ops == expected
    assert fixed == pytest.approx(fixed_s, abs=1e-12) and per_op == pytest.approx(per_op_s)
    if ops < AUTO_MAX_OPS:
        assert fixed <= 0.01 * (fixed + ops * per_op)  # the goal holds at the chosen count...
        if ops > 1:  # ...and not at half of it: the smallest power of two that meets it
            assert fixed > 0.01 * (fixed + ops // 2 * per_op)


def test_auto_ops_per_round_makes_rounds_of_at_least_a_millisecond():
    # A host-bound op whose fixed cost jitter hid (T(2) = 2 T(1)): 50 us ops, rounds of >= 1 ms
    ops, fixed, per_op = choose_ops_per_round(_linear(0.0, 50e-6))
    assert (ops, fixed) == (32, 0.0) and per_op == pytest.approx(50e-6)
    assert choose_ops_per_round(_linear(0.0, 50e-6), min_round_s=0.0)[0] == 1  # the old rule


def test_auto_ops_per_round_keeps_a_round_under_its_time_cap():
    ops, _, _ = choose_ops_per_round(_linear(20e-3, 0.3), max_round_s=1.0)
    assert ops == 2  # 1% would need 7 ops, but 3 would be past one second; a power of two
    calls = []
    choose_ops_per_round(lambda k: calls.append(k) or 1e-6 + k * 1e-3)
    assert calls == [1, 2]  # the search stops as soon as the goal is met


def test_a_round_of_k_ops_calls_the_workload_k_times_and_records_the_time_per_op():
    log = {"setup": 0, "teardown": 0}
    session = RankSession(_FakeCtx(), _Counting(log), RoundPlan(warmup=1, rounds=3, ops_per_round=4))
    session._time_round = lambda ctx, run_round, state: (run_round(state), 0.008)[1]  # the whole round
    session._agree = lambda ctx, values: list(values)
    session.start()
    times, _ = session.record(3)
    assert times == [0.002] * 3  # 8 ms for 4 ops
    # warm-up, census, recorded rounds of 4 ops; the memory census counts as many steps as the census
    assert len(log["rounds_by_generation"]) == 4 * (1 + 1 + 3) + 4
    assert session.round_estimate_s == pytest.approx(0.008)  # rounds are sized by the whole round
    metrics = session.finish(check=False)
    assert metrics["ops_per_round"] == 4 and "round_fixed_cost_s" not in metrics


def test_auto_ops_per_round_in_a_session_measures_and_records_what_it_chose():
    log = {"setup": 0, "teardown": 0}
    session = RankSession(_FakeCtx(), _Counting(log), RoundPlan(warmup=1, rounds=2, ops_per_round="auto"))

    def round_with_a_fixed_cost(ctx, run_round, state):
        before = len(log.get("rounds_by_generation", []))
        run_round(state)
        ops = len(log["rounds_by_generation"]) - before
        return 50e-6 + ops * 100e-6  # 50 us fixed, 100 us an op

    session._time_round = round_with_a_fixed_cost
    session._agree = lambda ctx, values: list(values)
    session.start()
    assert session.ops_per_round == 64  # 50 us <= 1% of the round from 50 ops on
    times, _ = session.record(2)
    assert times == [pytest.approx((50e-6 + 64 * 100e-6) / 64)] * 2
    metrics = session.finish(check=False)
    assert metrics["ops_per_round"] == 64 and metrics["round_fixed_cost_s"] == pytest.approx(50e-6)


def test_cuda_graph_mode_refuses_cpu_cases_and_workloads_it_cannot_capture():
    with pytest.raises(ValueError, match="CUDA graph mode captures GPU work; this case runs on the CPU"):
        RankSession(_FakeCtx(), _Nothing(), RoundPlan(cuda_graphs=True))

    class _CudaCtx(_FakeCtx):
        device_type = "cuda"

    with pytest.raises(ValueError, match="_Nothing cannot be captured in a CUDA graph"):
        RankSession(_CudaCtx(), _Nothing(), RoundPlan(cuda_graphs=True))
