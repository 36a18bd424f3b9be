"""``ddpbench bisect``: on a small git history of a flat-layout user project it finds the commit that
added an all_reduce of 4 MB to the step; with no regression between GOOD and BAD it stops after
the confirming probe; bad input is a usage error naming the fix; its worktrees are removed, also
after an interrupt."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

STEP = '''
import time

import torch
import torch.distributed as dist

EXTRA_ALL_REDUCE = {extra}  # the planted change: an all_reduce of 4 MB more in every step
PAUSE_S = 0.003  # {note}


def setup(ctx):
    return torch.ones(4096), torch.ones(1 << 20)


def step(state):
    small, large = state
    time.sleep(PAUSE_S)
    dist.all_reduce(small)
    if EXTRA_ALL_REDUCE:
        dist.all_reduce(large)
'''

BENCH = '''
import ddpbench

from mystep import setup, step


def test_step(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, step))
'''

# Short, decisive A/B runs: the planted change makes the step several times slower, and a wide
# threshold keeps identical sides from being called apart on a loaded 2-core machine.
# One pool per side: half the rank processes to start on a 2-core machine.
PYTEST_ARGS = ["--", "-p", "no:cacheprovider", "-m", "not gpu", "--dist-ab-block-time=0.02",
               "--dist-ab-threshold=50%", "--dist-ab-pools-per-side=1"]
# Identical sides should read `same` at the one look a short probe gets (its first stage, 12 pairs,
# at a stop level near 0.001: docs/design/ab.md#the-stops-own-error). Blocks of 3 rounds of a ~5 ms
# step whose interquartile range is 75% under load rule out x1.5 there in 3 of 10 resamplings of
# such rounds, blocks of ~18 rounds in nearly all; 24 blocks of 0.12 s still fit --max-time 3, as
# the gate requires of a first stage. A load spike in one block can still leave them inconclusive.
QUIET_ARGS = [arg if not arg.startswith("--dist-ab-block-time=") else "--dist-ab-block-time=0.12"
              for arg in PYTEST_ARGS]
PLANTED = 11  # the 1-based commit after GOOD that adds the all_reduce
BROKEN = 8  # ... and one that does not collect: the search's first probe after confirming BAD


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
                           *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _history(root, commits=16, planted=PLANTED, broken=None):
    """GOOD (the root commit) and ``commits`` first-parent commits after it, the ``planted``-th
    of which adds the extra all_reduce, the ``broken``-th a syntax error (the next one fixes it);
    the others change a comment or a notes file."""
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_bench.py").write_text(BENCH)
    (root / "mystep.py").write_text(STEP.format(extra=False, note="revision 0"))
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "GOOD: the step")
    shas = [_git(root, "rev-parse", "HEAD")]
    extra = False
    for i in range(1, commits + 1):
        if i == planted:
            extra = True
            subject = "step: all_reduce the large buffer too"
        elif i % 3 == 0:
            (root / "NOTES.md").write_text(f"note {i}\n")
            subject = f"notes {i}"
        else:
            subject = f"step: comment {i}"
        text = STEP.format(extra=extra, note=f"revision {i if i % 3 else i - 1}")
        if i == broken:
            text, subject = text + "\ndef unfinished(:\n", "step: half a refactoring"
        (root / "mystep.py").write_text(text)
        _git(root, "add", ".")
        _git(root, "commit", "-q", "-m", subject)
        shas.append(_git(root, "rev-parse", "HEAD"))
    return shas


def _bisect(repo, tmp, *args, **kwargs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["TMPDIR"] = str(tmp)
    return subprocess.run([sys.executable, "-m", "ddpbench.cli", "bisect", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=900, **kwargs)


def _left_in(scratch):
    """What bisect left in its temporary folder; torch's own compile cache folder (torchinductor_<user>,
    made by any rank process that imports torch._dynamo, as the census's dispatch mode does) is torch's."""
    return [p for p in scratch.iterdir() if not p.name.startswith("torchinductor_")]


def _worktrees(repo):
    return _git(repo, "worktree", "list", "--porcelain").count("worktree ")


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp"


@pytest.mark.pool
def test_bisect_finds_the_commit_that_added_an_all_reduce(tmp_path, scratch):
    repo = tmp_path / "project"
    shas = _history(repo, broken=BROKEN)
    started = time.monotonic()
    # 5 s (10 s on the retry): an unchanged commit must reach `same` at the looks' stop levels
    # (docs/design/ab.md#the-looks-levels) under make test's load, or it is skipped and the search left undecided.
    run = _bisect(repo, scratch, shas[0], "main", "-k", "test_step", "--max-time", "5", *PYTEST_ARGS)
    seconds = time.monotonic() - started
    print(f"\nbisect of {len(shas) - 1} commits in {seconds:.0f} s:\n{run.stdout}")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert f"first bad commit: {shas[PLANTED]} step: all_reduce the large buffer too" in out
    # Every probe is in the table with its ratio and interval; BAD (confirmed) and the culprit are bad.
    probes = re.findall(r"^  ([0-9a-f]{12})  (good|bad|inconclusive|skip) ", out, re.M)
    tested = dict(probes)
    assert tested[shas[-1][:12]] == "bad" and tested[shas[PLANTED][:12]] == "bad"
    assert tested[shas[PLANTED - 1][:12]] == "good"
    # The commit that does not collect is skipped, as git bisect skip does, and a neighbour tested.
    assert tested[shas[BROKEN][:12]] == "skip" and "did not give verdicts (pytest exit 2)" in out
    assert "ERROR test_bench.py" in out  # the probe's own rootdir and ini, not GOOD's
    assert 3 <= len(probes) <= 8, out
    assert re.search(r"test_step\[gloo-2p\]: x\d+\.\d{3} \[\d+\.\d{3}, \d+\.\d{3}\] regression", out)
    # The command that repeats the culprit's verdict: both worktrees, GOOD as the baseline, the seed.
    assert f"git worktree add ../ddpbench-good {shas[0][:12]} && git worktree add ../ddpbench-probe " \
           f"{shas[PLANTED][:12]}" in out
    assert re.search(r"cd \.\./ddpbench-probe && \S+ -m pytest -k test_step -p no:cacheprovider -m 'not gpu' .* "
                     r"--dist-baseline-path=\.\./ddpbench-good .*--dist-ab-max-time=\d+ --benchmark-json=ab\.json --dist-ab-seed=\d+", out)
    # Its worktrees and temporary folder are gone.
    assert _worktrees(repo) == 1 and _left_in(scratch) == []


@pytest.mark.pool
def test_without_a_regression_between_good_and_bad_it_stops_after_confirming(tmp_path, scratch):
    repo = tmp_path / "project"
    shas = _history(repo, commits=4, planted=99)
    # --setup builds each commit's environment once, in its worktree (here: an interpreter wrapper
    # that logs where it runs); --python names what it built, for both sides.
    log = tmp_path / "setup.log"
    setup = (f"git rev-parse HEAD >> {log} && printf '#!/bin/sh\\necho \"$PWD\" >> {log}.py\\n"
             f"exec {sys.executable} \"$@\"\\n' > py && chmod +x py")
    run = _bisect(repo, scratch, shas[0], shas[-1], "-k", "test_step", "--max-time", "3", "--setup", setup,
                  "--python", "py", *QUIET_ARGS)
    # Identical commits are never a regression. Read `same` they are nothing to bisect (exit 0); under a
    # load spike the gate may not rule out x1.5 within the probe's time, and bisect then says it could
    # not confirm one (exit 1): both stop after BAD. (A `same` BAD read as nothing to bisect is also
    # checked without pools, from saved runs: test_bisect_reading.py.)
    confirm = re.search(rf"^  \[1\] {shas[-1][:12]} step: comment 4: (\w+)  ", run.stdout, re.M)
    assert confirm and confirm.group(1) in ("GOOD", "INCONCLUSIVE"), run.stdout + run.stderr
    if confirm.group(1) == "GOOD":
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"no regression between GOOD {shas[0][:12]} and BAD {shas[-1][:12]}: nothing to bisect" in run.stdout
    else:
        assert run.returncode == 1, run.stdout + run.stderr
        assert f"could not confirm a regression at BAD {shas[-1][:12]} (inconclusive: " in run.stdout
    assert sorted(log.read_text().split()) == sorted([shas[0], shas[-1]])  # once per commit, reused
    used = set(log.with_suffix(".log.py").read_text().split())
    assert any(path.endswith("/good") for path in used) and any(path.endswith(f"/{shas[-1][:12]}") for path in used)
    assert len(re.findall(r"^  \[\d+\] ", run.stdout, re.M)) == 1  # one probe: BAD itself
    assert "searching" not in run.stdout
    assert _worktrees(repo) == 1 and _left_in(scratch) == []


@pytest.mark.pool
def test_bad_input_is_a_usage_error_naming_the_fix(tmp_path, scratch):
    plain = tmp_path / "plain"
    plain.mkdir()
    run = _bisect(plain, scratch, "HEAD~1", "HEAD")
    assert run.returncode == 2 and "is not inside a git checkout" in run.stderr
    repo = tmp_path / "project"
    shas = _history(repo, commits=3, planted=99)
    run = _bisect(repo, scratch, shas[2], shas[1], "-k", "test_step")
    assert run.returncode == 2 and "is not an ancestor of BAD" in run.stderr and "Swap them" in run.stderr
    run = _bisect(repo, scratch, "nosuchrev", shas[1])
    assert run.returncode == 2 and "GOOD 'nosuchrev' is not a commit" in run.stderr
    run = _bisect(repo, scratch, shas[0], shas[-1], "--python", ".venv/bin/python")
    assert run.returncode == 2 and "give --setup too" in run.stderr
    run = _bisect(repo, scratch, shas[0], shas[-1], "--", "--dist-ab-max-time=3")
    assert run.returncode == 2 and "give it as ddpbench bisect --max-time" in run.stderr
    run = _bisect(repo, scratch, shas[0], shas[-1], "-k", "no_such_case", "--", "-p", "no:cacheprovider")
    assert run.returncode == 2 and "collects no case at BAD" in run.stderr, run.stderr
    assert "pytest --collect-only -q -k no_such_case" in run.stderr
    (repo / "mystep.py").write_text("# edited, not committed\n")
    run = _bisect(repo, scratch, shas[0], shas[-1], "-k", "test_step")
    assert run.returncode == 2 and "uncommitted changes (mystep.py)" in run.stderr and "git stash" in run.stderr
    assert _worktrees(repo) == 1 and _left_in(scratch) == []


@pytest.mark.pool
def test_an_interrupt_removes_the_worktrees(tmp_path, scratch):
    repo = tmp_path / "project"
    shas = _history(repo, commits=3, planted=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["TMPDIR"] = str(scratch)
    child = subprocess.Popen([sys.executable, "-m", "ddpbench.cli", "bisect", shas[0], shas[-1], "-k", "test_step",
                              "--max-time", "30", *PYTEST_ARGS], cwd=repo, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _worktrees(repo) < 3 and time.monotonic() < deadline:  # GOOD's and BAD's: the runs begin
            time.sleep(0.5)
        time.sleep(3)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, out + err
    assert "interrupted; removing its worktrees" in err
    assert _worktrees(repo) == 1 and _left_in(scratch) == []


def test_the_baseline_gets_the_import_folder_of_each_selected_test_file(tmp_path):
    from ddpbench.bisect.runner import import_dirs

    (tmp_path / "benchmarks" / "pkg").mkdir(parents=True)
    (tmp_path / "benchmarks" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "pkg" / "test_x.py").write_text("")
    (tmp_path / "test_y.py").write_text("")
    # The root itself is on the baseline's path already; a package's tests import from above it.
    assert import_dirs(tmp_path, ["benchmarks/pkg/test_x.py::test_a", "test_y.py::test_b"], "") == ["benchmarks"]
    # Run from a sub-folder, node ids are relative to it (or to the rootdir, when an ini sits above).
    assert import_dirs(tmp_path, ["pkg/test_x.py::test_a"], "benchmarks/") == ["benchmarks"]


def _without_runs(tmp_path, commits, pytest_args, outcome_of, cases=()):
    """A Bisect over ``commits`` whose probes read ``outcome_of(index)``, with ``cases``; no git, no pytest."""
    import io

    from ddpbench.bisect import Bisect, Checkout, Options, Probe

    checkout = Checkout(tmp_path, "", "0" * 40, commits[-1], commits)
    search = Bisect(checkout, Options(max_time=1.0, pytest_args=pytest_args), tmp_path, out=io.StringIO())

    def probe(sha):
        index = commits.index(sha)
        search.probes[sha] = Probe(index, sha, f"commit {index}", outcome_of(index), cases=list(cases),
                                   command="(command)")
        return search.probes[sha]

    search.probe = probe
    return search


def test_skipped_commits_between_the_last_good_and_first_bad_leave_it_undecided(tmp_path):
    # The search alone, with each probe's outcome given: 0-7 good, 8-9 unmeasurable, 10 on bad.
    outcomes = ["good"] * 8 + ["skip"] * 2 + ["bad"] * 6
    order = []

    def outcome_of(index):
        order.append(index)
        return outcomes[index]

    commits = [f"{i:040x}" for i in range(1, 17)]
    search = _without_runs(tmp_path, commits, [], outcome_of)
    assert search.search() == 1
    # BAD first, then the middle of what is left; after a skip (9) the untested commit nearest the
    # middle (8 and 10 tie: the earlier), until only skipped commits lie between good and bad.
    assert order == [15, 7, 11, 9, 8, 10]
    text = search.out.getvalue()
    assert f"the first bad commit is one of {commits[8][:12]}, {commits[9][:12]}, {commits[10][:12]}" in text
    outcomes[8:10] = ["good", "bad"]  # measurable after all: found
    search.probes.clear(), order.clear()
    assert search.search() == 0 and f"first bad commit: {commits[9]} commit 9" in search.out.getvalue()


def test_after_confirming_bad_the_probes_split_the_step_at_its_geometric_midpoint(tmp_path):
    # BAD x2.17 [2.006, 2.340]: later probes use threshold sqrt(2.006) - 1 = 41.6%, so a commit
    # at x1.0 reads `same` instead of `inconclusive` at +-5%. A threshold the user set is kept.
    from ddpbench.bisect import ProbeCase

    def search_with(pytest_args, cases):
        commits = [f"{i:040x}" for i in range(1, 5)]
        search = _without_runs(tmp_path, commits, pytest_args, lambda i: "bad" if i >= 2 else "good", cases)
        assert search.search() == 0
        return search

    step = [ProbeCase("test_step[gloo-2p]", "regression", 2.17, (2.006, 2.340))]
    search = search_with([], step)
    assert search.runner.threshold == pytest.approx(2.006 ** 0.5 - 1)
    assert "--dist-ab-threshold=41.6%" in search.out.getvalue()
    assert search_with(["--dist-ab-threshold=10%"], step).runner.threshold is None
    # A small step never splits below the gate's default; a missing case (no interval) keeps it too.
    small = [ProbeCase("test_step[gloo-2p]", "regression", 1.07, (1.06, 1.09))]
    assert search_with([], small).runner.threshold == 0.05
    assert search_with([], [ProbeCase("test_step[gloo-2p]", "missing")]).runner.threshold is None
