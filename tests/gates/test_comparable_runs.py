"""Only comparable runs are compared, and a partial run is never the default baseline.

* what decides a case's measurement is recorded with every saved run (a real pytest run saves it);
* ``ddpbench compare`` refuses runs whose torch, CUDA, NCCL, engine, Python, CPU or GPUs differ
  (exit 2 naming each difference and ``--allow-different``), never over a hostname; a case whose own
  facts differ (pinning, ops per round...) is inconclusive with the difference; older runs without a
  fingerprint are compared on what they record, said so;
* with no run named, the baseline is the newest *complete* run of the current run's machine and
  branch, and the output says which runs it passed over.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from helpers.benchjson import MACHINE, bench, run_cli, run_doc, write
from ddpbench import cli
from ddpbench.storage.runs import choose_runs, resolve_run, saved_runs


def sample(seed, median, n=30):
    return list(median * np.exp(np.random.default_rng(seed).normal(0.0, 0.03, n)))


CASE = "test_all_reduce[gloo-2p-1MB]"
CPU_CASE = {"backend": "gloo", "world_size": 2, "device": "cpu", "nodes": 1, "pinned_cores": False,
            "ops_per_round": 1}


def _pair(tmp_path, base_facts=None, cur_facts=None, base_machine=None, cur_machine=None,
          base_extra=None, cur_extra=None, slowdown=1.0):
    b = write(tmp_path / "base.json", run_doc([bench(CASE, sample(1, 0.002), extra_info=base_extra or CPU_CASE)],
                                              fingerprint=base_facts, machine=base_machine))
    c = write(tmp_path / "cur.json", run_doc([bench(CASE, sample(2, 0.002 * slowdown), extra_info=cur_extra or CPU_CASE)],
                                             fingerprint=cur_facts, machine=cur_machine))
    return str(b), str(c)


# ---------------------------------------------------------------------------------------------
# recorded with every saved run of a session that uses ddpbench
# ---------------------------------------------------------------------------------------------

# a ddpbench case that starts no ranks: it asks for a ddpbench fixture
WITH_DDPBENCH = """
def test_a(benchmark, dist_round_plan):
    benchmark(sum, range(100))
"""

PLAIN = """
def test_a(benchmark):
    benchmark(sum, range(100))
"""

# after the run is saved (pytest_sessionfinish): whether anything imported torch
TORCH_AT_END = """
import sys

def pytest_unconfigure(config):
    with open("torch_imported.txt", "w") as fh:
        fh.write(str("torch" in sys.modules))
"""


def test_every_saved_run_records_its_fingerprint_and_completeness(pytester):
    import torch
    from pytest_benchmark.utils import get_machine_id

    import ddpbench
    from ddpbench.devices import cpu_count
    from ddpbench.gates.ab.side_environments import source_digest

    pytester.makepyfile(test_ddpbench=WITH_DDPBENCH)
    result = pytester.runpytest_subprocess("--benchmark-autosave", "--benchmark-json=run.json",
                                           "-p", "no:cacheprovider")
    assert result.ret == 0
    [saved] = (pytester.path / ".benchmarks" / get_machine_id()).glob("*.json")
    for doc in (json.loads(saved.read_text()), json.loads((pytester.path / "run.json").read_text())):
        facts = doc["machine_info"]["ddpbench_fingerprint"]
        assert facts["torch"] == torch.__version__  # the full version: 2.13.0+cpu on a CPU build
        assert facts["cuda"] == torch.version.cuda
        assert facts["engine"] == source_digest(os.path.dirname(ddpbench.__file__))
        assert facts["python"].endswith(".".join(map(str, sys.version_info[:3])))
        assert facts["cpu_model"] and facts["cpu_cores"] == cpu_count()
        assert isinstance(facts["gpus"], list) and "node" not in facts
        assert doc["ddpbench_run"] == {"complete": True, "exitstatus": 0, "failed": 0, "failed_cases": [],
                                       "stopped": None}
        # the calibration probe is a measurement: beside machine_info, whose facts pytest-benchmark
        # compares to warn of another machine
        assert doc["ddpbench_calibration"]["min_s"] > 0 and "ddpbench_calibration" not in doc["machine_info"]


def test_a_plain_pytest_benchmark_run_gets_no_ddpbench_facts_and_no_torch(pytester):
    """Without a ddpbench case the run is pytest-benchmark's own (plus whether it is complete)."""
    pytester.makepyfile(test_plain=PLAIN)
    pytester.makeconftest(TORCH_AT_END)
    result = pytester.runpytest_subprocess("--benchmark-json=run.json", "-p", "no:cacheprovider")
    assert result.ret == 0
    doc = json.loads((pytester.path / "run.json").read_text())
    assert not {"ddpbench_fingerprint", "ddpbench_gpus", "ddpbench_calibration"} & set(doc["machine_info"])
    assert "ddpbench_calibration" not in doc and doc["ddpbench_run"]["complete"] is True
    assert (pytester.path / "torch_imported.txt").read_text() == "False"


