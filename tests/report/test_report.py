"""ddpbench report: seed-shaped tables and PNG charts from fixture JSON holding every family."""

from __future__ import annotations

import builtins
import json

import pytest

from helpers.benchjson import MACHINE, bench, run_doc, write
from ddpbench import cli, report
from ddpbench.storage.runs import load_run

MB = 1024 * 1024
# Every case's rounds are skewed (one slow round): mean != median, so each assertion below tells
# which statistic a table uses. Collectives: median t, mean 1.5 t.
SKEW = (1.0, 1.0, 1.0, 3.0)
MACHINE_WITH_CORES = dict(MACHINE, cpu={"brand_raw": "Test CPU", "count": 2})
PROVENANCE = "_Run run.json, saved 2026-01-01T00:00:00; machine box (Test CPU, 2 cores)._"


def _memory(peak, **at_peak):
    """A memory census record (extra_info["memory"]) with ``peak`` bytes and these categories."""
    return {"version": 1, "method": "MemTracker", "device": "cpu", "steps_counted": 1, "peak_bytes": peak,
            "max_peak_bytes": peak, "at_peak": at_peak, "peak_at": {"module": "blocks.0", "phase": "backward"},
            "after_step_bytes": peak // 2, "after_step": {}, "optimizers": [{"name": "AdamW", "foreach": False}]}


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
                                      "memory": _memory(3 * MB) if variant == "torch" else None}))
    if "training" in families:
        for impl in ("ddp", "handwritten", "lightning"):
            for accum in (4, 1):
                for ws in (1, 2):
                    benches.append(bench(f"test_training[{impl}-{ws}p-accum{accum}]", [0.05, 0.06, 0.16],
                                         {"backend": "gloo", "world_size": ws, "device": "cpu", "impl": impl,
                                          "model": "mlp", "grad_accum": accum, "batch_size": 32,
                                          "samples_per_second": 1000.0 * ws * accum * (0.9 if ws > 1 else 1),
                                          "final_loss": 0.123, "scaling_efficiency": 0.9 if ws > 1 else 1.0}))
    if "datasets" in families:
        reported = {"backend": "gloo", "world_size": 2, "device": "cpu", "num_samples": 2048,
                    "sample_shape": [3, 224, 224], "sample_bytes": 602112, "variable_size": False,
                    "num_workers": 2, "sharing_strategy": "file_descriptor", "data_source": "handover",
                    "share_seconds": 0.25, "peak_memory_bytes": 50 * MB}
        for layout, start, persistent, source in (("list", "fork", False, "handover"),
                                                  ("list", "spawn", False, "handover"),
                                                  ("list", "fork", True, "handover"),
                                                  ("list", "fork", False, "rank"),
                                                  ("stacked", "fork", False, "handover")):
            benches.append(bench(f"test_reported_path[{layout}-{source}-{start}-{persistent}]", [0.5, 0.6, 0.6, 1.3],
                                 dict(reported, layout=layout, worker_start=start, persistent_workers=persistent,
                                      data_source=source, open_fds=2063 if layout == "list" else 16)))
        # a run saved before the sample and loader columns existed
        benches.append(bench("test_dataset_sharing[old]", [0.5, 0.6, 1.3],
                             {"backend": "gloo", "world_size": 2, "device": "cpu", "layout": "packed",
                              "num_samples": 10000, "num_workers": 0, "sharing_strategy": "file_system",
                              "share_seconds": 0.25, "open_fds": 12, "peak_memory_bytes": 50 * MB}))
    if "other" in families:
        benches.append(bench("test_something_else", [0.001, 0.002, 0.009]))
    return write(tmp_path / "run.json", run_doc(benches, machine=MACHINE_WITH_CORES))


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
    assert "handwritten median time (ms)" in header and "torch peak memory (census)" in header
    assert len(rows) == 2 and rows[0][:3] == ["32", "64", "2"]
    assert rows[0][header.index("handwritten median time (ms)")] == "3.000"  # median, not the mean 5.000
    assert "3.0 MiB" in rows[0] and "n/a" in rows[0]  # the handwritten variant has no memory number

    header, rows = _table_rows(text, "### lightning")
    assert header[:4] == ["Ranks", "Model", "grad_accum", "batch_size"] and "Peak memory (census)" in header
    # Rows that differ only in grad_accum are told apart, ordered by accumulation then ranks.
    assert [r[:4] for r in rows] == [["1", "mlp", "1", "32"], ["2", "mlp", "1", "32"],
                                     ["1", "mlp", "4", "32"], ["2", "mlp", "4", "32"]]
    assert rows[1][header.index("Samples/s")] == "1800.0" and rows[3][header.index("Samples/s")] == "7200.0"
    assert rows[0][header.index("Time per round (ms)")] == "60.000"  # the median step, not the mean 90.000

    _, rows = _table_rows(text, "## Other cases")
    assert rows == [["test_something_else", "2.000"]]  # median (the mean is 4.000)


