"""The structural verdict: two census records compared exactly (planted changes give the exact
line; fewer is an improvement; order never matters; a side without a census leaves the timing
verdict alone), and both gates acting on it: a structural regression fails `ddpbench compare` and
the A/B run whatever the timing says, unless the change is accepted by the option, and the table
shows it either way."""

from __future__ import annotations

import copy
import json

import pytest

from helpers.benchjson import bench, run_cli, run_doc, write
from helpers.census_records import census
from ddpbench import cli
from ddpbench.gates import verdicts
from ddpbench.gates.exit_decision import decide_exit, exit_lines
from ddpbench.gates.stored_run_gate import compare_runs
from ddpbench.gates.structure import StructureVerdict, compare_census
from ddpbench.storage.records import RecordError
from ddpbench.storage.runs import load_run

MiB = 1 << 20


# The DDP step of the issue: three all_reduce calls over two buckets...
BASE = census(("all_reduce", "float32", 2, [MiB, MiB, 2 * MiB]), buckets=[2 * MiB, 2 * MiB])
# ... and the change that split them: four calls, one more MiB, four buckets of the same bytes.
GREW = census(("all_reduce", "float32", 2, [MiB, MiB, MiB, 2 * MiB]), buckets=[MiB] * 4)
GREW_LINE = "all_reduce float32 in a group of 2: 3 → 4 per step, +1.0 MiB; buckets 2 → 4"


# ----------------------------------------------------------------------------------------------
# The rule
# ----------------------------------------------------------------------------------------------


def test_more_collectives_bytes_and_buckets_are_a_regression_with_a_line_naming_each():
    assert compare_census(BASE, GREW) == StructureVerdict("regression", GREW_LINE)


def test_fewer_are_an_improvement_with_the_same_line_reversed():
    assert compare_census(GREW, BASE) == StructureVerdict(
        "improvement", "all_reduce float32 in a group of 2: 4 → 3 per step, -1.0 MiB; buckets 4 → 2")


def test_a_census_that_differs_only_in_order_is_the_same():
    shuffled = copy.deepcopy(census(("all_reduce", "float32", 2, [MiB, 2 * MiB]),
                                    ("all_gather", "bfloat16", 2, [4 * MiB]), buckets=[MiB, 3 * MiB]))
    base = copy.deepcopy(shuffled)
    shuffled["collectives"].reverse()
    shuffled["collectives"][1]["call_bytes"].reverse()
    shuffled["ddp_buckets"].reverse()
    assert shuffled["collectives"] != base["collectives"]  # the order really differs
    assert compare_census(base, shuffled) == StructureVerdict("same", "")
    assert compare_census(BASE, copy.deepcopy(BASE)) == StructureVerdict("same", "")


