"""Every rank's census and memory census is kept and compared rank by rank, in both gates: a
3-stage pipeline whose middle stage sends twice instead of once is a structural regression naming
rank 1 (it read `same`, rank 0's census compared, when only rank 0's was kept); a rank whose peak
grows below rank 0's is a memory regression naming it. Runs that kept rank 0's alone still read."""

from __future__ import annotations

import json

import pytest

from helpers.benchjson import after_quiet_history, bench, run_cli, run_doc, write
from helpers.census_records import census
from helpers.verdict_text import case_blocks
from ddpbench.engine.census import combine_census
from ddpbench.engine.memory import combine_memory
from ddpbench.gates.memory import compare_memory
from ddpbench.gates.structure import StructureVerdict, compare_census
from ddpbench.storage.records import RecordError

MiB = 1 << 20
NAME = "test_pipeline[gloo-3p]"
STEADY = [0.0010, 0.00101, 0.00099, 0.00100, 0.00102, 0.00098] * 5


def send(peer, calls=1):
    return ("send", "float32", 3, [MiB] * calls, {"peer": peer})


def recv(peer):
    return ("recv", "float32", 3, [MiB], {"peer": peer})


# Stage 0 sends its activations on, stage 1 receives and sends on, stage 2 receives.
PIPELINE = [census(send(1)), census(recv(-1), send(1)), census(recv(-1))]
# The change: stage 1 sends its activations twice.
TWICE = [PIPELINE[0], census(recv(-1), send(1, calls=2)), PIPELINE[2]]
TWICE_LINE = "rank 1: send float32 in a group of 3 to +1: 1 → 2 per step, +1.0 MiB"


def test_a_change_on_a_middle_stage_is_a_regression_naming_its_rank():
    verdict = compare_census(combine_census(PIPELINE), combine_census(TWICE))
    assert verdict == StructureVerdict("regression", TWICE_LINE)
    assert compare_census(combine_census(TWICE), combine_census(PIPELINE)) == StructureVerdict(
        "improvement", "rank 1: send float32 in a group of 3 to +1: 2 → 1 per step, -1.0 MiB")
    assert compare_census(combine_census(PIPELINE), combine_census(PIPELINE)) == StructureVerdict("same")


def test_the_saved_record_keeps_every_rank_and_tells_the_change():
    saved = json.loads(json.dumps(combine_census(TWICE)))
    assert saved["ranks_counted"] == 3 and saved["ranks_disagree"] is True
    assert [group["ranks"] for group in saved["other_ranks"]] == ["1", "2"]
    assert saved["other_ranks"][0]["fields"]["collectives"] == TWICE[1]["collectives"]
    assert saved["collectives"] == PIPELINE[0]["collectives"]  # rank 0's, whole, as before


def test_ranks_alike_are_named_once_and_the_record_stays_small_at_large_world_sizes():
    ddp = census(("all_reduce", "float32", 1024, [MiB, 2 * MiB]))
    alike = combine_census([ddp] * 1024)
    assert alike == dict(ddp, ranks_counted=1024)  # no rank differs: nothing more is saved
    last = census(("all_reduce", "float32", 1024, [MiB]))
    one_differs = combine_census([ddp] * 1023 + [last])
    assert one_differs["other_ranks"] == [{"ranks": "1023", "fields": {"collectives": last["collectives"]}}]
    many = combine_census([ddp, last] * 512)  # every odd rank differs: one group, its ranks as runs
    (group,) = many["other_ranks"]
    assert group["ranks"].startswith("1,3,5,") and group["fields"] == {"collectives": last["collectives"]}
    assert len(json.dumps(many)) < 8 * len(json.dumps(ddp)) + len(group["ranks"])
    # Every rank alike on both sides, one rank's change: the line names that rank alone.
    assert compare_census(one_differs, alike) == StructureVerdict(
        "regression", "rank 1023: all_reduce float32 in a group of 1024: 1 → 2 per step, +2.0 MiB")


def test_a_rank_that_recorded_no_census_or_an_incomplete_one_is_not_judged_as_whole():
    partial = [PIPELINE[0], dict(PIPELINE[1], incomplete="a thread started before the census"), PIPELINE[2]]
    verdict = compare_census(combine_census(PIPELINE), combine_census(partial))
    assert verdict == StructureVerdict("regression", "rank 1: counted in full on the baseline only (current: its census "
                                                     "is incomplete (a thread started before the census)): a "
                                                     "regression until accepted")
    both = compare_census(combine_census(partial), combine_census(partial))
    assert both.verdict == "not counted" and both.line.startswith("rank 1: baseline: its census is incomplete")
    missing = compare_census(combine_census(PIPELINE), combine_census([PIPELINE[0], None, PIPELINE[2]]))
    assert missing.verdict == "regression" and "current: that rank recorded no census" in missing.line


def test_a_run_that_kept_rank_zero_s_alone_is_still_read():
    old = dict(PIPELINE[0], ranks_disagree=True)  # saved before every rank was kept
    assert compare_census(old, old) == StructureVerdict(
        "same", "rank 0's census compared: the ranks disagree on both sides and both kept rank 0's alone")
    verdict = compare_census(old, combine_census(TWICE))
    assert verdict == StructureVerdict(
        "same", "rank 0's census compared: the ranks disagree on both sides and the baseline kept rank 0's alone")