def test_dataset_table_tells_every_case_apart(tmp_path):
    text = report.markdown_report(load_run(_fixture_run(tmp_path, families=("datasets",))))
    header, rows = _table_rows(text, "## Dataset sharing")
    assert header == ["layout", "num_samples", "sample size", "data", "workers", "worker start", "persistent",
                      "sharing strategy", "share time (s)", "epoch time (s)", "epoch IQR (s)", "open fds", "memory"]
    assert len({tuple(r) for r in rows}) == len(rows) == 6
    cells = [dict(zip(header, r)) for r in rows]
    spawn = next(c for c in cells if c["worker start"] == "spawn")
    assert spawn == {"layout": "list", "num_samples": "2048", "sample size": "3x224x224 (588.0 KiB)", "data": "handover",
                     "workers": "2", "worker start": "spawn", "persistent": "no", "sharing strategy": "file_descriptor",
                     "share time (s)": "0.250", "epoch time (s)": "0.600", "epoch IQR (s)": "0.200",
                     "open fds": "2063", "memory": "50.0 MiB"}  # median epoch; IQR of 0.5 0.6 0.6 1.3 (quartiles 0.575, 0.775)
    assert [c["persistent"] for c in cells if c["layout"] == "list" and c["worker start"] == "fork"
            and c["data"] == "handover"] == ["no", "yes"]
    assert [c["data"] for c in cells if c["layout"] == "list"].count("rank") == 1
    old = next(c for c in cells if c["layout"] == "packed")  # saved before these columns existed
    assert (old["sample size"], old["worker start"], old["persistent"], old["data"]) == ("n/a", "-", "-", "handover")


def test_every_table_says_which_run_and_machine(tmp_path):
    text = report.markdown_report(load_run(_fixture_run(tmp_path)))
    lines = text.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith("|") and not lines[i + 1].startswith("|")]
    assert len(ends) == 9  # all_reduce, broadcast, syncbn, 3 training impls, datasets, other, memory
    assert all(lines[i + 1] == "" and lines[i + 2] == PROVENANCE for i in ends)


def test_size_labels_match_the_tables_and_points_carry_their_iqr(tmp_path):
    run = load_run(_fixture_run(tmp_path, families=("collectives",)))
    _, rows = _table_rows(report.markdown_report(run), "### all_reduce")
    cases = list(run.cases.values())
    positions, labels = report.size_ticks(c.extra_info["size_bytes"] for c in cases)
    assert positions == [MB, 10 * MB] and labels == ["1MB", "10MB"] == sorted({r[2] for r in rows}, key=len)
    assert report.size_ticks([100 * MB, MB, 10 * MB, 1024 ** 3])[1] == ["1MB", "10MB", "100MB", "1GB"]
    series = report.collectives_series(cases, "time")
    t = MB / 1e9  # the median round of 1 MB at 2 ranks; rounds t, t, t, 3t: quartiles t and 1.5 t
    size, value, low, high = series["all_reduce"][("gloo", 2)][0]
    assert size == MB and value == pytest.approx(t * 1e3) and low == pytest.approx(t * 1e3)
    assert high == pytest.approx(1.5 * t * 1e3)
    _, value, low, high = report.collectives_series(cases, "bw")["all_reduce"][("gloo", 2)][0]
    assert value == pytest.approx(1.0) and low == pytest.approx(1 / 1.5) and high == pytest.approx(1.0)


