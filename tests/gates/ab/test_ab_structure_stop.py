"""A structural regression ends an A/B case after its first look: the two sides' censuses, taken at
set-up, already decide its verdict (it stands whatever the timing says), so further pairs would
only spend the run's time. Not when the gate accepts structural changes, not for a structural
improvement or a reordering, not when a side has no census. The engine runs on fake pools
(tests/helpers/fake_pools.py) whose blocks stay inconclusive for many looks, so the stop is the census's."""

import dataclasses

from ddpbench.engine.timing import RoundPlan
from ddpbench.gates import verdicts
from ddpbench.gates.ab.pairs_loop import ABSettings, run_case

from helpers.census_records import census
from helpers.fake_pools import ROUND_S, fake_pools


BASE = census(("all_reduce", "float32", 2, [1 << 20]))
GREW = census(("all_reduce", "float32", 2, [1 << 20, 4096]))  # one 4 KB all_reduce more per step
TWO_KINDS = census(("all_reduce", "float32", 2, [4096]), ("broadcast", "float32", 2, [4096]))
REORDERED = dict(TWO_KINDS, collectives=TWO_KINDS["collectives"][::-1])
# Noisy blocks and a small slowdown: the timing stays inconclusive look after look.
SETTINGS = ABSettings(block_time_s=3 * ROUND_S, max_time_s=600.0, max_extended_pairs=96)


def _case(censuses, settings=SETTINGS):
    return run_case(fake_pools(seed=3, noise=0.6, slower=1.03, censuses=censuses), workload=None,
                    plan=RoundPlan(warmup=1), settings=settings, timeout_s=60, case_id="structure-stop", seed=3)


def test_the_timing_alone_takes_many_looks_here():
    outcome = _case((BASE, BASE))
    assert outcome.result.verdict == "inconclusive" and len(outcome.levels_applied) > 1
    assert outcome.stopped_by_structure is None and "stopped_by_structure" not in outcome.summary({})


def test_a_structural_regression_ends_the_case_after_its_first_look():
    outcome = _case((BASE, GREW))
    assert len(outcome.levels_applied) == 1 and len(outcome.pairs) == SETTINGS.stage_sizes(2)[0] == 12
    assert outcome.stopped_by_structure == "all_reduce float32 in a group of 2: 1 → 2 per step, +4.0 KiB"
    summary = outcome.summary({})
    assert summary["stopped_by_structure"] == outcome.stopped_by_structure and summary["stages"] == 1
    # The report: a regression by the structure, the timing read at its first look.
    case = verdicts.ab_verdict("t.py::test_step", summary, None, GREW)
    assert case.verdict == "regression" and case.timing_verdict == "inconclusive"
    text = verdicts.format_text(verdicts.ab_report([case]))
    assert "regression (structure; timing inconclusive at its first look)" in text


def test_a_change_on_one_rank_alone_ends_the_case_after_its_first_look():
    """Rank 1 issues one more all_reduce than rank 0 on both sides, and one more again on the
    candidate: judged on rank 0's census alone, the ranks disagreeing on both sides, it read `same`."""
    outcome = _case(([BASE, GREW], [BASE, census(("all_reduce", "float32", 2, [1 << 20, 4096, 4096]))]))
    assert len(outcome.levels_applied) == 1
    assert outcome.stopped_by_structure == "rank 1: all_reduce float32 in a group of 2: 2 → 3 per step, +4.0 KiB"
    summary = outcome.summary({})
    assert summary["census_baseline"]["other_ranks"] == [{"ranks": "1", "fields": {
        "collectives": GREW["collectives"]}}]


def test_no_stop_when_the_change_is_accepted_improves_or_reorders_or_a_side_has_no_census():
    accepted = dataclasses.replace(SETTINGS, stop_on_structural_regression=False)
    for censuses, settings in (((BASE, GREW), accepted), ((GREW, BASE), SETTINGS),
                               ((TWO_KINDS, REORDERED), SETTINGS),
                               ((None, GREW), SETTINGS), ((BASE, None), SETTINGS)):
        outcome = _case(censuses, settings)
        assert outcome.stopped_by_structure is None and len(outcome.levels_applied) > 1, censuses


def _saved_run(tmp_path, summary, candidate_census):
    """A --benchmark-json file holding one A/B case: its extra_info["ab"] and candidate census."""
    from helpers.benchjson import bench, run_doc, write

    info = {"ab": summary, "census": candidate_census}
    return str(write(tmp_path / "ab.json", run_doc([bench("test_step", [ROUND_S] * 5, info)])))


