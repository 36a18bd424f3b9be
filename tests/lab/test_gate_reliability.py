"""lab/reference/gate_reliability.py: which cases count for power, the pytest command it runs and
its table over saved runs (synthetic here: unchanged reruns whose medians move between runs, and
trials slowed by 30%)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from helpers.benchjson import bench, run_doc, write
from helpers.lab_scripts import load_lab_script


@pytest.fixture(scope="module")
def reliability():
    return load_lab_script("gate_reliability")


def test_power_counts_the_injected_ops_at_10_mb_and_up_and_the_training_steps(reliability):
    inject = reliability.DEFAULT_INJECT
    assert reliability.injected_case("test_all_reduce[gloo-2p-10MB]", inject)
    assert not reliability.injected_case("test_all_reduce[gloo-2p-1MB]", inject)
    assert reliability.injected_case("test_transformer[gloo-2p-cpu-small-ddp]", inject)
    assert not reliability.injected_case("test_training[gloo-2p-mlp-ddp-accum1-b32]", "all_reduce:20%")


def test_the_pytest_command_saves_raw_rounds_with_the_injection_plugin(reliability, tmp_path):
    args = argparse.Namespace(
        cases="collectives", select=None, pools=3, python="py", out=str(tmp_path), pytest_args=["-x"])
    cmd = reliability.pytest_command(args, "rerun01")
    assert cmd[:3] == ["py", "-m", "pytest"] and "ddpbench.testing" in cmd and "--benchmark-save-data" in cmd
    assert "--benchmark-save=rerun01" in cmd and "--dist-case-pools=3" in cmd and cmd[-1] == "-x"


def test_the_table_reads_each_run_against_the_baseline_lever_by_lever(reliability, tmp_path, capsys):
    rng = np.random.default_rng(0)
    folder = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    labels = ["baseline"] + [f"rerun{i:02d}" for i in range(1, 7)] + ["inject01", "inject02"]
    for number, label in enumerate(labels, start=1):
        slow = 1.3 if label.startswith("inject") else 1.0
        level = 0.01 * slow * np.exp(rng.normal(0.0, 0.06))  # the run's own effect
        data = list(level * np.exp(rng.normal(0.0, 0.02, 30)))
        write(folder / f"{number:04d}_{label}.json", run_doc([bench("test_all_reduce[gloo-2p-10MB]", data)]))
    args = argparse.Namespace(out=str(tmp_path), inject=reliability.DEFAULT_INJECT, load=None)
    reliability.compare(args)
    out = capsys.readouterr().out
    assert "6 unchanged reruns and 2 injected trials" in out
    totals = {line.split(" false")[0].strip(): line for line in out.splitlines() if "case comparisons" in line}
    assert set(totals) == set(reliability.READINGS)
    assert "false regressions 0/6 case comparisons" in totals["after"]
    assert "power at the injected slowdown" in totals["after"] and "/2 (" in totals["after"]