def test_charts_label_sizes_as_the_tables_and_draw_iqr_bars(tmp_path):
    plt = report.pyplot()
    run = load_run(_fixture_run(tmp_path, families=("collectives", "training")))
    groups = report.by_family(run)
    fig = report.collectives_figure(plt, groups["collectives"], "time")
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1MB", "10MB"]
        expected = report.collectives_series(groups["collectives"], "time")[ax.get_title()]
        bars = {}
        for container in ax.containers:  # one error-bar container per line: (x, low) - (x, high)
            segments = container.lines[2][0].get_segments()
            bars[container.get_label()] = [v for s in segments for v in (s[0][0], s[0][1], s[1][1])]
        assert bars["gloo, 2 proc"] == pytest.approx([v for x, _, lo, hi in expected[("gloo", 2)] for v in (x, lo, hi)])
    finally:
        plt.close(fig)
    fig = report.training_figure(plt, groups["training"])
    try:
        assert len(fig.axes[0].containers) == 6  # ddp, handwritten, lightning x accum 1 and 4 (mlp), IQR bars
    finally:
        plt.close(fig)


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
    rc = cli.main(["report", str(path), "--chart", str(tmp_path / "out"), "--output", str(tmp_path / "r.md")])
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
    rc = cli.main(["report", "--no-chart"])
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
    rc = cli.main(["report", str(path), "--chart", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "| gloo | 2 | 1MB |" in out  # the tables still come
    assert "charts need matplotlib" in err and "ddpbench[plot]" in err and "--no-chart" in err
    assert "Traceback" not in err
    assert cli.main(["report", str(path), "--no-chart"]) == 0


def test_gpu_runs_name_their_gpus_and_ranks_sharing_a_gpu_get_their_own_rows(tmp_path):
    benches = []
    for backend, ws, device in (("nccl", 1, "cuda"), ("gloo", 2, "cuda"), ("gloo", 2, "cpu")):
        benches.append(bench(f"test_syncbn[{backend}-{device}-{ws}p-fused]", [0.002, 0.003, 0.004],
                             {"backend": backend, "world_size": ws, "device": device, "variant": "fused",
                              "batch_size": 32, "hidden_dim": 128, "peak_memory_bytes": MB}))
    gpus = {"devices": ["NVIDIA H100 80GB HBM3"], "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9"}
    path = write(tmp_path / "gpu.json", run_doc(benches, machine=dict(MACHINE_WITH_CORES, ddpbench_gpus=gpus)))
    text = report.markdown_report(load_run(path))
    header, rows = _table_rows(text, "## SyncBatchNorm")
    assert header[3] == "backend"
    # The gloo ranks on CPU and on one GPU are separate rows, each saying where it ran.
    assert sorted((r[2], r[3]) for r in rows) == [("1", "nccl"), ("2", "gloo"), ("2", "gloo (cuda)")]
    assert ("machine box (Test CPU, 2 cores), 1 x NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, CUDA 13.0, "
            "NCCL 2.28.9)._") in text


def _variant_case(op, dtype="float32", reduce_op="sum", placement=None, ops=1, straggler=None):
    own = {"all_reduce": "in-place", "broadcast": "in-place"}.get(op, "out-of-place")
    info = {"backend": "gloo", "world_size": 2, "device": "cpu", "op": op, "size_bytes": MB,
            "algbw_GBps": 1.0, "busbw_GBps": 1.0, "dtype": dtype, "placement": placement or own,
            "ops_per_round": ops}
    if op in ("all_reduce", "reduce_scatter"):
        info["reduce_op"] = reduce_op
    if straggler:
        info.update(straggler_rank=straggler[0], straggler_share=straggler[1], straggler_excess_pct=straggler[2])
    name = f"test_{op}[gloo-2p-1MB-{dtype}-{reduce_op}-{placement or own}]"
    return bench(name, [0.001, 0.001, 0.002], info)


def _collectives_table(tmp_path, cases):
    return report.collectives_tables(list(load_run(write(tmp_path / "v.json", run_doc(cases))).cases.values()))


def test_variant_columns_appear_only_when_a_run_varies_them(tmp_path):
    default = _collectives_table(tmp_path, [_variant_case(op) for op in ("all_reduce", "all_gather", "broadcast")])
    assert "| Backend | Processes | Size | Avg Time (ms) |" in default  # the seed's shape, unchanged
    for header in ("Dtype", "Reduction", "Placement", "Ops per round"):
        assert header not in default
    varied = _collectives_table(tmp_path, [
        _variant_case("all_reduce", "bfloat16", "max"), _variant_case("all_reduce", "float32", "sum"),
        _variant_case("all_gather", placement="in-place"), _variant_case("all_gather", ops=8)])
    assert "| Backend | Processes | Dtype | Reduction | Placement | Ops per round | Size |" in varied
    assert "| gloo | 2 | bfloat16 | max | in-place | 1 | 1MB |" in varied
    assert "| gloo | 2 | float32 | - | in-place | 1 | 1MB |" in varied  # all_gather does not reduce
    one_setting = _collectives_table(tmp_path, [_variant_case("all_reduce", "bfloat16")])
    assert "| Backend | Processes | Dtype | Size |" in one_setting  # not the default: shown


def test_a_straggler_line_names_the_rank_that_was_slowest_most_often(tmp_path):
    table = _collectives_table(tmp_path, [_variant_case("all_reduce", straggler=(1, 0.55, 2.0)),
                                          _variant_case("all_reduce", "bfloat16", straggler=(0, 0.9, 12.5))])
    assert ("_Straggler: in test_all_reduce[gloo-2p-1MB-bfloat16-sum-in-place], rank 0 was the slowest rank in "
            "90% of the rounds, by 12.5% over the other ranks (median of those rounds)._") in table
    assert "Straggler" not in _collectives_table(tmp_path, [_variant_case("all_reduce")])


# ----------------------------------------------------------------------------------------------
# Bad input is a named error (exit 2), never a traceback
# ----------------------------------------------------------------------------------------------


def _report_error(capsys, *argv) -> str:
    rc = cli.main(["report", *map(str, argv)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err, (rc, out, err)
    assert err.startswith("ddpbench report: error: ")
    return err


def _one_case(tmp_path, extra_info, **stats_over):
    """A run of one case; ``stats_over``: stats fields to overwrite (``data=None`` drops the rounds)."""
    doc = run_doc([bench("test_all_reduce[gloo-2p-1MB]", [0.001, 0.002, 0.003], extra_info)])
    stats = doc["benchmarks"][0]["stats"]
    stats.update(stats_over)
    if stats.get("data", 0) is None:
        del stats["data"]
    return write(tmp_path / "bad.json", doc)


COLLECTIVE = {"backend": "gloo", "world_size": 2, "device": "cpu", "op": "all_reduce", "size_bytes": MB}


@pytest.mark.parametrize("extra_info,message", [
    (dict(COLLECTIVE, size_bytes="1MB"), "extra_info.size_bytes is '1MB', expected a whole number of bytes above 0"),
    (dict(COLLECTIVE, world_size="two"), "extra_info.world_size is 'two', expected a whole number of ranks"),
    (dict(COLLECTIVE, op=["all_reduce"]), "extra_info.op is ['all_reduce'], expected a collective's name"),
    (dict(COLLECTIVE, backend={"name": "gloo"}), "extra_info.backend is dict {'name': 'gloo'}, expected one plain value"),
])
def test_malformed_extra_info_is_named_with_the_case_and_field(tmp_path, capsys, extra_info, message):
    err = _report_error(capsys, _one_case(tmp_path, extra_info), "--no-chart")
    assert "test_all_reduce[gloo-2p-1MB]: " + message in err and "damaged or was edited" in err


def test_zero_medians_and_extra_info_that_is_not_an_object_are_named(tmp_path, capsys):
    err = _report_error(capsys, _one_case(tmp_path, COLLECTIVE, data=[0.0, 0.0, 0.0], median=0.0), "--no-chart")
    assert "stats.data is not a list of round times (seconds, each above 0)" in err
    err = _report_error(capsys, _one_case(tmp_path, COLLECTIVE, data=None, median=0.0), "--no-chart")
    assert "its median round time is 0 s, and a round cannot take no time" in err
    path = _one_case(tmp_path, COLLECTIVE)
    doc = json.loads(path.read_text())
    doc["benchmarks"][0]["extra_info"] = ["op", "all_reduce"]
    path.write_text(json.dumps(doc))
    assert "extra_info is list, not an object of keys" in _report_error(capsys, path, "--no-chart")


def test_output_and_chart_folders_that_do_not_exist_are_named_and_nothing_is_created(tmp_path, capsys):
    path = _fixture_run(tmp_path, families=("collectives",))
    missing = tmp_path / "no-such-folder"
    err = _report_error(capsys, path, "--no-chart", "--output", missing / "r.md")
    assert (f"--output {missing / 'r.md'}: the folder {missing} does not exist; create it (mkdir -p {missing}) "
            f"or give --output a path in an existing folder") in err
    err = _report_error(capsys, path, "--chart", missing / "charts")
    assert f"--chart {missing / 'charts'}: the folder {missing} does not exist" in err
    (tmp_path / "a-file").write_text("")
    assert "is a file, not a folder" in _report_error(capsys, path, "--chart", tmp_path / "a-file")
    assert "is a folder; name a file in it" in _report_error(capsys, path, "--no-chart", "--output", tmp_path)
    assert not missing.exists()
    # The default charts folder is still created on a fresh checkout (make bench relies on it).
    assert cli.main(["report", str(path), "--no-chart", "--output", str(tmp_path / "r.md")]) == 0


def test_transformer_cases_get_their_own_table(tmp_path):
    info = {"backend": "gloo", "world_size": 2, "device": "cpu", "impl": "fsdp2", "size": "cpu-small",
            "tokens_per_second": 4096.0, "model_flops_per_step": 1e10, "mfu": 0.125, "peak_flops_measured": 2e11,
            "param_bytes": 8 * MB, "sharded_param_bytes": 4 * MB, "final_loss": 4.5, "memory": _memory(400 * MB)}
    exposed = dict(info, impl="ddp", compute_s=0.2, compute_s_ci=[0.19, 0.21], exposed_comm_s=0.0125,
                   exposed_comm_s_ci=[-0.001, 0.02], comm_isolated_s=0.05, comm_overlap_pct=75.0)
    path = write(tmp_path / "run.json", run_doc([
        bench("test_transformer[gloo-2p-cpu-small-fsdp2]", [0.2, 0.25, 0.3], info),
        bench("test_transformer[gloo-2p-cpu-small-ddp]", [0.2, 0.25, 0.3], exposed),
        bench("test_training[ddp-2p-accum1]", [0.05, 0.06], {"backend": "gloo", "world_size": 2, "device": "cpu",
                                                           "impl": "ddp", "model": "mlp", "grad_accum": 1,
                                                           "batch_size": 32, "samples_per_second": 1000.0})],
        machine=MACHINE_WITH_CORES))
    text = report.markdown_report(load_run(path))
    header, rows = _table_rows(text, "## Transformer training")
    assert header == ["Case", "Ranks", "Time per step (ms)", "Tokens/s", "MFU", "Measured peak (GFLOP/s)",
                      "Compute (ms)", "Exposed comm (ms)", "Comm alone (ms)", "Comm hidden", "Params",
                      "Params per rank", "Final loss", "Peak memory (census)"]
    assert rows == [["test_transformer[gloo-2p-cpu-small-ddp]", "2", "250.000", "4096", "0.125", "200.0",
                     "200.000 [190.000, 210.000]", "12.500 [-1.000, 20.000]", "50.000", "75%",
                     "8.0 MiB", "4.0 MiB", "4.5000", "400.0 MiB"],
                    ["test_transformer[gloo-2p-cpu-small-fsdp2]", "2", "250.000", "4096", "0.125", "200.0",
                     "-", "-", "-", "-", "8.0 MiB", "4.0 MiB", "4.5000", "400.0 MiB"]]
    _, training_rows = _table_rows(text, "## Training")
    assert [row[1] for row in training_rows] == ["mlp"]  # the transformer case is not a training row


def test_the_memory_table_shows_each_case_s_peak_and_what_held_it(tmp_path):
    # Seed 004's comparison as the census records it: DDP holds one bucket copy more than the
    # hand-written loop, and gradient_as_bucket_view takes it away.
    held = dict(parameters=8 * MB, gradients=8 * MB, optimizer_state=16 * MB)
    cases = {"manual": _memory(34 * MB, **held), "ddp": _memory(42 * MB, **held, ddp_buckets=8 * MB),
             "ddp_view": _memory(34 * MB, **held)}
    cuda = dict(_memory(34 * MB, **held), device="cuda",
                measured={"max_allocated_bytes": 40 * MB, "max_reserved_bytes": 64 * MB,
                          "census_over_allocated": 0.85})
    benches = [bench(f"test_training[{name}]", [0.05, 0.06], {"backend": "gloo", "world_size": 2, "device": "cpu",
                                                             "impl": "ddp", "model": "mlp", "memory": memory})
               for name, memory in cases.items()]
    benches.append(bench("test_cuda_case", [0.01], {"backend": "nccl", "world_size": 1, "device": "cuda",
                                                    "memory": cuda}))
    text = report.markdown_report(load_run(write(tmp_path / "run.json", run_doc(benches, machine=MACHINE_WITH_CORES))))
    header, rows = _table_rows(text, "## Memory")
    assert header == ["Case", "Ranks", "Peak (census)", "Parameters", "Gradients", "Optimizer state", "DDP buckets",
                      "Peak at", "Kept after the step", "Optimizer", "Measured max allocated", "Census / measured"]
    cells = {row[0]: dict(zip(header, row)) for row in rows}
    assert cells["test_training[ddp]"]["DDP buckets"] == "8.0 MiB" and cells["test_training[manual]"]["DDP buckets"] == "-"
    assert [cells[f"test_training[{n}]"]["Peak (census)"] for n in cases] == ["34.0 MiB", "42.0 MiB", "34.0 MiB"]
    assert cells["test_training[ddp]"]["Peak at"] == "blocks.0 backward"
    assert cells["test_training[ddp]"]["Optimizer"] == "AdamW (foreach off)"
    assert (cells["test_cuda_case"]["Measured max allocated"], cells["test_cuda_case"]["Census / measured"]) == (
        "40.0 MiB", "0.850")
    _, training_rows = _table_rows(text, "### ddp")  # the family's table shows the census peak too
    assert sorted(row[-1] for row in training_rows) == ["34.0 MiB", "34.0 MiB", "42.0 MiB"]


@pytest.mark.parametrize("memory,message", [
    ({"version": 1, "method": "MemTracker", "device": "cpu", "peak_bytes": "lots"},
     "memory.peak_bytes is 'lots', expected a whole number of bytes >= 0"),
    ({"peak_bytes": "lots"}, "memory.version is None, expected a whole number (the version of its format)"),
])
def test_a_damaged_memory_census_is_named(tmp_path, capsys, memory, message):
    path = write(tmp_path / "run.json", run_doc([bench("test_x", [0.01], {"memory": memory})]))
    assert cli.main(["report", str(path), "--no-chart"]) == 2
    assert "test_x: extra_info " + message in capsys.readouterr().err


def test_the_numerics_table_shows_each_case_s_replay_and_leaves_out_what_is_not_counted(tmp_path, capsys):
    def record(spread=0.0, first=None, **more):
        steps = [{"param w": ["p0", 1.0, 1.0, 1.0]}, {"param w": ["p1", 1.0, 1.0, 1.0], "loss": ["l1", 2.5, 2.5, 2.5]}]
        return dict({"version": 1, "steps": 1, "digests": ["a" * 64, "b" * 64], "tensors": [steps],
                     "replay_spread": spread, "first_nondeterministic_step": first}, **more)

    band = {"band": [{}, {"grad": 2.5e-7, "param": 1e-6}], "band_replays": 2}
    benches = [bench("test_exact", [0.01], {"numerics": record(**band)}),
               bench("test_noisy", [0.01], {"numerics": record(2e-7, 1)}),
               bench("test_unseeded", [0.01], {"numerics": record(not_reproducible="rank 0: the set-up differs")})]
    text = report.markdown_report(load_run(write(tmp_path / "run.json", run_doc(benches))))
    header, rows = _table_rows(text, "## Numerics")
    assert header == ["Case", "Steps", "Ranks", "Tensors", "Replays agree", "Band, step 1 gradients",
                      "Last step digest", "Loss (rank 0)"]
    assert rows == [["test_exact", "1", "1", "2", "bitwise", "1e-06", "bbbbbbbbbbbb", "2.5"],  # 4 x 2.5e-7
                    ["test_noisy", "1", "1", "2", "from step 1, up to 2e-07", "-", "bbbbbbbbbbbb", "2.5"]]
    damaged = write(tmp_path / "bad.json", run_doc([bench("test_x", [0.01], {"numerics": record(digests="x")})]))
    assert cli.main(["report", str(damaged), "--no-chart"]) == 2
    assert "test_x: extra_info numerics.digests is 'x'" in capsys.readouterr().err


def test_sizes_are_in_binary_units_named_as_such():
    # One convention for bytes in the report: IEC units, at a scale that shows the size (76,080,712 B
    # was "72.6 MB" and 32,772 B "0.0 MB").
    from ddpbench.report.cells import mem

    assert [mem(76_080_712), mem(32_772), mem(512), mem(3 * 2**30), mem(None)] == \
        ["72.6 MiB", "32.0 KiB", "512 B", "3.0 GiB", "n/a"]
