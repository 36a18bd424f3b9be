"""Does the A/B gate flag a planted change, and does it stay quiet without one? (docs/results.md)

Makes two detached git worktrees of this repository's HEAD in a temporary folder, ``base`` and
``head``; in ``head`` it replaces one exact text in one file (the planted change; none for A/A),
then runs the A/B gate from ``head`` as ab.yml does (``--dist-baseline-path=../base/src``, each side
importing its own ``src/``) on the selected cases, ``--runs`` times, and prints each run's verdict
table (``ddpbench compare ab.json``), exit status and wall time, then the verdict counts.

    # DDP's buckets: bucket_cap_mb 25 -> 1 in the default cpu-small DDP case, and an A/A
    .venv/bin/python lab/reference/ab_planted_change.py --runs 3 \\
        --file src/ddpbench/workloads/training/transformer_settings.py \\
        --old "bucket_cap_mb=self.bucket_cap_mb" --new "bucket_cap_mb=1" \\
        -- benchmarks/test_transformer.py -k "cpu-small-ddp]"
    .venv/bin/python lab/reference/ab_planted_change.py --runs 3 -- benchmarks/test_transformer.py -k "cpu-small-ddp]"

Everything after ``--`` goes to pytest. Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def worktree(path: Path) -> None:
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), "HEAD"], cwd=ROOT, check=True)


def plant(head: Path, file: str, old: str, new: str) -> None:
    target = head / file
    text = target.read_text()
    if text.count(old) != 1:
        sys.exit(f"--old must occur exactly once in {file}; it occurs {text.count(old)} times")
    target.write_text(text.replace(old, new))


def ab_run(head: Path, pytest_args: list[str], index: int) -> tuple[int, float, list[dict], str]:
    result = head / f"ab-{index}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = str(head / "src")  # the candidate imports head's code, as in ab.yml
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args,
                          "--dist-baseline-path=../base/src", f"--benchmark-json={result}"],
                         cwd=head, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    try:
        cases = [dict(name=b["name"], **b["extra_info"]["ab"]) for b in json.loads(result.read_text())["benchmarks"]
                 if isinstance(b.get("extra_info", {}).get("ab"), dict)]
    except (OSError, ValueError, KeyError):
        cases = []
    table = subprocess.run([sys.executable, "-m", "ddpbench.cli", "compare", str(result)], cwd=head, env=env,
                           capture_output=True, text=True).stdout if cases else run.stdout[-3000:] + run.stderr[-2000:]
    return run.returncode, wall, cases, table


def main() -> None:
    argv = sys.argv[1:]
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--file", help="file (relative to the repository root) the planted change edits")
    parser.add_argument("--old", help="the exact text to replace (must occur once)")
    parser.add_argument("--new", help="its replacement")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if bool(args.file) != bool(args.old) or (args.old and args.new is None):
        parser.error("--file, --old and --new go together (none of them: an A/A run)")
    tmp = Path(tempfile.mkdtemp(prefix="ab-planted-"))
    base, head = tmp / "base", tmp / "head"
    try:
        worktree(base)
        worktree(head)
        if args.file:
            plant(head, args.file, args.old, args.new)
        print(f"{'planted: ' + args.file + ': ' + repr(args.old) + ' -> ' + repr(args.new) if args.file else 'A/A'}"
              f"; pytest {' '.join(pytest_args)}", flush=True)
        counts, walls = collections.Counter(), []
        for index in range(1, args.runs + 1):
            status, wall, cases, table = ab_run(head, pytest_args, index)
            walls.append(wall)
            counts.update(c.get("verdict") for c in cases)
            print(f"\n--- run {index}: exit {status}, {wall:.0f} s, "
                  + ", ".join(f"{c['name']}: {c.get('verdict')} x{c.get('ratio', float('nan')):.3f}" for c in cases))
            print(table, flush=True)
        print(f"\n{args.runs} runs: verdicts {dict(counts)}; wall median {statistics.median(walls):.0f} s "
              f"(min {min(walls):.0f}, max {max(walls):.0f})")
    finally:
        for tree in (base, head):
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
