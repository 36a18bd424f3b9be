"""A run file is input: whoever wrote it chose every string and value in it. What ``compare`` and
``report`` print of it (terminal or markdown) shows each string literally — no new line, heading,
image, link, HTML or @mention, no escape sequence — and every memory census field is checked on
reading: a value of the wrong type is a named error (exit 2), never a traceback or a wrong verdict."""

from __future__ import annotations

import pytest

from helpers.benchjson import bench, run_cli, run_doc, write

MEMORY = {"version": 1, "method": "MemTracker", "device": "cpu", "steps_counted": 1, "peak_bytes": 1 << 20,
          "max_peak_bytes": 1 << 20, "at_peak": {"activations": 1 << 20},
          "peak_at": {"module": "blocks.0", "phase": "backward"}, "after_step_bytes": 0, "after_step": {},
          "optimizers": [{"name": "AdamW", "foreach": False}]}
INJECTED = "blocks.0\n# Pwned\n![x](https://evil.example/x.png) @octocat <img src=x> \x1b[2J|"
ROUNDS = [1.0e-3, 1.01e-3, 0.99e-3, 1.0e-3, 1.02e-3, 0.98e-3] * 3


def _runs(tmp_path, current_memory, baseline_memory=MEMORY):
    base = write(tmp_path / "base.json", run_doc([bench("test_step", ROUNDS, {"memory": baseline_memory})]))
    cur = write(tmp_path / "cur.json", run_doc([bench("test_step", ROUNDS, {"memory": current_memory})]))
    return str(base), str(cur)


def _grown(**more):
    return dict(MEMORY, peak_bytes=2 << 20, max_peak_bytes=2 << 20, at_peak={"activations": 2 << 20}, **more)


def test_a_module_name_in_a_run_file_cannot_inject_markdown_into_compare(tmp_path, capsys):
    base, cur = _runs(tmp_path, _grown(peak_at={"module": INJECTED, "phase": "backward"}))
    rc, out, _ = run_cli(capsys, "compare", base, cur, "--markdown")
    assert rc == 1, out
    row = next(line for line in out.splitlines() if "test_step" in line)
    # One row: the newlines are shown as \n, not ended there (before: a heading line "# Pwned").
    assert not any(line.startswith("#") and "Pwned" in line for line in out.splitlines()), out
    assert "\\\\n# Pwned" in row and "](https" not in row and "]\\(https" in row
    assert "@octocat" not in out and "@&#8203;octocat" in row
    assert "<img" not in out and "&lt;img" in row and "\x1b" not in out
    assert row.count(" | ") == row.replace("\\|", "").count(" | ")  # every | in a cell escaped


def test_a_module_name_in_a_run_file_cannot_drive_the_terminal_in_compare(tmp_path, capsys):
    base, cur = _runs(tmp_path, _grown(peak_at={"module": INJECTED, "phase": "backward"}))
    rc, out, _ = run_cli(capsys, "compare", base, cur)
    assert rc == 1 and "\x1b" not in out and "\\x1b[2J" in out, out
    assert "Pwned" in out and not any(line.startswith("# Pwned") for line in out.splitlines())


def test_report_shows_a_run_files_strings_literally(tmp_path, capsys):
    memory = dict(MEMORY, peak_at={"module": INJECTED, "phase": "backward"})
    run = write(tmp_path / "run.json", run_doc([bench("test_step", ROUNDS, {"memory": memory})]))
    rc, out, _ = run_cli(capsys, "report", str(run), "--no-chart")
    assert rc == 0, out
    assert not any(line.startswith("# Pwned") for line in out.splitlines()) and "\x1b" not in out
    assert "@&#8203;octocat" in out and "](https" not in out


@pytest.mark.parametrize("field, value, message", [
    ("optimizers", "x", "memory.optimizers is 'x', expected a list of optimizers"),
    ("optimizers", [{"name": "AdamW", "foreach": "no"}], "memory.optimizers[0].foreach is 'no', expected true or false"),
    ("ranks_disagree", "false", "memory.ranks_disagree is 'false', expected true or false"),
    ("peak_at", {"module": 3, "phase": "backward"}, "memory.peak_at.module is 3, expected text"),
    ("measured", {"max_allocated_bytes": "lots"}, "memory.measured.max_allocated_bytes is 'lots'"),
    ("steps_counted", 0, "memory.steps_counted is 0, expected a whole number of steps >= 1"),
])
def test_every_memory_field_is_checked_on_reading(tmp_path, capsys, field, value, message):
    # Before: optimizers "x" was a traceback in report, ranks_disagree "false" read as true (exit 1).
    broken = dict(MEMORY, **{field: value})
    base, cur = _runs(tmp_path, broken)
    rc, out, err = run_cli(capsys, "compare", base, cur)
    assert rc == 2 and message in out + err, out + err
    rc, out, err = run_cli(capsys, "report", cur, "--no-chart")
    assert rc == 2 and message in out + err, out + err
