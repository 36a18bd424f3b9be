"""A/B mode end to end: sides really differ, bad sides are usage errors, a slowdown injected on
one side is a regression (exit 1) and `ddpbench compare` prints the run's verdicts."""

import json
import os
import subprocess
import sys

import pytest

from ddpbench.gates.ab.heap import STEADY_HEAP_ENV, heap_env
from ddpbench.gates.ab.side_environments import SideError, make_side, parse_env_assignments, probe
from ddpbench.pool import PoolSpec, RankLaunch, RankPool
from ddpbench.rank_process import RANK_PROTOCOL

SLEEPY = '''
import os
import time

from ddpbench.workloads import Workload


class Sleep(Workload):
    """Each round sleeps 4 ms times $SLEEP_FACTOR (read in the ranks)."""

    def setup(self, ctx):
        return float(os.environ.get("SLEEP_FACTOR", "1"))

    def run_round(self, factor):
        time.sleep(0.004 * factor)


def test_sleep(dist_benchmark):
    dist_benchmark(Sleep())
'''

FAST = ["--dist-ab-block-time=0.02", "--dist-ab-max-time=8", "-m", "not gpu", "-p", "no:cacheprovider"]


def _side_report(ctx):
    return {"started_by": os.environ.get("DDPBENCH_TEST_INTERPRETER"),
            "marker": os.environ.get("DDPBENCH_TEST_SIDE"), "sys_path": list(sys.path)}


