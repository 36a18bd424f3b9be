"""lab/reference/nccl_tests_side_by_side.py: parsing recorded nccl-tests output (H100, nccl-tests
2.19.6) and the per-size summary; no GPU needed."""

import pathlib

import pytest

from helpers.lab_scripts import load_lab_script

DATA = pathlib.Path(__file__).parent / "data"
side_by_side = load_lab_script("nccl_tests_side_by_side")


def test_parses_both_placements_of_every_size_of_a_recorded_run():
    parsed = side_by_side.parse_nccl_tests((DATA / "nccl_tests_all_gather_h100.txt").read_text())
    assert parsed["version"] == "2.19.6" and parsed["wrong"] == 0
    assert sorted(parsed["rows"]) == [1 << 20, 10 << 20, 100 << 20, 1000 << 20]
    assert parsed["rows"][1000 << 20]["out-of-place"] == pytest.approx(693.33)
    assert all(set(placed) == {"out-of-place", "in-place"} for placed in parsed["rows"].values())


def test_parses_graph_mode_output():
    parsed = side_by_side.parse_nccl_tests((DATA / "nccl_tests_reduce_scatter_graphs_h100.txt").read_text())
    assert parsed["rows"][10 << 20] == {"out-of-place": 9.00, "in-place": 0.01}


def test_counts_wrong_elements_and_refuses_output_without_results():
    text = (DATA / "nccl_tests_all_gather_h100.txt").read_text().splitlines()
    row = next(i for i, line in enumerate(text) if line.strip().startswith("1048576 "))
    fields = text[row].split()
    fields[8] = "3"  # out-of-place #wrong
    text[row] = "  ".join(fields)
    assert side_by_side.parse_nccl_tests("\n".join(text))["wrong"] == 3
    with pytest.raises(ValueError, match="no result lines"):
        side_by_side.parse_nccl_tests("# nccl-tests version 2.19.6\nNCCL failure common.cu:1 'unhandled cuda error'\n")


def test_sizes_and_the_summary_pair_each_tool_by_op_placement_and_size():
    assert side_by_side.ddpbench_sizes([1 << 20, 1000 << 20]) == "1MB,1000MB"
    with pytest.raises(ValueError):
        side_by_side.ddpbench_sizes([1000])
    ours = side_by_side.read_ddpbench_json({"benchmarks": [
        {"extra_info": {"op": "all_gather", "placement": "out-of-place", "size_bytes": 1 << 20},
         "stats": {"median": 8e-6}},
        {"extra_info": {"workload": "other"}, "stats": {"median": 1.0}}]})
    assert ours == {("all_gather", "out-of-place", 1 << 20): pytest.approx(8.0)}
    records = [{"repeat": r, "graphs": "off", "op": "all_gather", "placement": "out-of-place",
                "size_bytes": 1 << 20, "nccl_tests_us": 4.0, "ddpbench_us": us} for r, us in enumerate((4.0, 5.0, 6.0))]
    records.append({"repeat": 0, "graphs": "off", "op": "all_reduce", "placement": "out-of-place",
                    "size_bytes": 1 << 20, "nccl_tests_us": 4.0, "ddpbench_us": None})
    rows = {(r["op"], r["placement"]): r for r in side_by_side.summarize(records)}
    ratio = rows[("all_gather", "out-of-place")]["ratio"]
    assert (ratio["median"], ratio["min"], ratio["max"], ratio["n"]) == (1.25, 1.0, 1.5, 3)
    assert rows[("all_reduce", "out-of-place")]["ratio"] is None  # torch has no out-of-place all_reduce
    assert "| off | all_gather | out-of-place | 1 MB |" in side_by_side.table(list(rows.values()))