@pytest.mark.parametrize("before, after, verdict, line", [
    # a new kind of collective, and one that went away
    (census(("all_reduce", "float32", 2, [MiB])),
     census(("all_gather", "bfloat16", 2, [2 * MiB, 2 * MiB]), ("all_reduce", "float32", 2, [MiB])),
     "regression", "all_gather bfloat16 in a group of 2: 0 → 2 per step, +4.0 MiB"),
    (census(("broadcast", "float32", 4, [MiB]), ("all_reduce", "float32", 4, [MiB])),
     census(("all_reduce", "float32", 4, [MiB])),
     "improvement", "broadcast float32 in a group of 4: 1 → 0 per step, -1.0 MiB"),
    # the same calls over another group is another collective
    (census(("all_reduce", "float32", 2, [MiB])), census(("all_reduce", "float32", 4, [MiB])),
     "regression", "all_reduce float32 in a group of 2: 1 → 0 per step, -1.0 MiB; all_reduce float32 in a group of 4: 0 → 1 per step, "
                   "+1.0 MiB; mixed: some figures up, some down (a regression)"),
    # bytes alone, and more calls of the same bytes
    (census(("all_reduce", "float32", 2, [MiB])), census(("all_reduce", "float32", 2, [2 * MiB])),
     "regression", "all_reduce float32 in a group of 2: 1 per step, +1.0 MiB"),
    (census(("all_reduce", "float32", 2, [2 * MiB])), census(("all_reduce", "float32", 2, [MiB, MiB])),
     "regression", "all_reduce float32 in a group of 2: 1 → 2 per step, same bytes"),
    # the same calls and bytes in other sizes: neither more nor fewer, stopped until accepted
    (census(("all_reduce", "float32", 2, [MiB, 3 * MiB])), census(("all_reduce", "float32", 2, [2 * MiB, 2 * MiB])),
     "regression", "all_reduce float32 in a group of 2: 2 per step, same bytes in other sizes (1.0 MiB, 3.0 MiB → 2.0 MiB, "
                   "2.0 MiB); neither more nor fewer (a regression until accepted)"),
    # torch.compile's counters
    (census(graph_breaks=0, recompiles=1), census(graph_breaks=2, recompiles=1),
     "regression", "graph breaks 0 → 2"),
    (census(graph_breaks=1, recompiles=3), census(graph_breaks=0, recompiles=1),
     "improvement", "graph breaks 1 → 0; recompiles 3 → 1"),
    # one figure up and another down is a regression, and the line says it is mixed
    (census(("all_reduce", "float32", 2, [MiB]), buckets=[MiB, MiB]),
     census(("all_reduce", "float32", 2, [MiB, MiB]), buckets=[2 * MiB]),
     "regression", "all_reduce float32 in a group of 2: 1 → 2 per step, +1.0 MiB; buckets 2 → 1; mixed: some figures up, "
                   "some down (a regression)"),
    # ranks that stop agreeing on the collectives
    (census(("all_reduce", "float32", 2, [MiB])), census(("all_reduce", "float32", 2, [MiB]), ranks_disagree=True),
     "regression", "the ranks disagree on the collectives"),
    # kernel launches are reported, never decided on
    (census(launches=120), census(launches=180), "same", "CUDA kernel launches 120 → 180 (reported, not judged)"),
    # a figure counted on one side only is named, not judged
    (census(graph_breaks=None), census(graph_breaks=3), "same", "graph breaks counted in the current only"),
])
def test_planted_changes_give_the_exact_verdict_and_line(before, after, verdict, line):
    assert compare_census(before, after) == StructureVerdict(verdict, line)


@pytest.mark.parametrize("before, after, line", [
    (None, BASE, "the baseline recorded no census"),
    (BASE, None, "the current recorded no census"),
    (None, None, "neither side recorded a census"),
    (BASE, dict(BASE, version=3), "current: census version 3 (this ddpbench reads versions 1, 2)"),
    (BASE, dict(GREW, method="profiler"), "counted differently (baseline dispatch:c10d, current profiler)"),
    # A workload that knows part of its step escapes the count (PowerSGD's callbacks, Lightning's
    # thread) on both sides: not judged, even though the counts differ.
    (dict(BASE, incomplete="callbacks on gloo's threads"), dict(GREW, incomplete="callbacks on gloo's threads"),
     "baseline: its census is incomplete (callbacks on gloo's threads); current: its census is incomplete "
     "(callbacks on gloo's threads)"),
])
def test_a_side_without_a_comparable_census_is_not_counted(before, after, line):
    assert compare_census(before, after) == StructureVerdict("not counted", line)


@pytest.mark.parametrize("change, message", [
    ({"collectives": "all_reduce"}, "census.collectives is 'all_reduce', expected a list of collectives"),
    ({"collectives": [{"kind": "all_reduce", "dtype": "float32", "group_size": 0, "count": 1, "bytes": 4}]},
     "census.collectives[0].group_size is 0, expected a whole number >= 1"),
    ({"collectives": [{"kind": "all_reduce", "dtype": "float32", "group_size": 2, "count": -1, "bytes": 4}]},
     "census.collectives[0].count is -1, expected a number >= 0"),
    ({"ddp_buckets": ["1MB"]}, "census.ddp_buckets[0] is '1MB', expected a number >= 0"),
    ({"graph_breaks": "two"}, "census.graph_breaks is 'two', expected a number >= 0 or null"),
    ({"ranks_disagree": "yes"}, "census.ranks_disagree is 'yes', expected true or false"),
    ({"incomplete": True}, "census.incomplete is True, expected text (why the census misses collectives)"),
])
def test_a_malformed_census_is_an_error_naming_its_side_and_field(change, message):
    with pytest.raises(RecordError) as caught:
        compare_census(BASE, dict(BASE, **change))
    assert str(caught.value) == message and caught.value.side == "current"
    with pytest.raises(RecordError) as caught:
        compare_census(dict(BASE, **change), BASE)
    assert caught.value.side == "baseline"


# ---- what depends on the data, which group, which peer, and the format's versions --------------

OBJECT = {"data_dependent_bytes": "object"}
SPLITS = {"data_dependent_bytes": "splits"}