@pytest.mark.pool
def test_each_side_ranks_run_with_its_interpreter_path_and_environment(tmp_path):
    # An "interpreter" of the side's own: a wrapper that marks its processes, then runs Python.
    python = tmp_path / "side-python"
    python.write_text(f"#!/bin/sh\nDDPBENCH_TEST_INTERPRETER={python} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    extra = tmp_path / "extra"
    extra.mkdir()
    launch = RankLaunch(python=str(python), paths=(str(extra),), env=(("DDPBENCH_TEST_SIDE", "baseline"),))
    pool = RankPool(PoolSpec("gloo", 2, "cpu"), launch=launch)
    try:
        reports = pool.run(_side_report)
    finally:
        pool.close()
    for report in reports:
        assert report["started_by"] == str(python)
        assert report["marker"] == "baseline"
        # The side's path comes first; the working directory is not put there (python -m or -c would).
        assert report["sys_path"][0] == str(extra)
        assert "" not in report["sys_path"] and os.getcwd() not in report["sys_path"][:2]


def _heap_report(ctx):
    return {key: os.environ.get(key) for key, _ in STEADY_HEAP_ENV}


@pytest.mark.pool
def test_both_sides_ranks_get_the_steady_heap_and_a_sides_own_setting_wins():
    assert heap_env("adaptive") == ()
    with pytest.raises(ValueError, match="expected one of steady, adaptive"):
        heap_env("fixed")
    side = make_side("baseline", None, None, {"MALLOC_TOP_PAD_": "4096"}, heap_env("steady"))
    pool = RankPool(PoolSpec("gloo", 2, "cpu"), launch=side.launch)
    try:
        reports = pool.run(_heap_report)
    finally:
        pool.close()
    for report in reports:
        assert report == {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TOP_PAD_": "4096",
                          "MALLOC_TRIM_THRESHOLD_": str(2**36)}
    assert side.describe()["env"] == {"MALLOC_TOP_PAD_": "4096"}
    assert side.describe()["common_env"] == dict(STEADY_HEAP_ENV)


def test_malformed_env_and_missing_interpreters_are_named():
    with pytest.raises(SideError, match="expected KEY=VALUE"):
        parse_env_assignments(["NOEQUALS"], "--dist-baseline-env")
    with pytest.raises(SideError, match="expected KEY=VALUE"):
        parse_env_assignments(["1BAD=x"], "--dist-candidate-env")
    assert parse_env_assignments(["A=1", "B=x=y"], "--dist-baseline-env") == {"A": "1", "B": "x=y"}
    with pytest.raises(SideError, match="no executable interpreter there"):
        make_side("baseline", "/nonexistent/bin/python", None, {})
    with pytest.raises(SideError, match="not a directory"):
        make_side("baseline", None, ["/nonexistent/src"], {})


def test_an_interpreter_without_ddpbench_is_refused(tmp_path):
    # The interpreter the venv was made from, isolated (-I): it sees neither the venv nor PYTHONPATH.
    base = os.path.join(sys.base_prefix, "bin", "python3")
    wrapper = tmp_path / "bare-python"
    wrapper.write_text(f"#!/bin/sh\nexec {base} -I \"$@\"\n")
    wrapper.chmod(0o755)
    with pytest.raises(SideError, match="cannot import ddpbench"):
        probe(make_side("baseline", str(wrapper), None, {}), 1)


def test_a_ddpbench_of_another_rank_protocol_is_refused(tmp_path):
    fake = tmp_path / "old" / "ddpbench"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (fake / "rank_process.py").write_text("RANK_PROTOCOL = 99\n")
    with pytest.raises(SideError, match="ddpbench 0.0.1 from .* speaks rank protocol 99, but this run's "
                                        "ddpbench speaks protocol 1: the controller cannot drive"):
        probe(make_side("baseline", None, [str(fake.parent)], {}), 1)


def _engine_copy(tmp_path, note="# another engine: same protocol, other source\n"):
    """A copy of this ddpbench whose source differs by a comment (a pull request's ddpbench)."""
    import shutil

    import ddpbench

    target = tmp_path / "engine" / "ddpbench"
    shutil.copytree(os.path.dirname(ddpbench.__file__), target,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(target / "timing.py", "a") as fh:
        fh.write(note)
    return target.parent


def test_another_engine_of_the_same_protocol_is_named_not_refused(tmp_path):
    from ddpbench.gates.ab.side_environments import engine_lines, engines_differ, local_facts

    ours = local_facts()
    baseline = probe(make_side("baseline", None, [str(_engine_copy(tmp_path))], {}), ours["rank_protocol"])
    candidate = probe(make_side("candidate", None, None, {}), ours["rank_protocol"])
    assert baseline.facts["ddpbench_file"].startswith(str(tmp_path))
    assert baseline.facts["ddpbench_version"] == candidate.facts["ddpbench_version"]  # same "0.1.0"...
    assert baseline.facts["ddpbench_source_sha256"] != candidate.facts["ddpbench_source_sha256"]  # ...other code
    assert candidate.facts["ddpbench_source_sha256"] == ours["ddpbench_source_sha256"]
    assert engines_differ(baseline, candidate)
    lines = engine_lines(baseline, candidate)
    assert f"DIFFERENT ddpbench engines (both speak rank protocol {RANK_PROTOCOL})" in lines[0]
    assert str(tmp_path) in lines[1] and baseline.facts["ddpbench_source_sha256"][:12] in lines[1]
    assert not engines_differ(candidate, candidate)


@pytest.mark.parametrize("args,message", [
    (["--dist-baseline-env", "NOEQUALS"], "*--dist-baseline-env 'NOEQUALS': expected KEY=VALUE*"),
    (["--dist-baseline-python", "/nonexistent/python"], "*no executable interpreter there*"),
    (["--dist-candidate-env", "A=1", "-n", "2"], "*run without -n (xdist)*"),
    (["--dist-candidate-env", "A=1", "--dist-ab-pools-per-side=0"], "*pools per side must be larger than 0*"),
])
def test_bad_sides_stop_the_run_with_a_usage_error(pytester, args, message):
    pytester.makepyfile(test_bench=SLEEPY)
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.ab_pools  # two pools per side, taking turns: every pool pair must see the slowdown
def test_a_slowdown_on_the_candidate_side_is_a_regression_and_exits_1(pytester):
    pytester.makepyfile(test_bench=SLEEPY)
    # FAST's 8 s cap ends the case after a look or two: the last look taken spends what is left of
    # alpha (the planned early levels alone would need ~36 pairs even for a 1.5x slowdown).
    result = pytester.runpytest_subprocess("--dist-candidate-env", "SLEEP_FACTOR=1.5", "--dist-ab-seed=4242",
                                           "--dist-ab-profile=off", "--benchmark-json=ab.json", *FAST, timeout=300)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*ddpbench A/B verdicts (1 regression*",
                                 "*test_sleep*regression*",
                                 "*candidate:*SLEEP_FACTOR=1.5*",
                                 "*ddpbench A/B: 1 regression(s): exit status 1*"])
    (case,) = json.loads((pytester.path / "ab.json").read_text())["benchmarks"]
    ab = case["extra_info"]["ab"]
    assert ab["verdict"] == "regression" and ab["p_value"] < ab["alpha_at_last_look"] == ab["alpha_per_look"][-1]
    assert len(ab["alpha_per_look"]) == ab["stages"] and ab["alpha_at_last_look"] <= ab["alpha"] == 0.01
    assert 1.3 < ab["ratio"] < 1.8  # 6 ms vs 4 ms sleeps
    assert ab["ratio_ci"][0] > 1.05
    assert ab["pairs"] >= 12 and ab["blocks"] == 2 * ab["pairs"] and ab["order"].count("AB") == ab["order"].count("BA")
    # Two pools per side by default, taking turns; every pool pair saw the slowdown.
    assert ab["pools_per_side"] == 2 and sorted(set(ab["pool_pair_of_pair"])) == [0, 1]
    assert ab["pool_pair_of_pair"].count(0) == ab["pool_pair_of_pair"].count(1) == ab["pairs"] // 2
    assert len(ab["ratio_per_pool_pair"]) == 2 and all(r > 1.3 for r in ab["ratio_per_pool_pair"])
    assert ab["ratio_of_block_minima"] > 1.3  # the fastest rounds moved too
    assert ab["sides"]["candidate"]["env"] == {"SLEEP_FACTOR": "1.5"} and ab["sides"]["baseline"]["env"] == {}
    # --dist-ab-seed repeats a run's order: the first stage is the one the seed draws for this case.
    from ddpbench.gates.ab import schedule

    first = schedule.pairs_over_pools(6, 2, schedule.case_rng(case["fullname"], 4242))
    assert ab["seed"] == 4242 and ab["order"].split()[:12] == ["AB" if f == "baseline" else "BA" for f, _, _ in first]
    result.stdout.fnmatch_lines(["*block order seed 4242 (--dist-ab-seed 4242 repeats it)*"])
    assert ab["sides"]["baseline"]["torch_version"]
    # The OS places A/B ranks by default, as in every other mode; both sides get the steady heap.
    assert case["extra_info"]["pinned_cores"] is False
    assert ab["heap"] == "steady" and ab["sides"]["candidate"]["common_env"] == dict(STEADY_HEAP_ENV)
    assert ab["sides"]["baseline"]["common_env"] == dict(STEADY_HEAP_ENV)
    # The case's own rounds are the candidate's (slower); the baseline's are kept raw in extra_info.
    assert case["stats"]["rounds"] == ab["pairs"] * ab["rounds_per_block"]
    # ... and so are the ranks' own times: each rank's median over every block, never empty.
    assert len(case["extra_info"]["rank_median_s"]) == 2 and case["extra_info"]["straggler_rank"] in (0, 1)
    assert case["extra_info"]["ops_per_round"] == 1
    assert ab["block_summary"] == "mean"  # what each block of a pair is compared by
    assert ab["pool_pair_threshold"] == pytest.approx(ab["threshold"])  # what each pool pair must show
    assert len(ab["baseline"]["round_times"]) == ab["baseline"]["rounds"]
    assert case["stats"]["median"] > ab["baseline"]["median_s"] * 1.2
    assert "profile" not in ab and "torch.profiler" not in result.stdout.str()  # --dist-ab-profile=off

    cli = [sys.executable, "-m", "ddpbench.cli", "compare", str(pytester.path / "ab.json")]
    text = subprocess.run(cli, capture_output=True, text=True)
    assert text.returncode == 1 and "regression" in text.stdout and "test_sleep" in text.stdout
    markdown = subprocess.run(cli + ["--markdown"], capture_output=True, text=True)
    assert markdown.returncode == 1
    assert "| case | baseline median (ms) |" in markdown.stdout and "❌ **regression**" in markdown.stdout


def test_identical_sides_are_not_a_regression_and_exit_0(pytester):
    # The false-alarm *rate* is measured on a quiet machine (lab/reference/ab_reliability.py); this
    # checks the path with a threshold that the test machine's load cannot cross (under `make
    # test -n 2` beside other jobs, identical sleeping sides were seen 5% apart).
    pytester.makepyfile(test_bench=SLEEPY)
    # One pool per side here: the single-pool path (the whole interval must clear the threshold).
    result = pytester.runpytest_subprocess(f"--dist-baseline-python={sys.executable}",
                                           "--dist-ab-threshold=25%", "--dist-ab-pools-per-side=1",
                                           "--dist-ab-heap=adaptive", "--dist-ab-profile=all",
                                           "--benchmark-json=aa.json", *FAST, timeout=300)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*1 pool(s) per side*", "*heap adaptive, both sides' ranks: glibc's defaults*"])
    (case,) = json.loads((pytester.path / "aa.json").read_text())["benchmarks"]
    ab = case["extra_info"]["ab"]
    assert ab["verdict"] in ("same", "not-slower", "inconclusive")
    assert 0.8 < ab["ratio"] < 1.25
    assert ab["pools_per_side"] == 1 and set(ab["pool_pair_of_pair"]) == {0} and len(ab["ratio_per_pool_pair"]) == 1
    assert ab["heap"] == "adaptive" and ab["sides"]["candidate"]["common_env"] == {}
    # Both sides launch identically here, yet each has pools of its own: never the same processes.
    baseline_pids = {pid for pool in ab["pool_pids"]["baseline"] for pid in pool}
    candidate_pids = {pid for pool in ab["pool_pids"]["candidate"] for pid in pool}
    assert len(baseline_pids) == len(candidate_pids) == 2 and not baseline_pids & candidate_pids
    assert isinstance(ab["seed"], int)  # drawn for this run and recorded
    # --dist-ab-profile=all profiles a case whatever its verdict, after it: both sides, each rank.
    assert ab["profile"]["errors"] == {} and len(ab["profile"]["traces"]["baseline"]) == 2
    assert all(os.path.exists(path) for paths in ab["profile"]["traces"].values() for path in paths)
    result.stdout.fnmatch_lines([f"*why *test_sleep* is as it is ({ab['verdict']}): torch.profiler*"])


def test_a_faster_candidate_is_not_slower_exits_0_and_leaves_its_time_to_the_next_case(pytester):
    # The baseline sleeps twice as long: after the first stage the interval lies far below
    # 1 + threshold, which ends the case as not-slower (the first look's level is far too strict
    # for an improvement on 12 pairs, and the 60 s share leaves room for more looks, so the first
    # is not the last). The run budget gives the time it did not use to the second case.
    pytester.makepyfile(test_bench=SLEEPY + "\n\ndef test_sleep_again(dist_benchmark):\n    dist_benchmark(Sleep())\n")
    result = pytester.runpytest_subprocess("--dist-baseline-env", "SLEEP_FACTOR=2", "--dist-ab-run-budget=120",
                                           "--dist-ab-stratify-cpu-sharing", "--dist-ab-profile=off",
                                           "--benchmark-json=ab.json", "--dist-ab-block-time=0.02", "-m", "not gpu",
                                           "-p", "no:cacheprovider", timeout=300)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*more within a run budget of 120 s (each case: its share of what is left)*",
                                 "*ddpbench A/B verdicts (2 not-slower*",
                                 "*::test_sleep?gloo-2p? *not-slower*", "*::test_sleep_again?gloo-2p? *not-slower*"])
    assert "exit status 1" not in result.stdout.str() and "rules out" not in result.stdout.str()
    first, second = (case["extra_info"]["ab"] for case in json.loads((pytester.path / "ab.json").read_text())["benchmarks"])
    for ab in (first, second):
        assert ab["verdict"] == "not-slower" and ab["ratio_ci"][1] < 0.8 and ab["stages"] == 1
        assert ab["run_budget_s"] == 120 and "rules_out_slowdown" not in ab
        # Each round's placement is kept (for replays); asked for, the pairs were compared by it.
        assert ab["stratify_placement"] and ab["block_summary"] == "mean per placement, at the pair's mix of placements"
        assert set(ab["baseline"]["shared_cpu_rounds"]) <= {"0", "1"}
        assert len(ab["baseline"]["shared_cpu_rounds"]) == len(ab["baseline"]["round_times"])
    assert 59 < first["time_cap_s"] <= 60  # half of the budget, less what set-up took before the clock
    assert second["time_cap_s"] > first["time_cap_s"] + 10  # the first case's unused time
    # Nearly decided at its share's end, the first case could have borrowed the second's share;
    # the last case has all that is left already. Neither needed to.
    assert 59 < first["borrow_time_s"] <= 60 and second["borrow_time_s"] == 0
    assert first["borrowed_looks"] == second["borrowed_looks"] == 0
    markdown = subprocess.run([sys.executable, "-m", "ddpbench.cli", "compare", str(pytester.path / "ab.json"),
                               "--markdown"], capture_output=True, text=True)
    assert markdown.returncode == 0 and markdown.stdout.count("✅ not-slower") == 2, markdown.stdout


