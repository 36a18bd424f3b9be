"""A plain run's terminal summary says what pytest-benchmark's table and pytest's `.ss` do not: each
case's memory peak, and why its cases were skipped (without -rs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddpbench import run_summary

MEMORY = {"version": 1, "method": "MemTracker", "device": "cpu", "steps_counted": 1, "peak_bytes": 855_040,
          "at_peak": {"parameters": 263_168, "activations": 591_872}, "peak_at": {"module": "Linear", "phase": "backward"},
          "before_step_bytes": 526_336, "after_step_bytes": 526_336, "after_step": {"parameters": 526_336},
          "optimizers": [{"name": "SGD", "foreach": None}]}
NCCL = "needs 1 CUDA device(s) (NCCL runs one rank per GPU); no CUDA device here"


def _skipped(nodeid: str, reason: str):
    return SimpleNamespace(nodeid=nodeid, longrepr=("t.py", 3, f"Skipped: {reason}"))


def test_skips_are_counted_by_reason_for_ddpbench_cases_only():
    reports = [_skipped("t.py::test_step[nccl-1p]", NCCL), _skipped("t.py::test_other[nccl-1p]", NCCL),
               _skipped("t.py::test_step[nccl-2p]", NCCL.replace("1 CUDA", "2 CUDA")),
               _skipped("t.py::test_unrelated", "no network")]
    cases = {"t.py::test_step[nccl-1p]", "t.py::test_other[nccl-1p]", "t.py::test_step[nccl-2p]"}
    assert run_summary.skip_lines(reports, cases, "fE") == [
        f"ddpbench: 2 cases skipped: {NCCL} (-rs lists them)",
        f"ddpbench: 1 case skipped: {NCCL.replace('1 CUDA', '2 CUDA')} (-rs lists them)"]
    # Where pytest lists every skip itself, nothing is said twice.
    assert run_summary.skip_lines(reports, cases, "fEs") == [] == run_summary.skip_lines(reports, cases, "a")


def test_each_case_line_gives_its_memory_peak_where_it_fell_and_what_stays():
    benches = [SimpleNamespace(name="test_my_ddp_step[gloo-2p]", extra_info={"memory": MEMORY}),
               SimpleNamespace(name="test_timed_only[gloo-2p]", extra_info={}),
               SimpleNamespace(name="test_lightning[gloo-2p]", extra_info={"memory": dict(MEMORY, incomplete="a thread")})]
    assert run_summary.case_lines(benches) == [
        "test_my_ddp_step[gloo-2p]  memory peak 835.0 KiB at Linear backward, 514.0 KiB kept after the step",
        "test_lightning[gloo-2p]    memory not counted: its memory census is incomplete (a thread)"]
    broken = SimpleNamespace(name="x", extra_info={"memory": {"version": 1}})
    assert run_summary.case_lines([broken])[0].startswith("x  memory census unreadable (")


@pytest.mark.pool
def test_a_first_run_says_why_its_cases_skipped_without_rs(pytester):
    # A ddpbench case skipped at collection starts no rank: the summary still names the reason.
    pytester.makepyfile(test_first="""
        import pytest

        @pytest.mark.skip(reason="needs 1 CUDA device(s); no CUDA device here")
        def test_step(dist_benchmark):
            pass

        @pytest.mark.skip(reason="not a ddpbench case")
        def test_plain():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-disable", "-m", "not gpu",
                                           timeout=120)
    result.assert_outcomes(skipped=2, deselected=2)
    result.stdout.fnmatch_lines(["ddpbench: 1 case skipped: needs 1 CUDA device(s); no CUDA device here "
                                 "(-rs lists them)"])
    assert "not a ddpbench case" not in result.stdout.str()