# ---------------------------------------------------------------------------------------------
# run facts: refused unless allowed
# ---------------------------------------------------------------------------------------------


def test_a_changed_torch_is_refused_naming_the_difference_and_the_override(tmp_path, capsys):
    b, c = _pair(tmp_path, base_facts={"torch": "2.12.0+cpu"}, cur_facts={},
                 slowdown=1.3)  # a slowdown that is torch's, not the code's
    rc, out, err = run_cli(capsys, "compare", b, c)
    assert rc == 2 and out == ""
    assert err.startswith("ddpbench compare: error: the runs are not comparable")
    assert "torch '2.12.0+cpu' -> '2.13.0+cpu'" in err and "--allow-different torch" in err
    rc, out, err = run_cli(capsys, "compare", b, c, "--allow-different", "torch")
    assert rc == 1 and "compared although torch '2.12.0+cpu' -> '2.13.0+cpu'" in out


def test_every_run_fact_that_differs_is_named(tmp_path, capsys):
    other = {"torch": "2.13.0+cu128", "cuda": "12.8", "nccl": "2.27.3", "engine": "f" * 64,
             "python": "CPython 3.12.1", "cpu_model": "Other CPU", "cpu_cores": 4, "gpus": ["NVIDIA H100"]}
    b, c = _pair(tmp_path, base_facts={}, cur_facts=other)
    rc, _, err = run_cli(capsys, "compare", b, c)
    assert rc == 2
    for text in ("torch '2.13.0+cpu' -> '2.13.0+cu128'", "cuda None -> '12.8'", "nccl None -> '2.27.3'",
                 "engine eeeeeeeeeeee -> ffffffffffff", "python 'CPython 3.11' -> 'CPython 3.12'",
                 "cpu_model 'Test CPU' -> 'Other CPU'", "cpu_cores 2 -> 4", "gpus none -> NVIDIA H100",
                 "--allow-different torch,cuda,nccl,engine,python,cpu_model,cpu_cores,gpus"):
        assert text in err
    assert run_cli(capsys, "compare", b, c, "--allow-different", "all")[0] == 0
    assert run_cli(capsys, "compare", b, c, "--allow-different", "torch,cuda,nccl,engine",
                 "--allow-different", "python,cpu_model")[0] == 2  # cpu_cores and gpus still differ


def test_a_new_hostname_or_python_patch_release_is_not_a_difference(tmp_path, capsys):
    # Every hosted runner has another hostname; a kernel or Python patch update is said, not refused.
    b, c = _pair(tmp_path, base_facts={}, cur_facts={"python": "CPython 3.11.9", "kernel": "6.5"},
                 cur_machine=dict(MACHINE, node="fv-az123-456", release="6.5"))
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 0 and "WARNING" not in out and "fv-az" not in out
    assert "note: Python CPython 3.11.7 -> CPython 3.11.9 (a patch release: compared)" in out
    assert "note: kernel 6.0 -> 6.5 (compared)" in out


