"""ddpbench history, its data: series per (machine, backend, case) in commit order, points with and
without spread, steps found where planted and not in noise, the filters, --json, and every
bad-input path of the CLI (exit 2 with a message naming the problem and the fix)."""

from __future__ import annotations

import copy
import hashlib
import json
import shlex
from datetime import datetime, timedelta, timezone
from html import escape as html_escape

import numpy as np
import pytest

from helpers.benchjson import MACHINE, bench, run_doc, write
from ddpbench import cli
from ddpbench.history import build_history
from ddpbench.history.page import embedded_json, page_data, render_page
from ddpbench.history.series import Point, Series, machine_of
from ddpbench.history.steps import detect_steps

DAY0 = datetime(2026, 2, 1, 9, 0, tzinfo=timezone.utc)
OTHER_MACHINE = dict(MACHINE, node="other-box", cpu={"brand_raw": "Other CPU"})
ALL_REDUCE = {"backend": "gloo", "world_size": 2, "device": "cpu", "op": "all_reduce", "size_bytes": 1 << 20}


def commit_of(i: int) -> str:
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def save(storage, i, benches, machine=None, folder="Linux-CPython-3.11-64bit", when=None, **commit):
    """Saved run number i+1 of commit i, committed i days after DAY0 (or at ``when``)."""
    when = DAY0 + timedelta(days=i) if when is None else when
    info = {"id": commit_of(i), "time": when.isoformat(), "branch": "main", "dirty": False, **commit}
    doc = run_doc(benches, machine=machine, commit=info, saved=(when + timedelta(hours=1)).isoformat())
    return write(storage / folder / f"{i + 1:04d}_{commit_of(i)[:8]}.json", doc)


def rounds(level, rng, n=9, noise=0.02):
    return list(level * np.exp(rng.normal(0.0, noise, n)))


def stepped_storage(tmp_path, runs=16, step_at=8, factor=1.5, run_noise=0.02, seed=0):
    """One all_reduce case at 10 ms, x``factor`` from run ``step_at`` on, and a flat case."""
    rng = np.random.default_rng(seed)
    storage = tmp_path / ".benchmarks"
    for i in range(runs):
        level = 0.010 * (factor if i >= step_at else 1.0) * np.exp(rng.normal(0, run_noise))
        save(storage, i, [bench("test_all_reduce[gloo-2p-1MB]", rounds(level, rng), ALL_REDUCE),
                          bench("test_flat", rounds(0.002 * np.exp(rng.normal(0, run_noise)), rng))])
    return storage


def series_of(levels, rng=None) -> Series:
    """A bare series with these run medians (no runs behind it: for the step detector alone)."""
    from ddpbench.history.series import RunRecord

    points = [Point(RunRecord(None, machine_of(MACHINE), commit_of(i)[:7], "main", False, None, None), m, None, None)
              for i, m in enumerate(levels)]
    return Series(0, machine_of(MACHINE), "gloo", "t::case", "case", "other", points)


