"""The report's scaling charts, read from the matplotlib objects (never pixels), for saved runs
built with tests/helpers/benchjson.py: a row of panels per model, whole-number world-size ticks only, one
line per configuration (a case's id without its world size, so accumulation settings never zig-zag
inside one line), transformer tokens/s and MFU, and every legend outside the data area."""

from __future__ import annotations

import pytest

from helpers.benchjson import bench, run_doc, write
from ddpbench import report
from ddpbench.storage.runs import Case, load_run

ROUNDS = [0.05, 0.06, 0.07]
IMPL_SPEED = {"manual": 1.0, "ddp": 1.1, "lightning": 0.8}
TRANSFORMER_CONFIGS = ("ddp", "ddp-cap1", "ddp-accum2", "fsdp2", "fsdp2-bf16")


def _samples_per_second(model, impl, accum, ws):
    return 1000.0 * ws * IMPL_SPEED[impl] * (1.3 if accum == 4 else 1.0) * (2.0 if model == "cnn" else 1.0)


def _tokens_per_second(size, i, ws):
    return 2000.0 * ws * (1 + i / 10) * (0.5 if size == "cpu-large" else 1.0)


def _mfu(size, i, ws):
    return round(0.3 - 0.02 * i - 0.01 * ws, 6)


def _run(tmp_path, world_sizes=(1, 2), transformer_mfu=True, families=("training", "transformer")):
    benches = []
    if "training" in families:
        for model in ("mlp", "cnn"):
            for impl in IMPL_SPEED:
                for accum in (4, 1):  # accum4 first: a line that followed case order would zig-zag
                    for ws in world_sizes:
                        benches.append(bench(
                            f"test_training[gloo-{ws}p-{model}-{impl}-accum{accum}-b32]", ROUNDS,
                            {"backend": "gloo", "world_size": ws, "device": "cpu", "impl": impl, "model": model,
                             "grad_accum": accum, "batch_size": 32,
                             "samples_per_second": _samples_per_second(model, impl, accum, ws)}))
    if "transformer" in families:
        for size in ("cpu-small", "cpu-large"):
            for i, config in enumerate(TRANSFORMER_CONFIGS):
                for ws in world_sizes:
                    info = {"backend": "gloo", "world_size": ws, "device": "cpu", "impl": config.split("-")[0],
                            "model": f"gpt-{size}", "size": size, "model_flops_per_step": 1e9,
                            "tokens_per_second": _tokens_per_second(size, i, ws)}
                    if transformer_mfu:
                        info["mfu"] = _mfu(size, i, ws)
                    benches.append(bench(f"test_transformer[gloo-{ws}p-{size}-{config}]", ROUNDS, info))
    return load_run(write(tmp_path / "run.json", run_doc(benches)))


@pytest.fixture
def plt():
    pyplot = report.pyplot()
    yield pyplot
    pyplot.close("all")


def _lines(ax) -> dict[str, tuple[list, list]]:
    """Legend label -> (x, y) of each error-bar line drawn in the panel."""
    lines = {}
    for container in ax.containers:
        line = container.lines[0]
        assert container.get_label() not in lines, f"two lines labelled {container.get_label()}"
        lines[container.get_label()] = (list(line.get_xdata()), list(line.get_ydata()))
    return lines


def _integer_ticks_only(ax) -> bool:
    ticks = list(ax.get_xticks())
    labels = [t.get_text() for t in ax.get_xticklabels()]
    return (all(float(t).is_integer() for t in ticks) and labels == [str(int(t)) for t in ticks]
            and len(ax.xaxis.get_minorticklocs()) == 0)


