"""Saved runs: a partial run is marked as such when saved, saving is whole or nothing, two saves
never share a number, and numbers go on past 9999 (ddpbench.storage.writing, ddpbench.storage.records).
Each pytest run here is a real one (pytester, a subprocess) with pytest-benchmark's autosave."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading

import pytest

CASES = """
import os

def test_a(benchmark):
    benchmark(sum, range(100))

def test_b(benchmark):
    benchmark(sum, range(100))
    assert os.environ.get("FAIL_B") != "1", "b failed"

def test_c(benchmark):
    benchmark(sum, range(100))
"""

PYTEST = ["--benchmark-autosave", "--benchmark-save-data", "--benchmark-max-time=0.002", "-p", "no:cacheprovider"]


def _machine_folder(pytester):
    from pytest_benchmark.utils import get_machine_id

    return pytester.path / ".benchmarks" / get_machine_id()


def _number(path):
    return int(path.name.split("_", 1)[0])


def _saved_runs(folder):
    """The saved runs of a machine folder in number order (read here without ddpbench, so these
    tests say what the storage holds whatever ddpbench's own listing does)."""
    return sorted((p for p in folder.glob("*.json") if p.name.split("_", 1)[0].isdigit()), key=_number)


def _runs(pytester):
    return _saved_runs(_machine_folder(pytester))


def _record(path):
    return json.loads(path.read_text())["ddpbench_run"]


def _files(folder):
    """What a machine folder holds besides the lock file saves take turns on."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".ddpbench-save.lock")


def _compare(pytester, *args):
    """ddpbench compare with no verdict at stake: these nanosecond cases' timings are not the point."""
    return subprocess.run([sys.executable, "-m", "ddpbench.cli", "compare", "--calibration", "never",
                           "--threshold", "900%", *args],
                          cwd=pytester.path, capture_output=True, text=True)


# ---------------------------------------------------------------------------------------------
# a partial run is marked, and never the default baseline
# ---------------------------------------------------------------------------------------------


def test_failed_and_stopped_runs_are_marked_incomplete_and_skipped_as_baseline(pytester, monkeypatch):
    pytester.makepyfile(test_cases=CASES)
    assert pytester.runpytest_subprocess(*PYTEST).ret == 0                      # 0001: complete
    monkeypatch.setenv("FAIL_B", "1")
    assert pytester.runpytest_subprocess(*PYTEST).ret == 1                      # 0002: b failed
    assert pytester.runpytest_subprocess(*PYTEST, "-x").ret == 1                # 0003: stopped at b
    monkeypatch.delenv("FAIL_B")
    assert pytester.runpytest_subprocess(*PYTEST).ret == 0                      # 0004: complete
    first, failed, stopped, last = _runs(pytester)
    assert _record(first)["complete"] and _record(last)["complete"]
    assert _record(failed) == {"complete": False, "exitstatus": 1, "failed": 1,
                               "failed_cases": ["test_cases.py::test_b"], "stopped": None}
    assert _record(stopped)["complete"] is False and _record(stopped)["stopped"] == "stopping after 1 failures"
    assert [b["name"] for b in json.loads(stopped.read_text())["benchmarks"]] == ["test_a", "test_b"]  # no c

    out = _compare(pytester)
    assert out.returncode == 0, out.stdout + out.stderr
    rel = lambda path: str(path.relative_to(pytester.path))
    assert f"baseline:  {rel(first)}" in out.stdout and f"candidate: {rel(last)}" in out.stdout
    assert f"passed over {stopped.name}: incomplete: 1 failed or erroring case(s) (test_cases.py::test_b); " \
           f"stopped early (stopping after 1 failures)" in out.stdout
    assert f"passed over {failed.name}: incomplete: 1 failed or erroring case(s)" in out.stdout

    # pytest-benchmark's own --benchmark-compare would take the newest run as it is
    last.unlink()
    result = pytester.runpytest_subprocess("--benchmark-compare", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*the newest saved run, {stopped.name}, is incomplete: *--benchmark-compare=NNNN*"])


def test_make_bench_with_a_failing_case_hands_compare_no_smaller_baseline(pytester, monkeypatch):
    """`make bench` with a failing case: the next compare fails on it (missing), and the one after
    that compares with the last complete run, not with the partial one."""
    pytester.makepyfile(test_cases=CASES.replace('benchmark(sum, range(100))\n    assert',
                                                 'assert os.environ.get("FAIL_B") != "1", "b failed"\n    '
                                                 'benchmark(sum, range(100))\n    assert'))
    assert pytester.runpytest_subprocess(*PYTEST).ret == 0
    monkeypatch.setenv("FAIL_B", "1")
    assert pytester.runpytest_subprocess(*PYTEST).ret == 1  # b fails before measuring: not in the run
    out = _compare(pytester)
    assert out.returncode == 1 and "missing" in out.stdout and "is incomplete" in out.stdout
    monkeypatch.delenv("FAIL_B")
    assert pytester.runpytest_subprocess(*PYTEST).ret == 0
    first, partial, last = _runs(pytester)
    out = _compare(pytester, "--json")
    assert out.returncode == 0
    doc = json.loads(out.stdout)
    assert (doc["baseline"], doc["current"]) == (str(first.relative_to(pytester.path)),
                                                 str(last.relative_to(pytester.path)))
    assert {case["verdict"] for case in doc["cases"]} <= {"same", "inconclusive", "improvement", "regression"}
    assert not any(case["verdict"] == "new" for case in doc["cases"])


# ---------------------------------------------------------------------------------------------
# whole or nothing
# ---------------------------------------------------------------------------------------------

TUPLE_KEYED = """
def test_good(benchmark):
    benchmark(sum, range(100))

def test_pairs(benchmark):
    benchmark(sum, range(100))
    benchmark.extra_info["by_pair"] = {(0, 1): 1.5}
"""


def test_an_unserialisable_extra_info_fails_its_case_by_name_and_the_rest_is_saved(pytester):
    pytester.makepyfile(test_cases=CASES)
    assert pytester.runpytest_subprocess(*PYTEST).ret == 0
    [first] = _runs(pytester)
    before = first.read_bytes()
    pytester.makepyfile(test_cases=TUPLE_KEYED)
    result = pytester.runpytest_subprocess(*PYTEST, "--benchmark-json=out.json")
    assert result.ret == 1
    lines = result.stdout.str().splitlines()
    at = lines.index(next(line for line in lines if "_ test_pairs _" in line))
    assert lines[at + 1] == ("this case's results cannot be saved: extra_info['by_pair'] has the key (0, 1) of "
                             "type tuple: JSON object keys must be strings (or numbers, booleans, None). Use a "
                             "string key, e.g. '0, 1'")
    assert any(line.startswith("FAILED test_cases.py::test_pairs") for line in lines)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert first.read_bytes() == before
    [_, second] = _runs(pytester)
    for doc in (json.loads(second.read_text()), json.loads((pytester.path / "out.json").read_text())):
        assert [b["name"] for b in doc["benchmarks"]] == ["test_good"]
        assert doc["ddpbench_run"]["complete"] is False


def test_a_run_that_cannot_be_serialised_is_not_saved_and_says_why(tmp_path):
    from ddpbench import storage

    folder = tmp_path / "m"
    storage.save_run(folder, "ok", {"benchmarks": []})
    bad = {"benchmarks": [{"fullname": "t.py::test_x", "extra_info": {"nested": [{(1, 2): 3}]}}]}
    with pytest.raises(storage.SaveError, match=r"t.py::test_x: extra_info\['nested'\]\[0\] has the key \(1, 2\)"):
        storage.save_run(folder, "bad", bad)
    assert _files(folder) == ["0001_ok.json"]


def _limited_file_size(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
    return apply


def test_a_write_that_fails_part_way_leaves_the_storage_as_it_was(pytester):
    pytester.makepyfile(test_cases=CASES)
    assert pytester.runpytest_subprocess(*PYTEST, "--benchmark-json=out.json").ret == 0
    [first] = _runs(pytester)
    saved, report = first.read_bytes(), (pytester.path / "out.json").read_bytes()
    assert len(saved) > 4096
    # The next run may write only 4 KiB per file: its run's file cannot be written whole.
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-m", "pytest", *PYTEST, "--benchmark-json=out.json"],
                         cwd=pytester.path, capture_output=True, text=True, env=env,
                         preexec_fn=_limited_file_size(4096), timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == pytest.ExitCode.INTERNAL_ERROR, text
    assert "ddpbench: ERROR: the run was not saved: cannot write the run in" in text
    assert "File too large" in text and "the saved runs are as they were" in text
    assert "ddpbench: ERROR: --benchmark-json was not written: cannot write out.json" in text
    assert "Traceback" not in text
    assert _files(_machine_folder(pytester)) == [first.name]  # no partial run, no temporary file
    assert first.read_bytes() == saved and (pytester.path / "out.json").read_bytes() == report


# ---------------------------------------------------------------------------------------------
# numbers: never shared, never run out
# ---------------------------------------------------------------------------------------------


def test_a_save_that_loses_the_race_for_a_number_takes_the_next(tmp_path):
    from ddpbench import storage

    folder = tmp_path / "m"
    storage.save_run(folder, "first", {"benchmarks": []})
    stale = iter([1, 1, 2])  # what another process saw just before the first run took 0001
    path = storage.save_run(folder, "second", {"benchmarks": [1]}, number=lambda _: next(stale))
    assert path.name == "0002_second.json"
    assert json.loads((folder / "0001_first.json").read_text()) == {"benchmarks": []}


def test_concurrent_saves_get_distinct_numbers(tmp_path):
    from ddpbench import storage

    folder = tmp_path / "m"
    start = threading.Barrier(8)

    def save(i):
        start.wait()
        for j in range(5):
            storage.save_run(folder, f"t{i}", {"benchmarks": [i, j]})

    threads = [threading.Thread(target=save, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = _saved_runs(folder)
    assert [_number(p) for p in runs] == list(range(1, 41))
    assert sorted(tuple(json.loads(p.read_text())["benchmarks"]) for p in runs) == \
        sorted((i, j) for i in range(8) for j in range(5))
    assert _files(folder) == [p.name for p in runs]  # no temporary file left


BARRIER = """
import os, time

def pytest_benchmark_update_json(config, benchmarks, output_json):
    # the last moment before pytest-benchmark saves: every run waits here for the others
    folder = os.environ["BARRIER_DIR"]
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.time() + 60
    while len(os.listdir(folder)) < int(os.environ["BARRIER_N"]) and time.time() < deadline:
        time.sleep(0.0005)
"""


def test_runs_saving_at_the_same_moment_do_not_share_a_number(pytester):
    pytester.makepyfile(test_cases=CASES)
    pytester.makeconftest(BARRIER)
    runs_at_once = 4
    barrier = pytester.path / "barrier"
    barrier.mkdir()
    env = dict(os.environ, BARRIER_DIR=str(barrier), BARRIER_N=str(runs_at_once))
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", *PYTEST], cwd=pytester.path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(runs_at_once)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output
    runs = _runs(pytester)
    assert [_number(p) for p in runs] == list(range(1, runs_at_once + 1)), outputs
    for path in runs:
        assert [b["name"] for b in json.loads(path.read_text())["benchmarks"]] == ["test_a", "test_b", "test_c"]


def test_runs_are_numbered_and_read_past_9999(pytester):
    pytester.makepyfile(test_cases=CASES)
    assert pytester.runpytest_subprocess(*PYTEST).ret == 0
    [first] = _runs(pytester)
    first.rename(first.with_name("9999_" + first.name.split("_", 1)[1]))
    for _ in range(2):
        result = pytester.runpytest_subprocess(*PYTEST)
        assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert [_number(p) for p in _runs(pytester)] == [9999, 10000, 10001]
    out = _compare(pytester)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "/10000_" in out.stdout.split("baseline:")[1].splitlines()[0]
    assert "/10001_" in out.stdout.split("candidate:")[1].splitlines()[0]
    # pytest-benchmark's own search sees four digits only: it would compare against 9999
    result = pytester.runpytest_subprocess("--benchmark-compare", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*numbered past 9999*--benchmark-compare=10001*"])
    assert pytester.runpytest_subprocess("--benchmark-compare=10001", "-p", "no:cacheprovider").ret == 0