@pytest.mark.parametrize("before, after, verdict, line", [
    # all_gather_object of a longer string: 9 more pickled bytes are data, not structure
    (census(("all_gather", "uint8", 2, [64], OBJECT)), census(("all_gather", "uint8", 2, [73], OBJECT)),
     "same", "all_gather uint8 in a group of 2: +9 B (object: bytes depend on the data, not judged)"),
    # an all_to_all whose splits the data sets (a mixture of experts' routing)
    (census(("all_to_all", "float32", 4, [4096], SPLITS)), census(("all_to_all", "float32", 4, [1024], SPLITS)),
     "same", "all_to_all float32 in a group of 4: -3.0 KiB (splits: bytes depend on the data, not judged)"),
    # ... their calls are still counted and judged
    (census(("all_gather", "uint8", 2, [64], OBJECT)), census(("all_gather", "uint8", 2, [64, 80], OBJECT)),
     "regression", "all_gather uint8 in a group of 2: 1 → 2 per step (object: bytes not judged)"),
    # a baseline whose split happened to be even (no mark) against one that was not: not judged either
    (census(("all_to_all", "float32", 4, [4096])), census(("all_to_all", "float32", 4, [5000], SPLITS)),
     "same", "all_to_all float32 in a group of 4: +904 B (splits: bytes depend on the data, not judged)"),
    # two mesh dimensions of one size swapping their traffic
    (census(("all_reduce", "float32", 2, [MiB], {"group": "mesh_dp"}),
            ("all_reduce", "float32", 2, [4 * MiB], {"group": "mesh_tp"})),
     census(("all_reduce", "float32", 2, [4 * MiB], {"group": "mesh_dp"}),
            ("all_reduce", "float32", 2, [MiB], {"group": "mesh_tp"})),
     "regression", "all_reduce float32 in mesh_dp (a group of 2): 1 per step, +3.0 MiB; all_reduce float32 in mesh_tp (a group of 2): "
                   "1 per step, -3.0 MiB; mixed: some figures up, some down (a regression)"),
    # a send that goes to the previous rank instead of the next
    (census(("send", "float32", 4, [MiB], {"peer": 1})), census(("send", "float32", 4, [MiB], {"peer": -1})),
     "regression", "send float32 in a group of 4 to -1: 0 → 1 per step, +1.0 MiB; send float32 in a group of 4 to +1: 1 → 0 per step, "
                   "-1.0 MiB; mixed: some figures up, some down (a regression)"),
    # two version-1 records (saved by an older ddpbench) are still compared as they were
    (census(("all_reduce", "float32", 2, [MiB]), version=1),
     census(("all_reduce", "float32", 2, [MiB, MiB]), version=1),
     "regression", "all_reduce float32 in a group of 2: 1 → 2 per step, +1.0 MiB"),
])
def test_data_dependent_bytes_groups_peers_and_old_records(before, after, verdict, line):
    assert compare_census(before, after) == StructureVerdict(verdict, line)


@pytest.mark.parametrize("before, after, line", [
    # a version-1 record against a version-2 one: refused, with why
    (census(("all_reduce", "float32", 2, [MiB]), version=1), census(("all_reduce", "float32", 2, [MiB])),
     "census versions differ (baseline 1, current 2): version 1 tells neither process groups nor peers apart "
     "and never checked for unseen collectives; record both sides with one ddpbench to compare them"),
    (census(("all_reduce", "float32", 2, [MiB])), census(("all_reduce", "float32", 2, [MiB]), version=1),
     "census versions differ (baseline 2, current 1): version 1 tells neither process groups nor peers apart "
     "and never checked for unseen collectives; record both sides with one ddpbench to compare them"),
    # a step that issues a collective every other step, saved before each step's profile was kept,
    # on both sides: which phase was counted is chance
    (dict(BASE, varies_between_steps="op 1 of 2: 1 all_reduce; op 2 of 2: none"),
     dict(GREW, varies_between_steps="op 1 of 2: 1 all_reduce; op 2 of 2: none"),
     "baseline: its collectives vary between steps (op 1 of 2: 1 all_reduce; op 2 of 2: none); current: its "
     "collectives vary between steps (op 1 of 2: 1 all_reduce; op 2 of 2: none)"),
])
def test_censuses_of_two_versions_or_varying_steps_are_not_counted(before, after, line):
    assert compare_census(before, after) == StructureVerdict("not counted", line)


