"""How ``ddpbench bisect`` reads its probes and survives commits it cannot run, without rank pools:
the A/B runs are canned run files (the JSON the gate saves), handed to bisect by a stand-in for its
subprocess runner; where git itself matters (worktrees, folders, untracked files) a tiny real
repository, and where pytest matters (a collection or a run that hangs) a tiny project whose
conftest sleeps.

* a probe is read as the gate that ran it read it (--dist-accept-structure-change);
* every case BAD judged must be judged at each probe, or the probe is a skip; a missing case is a
  skip with its reason, bad only with --missing-is-bad;
* a hung collection or A/B run, a failed ``git worktree add``, a folder missing at an old commit
  are named, never a hang or a traceback; what bisect prints carries no terminal escapes; the
  reproduce line's ``cd`` is quoted; untracked files are mentioned."""

from __future__ import annotations

import io
import json
import subprocess
import time
from pathlib import Path

import pytest

from helpers.benchjson import bench, run_doc
from helpers.census_records import census
from ddpbench.bisect import Bisect, BisectError, Checkout, Options, ProbeCase
from ddpbench.bisect import inputs
from ddpbench.bisect.inputs import check_input

A, B = "benchmarks/test_x.py::test_a", "benchmarks/test_x.py::test_b"
BASE = census(("all_reduce", "float32", 2, [4096]))
GREW = census(("all_reduce", "float32", 2, [4096, 4096]))


def _ab(verdict, ratio=1.0, ci=(0.95, 1.05), **more):
    return {"verdict": verdict, "ratio": ratio, "ratio_ci": list(ci), "pairs": 12, "threshold": 0.05,
            "seed": 7, **more}


def _doc(*cases, lost=()):
    """A run file: (name, extra_info["ab"], candidate census or None) per case; ``lost``: the names
    of cases the candidate lost (verdict missing, no benchmark entry)."""
    entries = []
    for name, ab, candidate_census in cases:
        info = {"ab": ab} if candidate_census is None else {"ab": ab, "census": candidate_census}
        entries.append(bench(name.split("::")[1], [0.001] * 3, info))
    doc = run_doc(entries)
    doc["ddpbench_ab_lost"] = [{"name": name, "ab": {"verdict": "missing", "reason": "candidate pool 0 failed"}}
                               for name in lost]
    return doc


SLOWER = _ab("regression", 2.0, (1.9, 2.1))
SAME = _ab("same")


def _canned(tmp_path, docs, pytest_args=(), **options):
    """A Bisect over len(docs) commits after GOOD whose A/B runs return ``docs[index]`` (index
    len(docs) - 1 is BAD); no git, no pytest."""
    commits = [f"{i:02x}" * 20 for i in range(1, len(docs) + 1)]
    checkout = Checkout(top=tmp_path, prefix="", good="0" * 40, bad=commits[-1], commits=commits)
    search = Bisect(checkout, Options(max_time=1.0, pytest_args=list(pytest_args), **options), tmp_path,
                    out=io.StringIO())
    for sha in [checkout.good, *commits]:
        (tmp_path / sha[:12]).mkdir(parents=True)
        search.worktrees.roots[sha] = tmp_path / sha[:12]
    runs = []

    def run(command, cwd, log, env=None, timeout=None):
        index = commits.index(next(sha for sha in commits if Path(cwd).name == sha[:12]))
        runs.append(index)
        out = next(a.split("=", 1)[1] for a in command if a.startswith("--benchmark-json="))
        Path(out).write_text(json.dumps(docs[index]))
        Path(log).write_text("")
        return 1 if any(c["extra_info"]["ab"]["verdict"] == "regression" for c in docs[index]["benchmarks"]) else 0

    search.children.run = run
    search.runs = runs
    return search


