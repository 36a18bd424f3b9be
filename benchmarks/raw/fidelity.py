"""Fidelity check: ddpbench's all_reduce median against a plain standalone script, in one run.

Each repeat runs every side once, in a rotated order (so drift in the machine's state hits all
sides alike), and each side reports its per-size median. Sides:

* ``plain``: benchmarks/raw/standalone_allreduce.py as a user would write it (the reference);
* ``plain+loopback``: the same script with GLOO_SOCKET_IFNAME=lo (ddpbench's loopback set-up);
* ``suite``: ``pytest benchmarks/test_collectives.py -k all_reduce`` with default options;
* ``suite-pinned``: the same with ``--dist-pin-cores=auto``;
* ``suite-fill``: the same with ``--dist-precision=0`` (rounds fill --dist-max-time, as the plain
  script's do, instead of stopping once the median is known to 1%).

Prints per size and side the median of the per-run medians with min-max, and the ratio to
``plain`` (median of the per-repeat ratios, with their min-max).

    .venv/bin/python benchmarks/raw/fidelity.py --repeats 7
    .venv/bin/python benchmarks/raw/fidelity.py --repeats 7 --sides plain,suite
    python3 benchmarks/raw/fidelity.py --backend nccl --world-size 1 --sizes 1MB,10MB,100MB,1GB --sides plain,suite
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


BACKEND = "gloo"  # --backend; nccl: the plain script and the suite on CUDA with NCCL


def run_standalone(sizes, world_size, *extra):
    out = subprocess.run([sys.executable, os.path.join(HERE, "standalone_allreduce.py"),
                          "--sizes", sizes, "--world-size", str(world_size), "--backend", BACKEND, *extra],
                         check=True, capture_output=True, text=True)
    return {int(size): r["median_s"] for size, r in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def run_suite(sizes, world_size, *extra):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "suite.json")
        subprocess.run([sys.executable, "-m", "pytest", "benchmarks/test_collectives.py", "-q",
                        "-p", "no:cacheprovider", "-k", f"test_all_reduce and {BACKEND}",
                        f"--dist-backend={BACKEND}", f"--dist-sizes={sizes}", f"--dist-world-sizes={world_size}",
                        f"--benchmark-json={path}", *extra],
                       check=True, cwd=ROOT, capture_output=True, text=True)
        with open(path) as fh:
            data = json.load(fh)
    return {case["extra_info"]["size_bytes"]: case["stats"]["median"] for case in data["benchmarks"]}


SIDES = {
    "plain": lambda s, n: run_standalone(s, n),
    "plain+loopback": lambda s, n: run_standalone(s, n, "--loopback"),
    "suite": lambda s, n: run_suite(s, n),
    "suite-pinned": lambda s, n: run_suite(s, n, "--dist-pin-cores=auto"),
    "suite-fill": lambda s, n: run_suite(s, n, "--dist-precision=0"),
}


def _ms(values):
    return (f"{statistics.median(values) * 1e3:.3f} ({min(values) * 1e3:.3f}-{max(values) * 1e3:.3f})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1MB,10MB,100MB")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sides", default="plain,plain+loopback,suite,suite-pinned",
                        help=f"comma list from {', '.join(SIDES)}; the first is the reference")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="nccl: both sides on CUDA with NCCL and CUDA-event timing (one rank per GPU)")
    args = parser.parse_args(argv)
    global BACKEND
    BACKEND = args.backend
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        parser.error(f"unknown side(s) {unknown}; choose from {', '.join(SIDES)}")
    results = {side: {} for side in sides}
    for i in range(args.repeats):
        order = sides[i % len(sides):] + sides[:i % len(sides)]
        for side in order:
            for size, median in SIDES[side](args.sizes, args.world_size).items():
                results[side].setdefault(size, []).append(median)
        print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    reference = sides[0]
    print(f"{args.repeats} repeats, world size {args.world_size}; cells: median of the per-run "
          f"medians in ms (min-max); ratio: median of the per-repeat ratios to {reference} (min-max)\n")
    print("| size | " + " | ".join(sides) + " | " + " | ".join(f"{s} / {reference}" for s in sides[1:]) + " |")
    print("|---" * (1 + 2 * len(sides) - 1) + "|")
    for size in sorted(results[reference]):
        cells = [_ms(results[side][size]) for side in sides]
        ratios = []
        for side in sides[1:]:
            r = [b / a for a, b in zip(results[reference][size], results[side][size])]
            ratios.append(f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})")
        label = f"{size // 1024**2} MB" if size % 1024**2 == 0 else f"{size} B"
        print(f"| {label} | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    main()
