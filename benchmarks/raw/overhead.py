"""Per-case overhead: a case's wall time (setup + call + teardown) minus its recorded round time.

Runs the collective benchmarks once with --junitxml and --benchmark-json and prints, per case,
wall time, recorded time and overhead; the first case of each pool (which pays the pool start) is
listed but left out of the median.

    .venv/bin/python benchmarks/raw/overhead.py [extra pytest args]
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(extra):
    with tempfile.TemporaryDirectory() as tmp:
        junit, bench = os.path.join(tmp, "junit.xml"), os.path.join(tmp, "bench.json")
        subprocess.run([sys.executable, "-m", "pytest", "benchmarks/test_collectives.py", "-q",
                        "-m", "not gpu and not slow", f"--junitxml={junit}",
                        f"--benchmark-json={bench}", *extra], check=True, cwd=ROOT)
        wall = {case.get("name"): float(case.get("time"))
                for case in ET.parse(junit).getroot().iter("testcase")}
        with open(bench) as fh:
            recorded = {c["name"]: sum(c["stats"]["data"]) for c in json.load(fh)["benchmarks"]}
    overheads, seen_pools = [], set()
    print("| case | wall (s) | recorded (s) | overhead (s) |")
    print("|---|---|---|---|")
    for name, rec in recorded.items():
        pool_key = "-".join(name.split("[", 1)[1].split("-")[:2])  # e.g. "gloo-2p"
        first = pool_key not in seen_pools
        seen_pools.add(pool_key)
        over = wall[name] - rec
        if not first:
            overheads.append(over)
        print(f"| {name}{' (pool start)' if first else ''} | {wall[name]:.3f} | {rec:.3f} | {over:.3f} |")
    if overheads:
        q = statistics.quantiles(overheads, n=4) if len(overheads) > 1 else [overheads[0]] * 3
        print(f"\noverhead once the pool is up: median {statistics.median(overheads):.3f} s, "
              f"IQR {q[0]:.3f}-{q[2]:.3f} s, min {min(overheads):.3f}, max {max(overheads):.3f} "
              f"over {len(overheads)} cases")


if __name__ == "__main__":
    main(sys.argv[1:])