@pytest.fixture
def subjects(monkeypatch):
    """Commit subjects as ``git log`` would give them, without a repository."""
    table = {}

    def git(cwd, *args, check=True):
        return subprocess.CompletedProcess(args, 0, table.get(args[-1], f"commit {args[-1][-2:]}") + "\n", "")

    monkeypatch.setattr(inputs, "git", git)  # Checkout.subject's
    return table


# ----------------------------------------------------------------------------------------------
# Reading a probe
# ----------------------------------------------------------------------------------------------


def test_a_probe_is_read_with_the_structural_acceptance_its_gate_ran_with(tmp_path, subjects):
    # Each commit adds an all_reduce on purpose; the gate ran with --dist-accept-structure-change
    # and passed every probe (its saved verdict `same`, the structure accepted): nothing to bisect.
    accepted = _ab("same", census_baseline=BASE, timing_verdict="same", structure_verdict="regression",
                   structure_accepted=True)
    docs = [_doc((A, accepted, GREW))] * 3
    search = _canned(tmp_path, docs, ["--dist-accept-structure-change"])
    assert search.search() == 0
    assert "no regression between GOOD" in search.out.getvalue() and search.runs == [2]
    # The same runs made without the option fail by structure, and are read so.
    failed = _ab("regression", census_baseline=BASE, timing_verdict="same", structure_verdict="regression")
    search = _canned(tmp_path / "unaccepted", [_doc((A, SAME, None))] + [_doc((A, failed, GREW))] * 2)
    assert search.search() == 0 and f"first bad commit: {search.checkout.commits[1]}" in search.out.getvalue()


MEMORY = {"version": 1, "method": "MemTracker", "device": "cuda", "peak_bytes": 1 << 20,
          "at_peak": {"activations": 1 << 20}, "peak_at": {"module": "net", "phase": "forward"},
          "measured": {"max_allocated_bytes": 100 << 20}}
MORE_MEMORY = dict(MEMORY, peak_bytes=2 << 20, at_peak={"activations": 2 << 20})
MORE_ALLOCATED = dict(MEMORY, measured={"max_allocated_bytes": 105 << 20})  # +5%, census the same


def _memory_doc(ab, memory):
    return run_doc([bench(A.split("::")[1], [0.001] * 3, {"ab": dict(ab, memory_baseline=MEMORY), "memory": memory})])


def test_a_probe_is_read_with_the_memory_acceptance_its_gate_ran_with(tmp_path, subjects):
    # The gate ran with --dist-accept-memory-change and passed every probe (exit 0, its saved
    # verdict `same`); before the fix bisect judged the memory anew without it and read BAD `bad`.
    passed = _ab("same", timing_verdict="same", memory_verdict="regression", memory_accepted=True)
    search = _canned(tmp_path, [_memory_doc(passed, MORE_MEMORY)] * 3, ["--dist-accept-memory-change"])
    assert search.search() == 0, search.out.getvalue()
    assert "no regression between GOOD" in search.out.getvalue() and search.runs == [2]
    # Without the option the same memory is a regression, and is read so.
    failed = _ab("regression", timing_verdict="same", memory_verdict="regression")
    search = _canned(tmp_path / "unaccepted", [_memory_doc(SAME, MEMORY)] + [_memory_doc(failed, MORE_MEMORY)] * 2)
    assert search.search() == 0 and f"first bad commit: {search.checkout.commits[1]}" in search.out.getvalue()
    assert "memory: regression: peak +1.0 MiB" in search.out.getvalue(), search.out.getvalue()[-600:]


@pytest.mark.parametrize("option", [["--dist-memory-tolerance=1%"], ["--dist-memory-tolerance", "1"]])
def test_a_probe_is_read_with_the_memory_tolerance_its_gate_ran_with(tmp_path, subjects, option):
    # The gate judged the measured max allocated with a 1% tolerance: +5% failed it (exit 1). Before
    # the fix bisect read the figure as not judged and found nothing to bisect.
    failed = _ab("regression", timing_verdict="same", memory_verdict="regression")
    docs = [_memory_doc(SAME, MEMORY)] + [_memory_doc(failed, MORE_ALLOCATED)] * 2
    search = _canned(tmp_path, docs, option)
    assert search.search() == 0 and f"first bad commit: {search.checkout.commits[1]}" in search.out.getvalue()
    assert "past the 1% tolerance" in search.out.getvalue()


