"""The pytest-benchmark flow on a distributed case, end to end (pytester subprocesses):

save a baseline (--benchmark-autosave --benchmark-save-data), slow the workload 3x, and see the
native gate (--benchmark-compare --benchmark-compare-fail=median:10%) fail, an unchanged rerun pass
a loose gate, --benchmark-json write the rounds, and `ddpbench compare` / `ddpbench report` read the
saved runs (including a stats-only run saved without --benchmark-save-data).

Robust on a loaded 2-core machine: the round is a 50 ms sleep on each of 2 ranks and the deliberate
slowdown is 3x, far beyond the 10% gate that must fail. Nothing asserts that an unchanged rerun
stays within 10%: under `make test -n 2` next to other work, a few ms of extra wake-up latency per
round can move a 50 ms median that much. The passing side uses a 100% gate (median:100%, and
--threshold 100% for `ddpbench compare`): it still shows that the gate compares and passes, and
that the fallback to summary stats gives a verdict, without a timing bet.
"""

from __future__ import annotations

import json

import pytest

from ddpbench import cli
from ddpbench.testing import INJECT_ENV, parse_injected_slowdown

pytest_plugins = ["pytester"]

WORKLOAD = '''
import os
import time

from ddpbench.workloads import Workload


class Sleepy(Workload):
    """Each round sleeps FLOW_DELAY_S on every rank (read at set-up, in the rank processes)."""

    group = "flow"

    def setup(self, ctx):
        return {"delay": float(os.environ["FLOW_DELAY_S"])}

    def run_round(self, state):
        time.sleep(state["delay"])

    def extra_info(self, world_size, median_s):
        return {"flow_delay_s": float(os.environ["FLOW_DELAY_S"])}
'''

BENCH = '''
from flowwork import Sleepy


def test_sleepy(dist_benchmark):
    dist_benchmark(Sleepy())
'''

COMMON = ["-p", "no:cacheprovider", "--dist-world-sizes=2", "--dist-rounds=7", "--dist-warmup=1",
          "-m", "not gpu", "--benchmark-autosave", "--benchmark-save-data"]
GATE = ["--benchmark-compare=0001", "--benchmark-compare-fail=median:10%"]  # the must-fail side (3x)
LOOSE_GATE = ["--benchmark-compare=0001", "--benchmark-compare-fail=median:100%"]  # the passing side
BASE_DELAY = "0.05"
SLOW_DELAY = "0.15"  # 3x


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch):
    # under `make test` (-n 2) this test runs in an xdist worker; pytest-benchmark in the child
    # would see PYTEST_XDIST_WORKER and disable benchmarking
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


def _run(pytester, monkeypatch, delay, *args, save_data=True):
    monkeypatch.setenv("FLOW_DELAY_S", delay)
    common = COMMON if save_data else [a for a in COMMON if a != "--benchmark-save-data"]
    return pytester.runpytest_subprocess(*common, *args, timeout=180)


def _saved(pytester):
    return sorted((pytester.path / ".benchmarks").glob("*/*.json"))


