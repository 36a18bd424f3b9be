"""ddpbench report: seed-shaped tables and PNG charts from fixture JSON holding every family."""

from __future__ import annotations

import builtins

import pytest

from benchjson import bench, run_doc, write
from ddpbench import cli, report
from ddpbench.compare import load_run

MB = 1024 * 1024
# Every case's rounds are skewed (one slow round): mean != median, so each assertion below tells
# which statistic a table uses. Collectives: median t, mean 1.5 t.
SKEW = (1.0, 1.0, 1.0, 3.0)


def _fixture_run(tmp_path, families=("collectives", "syncbn", "training", "datasets", "other")):
    benches = []
    if "collectives" in families:
        for op, factor in (("all_reduce", 1.0), ("broadcast", 1.0)):
            for ws in (2, 4):
                for size in (MB, 10 * MB):
                    t = size / 1e9 * ws / 2  # the median round
                    # Stored bandwidths as the plugin stores them, from the median: deliberately not
                    # what the table shows (from the mean), so a table that copied them would fail.
                    benches.append(bench(f"test_{op}[gloo-{ws}p-{size // MB}MB]", [t * k for k in SKEW],
                                         {"backend": "gloo", "world_size": ws, "device": "cpu", "op": op,
                                          "size_bytes": size, "algbw_GBps": size / t / 1e9,
                                          "busbw_GBps": size / t / 1e9 * factor * (2 * (ws - 1) / ws
                                                                                   if op == "all_reduce" else 1)}))
    if "syncbn" in families:
        for variant in ("torch", "handwritten"):
            for hidden in (64, 256):
                benches.append(bench(f"test_syncbn[{variant}-{hidden}]", [0.002, 0.003, 0.010],
                                     {"backend": "gloo", "world_size": 2, "device": "cpu", "variant": variant,
                                      "batch_size": 32, "hidden_dim": hidden,
                                      "peak_memory_bytes": 3 * MB if variant == "torch" else None}))
    if "training" in families:
        for impl in ("ddp", "handwritten", "lightning"):
            for ws in (1, 2):
                benches.append(bench(f"test_training[{impl}-{ws}p]", [0.05, 0.06, 0.16],
                                     {"backend": "gloo", "world_size": ws, "device": "cpu", "impl": impl,
                                      "model": "mlp", "grad_accum": 1, "batch_size": 64,
                                      "samples_per_second": 1000.0 * ws * (0.9 if ws > 1 else 1),
                                      "final_loss": 0.123, "scaling_efficiency": 0.9 if ws > 1 else 1.0}))
    if "datasets" in families:
        for layout in ("list_of_tensors", "packed"):
            benches.append(bench(f"test_dataset_sharing[{layout}-2w]", [0.5, 0.6, 1.3],
                                 {"backend": "gloo", "world_size": 2, "device": "cpu", "layout": layout,
                                  "num_samples": 10000, "num_workers": 2, "sharing_strategy": "file_system",
                                  "share_seconds": 0.25, "open_fds": 1234 if layout == "list_of_tensors" else 12,
                                  "peak_memory_bytes": 50 * MB}))
    if "other" in families:
        benches.append(bench("test_something_else", [0.001, 0.002, 0.009]))
    return write(tmp_path / "run.json", run_doc(benches))


def _table_rows(text, heading):
    """The data rows of the first markdown table after ``heading``."""
    lines = text.splitlines()
    start = lines.index(heading)
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
        elif table:
            break
    return table[0], table[2:]