def test_a_memory_tolerance_bisect_cannot_read_is_bad_input(tmp_path):
    repo = tmp_path / "project"
    shas = _repo(repo, [{"README": "0"}, {"README": "1"}])
    with pytest.raises(BisectError, match="--dist-memory-tolerance among the pytest arguments: 'lots'"):
        check_input(repo, shas[0], shas[1], Options(pytest_args=["--dist-memory-tolerance=lots"]))


def _numerics(grad: float) -> dict:
    steps = [{"param w": ["p0", 1.0, 1.0, 1.0]}, {"param w": [f"p{grad}", 1.0, 1.0, 1.0],
                                                  "grad w": [f"g{grad}", grad, grad, grad]}]
    return {"version": 1, "steps": 1, "digests": ["d0", f"d{grad}"], "tensors": [steps], "replay_spread": 0.0}


def test_a_probe_is_read_with_the_numerics_acceptance_and_tolerance_its_gate_ran_with(tmp_path, subjects):
    # Each commit changes what the steps compute (gradients x2) on purpose; the gate ran with
    # --dist-accept-numerics-change and passed every probe: nothing to bisect.
    changed = _ab("same", numerics_baseline=_numerics(1.0), timing_verdict="same")

    def doc(ab, grad):
        return run_doc([bench("test_a", [0.001] * 3, {"ab": ab, "numerics": _numerics(grad)})])

    docs = [doc(changed, 2.0)] * 3
    search = _canned(tmp_path, docs, ["--dist-accept-numerics-change"])
    assert search.search() == 0 and "no regression between GOOD" in search.out.getvalue()
    search = _canned(tmp_path / "tolerated", docs, ["--dist-numerics-tolerance=150%"])
    assert search.search() == 0 and "no regression between GOOD" in search.out.getvalue()
    # Without either, the change is read as the regression its gate failed on.
    search = _canned(tmp_path / "unaccepted", [doc(changed, 1.0)] + [doc(changed, 2.0)] * 2)
    assert search.search() == 0 and f"first bad commit: {search.checkout.commits[1]}" in search.out.getvalue()
    assert "numerics: changed from step 1 of 1" in search.out.getvalue()


def test_a_probe_that_did_not_judge_a_case_bad_judged_is_a_skip_not_good(tmp_path, subjects):
    # BAD: test_a twice as slow, test_b unchanged. Commit 1 lacks test_a (skipped there, or not
    # collected): read by the verdicts present only it would be good, and commit 2 named.
    docs = [_doc((A, SAME, None), (B, SAME, None)), _doc((B, SAME, None)),
            _doc((A, SLOWER, None), (B, SAME, None)), _doc((A, SLOWER, None), (B, SAME, None))]
    search = _canned(tmp_path, docs)
    assert search.search() == 1
    out = search.out.getvalue()
    assert f"{search.checkout.commits[1][:12]}  skip" in out and f"not judged here: {A} (not in the run)" in out
    assert f"the first bad commit is one of {search.checkout.commits[1][:12]}, {search.checkout.commits[2][:12]}" in out


def test_a_missing_case_is_a_skip_with_its_reason_unless_missing_is_bad(tmp_path, subjects):
    docs = [_doc((A, SAME, None)), _doc(lost=[A]), _doc((A, SLOWER, None)), _doc((A, SLOWER, None))]
    search = _canned(tmp_path, docs)
    assert search.search() == 1
    out = search.out.getvalue()
    assert f"{A}: missing (candidate pool 0 failed) -- not judged here: {A} (missing)" in out
    assert "--missing-is-bad searches for the commit that lost it" in out
    search = _canned(tmp_path / "asked", docs, missing_is_bad=True)
    assert search.search() == 0 and f"first bad commit: {search.checkout.commits[1]}" in search.out.getvalue()


