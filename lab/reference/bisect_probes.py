"""Probes and wall time of ``ddpbench bisect`` finding a planted commit (docs/results.md, *Bisect*).

Builds, in a temporary folder, a flat-layout user project with GOOD and N first-parent commits after
it; commit ``round(N * 0.7)`` adds an all_reduce of 4 MB to a step that sleeps 3 ms and all_reduces
16 KB, the others change a comment or a notes file. Then runs ``ddpbench bisect GOOD main -k test_step``
with the A/B gate's default options (as a user would) and reports, per run: the probes (A/B runs),
the wall time, and whether the first bad commit it named is the planted one.

    .venv/bin/python lab/reference/bisect_probes.py --commits 16 64 --runs 3

Time it on a quiet machine: nothing else running (on 2 cores a helper moves wall times 1.3-3x).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP = '''
import time

import torch
import torch.distributed as dist

EXTRA_ALL_REDUCE = {extra}  # the planted change: an all_reduce of 4 MB more in every step


def setup(ctx):
    return torch.ones(4096), torch.ones(1 << 20)


def step(state):
    small, large = state
    time.sleep(0.003)  # revision {revision}
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


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=lab", "-c", "user.email=lab@example.com",
                           "-c", "commit.gpgsign=false", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def build_history(root: Path, commits: int, planted: int) -> list[str]:
    """GOOD and ``commits`` commits after it; the ``planted``-th adds the all_reduce. Returns the shas."""
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_bench.py").write_text(BENCH)
    (root / "mystep.py").write_text(STEP.format(extra=False, revision=0))
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "GOOD: the step")
    shas = [git(root, "rev-parse", "HEAD")]
    for i in range(1, commits + 1):
        if i % 3 == 0:
            (root / "NOTES.md").write_text(f"note {i}\n")
        else:
            (root / "mystep.py").write_text(STEP.format(extra=i >= planted, revision=i))
        if i == planted:
            (root / "mystep.py").write_text(STEP.format(extra=True, revision=i))
        git(root, "add", ".")
        git(root, "commit", "-q", "-m", "step: all_reduce the large buffer too" if i == planted else f"change {i}")
        shas.append(git(root, "rev-parse", "HEAD"))
    return shas


def one_run(commits: int) -> dict:
    planted = round(commits * 0.7)
    with tempfile.TemporaryDirectory(prefix="bisect-probes-") as tmp:
        repo = Path(tmp) / "project"
        shas = build_history(repo, commits, planted)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "ddpbench.cli", "bisect", shas[0], "main", "-k", "test_step",
                              "--", "-p", "no:cacheprovider"],
                             cwd=repo, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - started
    probes = re.findall(r"^  ([0-9a-f]{12})  (good|bad|inconclusive|skip) ", run.stdout, re.M)
    found = re.search(r"first bad commit: ([0-9a-f]{40})", run.stdout)
    return {"commits": commits, "planted": planted, "exit": run.returncode, "probes": len(probes),
            "wall_s": wall, "found_planted": bool(found) and found.group(1) == shas[planted],
            "tail": run.stdout[-1500:] + run.stderr[-1500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for commits in args.commits:
        results = []
        for index in range(args.runs):
            result = one_run(commits)
            results.append(result)
            print(f"{commits} commits, run {index + 1}: exit {result['exit']}, {result['probes']} probes, "
                  f"{result['wall_s']:.0f} s, found the planted commit: {result['found_planted']}", flush=True)
            if not result["found_planted"]:
                print(result["tail"])
        walls = [r["wall_s"] for r in results]
        probes = [r["probes"] for r in results]
        print(f"{commits} commits: probes {min(probes)}-{max(probes)}, wall median {statistics.median(walls):.0f} s "
              f"(min {min(walls):.0f}, max {max(walls):.0f}), found {sum(r['found_planted'] for r in results)}"
              f"/{len(results)}\n", flush=True)


if __name__ == "__main__":
    main()
