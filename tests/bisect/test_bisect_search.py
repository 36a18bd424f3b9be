"""``ddpbench bisect``'s search (``narrow``) driven by a table of probe outcomes, without git or
pytest: the first bad commit found in few probes wherever the step is, BAD never probed again, and
commits it could not read (skip, inconclusive, a missing case without --missing-is-bad) left as
candidates rather than guessed."""

import math

import pytest

from ddpbench.bisect import ProbeCase, SearchResult, narrow, read_probe
from ddpbench.bisect.probe import judged_cases


def _search(outcomes):
    """narrow over one commit per outcome (the last is BAD); the result and the commits asked, in order."""
    commits = [f"c{i}" for i in range(len(outcomes))]
    asked = []

    def outcome_of(commit):
        asked.append(commit)
        return outcomes[commits.index(commit)]

    return narrow(commits, outcome_of), asked


def test_bad_alone_is_the_first_bad_commit_without_a_probe():
    result, asked = _search(["bad"])
    assert result == SearchResult(["c0"], []) and asked == []
    assert result.found and result.first_bad == "c0"


@pytest.mark.parametrize("before_bad, expected", [("good", ["c1"]), ("bad", ["c0"]), ("skip", ["c0", "c1"]),
                                                  ("inconclusive", ["c0", "c1"])])
def test_two_commits_one_probe(before_bad, expected):
    result, asked = _search([before_bad, "bad"])
    assert asked == ["c0"] and result.probed == ["c0"]
    assert result.candidates == expected and result.found == (len(expected) == 1)


@pytest.mark.parametrize("n", [3, 16, 33])
def test_the_step_is_found_wherever_it_is_in_about_log2_probes(n):
    for step in range(n):
        result, asked = _search(["good"] * step + ["bad"] * (n - step))
        assert result.found and result.first_bad == f"c{step}", step
        assert len(asked) == len(set(asked)) <= math.ceil(math.log2(n)), (step, asked)
        assert f"c{n - 1}" not in asked  # BAD is known bad: never probed by the search
        assert result.probed == asked


def test_all_good_before_bad_names_bad_and_all_bad_names_the_first_commit():
    result, asked = _search(["good"] * 7 + ["bad"])
    assert result.first_bad == "c7" and result.found and asked == ["c3", "c5", "c6"]
    result, asked = _search(["bad"] * 8)
    assert result.first_bad == "c0" and result.found and asked == ["c3", "c1", "c0"]


def test_the_middle_first_then_the_untested_commit_nearest_it_after_a_skip():
    # A skip at the middle (c1): the nearest untested commit next, the earlier on a tie (c0 over c2).
    result, asked = _search(["good", "skip", "bad", "bad"])
    assert asked == ["c1", "c0", "c2"]
    assert result.candidates == ["c1", "c2"] and not result.found and result.first_bad == "c2"


def test_skips_only_widen_the_candidates_around_the_step():
    outcomes = ["good"] * 5 + ["skip", "inconclusive"] + ["bad"] * 5
    result, asked = _search(outcomes)
    assert result.candidates == ["c5", "c6", "c7"] and not result.found
    assert all(outcomes[int(c[1:])] in ("skip", "inconclusive") for c in result.candidates[:-1])
    # Every commit skipped: all of them are candidates, each asked once.
    result, asked = _search(["skip"] * 5 + ["bad"])
    assert result.candidates == [f"c{i}" for i in range(6)] and sorted(asked) == [f"c{i}" for i in range(5)]


A = "test_x.py::test_a"
SAME = ProbeCase(A, "same", 1.0, (0.95, 1.05))
SLOWER = ProbeCase(A, "regression", 2.0, (1.9, 2.1))
LOST = ProbeCase(A, "missing", reason="candidate pool 0 failed")
UNSURE = ProbeCase(A, "inconclusive", 1.3, (0.9, 1.7))


def _read(runs, missing_is_bad=False):
    """narrow over commits whose A/B runs gave ``runs`` (the last is BAD's), each read as bisect
    reads a probe against the cases BAD judged."""
    reference = judged_cases(runs[-1], missing_is_bad)
    outcomes = [read_probe(cases, reference, missing_is_bad)[0] for cases in runs]
    return _search(outcomes)[0]


def test_a_missing_case_is_a_skip_unless_missing_is_bad():
    # c2 and c3 lost the case (crashed); from c4 on it is twice as slow.
    runs = [[SAME], [SAME], [LOST], [LOST], [SLOWER], [SLOWER]]
    assert _read(runs).candidates == ["c2", "c3", "c4"]  # a slowdown search cannot place them
    result = _read(runs, missing_is_bad=True)
    assert result.found and result.first_bad == "c2"  # the commit that broke the case


def test_an_inconclusive_reading_is_a_skip_and_a_run_without_verdicts_too():
    assert _read([[SAME], [UNSURE], [SLOWER]]).candidates == ["c1", "c2"]
    assert _read([[SAME], [], [SLOWER]]).candidates == ["c1", "c2"]
    assert _read([[SAME], [SAME], [SLOWER]]).first_bad == "c2"
