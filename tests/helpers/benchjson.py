"""Builders of pytest-benchmark JSON documents (the shape pytest-benchmark 5.x writes) for tests, and
:func:`run_cli`, which runs ``ddpbench`` on them in-process."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

MACHINE = {"node": "box", "processor": "x86_64", "machine": "x86_64", "system": "Linux",
           "release": "6.0", "python_implementation": "CPython", "python_version": "3.11.7",
           "cpu": {"brand_raw": "Test CPU"}}


def stats_of(data, include_data=True):
    data = list(data)
    ordered = sorted(data)
    n = len(ordered)
    q1, q3 = ordered[n // 4], ordered[(3 * n) // 4]
    stats = {"min": ordered[0], "max": ordered[-1], "mean": statistics.fmean(data),
             "stddev": statistics.stdev(data) if n > 1 else 0.0, "rounds": n,
             "median": statistics.median(data), "iqr": q3 - q1, "q1": q1, "q3": q3,
             "iqr_outliers": 0, "stddev_outliers": 0, "outliers": "0;0", "ld15iqr": ordered[0],
             "hd15iqr": ordered[-1], "ops": 1 / statistics.fmean(data), "total": sum(data),
             "iterations": 1}
    if include_data:
        stats["data"] = data
    return stats


def bench(name, data, extra_info=None, group=None, include_data=True, module="benchmarks/test_x.py"):
    return {"group": group, "name": name, "fullname": f"{module}::{name}", "params": None,
            "param": None, "extra_info": dict(extra_info or {}), "options": {},
            "stats": stats_of(data, include_data)}


# A fingerprint as ddpbench records it (ddpbench.gates.fingerprint.run_facts).
FINGERPRINT = {"version": 1, "torch": "2.13.0+cpu", "cuda": None, "nccl": None, "engine": "e" * 64,
               "ddpbench_version": "0.1.0", "python": "CPython 3.11.7", "cpu_model": "Test CPU",
               "cpu_cores": 2, "gpus": [], "kernel": "6.0"}


def run_doc(benchmarks, probe_s=0.001, machine=None, include_probe=True, commit=None,
            saved="2026-01-01T00:00:00", fingerprint=None, run=None):
    """A run; ``commit``: commit_info fields (pytest-benchmark's id, time, branch, dirty) over the
    default ``{"id": "abc"}``; ``saved``: the run's datetime; ``fingerprint``: facts over
    :data:`FINGERPRINT` (default: none recorded, as an older ddpbench saved); ``run``: the run's
    completeness record (``{"complete": False, "failed": 1, ...}``; default: none)."""
    machine_info = dict(MACHINE if machine is None else machine)
    if include_probe:
        machine_info["ddpbench_calibration"] = {
            "kind": "memcpy-4MiB+matmul-128-float32-1thread", "version": 1, "min_s": probe_s,
            "median_s": probe_s * 1.1, "repeats": 100}
    if fingerprint is not None:
        machine_info["ddpbench_fingerprint"] = {**FINGERPRINT, **fingerprint}
    doc = {"machine_info": machine_info, "commit_info": {"id": "abc", **(commit or {})},
           "benchmarks": list(benchmarks), "datetime": saved, "version": "5.3.1"}
    if run is not None:
        doc["ddpbench_run"] = {"complete": True, "exitstatus": 0, "failed": 0, "failed_cases": [],
                               "stopped": None, **run}
    return doc


def write(path, doc) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def run_cli(capsys, *argv):
    """``ddpbench ARGV`` in-process: (exit status, stdout, stderr); it must never print a traceback."""
    from ddpbench import cli

    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def after_quiet_history(folder, base_doc, cur_doc, history: int = 4) -> tuple[Path, Path]:
    """``base_doc`` and ``cur_doc`` saved as runs ``history`` + 1 and + 2 of a machine folder, after
    ``history`` copies of the baseline: the stored gate's run-to-run component then reads a quiet
    machine (5 saved runs, none moving), so the timing verdict is the rounds' own, as two runs of one
    quiet session would give it. For tests of what a comparison shows besides the run-to-run
    spread (tests/gates/test_run_to_run.py tests that)."""
    folder = Path(folder) / "Linux-CPython-3.11-64bit"
    for i in range(history):
        write(folder / f"{i + 1:04d}_history.json", base_doc)
    base = write(folder / f"{history + 1:04d}_base.json", base_doc)
    return base, write(folder / f"{history + 2:04d}_cur.json", cur_doc)