# ---- nothing counted partially is judged as whole ---------------------------------------------

INCOMPLETE = dict(GREW, incomplete="callbacks on gloo's threads")
VARIES = dict(GREW, varies_between_steps="op 1 of 2: 1 all_reduce; op 2 of 2: none")


@pytest.mark.parametrize("before, after, line", [
    (BASE, INCOMPLETE, "counted in full on the baseline only (current: its census is incomplete (callbacks on "
                       "gloo's threads)): a regression until accepted"),
    (INCOMPLETE, BASE, "counted in full on the current only (baseline: its census is incomplete (callbacks on "
                       "gloo's threads)): a regression until accepted"),
    (BASE, VARIES, "counted in full on the baseline only (current: its collectives vary between steps (op 1 of 2: "
                   "1 all_reduce; op 2 of 2: none)): a regression until accepted"),
])
def test_a_census_counted_on_one_side_only_is_a_regression_until_accepted(before, after, line):
    assert compare_census(before, after) == StructureVerdict("regression", line)


def _steps(*steps):
    """A census whose collectives vary between steps, with each step's profile (each step: the
    all_reduce call sizes)."""
    records = [census(*([("all_reduce", "float32", 2, calls)] if calls else [])) for calls in steps]
    ops = len(steps)
    average = census(("all_reduce", "float32", 2, [c for calls in steps for c in calls]))
    for entry in average["collectives"]:
        entry.update(count=entry["count"] / ops, bytes=entry["bytes"] / ops, call_bytes=None)
    text = "; ".join(f"op {i + 1} of {ops}: {len(calls) or 'none'}{' all_reduce' if calls else ''}"
                     for i, calls in enumerate(steps))
    return dict(average, ops_counted=ops, varies_between_steps=text, steps=[r["collectives"] for r in records])


@pytest.mark.parametrize("before, after, verdict, line", [
    # gradient accumulation over 2 steps whose sync step all_reduces 1 MiB more
    (_steps([], [MiB]), _steps([], [MiB, MiB]), "regression",
     "step 2 of 2: all_reduce float32 in a group of 2: 1 → 2 per step, +1.0 MiB"),
    (_steps([], [MiB, MiB]), _steps([], [MiB]), "improvement",
     "step 2 of 2: all_reduce float32 in a group of 2: 2 → 1 per step, -1.0 MiB"),
    # the census began in the other phase of the cycle on one side: the same steps
    (_steps([], [MiB]), _steps([MiB], []), "same", ""),
    # a step that varies now against one that did not
    (census(("all_reduce", "float32", 2, [MiB])), _steps([], [MiB]), "improvement",
     "step 1 of 2: all_reduce float32 in a group of 2: 1 → 0 per step, -1.0 MiB"),
])
def test_steps_that_vary_are_compared_step_by_step(before, after, verdict, line):
    assert compare_census(before, after) == StructureVerdict(verdict, line)


def test_compare_fails_on_a_census_counted_on_one_side_only_until_accepted(tmp_path, capsys):
    b, c = _runs(tmp_path, _steps([], [MiB]), _steps([], [MiB, MiB]))
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 1 and "regression: step 2 of 2: all_reduce float32 in a group of 2: 1 → 2 per step, +1.0 MiB" in out
    b, c = _runs(tmp_path, BASE, INCOMPLETE)
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 1 and "counted in full on the baseline only" in out
    rc, out, _ = run_cli(capsys, "compare", b, c, "--accept-structure-change")
    assert rc == 0 and "regression, accepted: counted in full on the baseline only" in out


@pytest.mark.parametrize("change, message", [
    ({"group": None}, "census.collectives[0].group is None, expected text (which process group)"),
    ({"peer": "next"}, "census.collectives[0].peer is 'next', expected an offset within the group (a whole "
                       "number), \"any\" or null"),
    ({"data_dependent_bytes": 3}, "census.collectives[0].data_dependent_bytes is 3, expected text (why its bytes "
                                  "depend on the data) or null"),
])
def test_a_malformed_version_2_entry_is_an_error_naming_its_field(change, message):
    bad = copy.deepcopy(BASE)
    bad["collectives"][0].update(change)
    with pytest.raises(RecordError) as caught:
        compare_census(BASE, bad)
    assert str(caught.value) == message


# ----------------------------------------------------------------------------------------------
# ddpbench compare: stored runs
# ----------------------------------------------------------------------------------------------