def _main(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------------------------------------
# series
# ---------------------------------------------------------------------------------------------


def test_series_never_mix_machines_or_backends(tmp_path):
    rng = np.random.default_rng(0)
    storage = tmp_path / ".benchmarks"
    for i in range(3):
        for machine, folder in ((MACHINE, "m-a"), (OTHER_MACHINE, "m-b")):
            save(storage, i, [bench("test_x", rounds(0.01, rng), {"backend": "gloo", "device": "cpu"}),
                              bench("test_y", rounds(0.01, rng), {"backend": "nccl", "device": "cuda"})],
                 machine=machine, folder=folder)
    # the same fullname measured on another backend in a later run is another series too
    save(storage, 3, [bench("test_x", rounds(0.01, rng), {"backend": "nccl", "device": "cuda"})], folder="m-a")
    history = build_history(storage)
    keys = {(s.machine.label, s.backend, s.name): len(s.points) for s in history.series}
    assert keys == {("box (Test CPU)", "gloo", "test_x"): 3, ("box (Test CPU)", "nccl", "test_y"): 3,
                    ("box (Test CPU)", "nccl", "test_x"): 1, ("other-box (Other CPU)", "gloo", "test_x"): 3,
                    ("other-box (Other CPU)", "nccl", "test_y"): 3}
    for series in history.series:
        assert {p.record.machine for p in series.points} == {series.machine}
    assert len(history.runs) == 7 and len(history.machines) == 2  # every machine folder is read


def test_machine_is_the_hardware_not_the_software():
    gpus = {"devices": ["NVIDIA H100"], "torch": "2.13.0", "cuda": "13.0", "nccl": "2.28.9"}
    a = machine_of(dict(MACHINE, ddpbench_gpus=gpus))
    assert a == machine_of(dict(MACHINE, python_version="3.12.1", ddpbench_gpus=dict(gpus, torch="2.14.0")))
    assert a != machine_of(dict(MACHINE, ddpbench_gpus=dict(gpus, devices=["NVIDIA A100"])))
    assert a != machine_of(MACHINE) and a.label == "box (Test CPU), 1 x NVIDIA H100"


def test_points_follow_commit_time_then_run_time_not_file_order(tmp_path):
    storage = tmp_path / ".benchmarks"
    case = lambda ms: [bench("test_x", [ms / 1e3] * 3)]  # noqa: E731
    save(storage, 0, case(3), when=DAY0 + timedelta(days=5))  # file 0001, the newest commit
    save(storage, 1, case(1), when=DAY0)
    save(storage, 2, case(2), when=DAY0 + timedelta(days=2))
    doc = run_doc(case(4), commit={"id": "nocommit", "time": None}, saved=(DAY0 + timedelta(days=3)).isoformat())
    write(storage / "Linux-CPython-3.11-64bit" / "0004_nocommit.json", doc)  # ordered by its run time
    # two runs of one commit: ties broken by the run's own datetime
    for number, (ms, saved) in enumerate(((6, 9), (5, 8)), start=5):
        doc = run_doc(case(ms), commit={"id": commit_of(9), "time": (DAY0 + timedelta(days=7)).isoformat()},
                      saved=(DAY0 + timedelta(days=saved)).isoformat())
        write(storage / "Linux-CPython-3.11-64bit" / f"{number:04d}_tie.json", doc)
    (series,) = build_history(storage).series
    assert [round(p.median_s * 1e3) for p in series.points] == [1, 2, 4, 3, 5, 6]
    assert series.points[2].record.commit == "nocommit"
    assert series.points[0].record.when_text() == "committed 2026-02-01 09:00 UTC"


def test_a_run_without_raw_rounds_is_a_point_without_spread(tmp_path):
    storage = tmp_path / ".benchmarks"
    save(storage, 0, [bench("test_x", [0.001, 0.002, 0.003, 0.010])])
    save(storage, 1, [bench("test_x", [0.004, 0.005, 0.006], include_data=False)])
    history = build_history(storage)
    with_data, without = history.series[0].points
    assert (with_data.q1_s, with_data.median_s, with_data.q3_s) == pytest.approx((0.00175, 0.0025, 0.00475))
    assert (without.q1_s, without.median_s, without.q3_s) == (None, 0.005, None)  # stats.median, no band
    points = page_data(history)["series"][0]["points"]
    assert points == [[0, 2.5, 1.75, 4.75], [1, 5.0, None, None]]


def test_ab_verdicts_and_ratios_reach_the_points(tmp_path):
    storage = tmp_path / ".benchmarks"
    save(storage, 0, [bench("test_x", [0.01] * 3)])
    save(storage, 1, [bench("test_x", [0.02] * 3, {"ab": {"verdict": "regression", "ratio": 2.0}})])
    history = build_history(storage)
    assert [(p.verdict, p.ab_ratio) for p in history.series[0].points] == [(None, None), ("regression", 2.0)]
    assert page_data(history)["series"][0]["points"][1][4:] == ["regression", 2.0]


def test_the_memory_census_peak_reaches_the_points(tmp_path):
    storage = tmp_path / ".benchmarks"
    memory = {"version": 1, "method": "MemTracker", "device": "cpu", "peak_bytes": 1000, "max_peak_bytes": 1500}
    save(storage, 0, [bench("test_x", [0.01] * 3, {"memory": memory})])
    save(storage, 1, [bench("test_x", [0.01] * 3)])  # a run without a memory census
    history = build_history(storage)
    assert [p.memory_peak_bytes for p in history.series[0].points] == [1500, None]  # the largest rank's
    assert [row[4:] for row in page_data(history)["series"][0]["points"]] == [[None, None, 1500], []]


def numerics_record(scale: float = 1.0) -> dict:
    """A 2-rank numerics record of 2 steps; ``scale`` multiplies the gradient from step 1 on."""
    from ddpbench.engine.numerics import combine_numerics

    steps = [{"param w": ["p0", 4.0, 8.0, 1.0]}]
    for s in (1, 2):
        steps.append({"param w": [f"p{s}-{scale}", 4.0 - s * scale * 0.1, 8.0, 1.0],
                      "grad w": [f"g{s}-{scale}", 2.0 * scale, 4.0 * scale, -scale], "loss": ["l", 2.0, 2.0, 2.0]})
    rank = {"version": 1, "seed": 0, "steps": 2, "replays": 2, "digests": [str(sorted(step.items())) for step in steps],
            "tensors": steps, "replay_spread": 0.0, "first_nondeterministic_step": None,
            "band": [{}, {"param": 1e-4, "grad": 1e-4}, {"param": 1e-4, "grad": 1e-4}], "band_replays": 2}
    return combine_numerics([rank, copy.deepcopy(rank)])


def test_numerics_changes_from_run_to_run_reach_the_points_the_page_and_the_command(tmp_path, capsys):
    storage = tmp_path / ".benchmarks"
    records = [numerics_record(), numerics_record(), None, numerics_record(2.0), numerics_record(2.0000002)]
    for i, numerics in enumerate(records):
        save(storage, i, [bench("test_step", [0.01] * 3, {"numerics": numerics} if numerics else {})])
    history = build_history(storage)
    points = history.series[0].points
    digest = points[0].numerics.digests[-1][:12]
    assert [p.numerics_state for p in points[:4]] == [f"2 steps, digest {digest}"] * 2 + [
        None, f"2 steps, digest {points[3].numerics.digests[-1][:12]}"]
    assert points[0].numerics_line is None
    assert points[1].numerics_line == "same (bitwise): 2 steps on 2 ranks, 3 tensors"
    assert points[3].numerics_line.startswith("changed from step 1 of 2: largest relative difference 1 (100%) "
                                              "in grad w")  # against the run before that has a replay
    assert points[4].numerics_line.startswith("rounding: bits differ from step 1 of 2")  # within 4 x 1e-4
    change, rounding = history.numerics_changes
    assert (change.before, change.after, change.outcome) == (points[1], points[3], "changed")
    assert (rounding.before, rounding.after, rounding.outcome) == (points[3], points[4], "rounding")
    rows = page_data(history)["series"][0]["points"]
    assert rows[1][4:] == [None, None, None, points[1].numerics_state, points[1].numerics_line]
    assert rows[2][4:] == []
    page = render_page(history)
    assert "<h2>Numerics changes</h2>" in page and html_escape(change.line) in page
    rc, out, err = _main(capsys, "history", "--storage", storage, "--output", tmp_path / "h.html", "--json")
    assert rc == 0 and "2 numerics change(s) from one run to the next (1 changed, 1 within rounding)" in err
    assert f": numerics {commit_of(1)[:7]} -> {commit_of(3)[:7]}: changed from step 1 of 2" in err
    assert f": numerics {commit_of(3)[:7]} -> {commit_of(4)[:7]}: rounding: bits differ" in err
    shown, shown_rounding = json.loads(out)["numerics_changes"]
    assert shown["line"] == change.line and shown["after"]["commit"] == commit_of(3)[:7]
    assert shown["outcome"] == "changed" and shown_rounding["outcome"] == "rounding"


def test_a_history_without_numerics_changes_says_why(tmp_path):
    storage = tmp_path / ".benchmarks"
    save(storage, 0, [bench("test_step", [0.01] * 3)])
    assert "no run recorded a numerics replay" in render_page(build_history(storage))
    save(storage, 1, [bench("test_step", [0.01] * 3, {"numerics": numerics_record()})])
    save(storage, 2, [bench("test_step", [0.01] * 3, {"numerics": numerics_record()})])
    assert "computes what its run before computed (2 replays)" in render_page(build_history(storage))


def test_a_damaged_numerics_record_stops_the_history_with_exit_2(tmp_path, capsys):
    storage = tmp_path / ".benchmarks"
    damaged = dict(numerics_record(), digests=7)
    path = save(storage, 0, [bench("test_step", [0.01] * 3, {"numerics": damaged})])
    rc, out, err = _main(capsys, "history", "--storage", storage, "--output", tmp_path / "h.html")
    assert rc == 2 and "numerics.digests is 7" in err and path.name in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# steps
# ---------------------------------------------------------------------------------------------


def test_a_planted_step_is_found_at_its_commit_and_a_flat_case_has_none(tmp_path):
    history = build_history(stepped_storage(tmp_path))
    (step,) = history.steps
    assert step.series.name == "test_all_reduce[gloo-2p-1MB]" and step.index == 8
    assert step.ratio == pytest.approx(1.5, rel=0.05)
    assert step.last_before.record.commit == commit_of(7)[:7] and step.first_after.record.commit == commit_of(8)[:7]
    out = step.to_dict()
    assert out["last_before"]["time"].startswith("2026-02-08") and out["first_after"]["time"].startswith("2026-02-09")
    assert out["chart"] == step.series.chart_id


def _step_with_commit_ids(tmp_path, first_after_id):
    """A 1.5x step between runs 3 and 4 (of 8) where run 4's file records ``first_after_id`` as
    its commit."""
    rng, storage = np.random.default_rng(1), tmp_path / ".benchmarks"
    for i in range(8):
        commit = {"id": first_after_id} if i == 4 else {}
        save(storage, i, [bench("test_all_reduce[gloo-2p-1MB]", rounds(0.010 * (1.5 if i >= 4 else 1.0), rng),
                                ALL_REDUCE)], **commit)
    return build_history(storage)


@pytest.mark.parametrize("commit_id", ["abc1234 HEAD;touch /tmp/ddpbench-pwned", "$(touch x)", "abc12",
                                       "<b>abc1234</b>", "abc1234\x1b[2J"])
def test_a_commit_id_that_is_not_a_git_hash_gets_no_bisect_command_and_says_why(tmp_path, commit_id):
    history = _step_with_commit_ids(tmp_path, commit_id)
    (step,) = history.steps
    assert step.bisect_command() is None
    reason = step.bisect_unavailable()
    assert f"records the commit id {step.first_after.record.commit!r}"[:60] in reason
    assert reason.endswith("not a git hash (7 to 40 hex digits)") and "\x1b" not in reason
    assert step.to_dict()["bisect"] is None and step.to_dict()["bisect_unavailable"] == reason
    assert "\x1b" not in step.describe()  # the terminal line shows the id quoted, escapes visible
    page = render_page(history)
    assert "ddpbench bisect" not in page and "<b>abc1234" not in page
    assert html_escape(reason) in page  # the reason, escaped, in the step's row


def test_git_hashes_of_7_to_40_hex_digits_make_a_quoted_bisect_command(tmp_path):
    full = "ABCDEF0123456789ABCDEF0123456789ABCDEF01"  # 40 hex digits (upper case: not shortened)
    step = _step_with_commit_ids(tmp_path, full).steps[0]
    assert step.bisect_unavailable() is None
    assert step.bisect_command().startswith(f"ddpbench bisect {commit_of(3)[:7]} {full} -k ")
    assert shlex.split(step.bisect_command())[2:4] == [commit_of(3)[:7], full]


@pytest.mark.parametrize("seed", range(5))
def test_noise_alone_gives_no_step(seed):
    rng = np.random.default_rng(seed)
    levels = 0.01 * np.exp(rng.normal(0.0, 0.05, 60))  # 5% run-to-run noise, as large as the min step
    assert detect_steps(series_of(levels)) == []


def test_min_step_decides_whether_a_small_change_is_a_step():
    rng = np.random.default_rng(3)
    levels = 0.01 * np.exp(rng.normal(0.0, 0.003, 30)) * np.where(np.arange(30) >= 15, 1.03, 1.0)
    assert detect_steps(series_of(levels)) == []  # 3% < the default 5%
    (step,) = detect_steps(series_of(levels), min_step=0.02)
    assert step.index == 15 and step.ratio == pytest.approx(1.03, abs=0.005)


def test_too_few_runs_or_equal_medians_give_no_step():
    assert detect_steps(series_of([0.01, 0.01, 0.01, 0.02, 0.02])) == []  # 5 runs: too few to tell
    assert detect_steps(series_of([0.01] * 10)) == []
    (step,) = detect_steps(series_of([0.01] * 5 + [0.02] * 5))  # no noise at all: the jump is the step
    assert step.index == 5 and step.ratio == 2.0


def test_two_steps_and_their_segment_medians():
    levels = [0.010] * 8 + [0.015] * 8 + [0.0075] * 8
    first, second = detect_steps(series_of(np.array(levels) * np.exp(np.random.default_rng(1).normal(0, 0.01, 24))))
    assert (first.index, second.index) == (8, 16)
    assert first.ratio == pytest.approx(1.5, rel=0.03) and second.ratio == pytest.approx(0.5, rel=0.03)
    assert first.after_s == second.before_s  # the middle segment's median, shared


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------


def test_cli_writes_the_page_and_prints_the_steps(tmp_path, capsys):
    storage = stepped_storage(tmp_path)
    (tmp_path / "out").mkdir()
    page = tmp_path / "out" / "history.html"
    rc, out, err = _main(capsys, "history", "--storage", storage, "--output", page)
    assert rc == 0 and err == ""
    assert f"history page: {page}" in out and "16 runs from 1 machine(s), 2 series, 1 step(s) of 5% or more" in out
    assert "test_all_reduce[gloo-2p-1MB] on box (Test CPU), gloo: 10" in out and f"between {commit_of(7)[:7]} (2026-02-08) and {commit_of(8)[:7]} (2026-02-09)" in out
    assert page.read_text().startswith("<!doctype html>")


def test_cli_json_prints_the_steps_alone_on_stdout(tmp_path, capsys):
    rc, out, err = _main(capsys, "history", "--storage", stepped_storage(tmp_path), "--output",
                         tmp_path / "h.html", "--json")
    assert rc == 0 and "history page:" in err
    doc = json.loads(out)
    assert (doc["runs"], doc["series"], doc["min_step"]) == (16, 2, 0.05)
    (step,) = doc["steps"]
    assert step["case"] == "test_all_reduce[gloo-2p-1MB]" and step["backend"] == "gloo"
    assert step["machine"] == "box (Test CPU)" and step["ratio"] == pytest.approx(1.5, rel=0.05)
    assert (step["last_before"]["commit"], step["first_after"]["commit"]) == (commit_of(7)[:7], commit_of(8)[:7])


def test_cli_reads_named_files_beside_the_storage(tmp_path, capsys):
    storage = stepped_storage(tmp_path, runs=6)
    extra = write(tmp_path / "ci.json", run_doc([bench("test_other", [0.001] * 3)],
                                               commit={"time": (DAY0 + timedelta(days=30)).isoformat()}))
    rc, out, _ = _main(capsys, "history", extra, "--storage", storage, "--output", tmp_path / "h.html", "--json")
    assert rc == 0 and json.loads(out)["runs"] == 7 and json.loads(out)["series"] == 3


def test_since_keeps_the_runs_from_that_date(tmp_path, capsys):
    storage = stepped_storage(tmp_path)
    history = build_history(storage, since=datetime(2026, 2, 9, tzinfo=timezone.utc))
    assert len(history.runs) == 8 and history.steps == []  # the step's earlier side is gone
    rc, out, _ = _main(capsys, "history", "--storage", storage, "--output", tmp_path / "h.html",
                       "--since", "2026-02-09", "--json")
    assert rc == 0 and json.loads(out)["runs"] == 8


def test_case_patterns_select_series_by_pattern_or_substring(tmp_path):
    storage = stepped_storage(tmp_path, runs=6)
    assert [s.name for s in build_history(storage, cases=["all_reduce"]).series] == ["test_all_reduce[gloo-2p-1MB]"]
    assert [s.name for s in build_history(storage, cases=["*flat"]).series] == ["test_flat"]
    assert len(build_history(storage, cases=["test_flat", "test_all_reduce[gloo-2p-1MB]"]).series) == 2


def _error(capsys, *argv) -> str:
    rc, out, err = _main(capsys, "history", *argv)
    assert rc == 2 and out == "" and "Traceback" not in err
    return err


def test_empty_storage_says_how_to_save_runs(tmp_path, capsys):
    err = _error(capsys, "--storage", tmp_path / "nothing-here", "--output", tmp_path / "h.html")
    assert "no runs to show" in err and "--benchmark-autosave --benchmark-save-data" in err
    assert "make bench" in err and not (tmp_path / "h.html").exists()


def test_a_file_of_another_tool_is_named_as_not_a_pytest_benchmark_run(tmp_path, capsys):
    other = tmp_path / "coverage.json"
    other.write_text(json.dumps({"meta": {"version": "7"}, "files": {}}))
    err = _error(capsys, other, "--storage", tmp_path / "none", "--output", tmp_path / "h.html")
    assert f"{other}: not a pytest-benchmark result" in err


def test_an_unreadable_saved_run_stops_the_command_unless_skipped(tmp_path, capsys):
    storage = stepped_storage(tmp_path, runs=6)
    broken = storage / "Linux-CPython-3.11-64bit" / "0007_truncated.json"
    broken.write_text('{"machine_info": {"node": "box"}, "benchmarks": [{"name": "te')
    err = _error(capsys, "--storage", storage, "--output", tmp_path / "h.html")
    assert f"{broken}: not valid JSON" in err and "delete that file" in err and "--skip-unreadable" in err
    rc, out, err = _main(capsys, "history", "--storage", storage, "--output", tmp_path / "h.html", "--skip-unreadable")
    assert rc == 0 and "6 runs" in out
    assert err.count("warning: skipped unreadable saved run") == 1 and str(broken) in err
    assert "0007_truncated.json" in (tmp_path / "h.html").read_text()  # the page says what it left out


def test_filters_that_leave_nothing_name_what_exists(tmp_path, capsys):
    storage = stepped_storage(tmp_path, runs=6)
    err = _error(capsys, "--storage", storage, "--output", tmp_path / "h.html", "--since", "2027-01-01")
    assert "no run on or after it" in err and "2026-02-06" in err  # the newest run's date
    err = _error(capsys, "--storage", storage, "--output", tmp_path / "h.html", "--case", "nosuchcase")
    assert "no case matches" in err and "test_flat" in err and "test_all_reduce[gloo-2p-1MB]" in err


def test_a_bad_since_date_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["history", "--storage", str(tmp_path), "--since", "last tuesday"])
    assert exc.value.code == 2 and "is not an ISO date; write e.g. 2026-01-31" in capsys.readouterr().err


