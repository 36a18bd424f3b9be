"""A structural regression ends an A/B case after its first look: the two sides' censuses, taken at
set-up, already decide its verdict (it stands whatever the timing says), so further pairs would
only spend the run's time. Not when the gate accepts structural changes, not for a structural
improvement or a reordering, not when a side has no census. The engine runs on fake pools
(tests/fake_pools.py) whose blocks stay inconclusive for many looks, so the stop is the census's."""

import dataclasses

from ddpbench.engine.timing import RoundPlan
from ddpbench.gates import verdicts
from ddpbench.gates.ab.engine import ABSettings, run_case

from census_records import census
from fake_pools import ROUND_S, fake_pools


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
    assert outcome.stopped_by_structure == "all_reduce float32 ×2: 1 → 2 per step, +4.0 KiB"
    summary = outcome.summary({})
    assert summary["stopped_by_structure"] == outcome.stopped_by_structure and summary["stages"] == 1
    # The report: a regression by the structure, the timing read at its first look.
    case = verdicts.ab_verdict("t.py::test_step", summary, None, GREW)
    assert case.verdict == "regression" and case.timing_verdict == "inconclusive"
    text = verdicts.format_text(verdicts.ab_report([case]))
    assert "regression (structure; timing inconclusive at its first look)" in text


def test_no_stop_when_the_change_is_accepted_improves_or_reorders_or_a_side_has_no_census():
    accepted = dataclasses.replace(SETTINGS, stop_on_structural_regression=False)
    for censuses, settings in (((BASE, GREW), accepted), ((GREW, BASE), SETTINGS),
                               ((TWO_KINDS, REORDERED), SETTINGS),
                               ((None, GREW), SETTINGS), ((BASE, None), SETTINGS)):
        outcome = _case(censuses, settings)
        assert outcome.stopped_by_structure is None and len(outcome.levels_applied) > 1, censuses
