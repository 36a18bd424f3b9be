"""Time per op with one op per round against another setting (auto, or a fixed count), alternated.

Each repeat runs the suite's all_reduce cases once per setting, each in a fresh pytest process
(order alternating between repeats), and reads the per-op median, the ops per round the setting
used and the fixed cost "auto" measured. Prints, per size, the median of the per-run medians
(min-max) of each setting and the median (min-max) of the per-repeat ratios other / 1.

    .venv/bin/python lab/reference/ops_per_round.py --repeats 7 --sizes 1MB,10MB [--other auto|8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_once(setting: str, sizes: str, out: Path) -> dict[str, dict]:
    """{case name: {median_s, ops_per_round, round_fixed_cost_s}} of one pytest run."""
    command = [sys.executable, "-m", "pytest", "benchmarks/test_collectives.py", "-k", "all_reduce",
               "-m", "not gpu", "-p", "no:cacheprovider", "-q", f"--dist-sizes={sizes}",
               f"--dist-ops-per-round={setting}", f"--benchmark-json={out}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    cases = {}
    for case in json.loads(out.read_text())["benchmarks"]:
        info = case["extra_info"]
        cases[case["name"]] = {"median_s": case["stats"]["median"], "ops_per_round": info.get("ops_per_round"),
                               "round_fixed_cost_s": info.get("round_fixed_cost_s")}
    return cases


def summarize(repeats: list[dict[str, dict[str, dict]]], other: str) -> str:
    names = sorted(repeats[0]["1"], key=lambda n: (len(n), n))
    lines = [f"| case | ops per round 1 (ms) | {other} (ms) | {other} / 1 | ops per round used | fixed cost "
             f"measured (us) |", "|---|---|---|---|---|---|"]

    def cell(values, scale=1e3, fmt="{:.3f}"):
        return f"{fmt.format(statistics.median(values) * scale)} ({fmt.format(min(values) * scale)}–" \
               f"{fmt.format(max(values) * scale)})"

    for name in names:
        one = [r["1"][name]["median_s"] for r in repeats]
        auto = [r[other][name]["median_s"] for r in repeats]
        ratios = [a / o for a, o in zip(auto, one)]
        chosen = sorted({r[other][name]["ops_per_round"] for r in repeats})
        fixed = [r[other][name]["round_fixed_cost_s"] or 0.0 for r in repeats]
        lines.append(f"| {name} | {cell(one)} | {cell(auto)} | {cell(ratios, 1, '{:.3f}')} | "
                     f"{', '.join(map(str, chosen))} | {cell(fixed, 1e6, '{:.1f}')} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default="1MB,10MB")
    parser.add_argument("--other", default="auto", help="the setting compared with 1: auto or a count")
    parser.add_argument("--out", help="folder for each run's JSON (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="ddpbench-ops-per-round-"))
    out.mkdir(parents=True, exist_ok=True)
    repeats = []
    settings = ("1", args.other)
    for i in range(args.repeats):
        order = settings if i % 2 == 0 else settings[::-1]
        repeat = {}
        for setting in order:
            repeat[setting] = run_once(setting, args.sizes, out / f"repeat{i}-{setting}.json")
        repeats.append(repeat)
        print(f"repeat {i + 1}/{args.repeats} done ({' then '.join(order)})", file=sys.stderr, flush=True)
    (out / "summary.json").write_text(json.dumps(repeats, indent=1))
    print(summarize(repeats, args.other))
    print(f"\nruns in {out}; load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