def test_tables_have_the_seed_shapes_and_rows(tmp_path):
    text = report.markdown_report(load_run(_fixture_run(tmp_path)))
    header, rows = _table_rows(text, "### all_reduce")
    assert header == ["Backend", "Processes", "Size", "Avg Time (ms)", "Effective Bandwidth (GB/s)",
                      "Bus Bandwidth (GB/s)"]
    assert [r[:3] for r in rows] == [["gloo", "2", "1MB"], ["gloo", "2", "10MB"], ["gloo", "4", "1MB"],
                                     ["gloo", "4", "10MB"]]
    # "Avg Time" is the mean and the bandwidths come from it: 1 MB at 2 ranks, median t = 1.048576 ms,
    # mean 1.5 t = 1.573 ms; algbw = 1 / 1.5 GB/s; busbw factor 1. (The stored, median-based
    # bandwidths would read 1.000.)
    assert rows[0][3:] == ["1.573", "0.667", "0.667"]
    assert rows[2][3:] == ["3.146", "0.333", "0.500"]  # 4 ranks: mean 3 t; busbw factor 2*3/4 = 1.5

    header, rows = _table_rows(text, "## SyncBatchNorm")
    assert header[:3] == ["batch_size", "hidden_dim", "num_workers"]
    assert "handwritten median time (ms)" in header and "torch max memory allocated" in header
    assert len(rows) == 2 and rows[0][:3] == ["32", "64", "2"]
    assert rows[0][header.index("handwritten median time (ms)")] == "3.000"  # median, not the mean 5.000
    assert "3.0 MB" in rows[0] and "n/a" in rows[0]  # the handwritten variant has no memory number

    header, rows = _table_rows(text, "### lightning")
    assert header[0] == "Ranks" and "Max Memory Allocated" in header
    assert [r[0] for r in rows] == ["1", "2"] and rows[1][3] == "1800.0"
    assert rows[0][2] == "60.000"  # the median step, not the mean 90.000

    header, rows = _table_rows(text, "## Dataset sharing")
    assert header == ["layout", "workers", "sharing strategy", "share time (s)", "epoch time (s)",
                      "open fds", "memory"]
    assert rows[0] == ["list_of_tensors", "2", "file_system", "0.250", "0.600", "1234", "50.0 MB"]  # median epoch

    _, rows = _table_rows(text, "## Other cases")
    assert rows == [["test_something_else", "2.000"]]  # median (the mean is 4.000)


def test_only_present_families_get_sections(tmp_path):
    text = report.markdown_report(load_run(_fixture_run(tmp_path, families=("collectives",))))
    assert "## Collectives" in text
    assert "## SyncBatchNorm" not in text and "## Training" not in text and "## Dataset sharing" not in text


def test_charts_are_valid_pngs(tmp_path):
    mpimg = pytest.importorskip("matplotlib.image")
    written = report.write_charts(load_run(_fixture_run(tmp_path)), tmp_path / "charts")
    assert sorted(p.name for p in written) == ["collectives_bandwidth.png", "collectives_time.png",
                                               "training_scaling.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = mpimg.imread(path)
        assert image.ndim == 3 and image.shape[0] >= 200 and image.shape[1] >= 300


def test_cli_report_prints_tables_and_says_where_the_charts_are(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = _fixture_run(tmp_path)
    rc = cli.main(["report", str(path), "--charts", str(tmp_path / "out"), "--output", str(tmp_path / "r.md")])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "| gloo | 2 | 1MB |" in out
    assert f"charts written to {tmp_path / 'out' / 'run'}/" in out
    assert (tmp_path / "out" / "run" / "training_scaling.png").exists()
    assert (tmp_path / "r.md").read_text().startswith("# ddpbench report: run.json")


def test_cli_report_defaults_to_the_newest_saved_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["report"])
    assert rc == 2 and "no saved run in .benchmarks" in capsys.readouterr().err
    doc = (_fixture_run(tmp_path, families=("other",))).read_text()
    (tmp_path / ".benchmarks" / "m").mkdir(parents=True)
    (tmp_path / ".benchmarks" / "m" / "0001_a.json").write_text(doc)
    (tmp_path / ".benchmarks" / "m" / "0002_b.json").write_text(doc.replace("test_something_else", "test_newest"))
    rc = cli.main(["report", "--no-charts"])
    out = capsys.readouterr().out
    assert rc == 0 and "test_newest" in out and "0002_b.json" in out


def test_cli_report_bad_input(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    rc = cli.main(["report", str(tmp_path / "bad.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("ddpbench report: error:") and "not valid JSON" in err


def test_missing_matplotlib_is_a_clear_message(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    path = _fixture_run(tmp_path, families=("collectives",))
    rc = cli.main(["report", str(path), "--charts", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "| gloo | 2 | 1MB |" in out  # the tables still come
    assert "charts need matplotlib" in err and "ddpbench[plot]" in err and "--no-charts" in err
    assert "Traceback" not in err
    assert cli.main(["report", str(path), "--no-charts"]) == 0