def test_a_change_accepted_after_the_run_cannot_pass_the_slowdown_its_stop_left_unmeasured(tmp_path, capsys):
    # Twice as slow, but stopped at the first look by the census: 12 pairs cannot reach that look's
    # level, so the timing reads inconclusive however slow the step is.
    from helpers.benchjson import run_cli

    slower = run_case(fake_pools(seed=3, noise=0.1, slower=2.0, censuses=(BASE, GREW)), workload=None,
                      plan=RoundPlan(warmup=1), settings=SETTINGS, timeout_s=60, case_id="structure-stop", seed=3)
    summary = slower.summary({})
    assert summary["stages"] == 1 and summary["verdict"] == "inconclusive" and summary["ratio_ci"][0] > 1.8
    run = _saved_run(tmp_path, summary, GREW)
    rc, out, _ = run_cli(capsys, "compare", run, "--accept-structure-change")
    assert rc == 1, out
    row = next(line for line in out.splitlines() if "test_step" in line and "<<" in line)
    assert row.endswith("regression (timing not measured)  <<")  # the row says what failed it, within 120 columns
    said = " ".join(out.split())  # the explanations wrap
    assert ("why: structural change accepted after the run; timing not measured: inconclusive at its "
            "first look, where the structure stopped it") in said
    assert ("1 case(s) stopped at their first look by a structural change that was accepted after the run "
            "(benchmarks/test_x.py::test_step): their timing was not measured, so they cannot pass. Run the A/B "
            "gate again with --dist-accept-structure-change to time them in full") in said
    assert "accepted by --accept-structure-change" not in out  # not listed as passing
    # Without accepting, the structure fails it as before; a case timed in full (the change accepted
    # at run time: no stop) keeps its timing verdict when the change is accepted.
    assert run_cli(capsys, "compare", run)[0] == 1
    timed = {key: value for key, value in summary.items() if key != "stopped_by_structure"}
    rc, out, _ = run_cli(capsys, "compare", _saved_run(tmp_path / "timed", timed, GREW), "--accept-structure-change")
    assert rc == 0 and "timing not measured" not in out and "1 inconclusive" in out


def test_a_stopped_case_whose_first_look_settled_the_timing_keeps_it_when_the_change_is_accepted():
    # The first look can still end `same` or `not-slower` (the interval, not the level, decides
    # those): that timing was measured, so accepting the change leaves it standing.
    summary = {"verdict": "same", "ratio": 1.0, "ratio_ci": [0.99, 1.01], "pairs": 12, "threshold": 0.05,
               "stopped_by_structure": "all_reduce float32 in a group of 2: 1 → 2 per step, +4.0 KiB", "census_baseline": BASE}
    case = verdicts.ab_verdict("t.py::test_step", summary, None, GREW, accept_structure_change=True)
    assert (case.verdict, case.timing_verdict, case.failed_by) == ("same", "same", [])
    assert not case.timing_unmeasured


MEMORY = {"version": 1, "method": "MemTracker", "device": "cpu", "peak_bytes": 1 << 20,
          "at_peak": {"activations": 1 << 20}, "peak_at": {"module": "net", "phase": "forward"},
          "after_step_bytes": 0, "after_step": {}}
MORE_MEMORY = dict(MEMORY, peak_bytes=2 << 20, at_peak={"activations": 2 << 20})


def test_a_memory_change_accepted_after_the_run_names_the_memory_option_to_time_it(tmp_path, capsys):
    # Stopped at its first look by the memory census, accepted by compare --accept-memory-change:
    # the hint names the option that lets the memory change through, not the structure's.
    from helpers.benchjson import bench, run_cli, run_doc, write

    summary = {"verdict": "inconclusive", "ratio": 2.0, "ratio_ci": [1.8, 2.2], "pairs": 12, "threshold": 0.05,
               "stages": 1, "stopped_by_memory": "peak +1.0 MiB", "memory_baseline": MEMORY}
    info = {"ab": summary, "memory": MORE_MEMORY}
    run = str(write(tmp_path / "ab.json", run_doc([bench("test_step", [ROUND_S] * 5, info)])))
    rc, out, _ = run_cli(capsys, "compare", run, "--accept-memory-change")
    assert rc == 1, out
    said = " ".join(out.split())  # the explanations wrap
    assert ("why: memory change accepted after the run; timing not measured: inconclusive at its first "
            "look, where the memory census stopped it") in said
    assert ("1 case(s) stopped at their first look by a memory change that was accepted after the run "
            "(benchmarks/test_x.py::test_step): their timing was not measured, so they cannot pass. Run the A/B "
            "gate again with --dist-accept-memory-change to time them in full") in said
    assert "--dist-accept-structure-change" not in out