def test_records_of_other_world_sizes_are_not_counted():
    assert compare_census(combine_census(PIPELINE[:2]), combine_census(PIPELINE)) == StructureVerdict(
        "not counted", "the baseline kept the census of 2 ranks, the current of 3")


@pytest.mark.parametrize("change, message", [
    ({"ranks_counted": 0}, "census.ranks_counted is 0, expected a whole number of ranks >= 1"),
    ({"other_ranks": "1"}, "census.other_ranks is '1', expected a list of groups of ranks (objects: ranks, fields)"),
    ({"other_ranks": [{"ranks": "2-1", "fields": {}}]}, "census.other_ranks[0].ranks is '2-1', expected ranks as "
                                                        "ascending runs (\"1-3,7\"), each below ranks_counted (3) "
                                                        "and named once"),
    ({"other_ranks": [{"ranks": "1", "fields": {"collectives": "send"}}]},
     "census[ranks 1].collectives is 'send', expected a list of collectives"),
])
def test_a_malformed_rank_record_is_an_error_naming_its_field(change, message):
    with pytest.raises(RecordError) as caught:
        compare_census(combine_census(PIPELINE), dict(combine_census(TWICE), **change))
    assert str(caught.value) == message and caught.value.side == "current"


@pytest.mark.parametrize("groups, message", [
    # Issue 60: rank 0's record is the record itself; named with fields it read as a regression.
    ([{"ranks": "0", "fields": {"collectives": []}}], "census.other_ranks[0].ranks is '0': rank 0's record is the "
                                                       "record itself (rank 0 is named here only with fields null, "
                                                       "when it recorded none)"),
    ([{"ranks": "0", "fields": None}, {"ranks": "1-2", "fields": {}}],
     "census.other_ranks names all 3 ranks: the record itself is no rank's"),
], ids=["rank-0-with-fields", "every-rank-named"])
def test_a_group_naming_rank_zero_s_record_is_a_named_error(groups, message, tmp_path, capsys):
    bad = dict(combine_census(PIPELINE), other_ranks=groups)
    with pytest.raises(RecordError) as caught:
        compare_census(combine_census(PIPELINE), bad)
    assert str(caught.value) == message
    b = write(tmp_path / "base.json", run_doc([bench(NAME, STEADY, {"census": combine_census(PIPELINE)})]))
    c = write(tmp_path / "cur.json", run_doc([bench(NAME, STEADY, {"census": bad})]))
    rc, out, err = run_cli(capsys, "compare", str(b), str(c))
    assert rc == 2 and out == "" and message in err  # bad input, not a regression (exit 1)
    # Rank 0 that recorded none is named there, fields null, as combine writes it.
    absent = combine_census([None, PIPELINE[1], PIPELINE[1]])
    assert absent["other_ranks"] == [{"ranks": "0", "fields": None}]
    assert compare_census(absent, absent).verdict == "not counted"


def test_a_malformed_rank_group_is_a_named_error(tmp_path, capsys):
    bad = dict(combine_census(TWICE), other_ranks=[{"ranks": "3", "fields": {}}])
    b = write(tmp_path / "base.json", run_doc([bench(NAME, STEADY, {"census": combine_census(PIPELINE)})]))
    c = write(tmp_path / "cur.json", run_doc([bench(NAME, STEADY, {"census": bad})]))
    rc, out, err = run_cli(capsys, "compare", str(b), str(c))
    assert rc == 2 and out == ""
    assert "census.other_ranks[0].ranks is '3', expected ranks as ascending runs (\"1-3,7\"), each below " \
           "ranks_counted (3) and named once" in err


# ---- both gates -----------------------------------------------------------------------------


def test_the_stored_compare_fails_on_a_middle_stage_s_change(tmp_path, capsys):
    b, c = after_quiet_history(tmp_path, run_doc([bench(NAME, STEADY, {"census": combine_census(PIPELINE)})]),
                               run_doc([bench(NAME, STEADY, {"census": combine_census(TWICE)})]))
    rc, out, _ = run_cli(capsys, "compare", str(b), str(c))
    block = case_blocks(out, {NAME})[NAME]  # the case's short row, its structure line under it
    assert rc == 1 and block.splitlines()[0].endswith("regression (structure; timing same)  <<")
    assert f"    structure: regression: {TWICE_LINE}" in block.splitlines()
    rc, _, _ = run_cli(capsys, "compare", str(b), str(c), "--accept-structure-change")
    assert rc == 0


AB = {"verdict": "same", "ratio": 1.0, "ratio_ci": [0.98, 1.02], "p_value": 0.5, "pairs": 12, "threshold": 0.05,
      "ratio_per_pool_pair": [1.0, 1.0], "ratio_of_block_minima": 1.0, "wall_s": 1.5,
      "baseline": {"median_s": 0.001}, "candidate": {"median_s": 0.001}}


