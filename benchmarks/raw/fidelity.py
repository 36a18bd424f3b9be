"""Fidelity check: ddpbench's all_reduce median vs the standalone script's, in one run.

Alternates the standalone script and the suite's all_reduce cases (same sizes, same rounds rule),
``--repeats`` times each (which side goes first alternates too), and prints per size the median
of each side's per-run medians, their ratio, and each repeat's ratio.

    .venv/bin/python benchmarks/raw/fidelity.py --repeats 7
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run_standalone(sizes, world_size):
    out = subprocess.run([sys.executable, os.path.join(HERE, "standalone_allreduce.py"),
                          "--sizes", sizes, "--world-size", str(world_size)],
                         check=True, capture_output=True, text=True)
    return {int(size): r["median_s"] for size, r in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def run_suite(sizes, world_size):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "suite.json")
        subprocess.run([sys.executable, "-m", "pytest", "benchmarks/test_collectives.py", "-q",
                        "-k", "test_all_reduce and gloo", f"--dist-sizes={sizes}",
                        f"--dist-world-sizes={world_size}", f"--benchmark-json={path}"],
                       check=True, cwd=ROOT, capture_output=True, text=True)
        with open(path) as fh:
            data = json.load(fh)
    return {case["extra_info"]["size_bytes"]: case["stats"]["median"] for case in data["benchmarks"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1MB,10MB,100MB")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    standalone, suite = {}, {}
    sides = [(run_standalone, standalone), (run_suite, suite)]
    for i in range(args.repeats):
        # Alternate which side goes first, so drift in the machine's state hits both alike.
        for runner, results in (sides if i % 2 == 0 else sides[::-1]):
            for size, median in runner(args.sizes, args.world_size).items():
                results.setdefault(size, []).append(median)
        print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr)
    print("| size | standalone median (ms) | ddpbench median (ms) | ratio of the medians | median of per-repeat ratios | per-repeat ratios |")
    print("|---|---|---|---|---|---|")
    for size in sorted(standalone):
        ratios = [b / a for a, b in zip(standalone[size], suite[size])]
        print(f"| {size // 1024**2} MB | {statistics.median(standalone[size]) * 1e3:.3f} "
              f"(min {min(standalone[size]) * 1e3:.3f}, max {max(standalone[size]) * 1e3:.3f}) | "
              f"{statistics.median(suite[size]) * 1e3:.3f} "
              f"(min {min(suite[size]) * 1e3:.3f}, max {max(suite[size]) * 1e3:.3f}) | "
              f"{statistics.median(suite[size]) / statistics.median(standalone[size]):.3f} | "
              f"{statistics.median(ratios):.3f} | {', '.join(f'{r:.3f}' for r in ratios)} |")


if __name__ == "__main__":
    main()
