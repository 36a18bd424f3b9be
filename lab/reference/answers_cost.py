"""What the four exact answers cost a plain run (issue 62, item 1): a case's own seconds (its timed
rounds plus every ``engine_*_s`` phase) with the collective census, the memory census, the
numerics replay and exposed communication on (today's defaults) against the timing alone
(``--dist-census=off --dist-memory-census=off --dist-numerics-steps=0 --dist-exposed-comm=off``).

Each selection runs as its own plain pytest run (``pytest benchmarks/... -k ...``), the two
settings alternated, ``--repeats`` times each; a case's figure is the median over the repeats.
Per case: timed rounds, the set-up / warm-up / between-rounds / check phases, each answer's own
phase, and own seconds on / off; per family: the largest and the median ratio.

    .venv/bin/python lab/reference/answers_cost.py                 # one case per family, 3 runs a setting
    .venv/bin/python lab/reference/answers_cost.py --whole-files   # every default case, a run per file
    .venv/bin/python lab/reference/answers_cost.py --repeats 1 --families collectives --json out.json
    .venv/bin/python lab/reference/answers_cost.py --case 'benchmarks/test_syncbn.py::test_syncbn[gloo-2p-fused-bs32-h128]'

``--whole-files`` runs each family's benchmark file in one pytest run, as ``make bench`` does (a
rank process's first case pays the imports its answers need; the others share them).
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OFF = ["--dist-census=off", "--dist-memory-census=off", "--dist-numerics-steps=0", "--dist-exposed-comm=off"]

# One plain run each: the three cases and one of each other family.
CASES = {
    "collectives": "benchmarks/test_collectives.py::test_all_reduce[gloo-2p-10MB]",
    "syncbn": "benchmarks/test_syncbn.py",
    "datasets": "benchmarks/test_dataset_sharing.py",
    "training": "benchmarks/test_training.py::test_training[gloo-2p-mlp-ddp-accum1-b32]",
    "transformer": "benchmarks/test_transformer.py::test_transformer[gloo-2p-cpu-small-ddp]",
}
FILES = {
    "collectives": "benchmarks/test_collectives.py",
    "syncbn": "benchmarks/test_syncbn.py",
    "datasets": "benchmarks/test_dataset_sharing.py",
    "training": "benchmarks/test_training.py",
    "transformer": "benchmarks/test_transformer.py",
}
ANSWERS = ("engine_census_s", "engine_memory_census_s", "engine_numerics_s", "engine_variants_s")
TIMING = ("engine_setup_s", "engine_warmup_s", "engine_between_rounds_s", "engine_check_s")


def first_case(path: str) -> str:
    """The first default (CPU, not slow) case id of a benchmark file."""
    out = subprocess.run([sys.executable, "-m", "pytest", path, "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", "not gpu and not slow and not multi_gpu"], cwd=ROOT, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if "::" in line and "nccl" not in line and "cuda" not in line:
            return line.strip()
    raise SystemExit(f"no default case in {path}:\n{out.stdout}{out.stderr}")


def run(selection: str, answers: bool, extra: list[str]) -> tuple[dict[str, dict], float]:
    """One plain pytest run of ``selection``: per case its engine keys and recorded seconds; its wall."""
    with tempfile.TemporaryDirectory() as tmp:
        bench = os.path.join(tmp, "bench.json")
        command = [sys.executable, "-m", "pytest", selection, "-q", "-p", "no:cacheprovider",
                   "-m", "not gpu and not slow and not multi_gpu", f"--benchmark-json={bench}",
                   *([] if answers else OFF), *extra]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode not in (0,):
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
        with open(bench) as fh:
            cases = json.load(fh)["benchmarks"]
    out = {}
    for case in cases:
        info = case["extra_info"]
        figures = {key: float(info.get(key) or 0.0) for key in TIMING + ANSWERS}
        figures["rounds_s"] = float(sum(case["stats"]["data"]))
        figures["own_s"] = figures["rounds_s"] + sum(v for k, v in info.items()
                                                     if k.startswith("engine_") and k.endswith("_s")
                                                     and isinstance(v, (int, float)))
        out[case["name"]] = figures
    return out, wall


def median_of(runs: list[dict[str, dict]]) -> dict[str, dict]:
    names = runs[0].keys()
    return {name: {key: statistics.median(r[name][key] for r in runs) for key in runs[0][name]} for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting (median over them)")
    parser.add_argument("--whole-files", action="store_true", help="every default case: one run per benchmark file")
    parser.add_argument("--families", default=",".join(FILES), help="comma list of families")
    parser.add_argument("--case", action="append", default=[],
                        help="a case id (path::test[id]) to run instead of the families' own; repeatable")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    families = [f for f in args.families.split(",") if f]
    selections = ([(case.split("::")[0].rsplit("/", 1)[-1], case) for case in args.case] if args.case else
                  [(family, FILES[family] if args.whole_files else CASES[family]) for family in families])
    dump: dict = {"load_before": os.getloadavg()}
    rows, summary = [], []
    print(f"# load average {os.getloadavg()[0]:.2f} at the start ({os.cpu_count()} CPUs)", flush=True)
    for family, selection in selections:
        if "::" not in selection and not args.whole_files:
            selection = first_case(selection)
        on_runs, off_runs, walls = [], [], {"on": [], "off": []}
        for _ in range(args.repeats):
            for answers in (True, False):
                figures, wall = run(selection, answers, args.pytest_args)
                (on_runs if answers else off_runs).append(figures)
                walls["on" if answers else "off"].append(wall)
        on, off = median_of(on_runs), median_of(off_runs)
        dump[family] = {"selection": selection, "on": on_runs, "off": off_runs, "walls": walls}
        ratios = []
        for name in on:
            if name not in off:
                continue
            ratio = on[name]["own_s"] / off[name]["own_s"] if off[name]["own_s"] else float("nan")
            ratios.append(ratio)
            rows.append((family, name, on[name], off[name], ratio))
        summary.append((family, len(ratios), max(ratios), statistics.median(ratios),
                        statistics.median(walls["on"]), statistics.median(walls["off"])))
        print(f"# {family}: {selection} — {len(ratios)} cases, own-seconds ratio on/off: largest "
              f"{max(ratios):.2f}x, median {statistics.median(ratios):.2f}x; run wall on "
              f"{statistics.median(walls['on']):.1f} s / off {statistics.median(walls['off']):.1f} s", flush=True)
    dump["load_after"] = os.getloadavg()
    print(f"\n# load average {os.getloadavg()[0]:.2f} at the end; median of {args.repeats} run(s) per setting\n")
    print("| family | cases | own-seconds ratio on / off: largest | median | run wall on / off |")
    print("|---|---|---|---|---|")
    for family, n, largest, median, wall_on, wall_off in summary:
        print(f"| {family} | {n} | {largest:.2f}x | {median:.2f}x | {wall_on:.1f} / {wall_off:.1f} s |")
    print()
    print("| family | case | timed rounds | set-up, warm-up, check, barriers | census | memory census | numerics "
          "| exposed comm | own s on / off | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for family, name, on, off, ratio in rows:
        rest = sum(on[k] for k in TIMING)
        print(f"| {family} | {name} | {on['rounds_s']:.2f} | {rest:.2f} | {on['engine_census_s']:.2f} | "
              f"{on['engine_memory_census_s']:.2f} | {on['engine_numerics_s']:.2f} | {on['engine_variants_s']:.2f} | "
              f"{on['own_s']:.2f} / {off['own_s']:.2f} | {ratio:.2f}x |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dump, fh, indent=1)


if __name__ == "__main__":
    main()