# ----------------------------------------------------------------------------------------------
# Each side runs its own code: a user project with a flat layout (no src/), two checkouts
# ----------------------------------------------------------------------------------------------

FLAT_STEP = """
import time

from ddpbench.workloads import Workload


class Step(Workload):
    def setup(self, ctx):
        return None

    def run_round(self, state):
        time.sleep({seconds})
"""

FLAT_TEST = """
from mypkg.step import Step


def test_step(dist_benchmark):
    dist_benchmark(Step())
"""


def _flat_checkout(root, seconds):
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "step.py").write_text(FLAT_STEP.format(seconds=seconds))
    (root / "test_bench.py").write_text(FLAT_TEST)
    return root


def _pytest_in(cwd, *args):
    """``python -m pytest`` started inside ``cwd``, as a PR job starts it in the head checkout:
    the controller then has ``cwd`` first on its own sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return subprocess.run([sys.executable, "-m", "pytest", "test_bench.py", "-p", "no:cacheprovider",
                           "-m", "not gpu", "--dist-ab-block-time=0.02", "--dist-ab-max-time=8", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.pool
def test_flat_layout_run_from_the_head_checkout_times_each_sides_own_code(tmp_path):
    base = _flat_checkout(tmp_path / "base", 0.004)
    head = _flat_checkout(tmp_path / "head", 0.008)  # the pull request doubles the step
    run = _pytest_in(head, "--dist-baseline-path=../base", "--benchmark-json=ab.json")
    assert run.returncode == 1, run.stdout + run.stderr
    (case,) = json.loads((head / "ab.json").read_text())["benchmarks"]
    ab = case["extra_info"]["ab"]
    assert ab["verdict"] == "regression" and 1.6 < ab["ratio"] < 2.4
    # The header says where each side's ranks import the code under test from.
    assert f"mypkg (2 modules): baseline {base}/mypkg/ | candidate {head}/mypkg/" in run.stdout
    assert f"test_bench: baseline {base}/test_bench.py | candidate {head}/test_bench.py" in run.stdout
    assert ab["sides"]["baseline"]["modules"]["mypkg.step"] == str(base / "mypkg" / "step.py")
    assert ab["sides"]["candidate"]["modules"]["mypkg.step"] == str(head / "mypkg" / "step.py")


@pytest.mark.pool
def test_an_a_a_of_two_identical_flat_checkouts_with_another_engine_passes(tmp_path):
    # Identical code on both sides; the baseline's ddpbench differs by a comment, as when a pull
    # request changes ddpbench itself: the run says so and still compares (same rank protocol).
    _flat_checkout(tmp_path / "base", 0.004)
    head = _flat_checkout(tmp_path / "head", 0.004)
    engine = _engine_copy(tmp_path)
    run = _pytest_in(head, "--dist-baseline-path=../base", f"--dist-baseline-path={engine}",
                     "--dist-ab-threshold=25%", "--benchmark-json=aa.json")
    assert run.returncode == 0, run.stdout + run.stderr
    (case,) = json.loads((head / "aa.json").read_text())["benchmarks"]
    ab = case["extra_info"]["ab"]
    assert ab["verdict"] in ("same", "inconclusive") and 0.8 < ab["ratio"] < 1.25
    assert f"the sides run DIFFERENT ddpbench engines (both speak rank protocol {RANK_PROTOCOL})" in run.stdout
    assert (f"baseline  engine: ddpbench 0.1.0 #{ab['sides']['baseline']['ddpbench_source_sha256'][:12]} "
            f"from {engine}/ddpbench") in run.stdout
    assert ab["sides"]["baseline"]["ddpbench_source_sha256"] != ab["sides"]["candidate"]["ddpbench_source_sha256"]


@pytest.mark.pool
def test_a_baseline_path_that_shadows_nothing_is_a_usage_error(tmp_path):
    head = _flat_checkout(tmp_path / "head", 0.004)
    (tmp_path / "empty").mkdir()
    run = _pytest_in(head, "--dist-baseline-path=../empty")
    out = run.stdout + run.stderr
    assert run.returncode == 2, out  # refused as unsafe isolation is (DESIGN.md: exit 2)
    assert "both sides import every module under test from the same files (" in out
    assert f"mypkg.step -> {head}/mypkg/step.py" in out
    assert f"--dist-baseline-path={tmp_path}/empty asks for other code" in out
    assert "the baseline checkout's root for a flat layout" in out


@pytest.mark.pool
def test_a_baseline_path_given_as_two_words_is_a_usage_error_naming_the_one_word_form(tmp_path):
    # pytest picks its rootdir before it knows ddpbench's options, so "../base" as a separate word
    # counts as a test path there and the base checkout's pytest.ini could configure the run.
    _flat_checkout(tmp_path / "base", 0.004)
    head = _flat_checkout(tmp_path / "head", 0.004)
    run = _pytest_in(head, "--dist-baseline-path", "../base")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "write --dist-baseline-path=../base (one word)" in run.stderr


# ----------------------------------------------------------------------------------------------
# Lost cases, new cases, and settings A/B mode cannot measure
# ----------------------------------------------------------------------------------------------

CRASHY = """
import os
import time