def _legends_outside_the_data(fig) -> bool:
    """Every legend drawn lies within the figure and overlaps no panel's data area."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    if not legends:
        return False
    for legend in legends:
        box = legend.get_window_extent(renderer)
        if any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes):
            return False
        if not (fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1):
            return False
    return True


def test_the_chart_checks_can_fail(plt):
    # matplotlib's defaults over world sizes 1 and 2: fractional ticks, a legend over the data
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1000, 2000], label="ddp")
    ax.plot([1, 2], [2000, 1000], label="manual")
    ax.legend(loc="center")
    assert not _integer_ticks_only(ax)
    assert not _legends_outside_the_data(fig)


def test_training_chart_has_a_panel_per_model_and_a_line_per_configuration(tmp_path, plt):
    fig = report.training_figure(plt, report.by_family(_run(tmp_path))["training"])
    assert [ax.get_title() for ax in fig.axes] == ["cnn", "mlp"]
    expected_labels = sorted(f"{impl}-accum{accum}" for impl in IMPL_SPEED for accum in (1, 4))
    for ax in fig.axes:
        lines = _lines(ax)
        assert sorted(lines) == expected_labels  # b32, gloo and the model: shared, left out
        for label, (xs, ys) in lines.items():
            impl, accum = label.split("-accum")
            assert xs == [1, 2]  # one point per world size, in order: no zig-zag
            assert ys == [_samples_per_second(ax.get_title(), impl, int(accum), ws) for ws in xs]
        assert list(ax.get_xticks()) == [1, 2] and _integer_ticks_only(ax)
        assert "world size" in ax.get_xlabel() and "samples/s" in ax.get_ylabel()
    assert _legends_outside_the_data(fig)


def test_transformer_chart_has_tokens_and_mfu_per_model(tmp_path, plt):
    fig = report.transformer_figure(plt, report.by_family(_run(tmp_path, world_sizes=(1, 2, 4, 8)))["transformer"])
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["gpt-cpu-large: tokens/s", "gpt-cpu-large: MFU (measured peak)",
                      "gpt-cpu-small: tokens/s", "gpt-cpu-small: MFU (measured peak)"]
    for ax in fig.axes:
        size = ax.get_title().split(":")[0].removeprefix("gpt-")
        lines = _lines(ax)
        assert sorted(lines) == sorted(TRANSFORMER_CONFIGS)
        for label, (xs, ys) in lines.items():
            i = TRANSFORMER_CONFIGS.index(label)
            assert xs == [1, 2, 4, 8]
            value = _mfu if "MFU" in ax.get_title() else _tokens_per_second
            assert ys == pytest.approx([value(size, i, ws) for ws in xs])
        # 1..8 on a base-2 axis, still labelled with the world sizes themselves
        assert list(ax.get_xticks()) == [1, 2, 4, 8] and _integer_ticks_only(ax)
    assert _legends_outside_the_data(fig)


def test_one_world_size_and_no_mfu_draws_a_sorted_bar_per_configuration(tmp_path, plt):
    # A run at one world size, saved without MFU: no MFU column, and instead of a column of dots
    # over one tick, a bar per configuration, the fastest on top, labelled on the axis.
    run = _run(tmp_path, world_sizes=(2,), transformer_mfu=False, families=("transformer",))
    fig = report.transformer_figure(plt, report.by_family(run)["transformer"])
    assert [ax.get_title() for ax in fig.axes] == ["gpt-cpu-large", "gpt-cpu-small"]
    assert fig.get_suptitle() == "transformer scaling at 2 processes"
    for ax in fig.axes:
        size = ax.get_title().removeprefix("gpt-")
        bars = sorted(ax.patches, key=lambda bar: bar.get_y())  # bottom to top
        names = [label.get_text() for label in ax.get_yticklabels()]
        expected = sorted(TRANSFORMER_CONFIGS, key=lambda config: _tokens_per_second(size, TRANSFORMER_CONFIGS.index(config), 2))
        assert names == expected and len(bars) == len(expected)
        assert [bar.get_width() for bar in bars] == pytest.approx(
            [_tokens_per_second(size, TRANSFORMER_CONFIGS.index(config), 2) for config in expected])
        assert "tokens/s" in ax.get_xlabel() and ax.get_legend() is None


def test_configuration_is_the_case_id_without_its_world_size():
    case = Case(name="test_training[gloo-2p-mlp-ddp-accum4-b32]", fullname="x", group=None,
                       extra_info={"world_size": 2}, stats={"median": 1.0}, data=None)
    assert report.configuration(case) == ("test_training", "gloo", "mlp", "ddp", "accum4", "b32")
    assert report.line_labels([("t", "gloo", "ddp", "b32"), ("t", "gloo", "manual", "b32")]) == {
        ("t", "gloo", "ddp", "b32"): "ddp", ("t", "gloo", "manual", "b32"): "manual"}
    assert report.line_labels([("t", "gloo", "ddp")]) == {("t", "gloo", "ddp"): "t-gloo-ddp"}


def test_write_charts_writes_the_transformer_chart(tmp_path):
    written = report.write_charts(_run(tmp_path), tmp_path / "charts")
    assert sorted(p.name for p in written) == ["training_scaling.png", "transformer_scaling.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for p in written)
