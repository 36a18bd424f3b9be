"""The reported path's grid (benchmarks/test_dataset_sharing.py::test_reported_path), list vs stacked,
measured interleaved: does a list of 602 KB tensors handed to spawned ranks make an epoch slower than
one stacked tensor, in which configurations, and by how much?

Every repeat is one pytest session over every configuration's two cases, passed as node ids in
the order to run them: the two layouts of one configuration run back to back, list first or
stacked first alternating over configurations and repeats, so slow drift and "who runs second" hit
both layouts alike. Each session writes --benchmark-json (with every epoch, --benchmark-save-data).
The table: per configuration, each layout's median epoch over all recorded epochs of all repeats
(with their IQR), and the ratio list / stacked of the two cases' medians within each repeat: its
median and min-max over the repeats.

    .venv/bin/python lab/investigations/dataset_repro.py                    # full grid, 5 repeats (slow)
    .venv/bin/python lab/investigations/dataset_repro.py --repeats 7 --only fork
    .venv/bin/python lab/investigations/dataset_repro.py --quick            # functional check: 256 samples, 2 short repeats
    .venv/bin/python lab/investigations/dataset_repro.py -- --dist-pin-cores=auto   # after --: more pytest options

Run it on a quiet machine; the JSON files stay in --out (default reports/dataset_repro/<time>/).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILE = "benchmarks/test_dataset_sharing.py"
TEST = "test_reported_path"
LAYOUTS = ("list", "stacked")
# test_reported_path[<backend>-<ws>p-<layout>-<rest>]
CASE_ID = re.compile(rf"^{TEST}\[(?P<prefix>[^-]+-\d+p)-(?P<layout>list|stacked)-(?P<config>.+)\]$")


def collect(python: str, backend: str) -> dict[str, dict[str, str]]:
    """{configuration: {layout: node id}} of the reported path's cases on ``backend``."""
    out = subprocess.run([python, "-m", "pytest", FILE, "--collect-only", "-q", "-m", "", "-p", "no:cacheprovider",
                          "-k", TEST], cwd=ROOT, capture_output=True, text=True)
    configs: dict[str, dict[str, str]] = defaultdict(dict)
    for line in out.stdout.splitlines():
        if "::" not in line:
            continue
        match = CASE_ID.match(line.split("::", 1)[1])
        if match and match["prefix"].startswith(backend + "-"):
            configs[f"{match['prefix']}-{match['config']}"][match["layout"]] = line.strip()
    complete = {config: ids for config, ids in configs.items() if set(ids) == set(LAYOUTS)}
    if not complete:
        raise SystemExit(f"dataset_repro.py: no {TEST} cases collected for {backend}:\n{out.stdout}{out.stderr}")
    return dict(sorted(complete.items()))


def epochs_of(doc: dict) -> dict[str, list[float]]:
    """{case name: every recorded epoch (s)} of one --benchmark-json document."""
    return {bench["name"]: list(bench["stats"].get("data") or []) for bench in doc.get("benchmarks", [])}


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summarise(configs, sessions: list[dict[str, list[float]]]) -> list[list[str]]:
    rows = []
    for config, ids in configs.items():
        names = {layout: node.split("::", 1)[1] for layout, node in ids.items()}
        pooled = {layout: [t for s in sessions for t in s.get(names[layout], [])] for layout in LAYOUTS}
        ratios = [statistics.median(s[names["list"]]) / statistics.median(s[names["stacked"]])
                  for s in sessions if s.get(names["list"]) and s.get(names["stacked"])]
        cells = [config]
        for layout in LAYOUTS:
            values = pooled[layout]
            if values:
                q1, q3 = quartiles(values)
                cells.append(f"{statistics.median(values):.3f} ({q3 - q1:.3f})")
            else:
                cells.append("n/a")
        if ratios:
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}), "
                         f"{len(ratios)} repeats")
        else:
            cells.append("n/a")
        rows.append(cells)
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="pytest sessions over the grid (default 5)")
    parser.add_argument("--only", default="", help="keep configurations whose id contains this text, e.g. 'fork'")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON files")
    parser.add_argument("--python", default=sys.executable, help="interpreter with ddpbench installed")
    parser.add_argument("--quick", action="store_true",
                        help="functional check: the default-run configuration only, 2 repeats of 3 epochs")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    configs = collect(args.python, args.backend)
    if args.quick:
        configs = {c: ids for c, ids in configs.items() if "256x" in c}
        args.repeats = 2
        extra = ["--dist-rounds=3", "--dist-warmup=1", *extra]
    if args.only:
        configs = {c: ids for c, ids in configs.items() if args.only in c}
    if not configs:
        parser.error("no configuration left to run (check --only)")
    out = args.out or ROOT / "reports" / "dataset_repro" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)

    sessions: list[dict[str, list[float]]] = []
    failed = []
    started = time.monotonic()
    for repeat in range(args.repeats):
        nodes = []
        for k, ids in enumerate(configs.values()):
            first = LAYOUTS[(repeat + k) % 2]
            nodes += [ids[first], ids[LAYOUTS[1 - LAYOUTS.index(first)]]]
        path = out / f"repeat{repeat + 1}.json"
        command = [args.python, "-m", "pytest", *nodes, "-m", "", "-q", "-p", "no:cacheprovider",
                   f"--benchmark-json={path}", "--benchmark-save-data", *extra]
        print(f"repeat {repeat + 1}/{args.repeats}: {len(nodes)} cases ...", file=sys.stderr, flush=True)
        status = subprocess.run(command, cwd=ROOT).returncode
        if status != 0:
            failed.append(f"repeat {repeat + 1}: pytest exit status {status}")
        if path.exists():
            sessions.append(epochs_of(json.loads(path.read_text())))
    wall = time.monotonic() - started

    print()
    print(f"# Reported path, list vs stacked: {len(configs)} configurations x {args.repeats} interleaved repeats "
          f"({wall / 60:.1f} min)")
    print()
    print("| configuration | list epoch median (IQR), s | stacked epoch median (IQR), s | "
          "ratio list/stacked: median (min-max) over repeats |")
    print("|---|---|---|---|")
    for cells in summarise(configs, sessions):
        print("| " + " | ".join(cells) + " |")
    print()
    print("Medians and IQRs over every recorded epoch of all repeats; each repeat's ratio is the two "
          "cases' median epochs in that session.")
    print(f"Command: {shlex.join([Path(args.python).name, 'lab/investigations/dataset_repro.py', *sys.argv[1:]])}")
    print(f"JSON: {out}/repeat*.json")
    for line in failed:
        print(f"WARNING: {line} (its cases may be missing above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