from ddpbench.workloads import Workload


class Step(Workload):
    \"\"\"Sleeps 4 ms a round; with ``may_crash``, raises after three rounds on a side whose ranks
    have $CRASH_IN_ROUND set.\"\"\"

    def __init__(self, may_crash):
        self.may_crash = may_crash

    def setup(self, ctx):
        return {"rounds": 0}

    def run_round(self, state):
        state["rounds"] += 1
        if self.may_crash and os.environ.get("CRASH_IN_ROUND") and state["rounds"] > 3:
            raise RuntimeError("the step broke")
        time.sleep(0.004)


def test_steady(dist_benchmark):
    dist_benchmark(Step(False))


def test_crashy(dist_benchmark):
    dist_benchmark(Step(True))
"""


def _said(result) -> str:
    """What the gate's lines say, each explanation whole (they wrap at 160 columns)."""
    return " ".join(result.stdout.str().replace("\nddpbench A/B:   ", " ").split())


def test_a_case_the_candidate_lost_fails_the_run_and_so_does_one_the_baseline_failed(pytester):
    pytester.makepyfile(test_bench=CRASHY)
    common = ["--dist-max-time=0.2", "--benchmark-json=run.json", "--dist-ab-threshold=50%",
              "--dist-ab-pools-per-side=1", *FAST]
    lost = pytester.runpytest_subprocess("--dist-candidate-env", "CRASH_IN_ROUND=1", *common, timeout=300)
    assert lost.ret == 1, lost.stdout.str()
    lost.stdout.fnmatch_lines(["*the candidate lost this case (the baseline ran it): ddpbench: candidate pool 0: "
                               "task ddpbench.gates.ab.tasks.* raised on rank(s)*",
                               "*--- candidate pool 0, rank 0 traceback ---*",
                               "*RuntimeError: the step broke*",
                               "*test_crashy*missing (candidate pool 0 failed)*",
                               "*1 case(s) the baseline has were lost by the candidate run (*test_crashy*)*"])
    assert "Exit status 1 (--dist-allow-missing accepts them)" in _said(lost)
    cli = [sys.executable, "-m", "ddpbench.cli", "compare", str(pytester.path / "run.json")]
    text = subprocess.run(cli, capture_output=True, text=True)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "test_crashy[gloo-2p]" in text.stdout and "lost by the candidate run" in text.stdout
    allowed = subprocess.run(cli + ["--allow-missing"], capture_output=True, text=True)
    assert allowed.returncode == 0 and "allowed by --allow-missing" in allowed.stdout

    skipped = pytester.runpytest_subprocess("--dist-candidate-env", "CRASH_IN_ROUND=1", "-k", "crashy",
                                            "--dist-allow-missing", *common, timeout=300)
    assert skipped.ret == 0, skipped.stdout.str()
    assert "1 case(s) the baseline has were lost by the candidate run" in _said(skipped)
    assert "allowed by --dist-allow-missing" in _said(skipped)

    # The baseline runs the case and fails it: not "new" (which would let any change pass), but the
    # baseline's failure, which fails the run unless allowed.
    failed = pytester.runpytest_subprocess("--dist-baseline-env", "CRASH_IN_ROUND=1", "-k", "crashy", *common,
                                           timeout=300)
    assert failed.ret == 1, failed.stdout.str()
    failed.stdout.fnmatch_lines(["*test_crashy*baseline-failed (baseline pool 0 failed)*<<*",
                                 "*1 case(s) failed on the baseline side (*test_crashy*): nothing to compare the "
                                 "candidate with*"])
    assert "Exit status 1 (--dist-allow-baseline-failure accepts them)" in _said(failed)
    cases = {c["name"]: c for c in json.loads((pytester.path / "run.json").read_text())["benchmarks"]}
    ab = cases["test_crashy[gloo-2p]"]["extra_info"]["ab"]
    assert ab["verdict"] == "baseline-failed" and "the step broke" in ab["error"]
    assert cases["test_crashy[gloo-2p]"]["stats"]["rounds"] >= 5  # the candidate, measured alone
    text = subprocess.run(cli, capture_output=True, text=True)
    assert text.returncode == 1 and "baseline-failed" in text.stdout, text.stdout + text.stderr
    allowed = subprocess.run(cli + ["--allow-baseline-failure"], capture_output=True, text=True)
    assert allowed.returncode == 0 and "allowed by --allow-baseline-failure" in allowed.stdout

    accepted = pytester.runpytest_subprocess("--dist-baseline-env", "CRASH_IN_ROUND=1", "-k", "crashy",
                                             "--dist-allow-baseline-failure", *common, timeout=300)
    assert accepted.ret == 0, accepted.stdout.str()
    assert "1 case(s) failed on the baseline side" in _said(accepted)
    assert "allowed by --dist-allow-baseline-failure" in _said(accepted)


