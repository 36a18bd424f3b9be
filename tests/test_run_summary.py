"""A plain run's terminal summary says what pytest-benchmark's table and pytest's `.ss` do not: each
case's census, memory peak and numerics replay on one line, and why its cases were skipped (without
-rs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddpbench import run_summary
from helpers.census_records import census as census_record

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
        "test_my_ddp_step[gloo-2p]  no census; memory peak 835.0 KiB at Linear backward, 514.0 KiB kept after the "
        "step; no numerics replay",
        "test_lightning[gloo-2p]    no census; memory not counted: its memory census is incomplete (a thread); no "
        "numerics replay"]
    broken = SimpleNamespace(name="x", extra_info={"memory": {"version": 1}})
    assert run_summary.case_lines([broken])[0].startswith("x  no census; memory census unreadable (")


def test_each_case_line_names_all_three_exact_answers():
    # What one step sends (the census, before only in the JSON), holds and computes, on one line.
    from ddpbench.engine.numerics import combine_numerics

    steps = [{"param w": ["p0", 4.0, 8.0, 1.0]}, {"param w": ["p1", 3.9, 8.0, 1.0], "loss": ["l", 2.0, 2.0, 2.0]}]
    rank = {"version": 1, "seed": 0, "steps": 1, "replays": 2, "digests": ["d0" * 32, "d1" * 32], "tensors": steps,
            "replay_spread": 0.0, "first_nondeterministic_step": None}
    census = census_record(("all_reduce", "float32", 2, [1024, 4096]), ("broadcast", "float32", 2, [512]))
    info = {"census": census, "memory": MEMORY, "numerics": combine_numerics([rank, rank])}
    (line,) = run_summary.case_lines([SimpleNamespace(name="test_step[gloo-2p]", extra_info=info)])
    sends, memory, numerics = line.removeprefix("test_step[gloo-2p]  ").split("; ")
    assert sends == "sends 2 all_reduce, 1 broadcast (5.5 KiB) per step"
    assert memory.startswith("memory peak 835.0 KiB")
    assert numerics.startswith("numerics 1 steps, replays bitwise equal, digest ")
    quiet = census_record()
    assert run_summary.census_fact({"census": quiet}) == "sends no collective per step"
    assert run_summary.census_fact({"census": dict(quiet, incomplete="a thread")}).startswith("census not counted: ")
    assert "sends" in run_summary.CASES_HEADING and "holds" in run_summary.CASES_HEADING \
        and "computes" in run_summary.CASES_HEADING


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
