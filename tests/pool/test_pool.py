"""The rank pool: start, reuse, results, failures (raise, death, hang), teardown, isolation."""

import os
import time

import psutil
import pytest

from helpers import rank_tasks
from ddpbench.pool import PoolError, PoolRegistry, PoolSpec, RankLaunch, RankPool, TaskFailed

SPEC = PoolSpec("gloo", 2, "cpu")


def _gone(pids, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def registry():
    reg = PoolRegistry()
    yield reg
    reg.close()


def test_results_come_back_in_rank_order_and_the_pool_is_reused(registry):
    pool = registry.get(SPEC)
    first = pool.run(rank_tasks.rank_and_sum, 10)
    assert [r["rank"] for r in first] == [0, 1]
    assert [r["sum"] for r in first] == [21.0, 21.0]  # (0+10) + (1+10): the all_reduce ran
    assert all(r["threads"] == 1 for r in first)
    assert registry.get(SPEC) is pool
    second = pool.run(rank_tasks.rank_and_sum, 0)
    assert [r["pid"] for r in second] == [r["pid"] for r in first] == pool.pids
    assert registry.started == 1


def test_tensor_arguments_reach_every_rank(registry):
    import torch

    pool = registry.get(SPEC)
    assert pool.run(rank_tasks.sum_of_tensor, torch.arange(100.0)) == [4950.0, 4950.0]


def test_an_exception_names_the_rank_and_carries_its_traceback(registry):
    pool = registry.get(SPEC)
    with pytest.raises(TaskFailed) as info:
        pool.run(rank_tasks.raise_on_rank_one, timeout_s=30)
    message = str(info.value)
    assert "raised on rank(s) [1] of 2" in message
    assert "ValueError: rank one refuses" in message
    assert "rank_tasks.py" in message and "raise_on_rank_one" in message
    assert set(info.value.errors) == {1}
    # Rank 0 finished, so nobody is stuck and the same pool keeps working.
    assert not info.value.pool_torn_down and pool.alive
    assert [r["sum"] for r in pool.run(rank_tasks.rank_and_sum, 0)] == [1.0, 1.0]


def test_a_failure_that_strands_the_other_ranks_tears_the_pool_down(registry):
    pool = registry.get(SPEC)
    pids = pool.pids
    with pytest.raises(TaskFailed) as info:
        pool.run(rank_tasks.raise_on_rank_one_then_collective, timeout_s=60)
    assert set(info.value.errors) == {1} and set(info.value.stuck) == {0}
    assert "barrier" in info.value.stuck[0]  # rank 0's stack dump shows where it waited
    assert info.value.pool_torn_down and not pool.alive
    assert _gone(pids)
    fresh = registry.get(SPEC)
    assert fresh is not pool
    assert [r["sum"] for r in fresh.run(rank_tasks.rank_and_sum, 0)] == [1.0, 1.0]


def test_a_rank_killed_mid_task_fails_fast_and_the_next_task_gets_a_fresh_pool(registry):
    pool = registry.get(SPEC)
    pids = pool.pids
    start = time.monotonic()
    with pytest.raises(TaskFailed) as info:
        pool.run(rank_tasks.die_on_rank_one, timeout_s=60)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "rank(s) [1] of 2 died" in message and "SIGKILL" in message
    assert info.value.dead == {1: -9}
    assert elapsed < 30, f"took {elapsed:.1f} s although the timeout was 60 s"
    assert _gone(pids)
    fresh = registry.get(SPEC)
    assert [r["sum"] for r in fresh.run(rank_tasks.rank_and_sum, 1)] == [3.0, 3.0]


def test_a_rank_stuck_past_the_timeout_is_named_with_its_stack(registry):
    pool = registry.get(SPEC)
    pids = pool.pids
    start = time.monotonic()
    with pytest.raises(TaskFailed) as info:
        pool.run(rank_tasks.sleep_past_timeout, 300, timeout_s=2)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "did not finish within 2 s" in message and "stuck rank(s): [0]" in message
    assert "sleep_past_timeout" in info.value.stuck[0]  # the faulthandler dump
    assert elapsed < 2 + 8
    assert _gone(pids)
    assert [r["rank"] for r in registry.get(SPEC).run(rank_tasks.rank_and_sum, 0)] == [0, 1]


def _wake_ups(pid: int) -> dict[str, int]:
    """Context switches so far (each a wake-up or a preemption) of every thread of ``pid``, by
    thread id and name."""
    counts = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as fh:
            name = fh.read().strip()
        with open(f"/proc/{pid}/task/{tid}/status") as fh:
            counts[f"{tid} {name}"] = sum(int(line.split()[1]) for line in fh
                                          if line.split(":")[0].endswith("ctxt_switches"))
    return counts


@pytest.mark.skipif(not hasattr(os, "pidfd_open") or not os.path.isdir("/proc/self/task"),
                    reason="needs Linux pidfds and /proc")
def test_an_idle_rank_adds_no_wake_ups_of_its_own(registry):
    """Between tasks no thread ddpbench runs in a rank wakes up on a timer (a parent watch that
    polled twice a second did). ddpbench's threads are the rank's Python threads; gloo's own TCP
    event loop, a C++ thread (named "gloo_tcp_loop" from torch 2.13, unnamed before), wakes every
    10 ms in every gloo process, a plain script's included: it is not ddpbench's to remove."""
    pool = registry.get(SPEC)
    pool.run(rank_tasks.rank_and_sum, 0)
    ours = pool.run(rank_tasks.python_thread_ids)
    time.sleep(0.5)  # the task's own hand-offs settle
    before = [_wake_ups(pid) for pid in pool.pids]
    time.sleep(3.0)
    for pid, earlier, tids in zip(pool.pids, before, ours):
        checked = {thread for thread in earlier if int(thread.split(" ", 1)[0]) in tids}
        assert len(checked) == len(tids), (tids, earlier)  # every Python thread found in /proc
        woke = {thread: n - earlier[thread] for thread, n in _wake_ups(pid).items() if thread in checked}
        assert all(n <= 1 for n in woke.values()), f"idle rank threads woke up in 3 s: {woke}"


def test_tasks_that_do_not_pickle_fail_clearly(registry):
    pool = registry.get(SPEC)
    with pytest.raises(PoolError, match="does not pickle"):
        pool.run(lambda ctx: None)
    with pytest.raises(TaskFailed, match="could not be sent back"):
        pool.run(rank_tasks.return_unpicklable)
    assert pool.alive


@pytest.mark.parametrize("launch", [None, RankLaunch(env=(("DDPBENCH_TEST_SIDE", "b"),))],
                         ids=["spawned", "a/b-side"])
def test_pool_processes_listen_on_loopback_only(registry, launch):
    pool = registry.get(SPEC, launch)
    listeners = pool.run(rank_tasks.listening_addresses)
    addresses = [ip for _, socks in listeners for ip, _ in socks]
    assert addresses, "gloo should hold listening sockets while the pool is up"
    for ip in addresses:
        assert ip.startswith("127.") or ip == "::1", f"a rank listens on {ip}: {listeners}"
    # The controller process listens on nothing either (the rendezvous is a FileStore).
    mine = [c for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert all(c.laddr.ip.startswith("127.") or c.laddr.ip == "::1" for c in mine), mine


@pytest.mark.pool
def test_closing_kills_ranks_and_their_children_and_removes_the_store():
    registry = PoolRegistry()
    pool = registry.get(SPEC)
    grandchildren = pool.run(rank_tasks.start_child_sleeper)
    store_dir = pool._store_dir
    assert os.stat(store_dir).st_mode & 0o777 == 0o700
    pids = pool.pids
    pool.kill()
    assert _gone(pids + grandchildren)
    assert not os.path.exists(store_dir)
    registry.close()


def test_ranks_exit_when_the_controller_dies(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "controller.py"
    script.write_text(
        "import os, sys\n"
        "from ddpbench.pool import RankPool, PoolSpec\n"
        "if __name__ == '__main__':\n"
        "    pool = RankPool(PoolSpec('gloo', 2, 'cpu'))\n"
        "    print(' '.join(map(str, pool.pids)), pool._store_dir, flush=True)\n"
        "    os._exit(0)\n"  # dies without closing the pool
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    *pids, store_dir = out.stdout.split()
    pids = [int(p) for p in pids]
    assert len(pids) == 2, out.stderr
    assert _gone(pids, timeout_s=15)
    assert not os.path.exists(store_dir)  # the ranks removed what the controller left


@pytest.mark.pool
def test_a_reply_the_controller_cannot_load_names_the_rank_and_the_pool_keeps_working(tmp_path):
    registry = PoolRegistry()
    try:
        pool = registry.get(SPEC, RankLaunch(), 1, owner="baseline")
        with pytest.raises(TaskFailed) as info:
            pool.run(rank_tasks.return_object_only_the_rank_can_import, str(tmp_path), timeout_s=60)
        message = str(info.value)
        assert "ddpbench: baseline pool 1: task helpers.rank_tasks.return_object_only_the_rank_can_import raised " \
               "on rank(s) [0, 1] of 2." in message
        assert "--- baseline pool 1, rank 0 traceback ---" in message
        assert "the controller could not load this rank's reply" in message
        assert "No module named 'rank_only_0'" in message
        assert pool.alive and not info.value.pool_torn_down  # the replies were read whole
        assert [r["sum"] for r in pool.run(rank_tasks.rank_and_sum, 0)] == [1.0, 1.0]
    finally:
        registry.close()


@pytest.mark.pool
def test_a_sticky_cuda_error_retires_the_pool_so_later_cases_get_a_fresh_one():
    registry = PoolRegistry()
    try:
        pool = registry.get(SPEC, owner="candidate")
        pids = pool.pids
        with pytest.raises(TaskFailed) as info:
            pool.run(rank_tasks.raise_sticky_cuda_error_on_rank_zero, timeout_s=60)
        message = str(info.value)
        assert "a sticky CUDA error (an illegal memory access was encountered)" in message
        assert "so the pool was retired" in message and info.value.pool_torn_down and not pool.alive
        assert _gone(pids)
        fresh = registry.get(SPEC, owner="candidate")
        assert fresh is not pool and [r["sum"] for r in fresh.run(rank_tasks.rank_and_sum, 0)] == [1.0, 1.0]
    finally:
        registry.close()


@pytest.mark.pool
def test_without_pidfds_a_dead_subprocess_rank_is_still_noticed(monkeypatch):
    import errno

    def no_pidfds(pid, flags=0):  # as on old kernels (psutil falls back on this errno too)
        raise OSError(errno.ENODEV, "pidfd_open: not supported")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds, raising=False)
    pool = RankPool(SPEC, launch=RankLaunch())
    try:
        pids = pool.pids
        start = time.monotonic()
        with pytest.raises(TaskFailed) as info:
            pool.run(rank_tasks.die_on_rank_one, timeout_s=60)
        assert info.value.dead == {1: -9} and "SIGKILL" in str(info.value)
        assert time.monotonic() - start < 30
        assert _gone(pids)
    finally:
        pool.kill()


@pytest.mark.pool
def test_identical_launches_of_two_owners_never_share_a_pool():
    registry = PoolRegistry()
    try:
        launch = RankLaunch()
        baseline = registry.get(SPEC, launch, 0, owner="baseline")
        candidate = registry.get(SPEC, launch, 0, owner="candidate")
        assert baseline is not candidate and not set(baseline.pids) & set(candidate.pids)
        assert registry.get(SPEC, launch, 0, owner="baseline") is baseline
        assert baseline.label == "baseline pool 0 (gloo, 2 ranks, cpu)"
    finally:
        registry.close()