STEADY = [0.0010, 0.00101, 0.00099, 0.00100, 0.00102, 0.00098] * 5  # 30 rounds, the same on both sides
NAME = "test_step[gloo-2p]"


def _runs(tmp_path, base_census, cur_census, cur_rounds=STEADY):
    def info(c):
        return {} if c is None else {"census": c}

    b = write(tmp_path / "base.json", run_doc([bench(NAME, STEADY, info(base_census))]))
    c = write(tmp_path / "cur.json", run_doc([bench(NAME, cur_rounds, info(cur_census))]))
    return str(b), str(c)


def _row_and_details(out: str) -> tuple[str, list[str]]:
    """The case's row in the text table and the lines indented under it."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if NAME in line and not line.startswith(" "))
    under = []
    for line in lines[at + 1:]:
        if not line.startswith("    "):
            break
        under.append(line)
    return lines[at], under


def test_compare_fails_on_a_structural_regression_whatever_the_timing_says(tmp_path, capsys):
    b, c = _runs(tmp_path, BASE, GREW)
    rc, out, _ = run_cli(capsys, "compare", b, c)
    assert rc == 1
    row, under = _row_and_details(out)
    assert row.endswith("regression (structure; timing same)  <<")
    assert f"    structure: regression: {GREW_LINE}" in under  # on its own line under the case's row
    last = out.rsplit("\n1 structural regression(s)", 1)[1]  # the last exit line, wrapped at 160 columns
    assert " ".join(last.split()) == (
        f"(benchmarks/test_x.py::{NAME}): what one step launches grew or changed, a "
        f"regression whatever the timing says (--accept-structure-change accepts a change made on purpose)")
    title = " ".join(out.split("\ncase ", 1)[0].split())  # the summary wraps at 120 columns
    assert "structure: 1 regression" in title
    rc, out, _ = run_cli(capsys, "compare", b, c, "--markdown")
    assert rc == 1 and "| structure | verdict |" in out
    assert f"| regression: {GREW_LINE} | ❌ **regression** (structure; timing same) |" in out
    rc, out, _ = run_cli(capsys, "compare", b, c, "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 1 and case["verdict"] == "regression" and case["timing_verdict"] == "same"
    assert case["structure"] == {"verdict": "regression", "line": GREW_LINE, "accepted": False}


def test_an_accepted_structural_change_passes_and_is_still_shown(tmp_path, capsys):
    b, c = _runs(tmp_path, BASE, GREW)
    rc, out, _ = run_cli(capsys, "compare", b, c, "--accept-structure-change")
    assert rc == 0
    row, under = _row_and_details(out)
    assert row.endswith("same") and f"    structure: regression, accepted: {GREW_LINE}" in under
    assert (f"1 structural change(s) accepted by --accept-structure-change (benchmarks/test_x.py::{NAME}): "
            f"shown, not failing") in out
    rc, out, _ = run_cli(capsys, "compare", b, c, "--accept-structure-change", "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 0 and case["verdict"] == "same" and case["structure"]["accepted"] is True
    # Accepting a structural change does not accept a slower step.
    b, c = _runs(tmp_path / "slower", BASE, GREW, cur_rounds=[t * 1.5 for t in STEADY])
    rc, out, _ = run_cli(capsys, "compare", b, c, "--accept-structure-change")
    assert rc == 1 and "1 regression(s): exit status 1" in out


def test_fewer_collectives_are_a_structural_improvement_and_pass(tmp_path, capsys):
    b, c = _runs(tmp_path, GREW, BASE)
    rc, out, _ = run_cli(capsys, "compare", b, c, "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 0 and case["verdict"] == case["timing_verdict"] == "same" and case["failed_by"] == []
    assert case["structure"]["verdict"] == "improvement"


@pytest.mark.parametrize("base_census, cur_census", [(None, GREW), (BASE, None), (None, None)],
                         ids=["older-baseline", "older-current", "neither"])
def test_without_a_census_on_one_side_the_timing_verdict_stands_alone(tmp_path, capsys, base_census, cur_census):
    b, c = _runs(tmp_path, base_census, cur_census)
    rc, out, _ = run_cli(capsys, "compare", b, c, "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 0 and case["verdict"] == "same" and case["structure"]["verdict"] == "not counted"
    b, c = _runs(tmp_path / "slower", base_census, cur_census, cur_rounds=[t * 1.5 for t in STEADY])
    assert run_cli(capsys, "compare", b, c)[0] == 1  # a timing regression still fails


def test_an_unchanged_structure_leaves_the_timing_verdict_alone(tmp_path, capsys):
    b, c = _runs(tmp_path, BASE, copy.deepcopy(BASE), cur_rounds=[t * 1.5 for t in STEADY])
    rc, out, _ = run_cli(capsys, "compare", b, c, "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 1 and case["verdict"] == case["timing_verdict"] == "regression" and case["failed_by"] == []
    assert case["structure"]["verdict"] == "same"


def test_an_unlike_case_is_not_counted(tmp_path):
    base = write(tmp_path / "b.json", run_doc([bench(NAME, STEADY, {"census": BASE, "world_size": 2})]))
    cur = write(tmp_path / "c.json", run_doc([bench(NAME, STEADY, {"census": GREW, "world_size": 4})]))
    (case,) = compare_runs(load_run(base), load_run(cur)).cases
    assert case.verdict == "inconclusive" and case.structure == StructureVerdict("not counted", "the cases are unlike")
    (case,) = compare_runs(load_run(base), load_run(cur), allow_different={"world_size"}).cases
    assert case.verdict == "regression" and case.structure.line == GREW_LINE  # allowed: compared


def test_a_malformed_census_in_a_saved_run_is_a_named_error(tmp_path, capsys):
    b, c = _runs(tmp_path, BASE, dict(GREW, ddp_buckets="four"))
    rc, out, err = run_cli(capsys, "compare", b, c)
    assert rc == 2 and out == ""
    assert err == (f"ddpbench compare: error: {c}: benchmarks/test_x.py::{NAME}: extra_info census.ddp_buckets "
                   f"is 'four', expected a list of byte counts or null. The file is damaged or was edited: "
                   f"restore it or rerun the case\n")


def test_every_command_that_reads_the_run_names_its_malformed_census_alike(tmp_path, capsys):
    # The run's records are checked once, as it is read: the report and the history say what compare says.
    _, c = _runs(tmp_path, BASE, dict(GREW, ddp_buckets="four"))
    message = (f"{c}: benchmarks/test_x.py::{NAME}: extra_info census.ddp_buckets is 'four', expected a list of "
               f"byte counts or null. The file is damaged or was edited: restore it or rerun the case")
    for command in (["report", c, "--no-chart"], ["history", c, "--storage", str(tmp_path / "none"),
                                                   "--output", str(tmp_path / "history.html")]):
        rc, out, err = run_cli(capsys, *command)
        assert rc == 2 and message in err, command
    assert not (tmp_path / "history.html").exists()


# ----------------------------------------------------------------------------------------------
# The A/B gate: the verdicts of a run, and a run's report
# ----------------------------------------------------------------------------------------------

AB = {"verdict": "same", "ratio": 1.0, "ratio_ci": [0.98, 1.02], "p_value": 0.5, "pairs": 12, "threshold": 0.05,
      "ratio_per_pool_pair": [1.0, 1.0], "ratio_of_block_minima": 1.0, "wall_s": 1.5,
      "baseline": {"median_s": 0.001}, "candidate": {"median_s": 0.001}}


def _ab_run(tmp_path, baseline_census, candidate_census, **ab):
    info = {"ab": dict(AB, **ab)}
    if baseline_census is not None:
        info["ab"]["census_baseline"] = baseline_census
    if candidate_census is not None:
        info["census"] = candidate_census
    return str(write(tmp_path / "ab.json", run_doc([bench(NAME, STEADY, info)])))


def test_an_ab_run_fails_on_a_structural_regression_unless_accepted(tmp_path, capsys):
    run = _ab_run(tmp_path, BASE, GREW)
    rc, out, _ = run_cli(capsys, "compare", run)
    assert rc == 1
    row, under = _row_and_details(out)
    assert row.endswith("regression (structure; timing same)  <<")
    assert f"    structure: regression: {GREW_LINE}" in under
    assert "--accept-structure-change accepts a change made on purpose" in out
    rc, out, _ = run_cli(capsys, "compare", run, "--accept-structure-change", "--markdown")
    assert rc == 0 and f"| regression, accepted: {GREW_LINE} | same |" in out
    # The structural verdict needs no pairs: one round is enough, and an inconclusive timing is kept.
    rc, out, _ = run_cli(capsys, "compare", _ab_run(tmp_path, BASE, GREW, verdict="inconclusive", pairs=1,
                                                  ratio_ci=None), "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 1 and (case["verdict"], case["timing_verdict"]) == ("regression", "inconclusive")
    assert "census_baseline" not in case["details"]  # the verdict's JSON keeps the line, not the census


def test_an_ab_run_without_a_census_on_a_side_keeps_its_timing_verdict(tmp_path, capsys):
    for base, cand in ((None, GREW), (BASE, None)):
        rc, out, _ = run_cli(capsys, "compare", _ab_run(tmp_path, base, cand), "--json")
        (case,) = json.loads(out)["cases"]
        assert rc == 0 and case["verdict"] == "same" and case["structure"]["verdict"] == "not counted"
    rc, out, _ = run_cli(capsys, "compare", _ab_run(tmp_path, GREW, BASE), "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 0 and case["structure"]["verdict"] == "improvement"


def test_a_saved_run_is_read_alike_in_the_old_and_the_new_record_format(tmp_path, capsys):
    # Before the decided verdict was saved, ab.verdict held the timing's word and nothing beside it;
    # now ab.verdict is what the run decided, timing_verdict and structure_verdict its components.
    old = _ab_run(tmp_path / "old", BASE, GREW, verdict="inconclusive", ratio_ci=[0.97, 1.09])
    new = _ab_run(tmp_path / "new", BASE, GREW, verdict="regression", timing_verdict="inconclusive",
                  structure_verdict="regression", ratio_ci=[0.97, 1.09])
    for run in (old, new):
        rc, out, _ = run_cli(capsys, "compare", run, "--json")
        (case,) = json.loads(out)["cases"]
        assert rc == 1 and (case["verdict"], case["timing_verdict"], case["failed_by"]) == (
            "regression", "inconclusive", ["structure"]), run
        # Accepted when read, either format falls back to the timing's own verdict, never the saved decision.
        rc, out, _ = run_cli(capsys, "compare", run, "--accept-structure-change", "--json")
        (case,) = json.loads(out)["cases"]
        assert rc == 0 and case["verdict"] == "inconclusive" and case["structure"]["accepted"] is True, run
    rc, _, err = run_cli(capsys, "compare", _ab_run(tmp_path / "bad", BASE, GREW, timing_verdict="slow"))
    assert rc == 2 and "ab.timing_verdict is 'slow', not one of" in err


def test_a_malformed_baseline_census_in_an_ab_run_is_a_named_error(tmp_path, capsys):
    run = _ab_run(tmp_path, dict(BASE, collectives=[1]), GREW)
    rc, out, err = run_cli(capsys, "compare", run)
    assert rc == 2 and out == ""
    assert (f"{NAME}: extra_info ab.census_baseline.collectives[0] is 1, expected an object (kind, dtype, "
            f"group_size, count, bytes, call_bytes). The run's file is damaged") in err


def test_the_ab_sessions_results_read_the_candidates_census_when_the_report_is_made():
    # (case id, extra_info["ab"], candidate median, the case's extra_info): the census may land in
    # extra_info after the timing; the report reads it at the end.
    info = {"ab": dict(AB, census_baseline=BASE)}
    results = [(NAME, info["ab"], 0.001, info), ("test_lost", {"verdict": "missing"}, None, None)]
    info["census"] = GREW
    report = verdicts.ab_report(verdicts.ab_verdicts(results))
    decision = decide_exit(report, allow_missing=True)
    assert decision.structural == (NAME,) and decision.status == 1
    lines = exit_lines(decision, "--dist-", report.current_label)
    assert ("1 structural regression(s) (test_step[gloo-2p]): what one step launches grew or "
                            "changed, a regression whatever the timing says (--dist-accept-structure-change "
                            "accepts a change made on purpose)") in " ".join(" ".join(lines).split())
    lost = next(c for c in report.cases if c.name == "test_lost")
    assert lost.structure is None  # nothing to compare: no structural verdict
    accepted = verdicts.ab_report(verdicts.ab_verdicts(results, accept_structure_change=True))
    decision = decide_exit(accepted, allow_missing=True)
    lines = exit_lines(decision, "--dist-", accepted.current_label)
    assert decision.status == 0 and decision.structural_accepted == (NAME,) and any("accepted by --dist-accept-structure-change" in line for line in lines)
    assert f"regression, accepted: {GREW_LINE}" in verdicts.format_text(accepted)


# ----------------------------------------------------------------------------------------------
# The A/B gate in a pytest run: exit status and acceptance
# ----------------------------------------------------------------------------------------------

PLANTED = f'''
import time

from ddpbench.workloads import Workload

BASE = {BASE!r}
GREW = {GREW!r}


class Sleep(Workload):
    def setup(self, ctx):
        return None

    def run_round(self, state):
        time.sleep(0.004)


def test_step(dist_benchmark):
    dist_benchmark(Sleep())
    # Both sides run the same code; the censuses are planted as the engine would record them.
    dist_benchmark.extra_info["census"] = GREW
    dist_benchmark.extra_info["ab"]["census_baseline"] = BASE
'''

AB_RUN = ["--dist-candidate-env", "UNUSED=1", "--dist-ab-threshold=50%", "--dist-ab-pools-per-side=1",
          "--dist-ab-block-time=0.02", "--dist-ab-max-time=2", "--dist-ab-profile=off", "-m", "not gpu",
          "-p", "no:cacheprovider"]


def test_the_ab_run_exits_1_on_a_structural_regression_and_compare_accepts_it_when_asked(pytester):
    pytester.makepyfile(test_bench=PLANTED)
    result = pytester.runpytest_subprocess(*AB_RUN, "--benchmark-json=ab.json", timeout=300)
    assert result.ret == 1, result.stdout.str()
    # The case's short row, the structural change on a line of its own under it.
    result.stdout.fnmatch_lines(["*test_step*regression (structure; timing *)*<<",
                                 f"    structure: regression: {GREW_LINE}",
                                 "*ddpbench A/B: 1 structural regression(s) (*test_step*)*",
                                 "*(--dist-accept-structure-change accepts a change made on purpose)"])
    (case,) = json.loads((pytester.path / "ab.json").read_text())["benchmarks"]
    # The saved verdict is the run's (it exited 1 on it); the timing's and the census's beside it.
    ab = case["extra_info"]["ab"]
    assert ab["verdict"] == "regression" and ab["timing_verdict"] != "regression"
    assert ab["structure_verdict"] == "regression" and "structure_accepted" not in ab
    run = str(pytester.path / "ab.json")
    assert cli.main(["compare", run]) == 1
    assert cli.main(["compare", run, "--accept-structure-change"]) == 0


@pytest.mark.parametrize("accept", [False, True])
def test_the_pytest_option_reaches_the_ab_session(pytester, monkeypatch, accept):
    import dataclasses

    from ddpbench.gates.ab import run_sides, session
    from ddpbench.gates.ab.side_environments import local_facts

    monkeypatch.setattr(run_sides, "probe", lambda side, protocol: dataclasses.replace(side, facts=local_facts()))
    args = ["--dist-candidate-env", "UNUSED=1"] + (["--dist-accept-structure-change"] if accept else [])
    ab = session.ABSession.from_options(pytester.parseconfig(*args))
    ab.results.append((NAME, dict(AB, census_baseline=BASE), 0.001, {"census": GREW}))
    assert ab.plan.accept_structure_change is accept and ab.exit_status() == (0 if accept else 1)
    # What the run file will say (extra_info["ab"], written before pytest-benchmark saves): the
    # verdict it exits on, with the timing's and the structure's beside it.
    ab.record_verdicts()
    saved = ab.results[0][1]
    assert (saved["verdict"], saved["timing_verdict"], saved["structure_verdict"]) == (
        "same" if accept else "regression", "same", "regression")
    assert saved.get("structure_accepted", False) is accept
    # An accepted change is timed in full; otherwise a structural regression ends its case early.
    assert ab.settings.stop_on_structural_regression is not accept
    said = " ".join(" ".join(line for line, _ in ab.summary_lines()).replace("ddpbench A/B:   ", " ").split())
    assert ("accepted by --dist-accept-structure-change" if accept else
            "--dist-accept-structure-change accepts a change made on purpose") in said


@pytest.mark.parametrize("timing", ["same", "not-slower", "inconclusive", "improvement"])
def test_every_timing_verdict_gets_its_structure_compared(tmp_path, capsys, timing):
    # A candidate that adds an op too small to time reads `not-slower` (its interval's upper end
    # within the threshold): the census still fails it.
    ci = {"same": [0.98, 1.02], "not-slower": [0.92, 1.03], "inconclusive": [0.97, 1.09],
          "improvement": [0.7, 0.8]}[timing]
    rc, out, _ = run_cli(capsys, "compare", _ab_run(tmp_path, BASE, GREW, verdict=timing, ratio_ci=ci), "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 1 and (case["verdict"], case["timing_verdict"]) == ("regression", timing)