def test_runs_without_run_facts_are_compared_on_what_they_record(tmp_path, capsys):
    b, c = _pair(tmp_path, base_facts=None, cur_facts={})  # the baseline: an older ddpbench
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 0
    assert ("WARNING: base.json recorded no run facts (saved by an older ddpbench or another tool): "
            "torch, cuda, nccl, engine, cpu_cores cannot be checked") in " ".join(out.split())
    # what an older run does record is still checked: its CPU, and the versions of a GPU run
    b, c = _pair(tmp_path / "gpu", base_facts=None, cur_facts={"torch": "2.13.0+cu128", "gpus": ["NVIDIA H100"]},
                 base_machine=dict(MACHINE, ddpbench_gpus={"devices": ["NVIDIA H100"], "torch": "2.12.0+cu126",
                                                           "cuda": "12.6", "nccl": "2.26.2"}))
    rc, _, err = run_cli(capsys, "compare", b, c)
    assert rc == 2 and "torch '2.12.0+cu126' -> '2.13.0+cu128'" in err


def test_bad_allow_different_values_are_usage_errors(tmp_path, capsys):
    b, c = _pair(tmp_path, base_facts={}, cur_facts={})
    with pytest.raises(SystemExit) as exc:
        cli.main(["compare", b, c, "--allow-different", "hostname"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown fact hostname" in err and "torch" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# case facts: marked per case
# ---------------------------------------------------------------------------------------------


def test_a_case_measured_differently_is_marked_not_compared(tmp_path, capsys):
    pinned = dict(CPU_CASE, pinned_cores=True)
    b, c = _pair(tmp_path, base_facts={}, cur_facts={}, cur_extra=pinned, slowdown=0.7)
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 0
    line = next(line for line in out.splitlines() if line.startswith(CASE))
    assert line.endswith("inconclusive (unlike: pinned_cores False -> True)")
    assert "--allow-different pinned_cores compares them anyway" in out
    rc, out, _ = run_cli(capsys, "compare", b, c, "--allow-different", "pinned_cores", "--json")
    [case] = json.loads(out)["cases"]
    assert case["verdict"] == "improvement" and case["reason"] == "unlike, allowed: pinned_cores False -> True"


def test_ops_per_round_compares_the_setting_not_the_count_auto_chose():
    from ddpbench.gates import fingerprint

    gpu_case = dict(CPU_CASE, device="cuda", backend="nccl")
    auto = lambda n: dict(gpu_case, ops_per_round=n, round_fixed_cost_s=1e-5)
    assert fingerprint.case_differences(auto(8), auto(16)) == []  # auto both times: the same setting
    diff = fingerprint.case_differences(dict(gpu_case, ops_per_round=1), auto(16))
    assert [d.describe() for d in diff] == ["ops_per_round 1 -> 'auto'"]
    graphs = fingerprint.case_differences(CPU_CASE, dict(CPU_CASE, cuda_graphs=True))
    assert [d.describe() for d in graphs] == ["cuda_graphs False -> True"]
    assert fingerprint.case_differences({}, {"unknown": 1}) == []  # another tool's cases: nothing to tell


# ---------------------------------------------------------------------------------------------
# the default pair: never a partial baseline
# ---------------------------------------------------------------------------------------------


def _saved(folder, number, median, run=None, branch="main", facts=None, cases=("a", "b")):
    doc = run_doc([bench(n, sample(number, median)) for n in cases], fingerprint=facts or {},
                  run=run, commit={"branch": branch})
    return write(folder / f"{number:04d}_run.json", doc)


def test_the_default_baseline_skips_incomplete_runs_and_says_so(tmp_path, capsys, monkeypatch):
    folder = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    _saved(folder, 1, 0.002)
    _saved(folder, 2, 0.002, run={"complete": False, "exitstatus": 1, "failed": 1,
                                 "failed_cases": ["benchmarks/test_x.py::b"], "stopped": "stopping after 1 failures"},
           cases=("a",))
    _saved(folder, 3, 0.002)
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_cli(capsys, "compare")
    assert rc == 0
    assert f"baseline:  {folder / '0001_run.json'}".replace(str(tmp_path) + "/", "") in out
    assert "candidate: .benchmarks/Linux-CPython-3.11-64bit/0003_run.json" in out
    assert "baseline chosen: the newest complete run of this machine on branch main" in out
    assert ("passed over 0002_run.json: incomplete: 1 failed or erroring case(s) (benchmarks/test_x.py::b); "
            "stopped early (stopping after 1 failures)") in out
    rc, out, _ = run_cli(capsys, "compare", "--json")
    assert json.loads(out)["selection"][1].startswith("passed over 0002_run.json: incomplete")
    # the incomplete run as the current one: compared, said so, its lost case fails the gate
    (folder / "0003_run.json").unlink()
    rc, out, _ = run_cli(capsys, "compare")
    assert rc == 1 and "the candidate 0002_run.json is incomplete" in out and "missing" in out


def test_the_default_baseline_is_of_the_same_machine_and_branch(tmp_path, capsys, monkeypatch):
    folder = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    _saved(folder, 1, 0.002, branch="feature")
    _saved(folder, 2, 0.002, branch="main")
    _saved(folder, 3, 0.002, branch="feature", facts={"cpu_model": "Other CPU"})
    _saved(folder, 4, 0.002, branch="feature")
    selection = choose_runs(tmp_path / ".benchmarks")
    assert selection.baseline.name == "0001_run.json" and selection.current.name == "0004_run.json"
    assert selection.lines == ["baseline chosen: the newest complete run of this machine on branch feature",
                               "passed over 0003_run.json: another machine (cpu_model 'Other CPU' -> 'Test CPU')",
                               "passed over 0002_run.json: branch main, not feature"]
    # a detached checkout (a CI job's pull request) names no branch: the newest of any branch
    _saved(folder, 5, 0.002, branch="(detached head)")
    assert choose_runs(tmp_path / ".benchmarks").baseline.name == "0004_run.json"
    # no run of the current branch: the newest complete run of this machine, said so
    _saved(folder, 6, 0.002, branch="new-idea")
    selection = choose_runs(tmp_path / ".benchmarks")
    assert selection.baseline.name == "0005_run.json"
    assert selection.lines[0] == ("baseline chosen: the newest complete run of this machine, from branch "
                                  "unknown: no complete run of branch new-idea qualifies")


def test_no_complete_baseline_is_an_error_naming_the_runs_passed_over(tmp_path, capsys, monkeypatch):
    folder = tmp_path / ".benchmarks" / "m"
    _saved(folder, 1, 0.002, run={"complete": False, "exitstatus": 3, "failed": 0})
    _saved(folder, 2, 0.002)
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(capsys, "compare")
    assert rc == 2
    assert "no complete saved run of this machine to compare 0002_run.json with" in err
    assert "0001_run.json: incomplete: pytest exit status 3 (internal error)" in err
    assert "ddpbench compare BASELINE CURRENT" in err
    assert run_cli(capsys, "compare", "1", "2")[0] == 0  # named runs are compared as named


def test_runs_numbered_past_9999_are_listed_in_number_order(tmp_path):
    folder = tmp_path / ".benchmarks" / "m"
    for number in (9998, 9999, 10000, 10001):
        _saved(folder, number, 0.002)
    assert [p.name for p in saved_runs(tmp_path / ".benchmarks")] == [
        "9998_run.json", "9999_run.json", "10000_run.json", "10001_run.json"]
    selection = choose_runs(tmp_path / ".benchmarks")
    assert (selection.baseline.name, selection.current.name) == ("10000_run.json", "10001_run.json")
    assert resolve_run("10000", tmp_path / ".benchmarks").name == "10000_run.json"
    assert resolve_run("9999", tmp_path / ".benchmarks").name == "9999_run.json"
