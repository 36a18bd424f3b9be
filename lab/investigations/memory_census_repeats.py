"""Issue 60 item 4: does a hand-written gradient all-reduce's memory census read the same on identical
runs? A user's test file (two ``Linear(64, 64)``, SGD, every gradient all-reduced and divided by the
world size; ``zero_grad()`` before the step, or ``zero_grad(set_to_none=True)`` after it), run as a
user runs it, N times on 2 gloo ranks; every run's ``extra_info["memory"]`` (every rank's record) is
compared as JSON and the records that differ from the most common one are shown.

    .venv/bin/python lab/investigations/memory_census_repeats.py --runs 30 --load
    PYTHONPATH=/tmp/main/src .venv/bin/python lab/investigations/memory_census_repeats.py --runs 30 --load
                                   # another ddpbench (e.g. `git archive a8e681c src | tar -x -C /tmp/main`)

``--load`` keeps two busy processes running throughout: the census depended on when gloo's worker
thread ran (docs/design/census-and-memory.md#a-collectives-tensors), which load makes later.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import textwrap

USER_FILE = textwrap.dedent('''
    import torch
    import torch.distributed as dist

    import ddpbench


    def setup(ctx):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
        return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(32, 64)


    def step_zero_first(state):
        model, optimizer, batch = state
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()


    def step_zero_last(state):
        model, optimizer, batch = state
        model(batch).square().mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


    def test_zero_first(dist_benchmark):
        dist_benchmark(ddpbench.FunctionWorkload(setup, step_zero_first))


    def test_zero_last(dist_benchmark):
        dist_benchmark(ddpbench.FunctionWorkload(setup, step_zero_last))
''')
ARGS = ["--dist-rounds=3", "--dist-warmup=2", "--dist-numerics-steps=0", "-m", "not gpu", "-q", "-p", "no:cacheprovider"]


def run_once(folder: str) -> dict:
    """One pytest run of the user's file; its cases' memory records."""
    out = os.path.join(folder, "run.json")
    if os.path.exists(out):
        os.remove(out)
    done = subprocess.run([sys.executable, "-m", "pytest", "test_dp.py", *ARGS, f"--benchmark-json={out}"],
                          cwd=folder, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the run failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    with open(out) as f:
        return {case["name"]: case["extra_info"]["memory"] for case in json.load(f)["benchmarks"]}


def differences(common: dict, record: dict) -> list[str]:
    """Per case, the fields where ``record`` differs from ``common``."""
    lines = []
    for case, memory in sorted(record.items()):
        base = common.get(case, {})
        for key in sorted(set(base) | set(memory)):
            if base.get(key) != memory.get(key):
                lines.append(f"{case} {key}: {json.dumps(base.get(key))} -> {json.dumps(memory.get(key))}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--load", action="store_true", help="two busy processes throughout")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="census_repeats_")
    with open(os.path.join(folder, "test_dp.py"), "w") as f:
        f.write(USER_FILE)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if args.load else 0)]
    try:
        records = []
        for i in range(args.runs):
            records.append(json.dumps(run_once(folder), sort_keys=True))
            print(f"run {i + 1} of {args.runs}", file=sys.stderr)
    finally:
        for process in load:
            process.kill()
    counts = collections.Counter(records)
    common = json.loads(counts.most_common(1)[0][0])
    print(f"{args.runs} runs, {len(counts)} distinct record(s); the most common in {counts.most_common(1)[0][1]}")
    for case, memory in sorted(common.items()):
        print(f"  {case}: peaks {memory.get('peak_bytes_per_rank')}, kept after the step {memory['after_step_bytes']} B")
    for i, record in enumerate(records):
        for line in differences(common, json.loads(record)):
            print(f"  run {i + 1}: {line}")


if __name__ == "__main__":
    main()