def test_the_ab_gate_fails_on_a_middle_stage_s_change(tmp_path, capsys):
    info = {"ab": dict(AB, census_baseline=combine_census(PIPELINE)), "census": combine_census(TWICE)}
    run = str(write(tmp_path / "ab.json", run_doc([bench(NAME, STEADY, info)])))
    rc, out, _ = run_cli(capsys, "compare", run, "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 1 and case["verdict"] == "regression" and case["structure"]["line"] == TWICE_LINE


def memory(peak, activations, after=1000):
    return {"version": 1, "method": "MemTracker", "device": "cpu", "peak_bytes": peak,
            "peak_at": {"module": "stage", "phase": "backward"}, "at_peak": {"activations": activations,
                                                                             "parameters": peak - activations},
            "before_step_bytes": after, "after_step_bytes": after, "after_step": {"parameters": after},
            "optimizers": []}


def test_a_rank_s_larger_peak_below_rank_zero_s_is_a_memory_regression_naming_it(tmp_path, capsys):
    stages = [memory(8 * MiB, 6 * MiB), memory(4 * MiB, 2 * MiB), memory(2 * MiB, MiB)]
    grown = [stages[0], memory(5 * MiB, 3 * MiB), stages[2]]  # rank 1 grows, still below rank 0's peak
    base, cur = combine_memory(stages), combine_memory(grown)
    assert cur["max_peak_bytes"] == base["max_peak_bytes"] == 8 * MiB
    verdict = compare_memory(base, cur)
    assert verdict == StructureVerdict("regression", "rank 1: peak +1.0 MiB: activations +1.0 MiB, at stage backward")
    info = {"ab": dict(AB, memory_baseline=base), "memory": cur}
    run = str(write(tmp_path / "ab.json", run_doc([bench(NAME, STEADY, info)])))
    rc, out, _ = run_cli(capsys, "compare", run, "--json")
    (case,) = json.loads(out)["cases"]
    assert rc == 1 and case["memory"]["line"] == verdict.line
    b = write(tmp_path / "base.json", run_doc([bench(NAME, STEADY, {"memory": base})]))
    c = write(tmp_path / "cur.json", run_doc([bench(NAME, STEADY, {"memory": cur})]))
    rc, _, _ = run_cli(capsys, "compare", str(b), str(c))
    assert rc == 1


@pytest.mark.parametrize("change, message", [
    # Issue 60: a largest peak below the record's own was accepted, and judged.
    (lambda r: dict(r, max_peak_bytes=r["peak_bytes"] - 1), "memory.max_peak_bytes is 8388607, below peak_bytes "
                                                             "(8388608): the largest rank's peak is at least the "
                                                             "record's own"),
    (lambda r: dict(r, max_peak_bytes=9 * MiB), "memory.max_peak_bytes is 9437184, but the largest of "
                                                "peak_bytes_per_rank is 8388608"),
    (lambda r: dict(r, peak_bytes_per_rank=[8 * MiB, 4 * MiB]), "memory.peak_bytes_per_rank holds 2 peaks for 3 "
                                                                "ranks counted"),
    (lambda r: dict(r, peak_bytes_per_rank=[8 * MiB, 2 * MiB, 4 * MiB]), "memory.peak_bytes_per_rank[1] is 2097152, "
                                                                         "but rank 1's record holds 4194304"),
    (lambda r: dict(r, other_ranks=[{"ranks": "0-1", "fields": {"peak_bytes": MiB}}]),
     "memory.other_ranks[0].ranks is '0-1': rank 0's record is the record itself (rank 0 is named here only with "
     "fields null, when it recorded none)"),
], ids=["max-below-own", "max-not-largest", "a-peak-short", "a-peak-not-its-rank-s", "rank-0-named"])
def test_a_memory_record_whose_peaks_disagree_is_a_named_error(change, message, tmp_path, capsys):
    stages = [memory(8 * MiB, 6 * MiB), memory(4 * MiB, 2 * MiB), memory(2 * MiB, MiB)]
    base = combine_memory(stages)
    with pytest.raises(RecordError) as caught:
        compare_memory(base, change(base))
    assert str(caught.value) == message and caught.value.side == "current"
    b = write(tmp_path / "base.json", run_doc([bench(NAME, STEADY, {"memory": base})]))
    c = write(tmp_path / "cur.json", run_doc([bench(NAME, STEADY, {"memory": change(base)})]))
    rc, out, err = run_cli(capsys, "compare", str(b), str(c))
    assert rc == 2 and out == "" and message in err
    alone = dict(stages[0], peak_bytes_per_rank=[8 * MiB, 4 * MiB, 2 * MiB], max_peak_bytes=8 * MiB)
    assert compare_memory(alone, alone).verdict == "same"  # saved before every rank's record was kept
    with pytest.raises(RecordError, match=r"peak_bytes_per_rank\[0\] is 4194304, but rank 0's peak_bytes is 8388608"):
        compare_memory(alone, dict(alone, peak_bytes_per_rank=[4 * MiB, 8 * MiB, 2 * MiB]))
