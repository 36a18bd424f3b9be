"""pytest-benchmark's own timing options mean for a ddpbench case what they mean for any benchmark,
set on the command line or in ``@pytest.mark.benchmark``: each sets the round plan as its --dist-
option would, the --dist- option winning where both are given; one without a meaning for a
distributed round is named once in the run's summary with the --dist- option that does its job.
--benchmark-disable runs the workload once and nothing more; --benchmark-skip skips the cases."""

from __future__ import annotations

import pytest

from ddpbench import benchmark_options as bo

pytest_plugins = ["pytester"]


def test_each_timing_option_sets_what_its_dist_option_would():
    choice = bo.choose({"min_rounds": 9, "max_time": 3.0, "precision": 0.02, "warmup": True,
                        "warmup_iterations": 4}, {})
    assert (choice.min_rounds, choice.min_time_s, choice.precision, choice.warmup) == (9, 3.0, 0.02, 4)
    assert choice.notes == ()
    assert bo.choose({"warmup": False}, {}).warmup == 0  # --benchmark-warmup=off: no warm-up round
    assert bo.choose({"warmup": True}, {}).warmup is None  # on: ddpbench warms up as it always does
    assert bo.choose({"warmup_iterations": 7}, {}).warmup == 7  # a ddpbench case always warms up
    assert bo.choose({}, {}) == bo.PlanChoice()


def test_the_dist_option_wins_where_both_are_given_and_the_run_says_so():
    choice = bo.choose({"max_time": 3.0, "warmup_iterations": 4, "precision": 0.02},
                       {"--dist-max-time": 0.5, "--dist-warmup": 1, "--dist-precision": 0.05})
    assert (choice.min_time_s, choice.warmup, choice.precision) == (None, None, None)
    assert choice.notes == (
        "ddpbench: --benchmark-warmup-iterations 4 is not read: --dist-warmup 1 is given, and it wins",
        "ddpbench: --benchmark-max-time 3 is not read: --dist-max-time 0.5 is given, and it wins",
        "ddpbench: --benchmark-precision 0.02 is not read: --dist-precision 0.05 is given, and it wins")


@pytest.mark.parametrize("option", bo.UNUSED, ids=lambda option: option.flag)
def test_an_option_without_a_meaning_names_its_dist_equivalent(option):
    (note,) = bo.choose({option.mark: "x"}, {}).notes
    assert note.startswith(f"ddpbench: {option.flag} has no meaning for a ddpbench case (")
    assert note.endswith(f"; see {option.dist_flag}")


PLAN_TESTS = """
import pytest

def test_plan(dist_round_plan):
    p = dist_round_plan
    print("\\nPLAN", p.warmup, p.min_time_s, p.min_rounds, p.max_rounds, p.precision, p.census, p.memory_census,
          p.numerics_steps)

@pytest.mark.benchmark(max_time=0.25, min_rounds=2)
def test_marked(dist_round_plan):
    print("\\nMARKED", dist_round_plan.min_time_s, dist_round_plan.min_rounds)
"""


def _plans(pytester, *args) -> tuple[list[str], str]:
    pytester.makepyfile(test_plan=PLAN_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--dist-census=collectives,memory",
                                           "--dist-numerics-steps=3", *args, timeout=120)
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(("PLAN ", "MARKED "))], out


def test_a_plain_run_keeps_ddpbenchs_own_plan(pytester):
    plans, out = _plans(pytester)
    assert plans == ["2 1.0 5 1000 0.01 True True 3", "0.25 2"]  # the mark alone sets its case
    assert "ddpbench: --benchmark" not in out


def test_pytest_benchmarks_options_set_the_plan_and_the_unused_ones_are_named_once(pytester):
    plans, out = _plans(pytester, "--benchmark-min-rounds=1200", "--benchmark-max-time=3", "--benchmark-warmup=on",
                        "--benchmark-warmup-iterations=4", "--benchmark-min-time=0.01", "--benchmark-precision=0.02")
    assert plans == ["4 3.0 1200 1200 0.02 True True 3", "0.25 2"]
    assert out.count("ddpbench: --benchmark-min-time has no meaning for a ddpbench case (a round is one step on "
                     "every rank, as long as the step takes); see --dist-ops-per-round") == 1


def test_the_dist_options_win_and_the_run_says_so_once(pytester):
    plans, out = _plans(pytester, "--benchmark-max-time=3", "--dist-max-time=0.5", "--benchmark-warmup=off",
                        "--dist-warmup=1")
    assert plans == ["1 0.5 5 1000 0.01 True True 3", "0.5 2"]
    assert out.count("ddpbench: --benchmark-max-time 3 is not read: --dist-max-time 0.5 is given, and it wins") == 1
    assert out.count("ddpbench: --benchmark-warmup off is not read: --dist-warmup 1 is given, and it wins") == 1


def test_benchmark_warmup_off_means_no_warm_up_round(pytester):
    plans, _ = _plans(pytester, "--benchmark-warmup=off")
    assert plans[0].split()[0] == "0"


def test_benchmark_disable_runs_the_workload_once_and_takes_no_census(pytester):
    # pytest-benchmark: "Benchmarked functions are only ran once and no stats are reported": no
    # census round, memory census steps or numerics replay beside that one run.
    plans, _ = _plans(pytester, "--benchmark-disable")
    assert plans[0].split()[-3:] == ["False", "False", "0"]


SKIPPED = """
import ddpbench

def setup(ctx):
    return None

def step(state):
    pass

def test_case(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, step))

def test_plain():
    pass
"""


def test_benchmark_skip_skips_the_cases_as_pytest_benchmark_documents(pytester):
    pytester.makepyfile(test_skip=SKIPPED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-skip", "-m", "not gpu", "-rs",
                                           timeout=120)
    result.assert_outcomes(passed=1, skipped=1, deselected=2)
    result.stdout.fnmatch_lines(["*test_skip.py: Skipping benchmark (--benchmark-skip active).*"])