def test_native_gate_and_ddpbench_compare_end_to_end(pytester, monkeypatch, capsys):
    pytester.makepyfile(flowwork=WORKLOAD, test_flow=BENCH)

    base = _run(pytester, monkeypatch, BASE_DELAY)
    assert base.ret == 0, base.stdout.str()
    [baseline] = _saved(pytester)
    assert baseline.name.startswith("0001_")
    doc = json.loads(baseline.read_text())
    [case] = doc["benchmarks"]
    assert case["name"] == "test_sleepy[gloo-2p]"
    assert len(case["stats"]["data"]) == 7  # raw rounds saved (--benchmark-save-data)
    assert case["extra_info"]["backend"] == "gloo" and case["extra_info"]["world_size"] == 2
    assert doc["ddpbench_calibration"]["min_s"] > 0  # drift probe recorded, beside machine_info

    slow = _run(pytester, monkeypatch, SLOW_DELAY, *GATE, "--benchmark-json=slow.json")
    output = slow.stdout.str() + slow.stderr.str()
    assert slow.ret != 0, output
    # pytest-benchmark's own message (it logs to stderr and raises PerformanceRegression)
    assert "Performance has regressed:" in output
    assert "test_sleepy[gloo-2p]" in output.split("Performance has regressed:")[1]
    assert len(json.loads((pytester.path / "slow.json").read_text())["benchmarks"][0]["stats"]["data"]) == 7
    # the same machine: no "machine_info is different" (the probe's timings are kept beside it), and
    # ddpbench's own verdicts for the same pair under pytest-benchmark's table, said to be informational
    assert "machine_info is different" not in output
    verdicts = output.split("ddpbench: noise-aware verdicts for the same comparison")[1]
    assert "candidate: this session" in verdicts and "test_sleepy[gloo-2p]" in verdicts
    assert "`ddpbench compare` is the gate" in verdicts

    # a baseline saved when ddpbench kept its probe in machine_info: still no warning
    doc = json.loads(baseline.read_text())
    doc["machine_info"]["ddpbench_calibration"] = doc.pop("ddpbench_calibration")
    baseline.write_text(json.dumps(doc))

    # the unchanged rerun is saved without --benchmark-save-data (stats only) to see compare's fallback
    same = _run(pytester, monkeypatch, BASE_DELAY, *LOOSE_GATE, save_data=False)
    assert same.ret == 0, same.stdout.str()
    assert "Performance has regressed" not in same.stdout.str() + same.stderr.str()
    assert "machine_info is different" not in same.stdout.str() + same.stderr.str()

    runs = _saved(pytester)
    assert [p.name[:4] for p in runs] == ["0001", "0002", "0003"]

    # the noise-aware gate on the same saved runs (in-process: a subprocess would only re-import).
    # --calibration never: the workload is a sleep, which a CPU probe does not describe (on a
    # loaded machine normalising by it could only add noise here)
    monkeypatch.chdir(pytester.path)
    capsys.readouterr()
    assert cli.main(["compare", "--calibration", "never", "--json", "1", "2"]) == 1
    [verdict] = json.loads(capsys.readouterr().out)["cases"]
    assert verdict["verdict"] == "regression" and verdict["ratio"] > 2
    # run 3 holds only summary stats: verdicts from them, said so, exit 2 unless accepted
    assert cli.main(["compare", "--calibration", "never", "1", "3"]) == 2
    out, err = capsys.readouterr()
    assert "summary stats" in out and "--benchmark-save-data" in err and "Traceback" not in err
    assert cli.main(["compare", "--calibration", "never", "--json", "--allow-summary-stats",
                     "--threshold", "100%", "1", "3"]) == 0
    [verdict] = json.loads(capsys.readouterr().out)["cases"]
    assert verdict["verdict"] == "same" and verdict["method"] == "summary-stats"  # within 100%
    # with no run named: the two newest runs (0002 slow -> 0003 back to normal: an improvement)
    assert cli.main(["compare", "--calibration", "never", "--allow-summary-stats"]) == 0
    assert "improvement" in capsys.readouterr().out

    assert cli.main(["report", "slow.json", "--no-chart"]) == 0
    assert "| test_sleepy[gloo-2p] |" in capsys.readouterr().out


def test_injected_slowdown_knob():
    assert parse_injected_slowdown("all_reduce:10%") == {"all_reduce": 0.10}
    assert parse_injected_slowdown(" all_reduce:10, broadcast:2.5% ") == {"all_reduce": 0.10, "broadcast": 0.025}
    assert parse_injected_slowdown("") == {} and parse_injected_slowdown(None) == {}
    for bad in ("all_reduce", "allreduce:10%", "all_reduce:-5%", "all_reduce:ten"):
        with pytest.raises(ValueError, match=INJECT_ENV):
            parse_injected_slowdown(bad)


KNOB_BENCHMARK = """
from ddpbench.workloads.collectives import Collective

def test_all_reduce(dist_benchmark):
    dist_benchmark(Collective("all_reduce", 4096), rounds=3, warmup=1)

def test_broadcast(dist_benchmark):
    dist_benchmark(Collective("broadcast", 4096), rounds=3, warmup=1)
"""


def test_the_knob_slows_only_the_named_op_and_only_with_the_testing_plugin(pytester, monkeypatch):
    # The product's timed path never reads the variable: without -p ddpbench.testing it does nothing.
    monkeypatch.setenv(INJECT_ENV, "all_reduce:10%")
    pytester.makepyfile(test_knob=KNOB_BENCHMARK)
    for plugin, expected in ((["-p", "ddpbench.testing"], 10.0), ([], None)):
        result = pytester.runpytest_subprocess(*plugin, "-m", "not gpu", "-p", "no:cacheprovider",
                                               "--benchmark-json=knob.json", timeout=120)
        assert result.ret == 0, result.stdout.str()
        cases = {c["name"]: c["extra_info"] for c in json.loads((pytester.path / "knob.json").read_text())["benchmarks"]}
        assert cases["test_all_reduce[gloo-2p]"].get("injected_slowdown_pct") == expected
        assert "injected_slowdown_pct" not in cases["test_broadcast[gloo-2p]"]
        assert cases["test_all_reduce[gloo-2p]"]["op"] == "all_reduce"  # the wrapper keeps the case's extra_info
