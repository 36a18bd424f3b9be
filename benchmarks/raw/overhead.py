"""Per-case overhead: a case's wall time (setup + call + teardown) minus its recorded round time.

Runs the collective benchmarks once with --junitxml and --benchmark-json and prints, per case,
wall time, recorded time and overhead, and splits the overhead with the engine's phase timings
(extra_info engine_*_s, max over ranks): the workload's set-up, warm-up rounds, the barriers
between recorded rounds, the result check, and what is left — the harness itself (task IPC,
pytest-benchmark, fixtures). The first case of each pool (which pays the pool start) is listed
but left out of the medians.

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
            cases = {c["name"]: c for c in json.load(fh)["benchmarks"]}
    phases = ("engine_setup_s", "engine_warmup_s", "engine_between_rounds_s", "engine_check_s")
    overheads, harness, seen_pools = [], [], set()
    print("| case | wall (s) | recorded (s) | overhead (s) | set-up | warm-up | barriers | check | harness |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, case in cases.items():
        recorded = sum(case["stats"]["data"])
        pool_key = "-".join(name.split("[", 1)[1].split("-")[:2])  # e.g. "gloo-2p"
        first = pool_key not in seen_pools
        seen_pools.add(pool_key)
        over = wall[name] - recorded
        parts = [case["extra_info"].get(key, 0.0) for key in phases]
        rest = over - sum(parts)
        if not first:
            overheads.append(over)
            harness.append(rest)
        print(f"| {name}{' (pool start)' if first else ''} | {wall[name]:.3f} | {recorded:.3f} | "
              f"{over:.3f} | " + " | ".join(f"{p:.3f}" for p in parts) + f" | {rest:.3f} |")
    for label, values in (("overhead", overheads), ("harness share of it", harness)):
        if values:
            q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
            print(f"\n{label} once the pool is up: median {statistics.median(values):.3f} s, "
                  f"IQR {q[0]:.3f}-{q[2]:.3f} s, min {min(values):.3f}, max {max(values):.3f} "
                  f"over {len(values)} cases")


if __name__ == "__main__":
    main(sys.argv[1:])