def test_read_probe_judges_only_what_bad_judged():
    from ddpbench.bisect import read_probe

    slower, same = ProbeCase(A, "regression", 2.0, (1.9, 2.1)), ProbeCase(B, "same", 1.0, (0.95, 1.05))
    assert read_probe([slower, same]) == ("bad", "")
    assert read_probe([same], [A, B]) == ("skip", f"not judged here: {A} (not in the run)")
    assert read_probe([same, ProbeCase(A, "inconclusive", 1.2, (0.9, 1.6))], [A, B]) == ("inconclusive", "")
    assert read_probe([same, ProbeCase(A, "improvement", 0.5, (0.4, 0.6))], [A, B]) == ("good", "")
    # A case BAD did not judge (new there) is not asked for; a baseline failure is not a verdict.
    assert read_probe([same], [B]) == ("good", "")
    outcome, note = read_probe([same, ProbeCase(A, "baseline-failed", reason="baseline pool 0 failed")], [A, B])
    assert (outcome, note) == ("skip", f"not judged here: {A} (baseline-failed)")
    assert read_probe([]) == ("skip", "no A/B verdict in the run")


# ----------------------------------------------------------------------------------------------
# What bisect prints
# ----------------------------------------------------------------------------------------------


def test_subjects_and_logs_are_printed_without_their_escape_sequences(tmp_path, subjects):
    docs = [_doc((A, SAME, None)), _doc((A, SLOWER, None))]
    search = _canned(tmp_path, docs)
    subjects[search.checkout.commits[1]] = "step: \x1b[2J\x1b]0;pwned\x07all_reduce \u202etoo"
    assert search.search() == 0
    out = search.out.getvalue()
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert f"first bad commit: {search.checkout.commits[1]} step: \\x1b[2J\\x1b]0;pwned\\x07all_reduce \\u202etoo" in out


def test_the_reproduce_lines_cd_is_quoted(tmp_path, subjects):
    search = _canned(tmp_path, [_doc((A, SLOWER, None))])
    search.checkout.prefix = "my benches/"
    text = search.runner.reproduce(search.checkout.commits[0], 1.0, 7)
    assert "\ncd '../ddpbench-probe/my benches' && " in text
    assert "--dist-baseline-path=../../ddpbench-good " in text


# ----------------------------------------------------------------------------------------------
# Commits bisect cannot run, and runs that hang
# ----------------------------------------------------------------------------------------------


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
                           *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _repo(root, files_per_commit):
    """A repository with one commit per dict of files (path -> text, None: removed); the commits' shas."""
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    shas = []
    for i, files in enumerate(files_per_commit):
        for name, text in files.items():
            if text is None:
                _git(root, "rm", "-q", "-r", name)
                continue
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "--allow-empty", "-m", f"commit {i}")
        shas.append(_git(root, "rev-parse", "HEAD"))
    return shas


def _real(cwd, tmp_path, good, bad, **options):
    """A Bisect run from ``cwd``, a folder of a real checkout."""
    options = Options(max_time=1.0, **options)
    (tmp_path / "scratch").mkdir()
    return Bisect(check_input(cwd, good, bad, options), options, tmp_path / "scratch", out=io.StringIO())