def test_only_a_baseline_that_cannot_import_the_case_makes_it_new():
    from ddpbench.gates.ab.case_runner import baseline_lacks_case
    from ddpbench.pool import PoolStartError, TaskFailed
    from ddpbench.pool.picklecheck import LOAD_FAILURE_PREFIX

    lacks = f"{LOAD_FAILURE_PREFIX}mypkg.step.Step (AttributeError: module 'mypkg.step' has no attribute 'Step')."
    assert baseline_lacks_case(TaskFailed("x", errors={0: lacks, 1: lacks}))
    assert not baseline_lacks_case(TaskFailed("x", errors={0: "Traceback ...\nRuntimeError: the step broke"}))
    assert not baseline_lacks_case(TaskFailed("x", errors={0: lacks}, dead={1: -9}))  # and a rank died
    assert not baseline_lacks_case(TaskFailed("x", stuck={0: "stack"}))  # hung
    assert not baseline_lacks_case(PoolStartError("the baseline's ranks did not start"))


@pytest.mark.parametrize("args,message", [
    (["--dist-warmup=0", "--dist-rounds=50"], "*--dist-warmup=0 with --dist-rounds in A/B mode*--dist-warmup=1*"),
    (["--dist-ab-block-time=5"], "*first stage alone*takes about 120 s, past --dist-ab-max-time 60 s*"),
    (["--dist-ab-seed=-3"], "*'-3' is not a seed*"),
])
def test_settings_a_b_mode_cannot_measure_are_usage_errors(pytester, args, message):
    pytester.makepyfile(test_bench=SLEEPY)
    result = pytester.runpytest_subprocess("--dist-candidate-env", "A=1", *args, "-p", "no:cacheprovider",
                                           timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_the_controller_reports_torch_as_its_ranks_do_local_tag_included(tmp_path, monkeypatch):
    """On a GPU image whose torch metadata says 2.11.0 while torch.__version__ says 2.11.0+cu130,
    the candidate (the controller's interpreter) and the probed baseline read as two torches."""
    import sys

    from ddpbench.gates.ab import side_environments

    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the controller must not import torch')\n")
    (fake / "version.py").write_text("__version__ = '9.9.0+cu999'\ndebug = False\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert side_environments._torch_version_without_import() == "9.9.0+cu999"
    assert side_environments.local_facts()["torch_version"] == "9.9.0+cu999"
