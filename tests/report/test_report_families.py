"""Each family's cases record the report section that shows them (``extra_info["family"]``), each
section is one module of ddpbench.report, and runs saved before cases recorded their family
still give the same report."""

from __future__ import annotations

import json
import pathlib

from helpers.benchjson import MACHINE, bench, run_doc, write
from ddpbench import report
from ddpbench.storage.runs import load_run
from test_import_cycles import find_cycle, import_graph
from helpers.paths import REPO_ROOT

DATA = pathlib.Path(__file__).resolve().parent / "data"
SRC = REPO_ROOT / "src"
COLLECTIVE = {"backend": "gloo", "world_size": 2, "device": "cpu", "op": "all_reduce", "size_bytes": 1 << 20}


def _built_in_cases():
    """One case descriptor of each built-in family, and the section its cases belong in."""
    from ddpbench.workloads.collectives import Collective
    from ddpbench.workloads.datasets import DatasetEpoch, DatasetSpec
    from ddpbench.workloads.syncbn import SyncBNCase
    from ddpbench.workloads.training import Training, TransformerTraining

    return [(Collective("all_reduce", 4096), "collectives"), (SyncBNCase("fused", 32, 128), "syncbn"),
            (DatasetEpoch.built_in_ranks(DatasetSpec("stacked", 8), "file_descriptor"), "datasets"),
            (Training("mlp", "ddp"), "training"), (TransformerTraining(), "transformer")]


def test_each_built_in_family_records_the_section_that_shows_it():
    for workload, section in _built_in_cases():
        recorded = workload.extra_info(2, 0.5)["family"]
        assert recorded == section, type(workload).__name__
    assert {section for _, section in _built_in_cases()} | {"other"} == {t.name for t in report.FAMILY_TABLES}


def test_a_case_is_shown_in_the_section_it_recorded_whatever_its_keys(tmp_path):
    # A collective's keys, recorded as a user's own family "other"; a training case whose keys read
    # as a transformer's; and a family this ddpbench has no table for (a newer one's), shown with the
    # other cases.
    run = load_run(write(tmp_path / "run.json", run_doc([
        bench("test_own_collective", [0.001, 0.002], dict(COLLECTIVE, family="other")),
        bench("test_training[x]", [0.05, 0.06], {"family": "training", "backend": "gloo", "world_size": 2,
                                                 "impl": "ddp", "model": "mlp", "tokens_per_second": 640.0,
                                                 "model_flops_per_step": 1e9}),
        bench("test_pipeline[x]", [0.01, 0.02], {"family": "pipeline", "backend": "gloo", "world_size": 2}),
        bench("test_all_reduce[gloo-2p-1MB]", [0.001, 0.002], COLLECTIVE)], machine=MACHINE)))
    groups = report.by_family(run)
    assert {name: sorted(c.name for c in cases) for name, cases in groups.items()} == {
        "other": ["test_own_collective", "test_pipeline[x]"], "training": ["test_training[x]"],
        "collectives": ["test_all_reduce[gloo-2p-1MB]"]}  # the last recorded none: told by its keys
    text = report.markdown_report(run)
    assert "| test_own_collective | 1.500 |" in text and "## Transformer training" not in text
    assert "### ddp\n\n| Ranks | Model |" in text and "| 2 | mlp | - | - | 55.000 | n/a |" in text


def test_a_family_that_is_not_one_plain_value_is_named(tmp_path, capsys):
    from ddpbench import cli

    path = write(tmp_path / "bad.json", run_doc([bench("test_x", [0.01], dict(COLLECTIVE, family=["a"]))]))
    assert cli.main(["report", str(path), "--no-chart"]) == 2
    assert "test_x: extra_info.family is list ['a'], expected one plain value" in capsys.readouterr().err


def test_a_run_saved_before_cases_recorded_their_family_reports_as_it_did():
    # A real run of a case of every family, saved by ddpbench before cases recorded "family"; the
    # markdown beside it is what that ddpbench's report printed for it.
    path = DATA / "run_saved_before_family.json"
    doc = json.loads(path.read_text())
    assert not any("family" in b["extra_info"] for b in doc["benchmarks"])
    expected = (DATA / "run_saved_before_family.md").read_text()
    assert report.markdown_report(load_run(path)) == expected
    assert [name for name in report.by_family(load_run(path))] == [
        "collectives", "syncbn", "training", "transformer", "datasets"]


def test_the_same_run_recording_its_families_reports_the_same(tmp_path):
    path = DATA / "run_saved_before_family.json"
    doc = json.loads(path.read_text())
    sections = {"op": "collectives", "variant": "syncbn", "layout": "datasets", "tokens_per_second": "transformer"}
    for case in doc["benchmarks"]:
        info = case["extra_info"]
        info["family"] = next((name for key, name in sections.items() if key in info), "training")
    recorded = tmp_path / path.name
    recorded.write_text(json.dumps(doc))
    assert report.markdown_report(load_run(recorded)) == (DATA / "run_saved_before_family.md").read_text()


def test_the_report_package_imports_run_one_way():
    package = "ddpbench.report"
    graph = import_graph(SRC / package.replace(".", "/"), package)
    assert f"{package}.collectives" in graph[f"{package}.families"]
    assert find_cycle(graph) is None


def test_a_case_without_a_key_its_family_s_table_needs_is_named(tmp_path, capsys):
    from ddpbench import cli

    info = {k: v for k, v in COLLECTIVE.items() if k != "size_bytes"}
    path = write(tmp_path / "bad.json", run_doc([bench("test_x", [0.01], dict(info, family="collectives"))]))
    assert cli.main(["report", str(path), "--no-chart"]) == 2
    assert ("test_x: extra_info has no size_bytes, which every case of the collectives family records"
            in capsys.readouterr().err)