def test_a_commit_git_cannot_check_out_or_without_the_folder_is_a_skipped_probe(tmp_path, monkeypatch):
    # Run from benches/. Commit 1 removed that folder; commit 2 brings it back with a file under a
    # filter that fails (as an LFS object missing from its server does).
    repo = tmp_path / "project"
    bench_file = {"benches/test_x.py": "def test_a():\n    pass\n"}
    shas = _repo(repo, [bench_file, {"benches": None},
                        dict(bench_file, **{".gitattributes": "blob filter=broken\n", "blob": "data"}),
                        {".gitattributes": "", "README": "3"}])
    _git(repo, "config", "filter.broken.smudge", "false")
    _git(repo, "config", "filter.broken.required", "true")
    search = _real(repo / "benches", tmp_path, shas[0], shas[-1])
    try:
        probe = search.probe(shas[1])  # no benches/
        assert (probe.outcome, probe.note) == ("skip", "the folder bisect runs in (benches) does not exist at "
                                                       "this commit")
        probe = search.probe(shas[2])  # its worktree cannot be checked out
        assert probe.outcome == "skip" and probe.note.startswith("git worktree add failed (exit "), probe.note
        assert "broken" in probe.note, probe.note
        assert search.probe(shas[2]).note == probe.note  # remembered, not retried
        with pytest.raises(BisectError, match="BAD .* cannot be set up: git worktree add failed"):
            search.runner.collect(shas[2], "BAD")
    finally:
        search.worktrees.remove_all()


def test_untracked_files_are_mentioned_not_refused(tmp_path, monkeypatch):
    repo = tmp_path / "project"
    shas = _repo(repo, [{"README": "0"}, {"README": "1"}])
    (repo / "local_data.bin").write_text("not committed")
    search = _real(repo, tmp_path, shas[0], shas[-1])
    try:
        assert search.checkout.untracked == ["local_data.bin"]
        def collect(sha, name):  # the note comes before any collection
            raise BisectError("stopped here by the test")

        monkeypatch.setattr(search.runner, "collect", collect)
        with pytest.raises(BisectError, match="stopped here"):
            search.run()
        assert ("note: 1 untracked file(s) (local_data.bin) are in no commit: the probes' worktrees do not have "
                "them") in search.out.getvalue()
    finally:
        search.worktrees.remove_all()


HANGS = '''
import sys
import time

if {when}:
    time.sleep(60)
'''


@pytest.mark.pool
def test_a_hanging_collection_or_ab_run_is_stopped_and_named(tmp_path, monkeypatch):
    repo = tmp_path / "project"
    project = {"pytest.ini": "[pytest]\n", "test_x.py": "def test_a():\n    pass\n"}
    in_ab_run = 'any(a.startswith("--dist-baseline-path") for a in sys.argv)'
    shas = _repo(repo, [dict(project, **{"conftest.py": HANGS.format(when="True")}),
                        {"conftest.py": HANGS.format(when=in_ab_run)}])
    search = _real(repo, tmp_path, shas[0], shas[-1], collect_timeout=1.5, probe_timeout=1.5)
    try:
        started = time.monotonic()
        with pytest.raises(BisectError, match=r"collecting the selection at GOOD \w+ did not finish "
                                              r"within 1.5 s \(--collect-timeout\)"):
            search.runner.collect(shas[0], "GOOD")
        probe = search.probe(shas[1])  # BAD collects, but its A/B run hangs
        assert probe.outcome == "skip" and probe.note.startswith(
            "the A/B run did not finish within 1.5 s (--probe-timeout"), probe.note
        assert time.monotonic() - started < 30 and not search.children.running
    finally:
        search.worktrees.remove_all()


def test_a_gate_option_is_read_in_either_spelling_the_plugin_takes():
    # --dist-accept-...: the spelling now; --dist-ab-...: the one before, which pytest still reads.
    for prefix in ("--dist-", "--dist-ab-"):
        options = Options(pytest_args=[f"{prefix}accept-structure-change", f"{prefix}accept-memory-change",
                                       f"{prefix}memory-tolerance=5%", f"{prefix}accept-numerics-change",
                                       f"{prefix}numerics-tolerance", "1%"])
        assert options.accept_structure_change and options.accept_memory_change
        assert options.gate_reading() == {"accept_memory_change": True, "memory_tolerance": pytest.approx(0.05),
                                          "accept_numerics_change": True, "numerics_tolerance": pytest.approx(0.01)}
