"""Fidelity check: ddpbench's all_reduce median vs the standalone script's, in one run.

Alternates the standalone script and the suite's all_reduce cases (same sizes, same rounds rule),
``--repeats`` times each, and prints per size the median of each side and their ratio.

    .venv/bin/python benchmarks/raw/fidelity.py --repeats 3
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
    for i in range(args.repeats):
        for size, median in run_standalone(args.sizes, args.world_size).items():
            standalone.setdefault(size, []).append(median)
        for size, median in run_suite(args.sizes, args.world_size).items():
            suite.setdefault(size, []).append(median)
        print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr)
    print("| size | standalone median (ms) | ddpbench median (ms) | ddpbench / standalone | per-repeat ratios |")
    print("|---|---|---|---|---|")
    for size in sorted(standalone):
        ratios = [b / a for a, b in zip(standalone[size], suite[size])]
        print(f"| {size // 1024**2} MB | {statistics.median(standalone[size]) * 1e3:.3f} "
              f"(min {min(standalone[size]) * 1e3:.3f}, max {max(standalone[size]) * 1e3:.3f}) | "
              f"{statistics.median(suite[size]) * 1e3:.3f} "
              f"(min {min(suite[size]) * 1e3:.3f}, max {max(suite[size]) * 1e3:.3f}) | "
              f"{statistics.median(ratios):.3f} | {', '.join(f'{r:.3f}' for r in ratios)} |")


if __name__ == "__main__":
    main()
