"""A user's own workload under the A/B gate: a step that all_reduces 100 MB, whose candidate adds one
4 KB all_reduce (docs/results.md, *Why is it slower?*).

The added op is about 1% of the step's time, below what timing can tell apart on a 2-core machine,
so the timing verdict reads `same` or `inconclusive`; the collective census counts it exactly and
the structural verdict fails the run with a line naming it. Two flat-layout checkouts (``base``,
``head``) are written to a temporary folder; the gate runs from ``head`` as a pull request's job
would (``--dist-baseline-path=../base``), ``--runs`` times, printing each verdict table.

    .venv/bin/python lab/reference/ab_user_workload.py --runs 3

Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP = '''
import torch
import torch.distributed as dist

EXTRA_4KB = {extra}


def setup(ctx):
    return torch.ones(25 * 1024 * 1024), torch.ones(1024)  # 100 MB and 4 KB of float32


def step(state):
    large, small = state
    dist.all_reduce(large)
    if EXTRA_4KB:
        dist.all_reduce(small)  # the pull request's extra op
'''

BENCH = '''
import ddpbench

from mystep import setup, step


def test_step(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, step))
'''


def checkout(root: Path, extra: bool) -> None:
    root.mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_bench.py").write_text(BENCH)
    (root / "mystep.py").write_text(STEP.format(extra=extra))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args, pytest_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="ab-user-") as tmp:
        base, head = Path(tmp) / "base", Path(tmp) / "head"
        checkout(base, extra=False)
        checkout(head, extra=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        walls, verdicts = [], []
        for index in range(1, args.runs + 1):
            result = head / f"ab-{index}.json"
            started = time.monotonic()
            run = subprocess.run([sys.executable, "-m", "pytest", "test_bench.py", "-p", "no:cacheprovider",
                                  "--dist-baseline-path=../base", f"--benchmark-json={result}", *pytest_args],
                                 cwd=head, env=env, capture_output=True, text=True)
            walls.append(time.monotonic() - started)
            table = subprocess.run([sys.executable, "-m", "ddpbench.cli", "compare", str(result)], cwd=head, env=env,
                                   capture_output=True, text=True)
            try:
                (case,) = json.loads(result.read_text())["benchmarks"]
                ab, census = case["extra_info"]["ab"], case["extra_info"].get("census")
                verdicts.append(ab["verdict"])
                census_s = case["extra_info"].get("engine_census_s")
            except (OSError, ValueError, KeyError):
                print(run.stdout[-3000:], run.stderr[-2000:])
                continue
            print(f"--- run {index}: pytest exit {run.returncode}, {walls[-1]:.0f} s; timing verdict {ab['verdict']} "
                  f"x{ab['ratio']:.4f} {ab.get('ratio_ci')}; census round {census_s} s; candidate census "
                  f"{census and census['collectives']}")
            print(table.stdout, flush=True)
        print(f"{args.runs} runs: timing verdicts {verdicts}; wall median {statistics.median(walls):.0f} s "
              f"(min {min(walls):.0f}, max {max(walls):.0f})")


if __name__ == "__main__":
    main()