def test_an_unwritable_output_is_an_error_not_a_traceback(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file where the folder should be")
    err = _error(capsys, "--storage", stepped_storage(tmp_path, runs=6), "--output", tmp_path / "taken" / "h.html")
    assert "cannot write the page" in err and "--output" in err
    # A folder that does not exist is named (a typo creates nothing), as for ddpbench report.
    missing = tmp_path / "no-such-folder" / "h.html"
    err = _error(capsys, "--storage", stepped_storage(tmp_path, runs=6), "--output", missing)
    assert (f"cannot write the page: --output {missing}: the folder {missing.parent} does not exist; "
            f"create it (mkdir -p {missing.parent})") in err
    assert not missing.parent.exists()


# ---------------------------------------------------------------------------------------------
# the page's data
# ---------------------------------------------------------------------------------------------


def test_strings_from_runs_cannot_end_the_embedded_script(tmp_path):
    storage = tmp_path / ".benchmarks"
    save(storage, 0, [bench("test_x", [0.01] * 3)], branch="</script><script>alert(1)</script>")
    page = render_page(build_history(storage))
    assert "alert(1)</script>" not in page and page.count("</script>") == 2  # the data's and the code's
    assert json.loads(embedded_json({"b": "</script>&"})) == {"b": "</script>&"}


def test_the_scale_scripts_runs_have_their_planted_steps_found(tmp_path):
    """lab/reference/history_scale.py plants a 1.3x step at 40% of the runs in cases 0, 10... and a
    0.8x one at 70% in cases 5, 15...: the timing it reports is of a history that finds them."""
    from helpers.lab_scripts import load_lab_script

    scale = load_lab_script("history_scale")
    history = build_history(scale.make_storage(tmp_path / ".benchmarks", runs=20, cases=10, rounds=20))
    found = sorted((step.series.name, step.index, round(step.ratio, 1)) for step in history.steps)
    assert found == [("test_all_reduce[gloo-2p-0]", 8, 1.3), ("test_all_reduce[gloo-2p-5]", 14, 0.8)]
