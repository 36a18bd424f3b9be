"""Every stored-run consumer reads the same interval, the run-to-run component in it
(docs/design/gates.md#run-to-run-variance): ``ddpbench compare`` (and ``make compare``, which runs
it), the verdicts under ``pytest --benchmark-compare``, and the history page's change points with
the ``ddpbench bisect`` command each suggests."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from helpers.benchjson import bench, run_cli, run_doc, write
from ddpbench.gates import benchmark_compare, stats
from ddpbench.gates import stored_run_gate as gate
from ddpbench.history import build_history
from ddpbench.storage.runs import history_runs, load_run

ROOT = Path(__file__).resolve().parents[2]
FOLDER = "Linux-CPython-3.11-64bit"
CASE = "test_all_reduce[gloo-2p-10MB]"
INFO = {"backend": "gloo", "world_size": 2, "device": "cpu", "op": "all_reduce", "size_bytes": 10 << 20}


def storage_of(tmp_path, levels, seed=0, run_sd=0.04):
    """Saved runs of one case, one per level (x its run's own effect), in one machine folder."""
    rng = np.random.default_rng(seed)
    folder = tmp_path / ".benchmarks" / FOLDER
    paths = []
    for i, level in enumerate(levels):
        run_level = level * np.exp(rng.normal(0.0, run_sd))
        data = list(run_level * np.exp(rng.normal(0.0, 0.02, 30)))
        commit = {"id": f"{i:07x}abcdef", "time": f"2026-01-{i + 1:02d}T00:00:00+00:00", "branch": "main"}
        paths.append(write(folder / f"{i + 1:04d}_run{i}.json",
                           run_doc([bench(CASE, data, INFO)], commit=commit, saved=f"2026-01-{i + 1:02d}T01:00:00")))
    return tmp_path / ".benchmarks", paths


def test_ddpbench_compare_reads_the_history_of_its_storage(tmp_path, capsys):
    storage, paths = storage_of(tmp_path, [0.01] * 8)
    rc, out, _ = run_cli(capsys, "compare", "--storage", str(storage), "--json")
    [case] = json.loads(out)["cases"]
    # the default pair: run 8 against run 7, the history runs 1..7 (the current run left out)
    assert case["details"]["run_to_run"]["source"] == "history, 7 runs"
    history, _ = history_runs(paths[-1].parent, paths[-1])
    expected = gate.compare_runs(load_run(paths[-2]), load_run(paths[-1]), history=history).cases[0]
    assert (case["ci_low"], case["ci_high"], case["p_value"]) == pytest.approx(
        (expected.ci_low, expected.ci_high, expected.p_value))
    assert case["details"]["detectable_slowdown"] == pytest.approx(expected.details["detectable_slowdown"])
    # the text form says where the run-to-run component came from
    rc, out, _ = run_cli(capsys, "compare", "--storage", str(storage))
    assert "run-to-run ±" in out and "(history, 7 runs)" in out


def test_make_compare_runs_ddpbench_compare():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ncompare:", 1)[1].split("\n\n", 1)[0]
    assert "ddpbench compare" in recipe


def test_the_verdicts_under_benchmark_compare_read_the_same_interval(tmp_path):
    storage, paths = storage_of(tmp_path, [0.01] * 7)
    rng = np.random.default_rng(9)
    current = run_doc([bench(CASE, list(0.012 * np.exp(rng.normal(0.0, 0.02, 30))), INFO)])
    lines = benchmark_compare.verdict_lines(paths[-1], current)
    # what ddpbench compare reads for the same pair with the same history (all 7 runs: the baseline
    # is the newest saved one)
    history, _ = history_runs(paths[-1].parent, through=paths[-1])
    from ddpbench.storage.runs import run_of_doc

    expected = gate.compare_runs(load_run(paths[-1]), run_of_doc(Path("this session"), current), history=history)
    [case] = expected.cases
    row = next(line for line in lines if line.startswith(CASE))
    assert f"{case.ratio:.3f} [{case.ci_low:.3f}, {case.ci_high:.3f}]" in row
    assert any("(history, 7 runs)" in line for line in lines)
    # a run saved after the baseline (this session's own, saved before the summary) is no history
    write(paths[-1].parent / "0008_this_session.json", current)
    assert benchmark_compare.verdict_lines(paths[-1], current) == lines
    # and that is what the session prints under pytest-benchmark's table
    session = SimpleNamespace(storage=SimpleNamespace(path=storage),
                              compared_mapping={paths[-1].relative_to(storage): {}})
    printed = []
    terminal = SimpleNamespace(write_sep=lambda sep, title: None, write_line=lambda line, **kw: printed.append(line))
    benchmark_compare.print_verdicts(terminal, session, current)
    assert printed == lines + [benchmark_compare.GATE_LINE]


def test_a_history_step_carries_the_stored_gates_interval_and_only_a_clear_one_a_bisect_command(tmp_path):
    storage, _ = storage_of(tmp_path, [0.01] * 8 + [0.015] * 8, run_sd=0.02)
    history = build_history(storage)
    (step,) = history.steps
    logs = np.log([p.median_s for p in step.series.points])
    low, high, between = stats.levels_interval(step.ratio, step.index, len(logs) - step.index, logs)
    assert (step.ci_low, step.ci_high) == pytest.approx((low, high)) and step.run_to_run_sd == pytest.approx(between.sd)
    assert step.beyond_noise and step.bisect_command() is not None
    assert step.to_dict()["ci"] == pytest.approx([low, high])


def test_a_step_within_the_run_to_run_noise_gets_no_bisect_command(tmp_path):
    from ddpbench.history.steps import Step

    storage, _ = storage_of(tmp_path, [0.01] * 8 + [0.015] * 8, run_sd=0.02)
    (found,) = build_history(storage).steps
    # the same step, had the series' noise put 1 inside its interval
    quiet = Step(found.series, found.index, found.before_s, found.after_s, ci_low=0.95, ci_high=1.6)
    assert not quiet.beyond_noise and quiet.bisect_command() is None
    assert quiet.bisect_unavailable() == ("within this series' run-to-run noise: the stored gate's interval "
                                          "[0.950, 1.600] holds 1")
