"""ddpbench's NCCL collectives against NVIDIA nccl-tests, alternated in one run.

nccl-tests is the outside reference for GPU collectives (DESIGN.md's fidelity rule). Given the
folder of a built nccl-tests (``all_reduce_perf`` ... in it; build it yourself, it is never part
of this repository), each repeat runs, for each graph mode, the four ``*_perf`` binaries with
``-g 1 -b 1M -e 1G -f 10 -n ITERS -w WARMUP`` (``-G GRAPH_LAUNCHES`` in graph mode) and one pytest
run of ``benchmarks/test_collectives.py`` on NCCL at world size 1 at the same byte sizes, in and
out of place (``--placements``; ``--dist-cuda-graphs`` in graph mode; ops per round ``auto``, the
CUDA default). The order of the two tools is swapped every repeat, and graph mode starts with the
tool eager mode did not, so even one repeat runs each tool first once. It prints per op, placement, graph mode and size the
median (min-max) of each tool's per-run time per op in microseconds and of the per-repeat ratio
ddpbench / nccl-tests.

nccl-tests times ITERS ops between two CUDA events and reports the mean per op; ddpbench times
rounds of k ops back to back (k chosen so the round's fixed cost is <= 1% of it) and reports the
median round's time per op. torch's all_reduce and broadcast work in place only, so their
out-of-place rows are nccl-tests' alone.

    python3 lab/reference/nccl_tests_side_by_side.py --nccl-tests .nccl-tests/build --repeats 3 \\
        --graphs off,on --out side_by_side/
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
PLACEMENTS = ("out-of-place", "in-place")


def parse_nccl_tests(text: str) -> dict:
    """nccl-tests' stdout -> ``{"version": str|None, "rows": {size_bytes: {"out-of-place": us,
    "in-place": us}}, "wrong": int}``.

    A data line starts with the byte size and count, then type, redop and root, then for each
    placement time (us), algbw, busbw and #wrong (plus four per-iteration columns with ``-I``).
    ``#wrong`` is ``N/A`` without data checks; any other non-zero count is summed into ``wrong``."""
    version = None
    rows: dict[int, dict[str, float]] = {}
    wrong = 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# nccl-tests version"):
            version = stripped.split()[3]
            continue
        if not stripped or stripped.startswith("#"):
            continue
        tokens = stripped.split()
        if len(tokens) < 13 or not (tokens[0].isdigit() and tokens[1].isdigit()):
            continue
        measures = tokens[5:]
        half = len(measures) // 2
        if half not in (4, 8) or len(measures) % 2:
            raise ValueError(f"nccl-tests line with {len(measures)} measurement columns, expected 8 "
                             f"or 16: {line!r}")
        placed = {}
        for placement, part in zip(PLACEMENTS, (measures[:half], measures[half:])):
            placed[placement] = float(part[0])
            if part[3] not in ("N/A", "0"):
                wrong += int(float(part[3]))
        rows[int(tokens[0])] = placed
    if not rows:
        raise ValueError("no result lines in nccl-tests output (did the binary fail? its output "
                         "should hold lines starting with the byte size)")
    return {"version": version, "rows": rows, "wrong": wrong}


def nccl_tests_command(build: Path, op: str, graphs: bool, iters: int, warmup: int,
                       graph_launches: int) -> list[str]:
    command = [str(build / f"{op}_perf"), "-g", "1", "-b", "1M", "-e", "1G", "-f", "10",
               "-n", str(iters), "-w", str(warmup)]
    if graphs:
        command += ["-G", str(graph_launches)]
    return command


def run_nccl_tests(build: Path, op: str, graphs: bool, iters: int, warmup: int,
                   graph_launches: int, log: Path | None) -> dict:
    command = nccl_tests_command(build, op, graphs, iters, warmup, graph_launches)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return parse_nccl_tests(done.stdout)


def first_side_swapped(repeat: int, mode_index: int) -> bool:
    """Whether ddpbench runs before nccl-tests in this repeat and graph mode: every other repeat,
    and the second mode starts with the tool the first did not."""
    return bool((repeat + mode_index) % 2)


def ddpbench_sizes(size_bytes: list[int]) -> str:
    """nccl-tests' sizes (powers of 1024 times 10**k) as a --dist-sizes list in whole MB."""
    out = []
    for size in size_bytes:
        if size % (1 << 20):
            raise ValueError(f"{size} bytes is not a whole MB")
        out.append(f"{size >> 20}MB")
    return ",".join(out)


def read_ddpbench_json(data: dict) -> dict:
    """A --benchmark-json file -> ``{(op, placement, size_bytes): median us per op}``."""
    out = {}
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        if "op" not in info:
            continue
        out[(info["op"], info.get("placement", "in-place"), int(info["size_bytes"]))] = \
            bench["stats"]["median"] * 1e6
    return out


def run_ddpbench(sizes: str, graphs: bool, log: Path | None, placements: str = ",".join(PLACEMENTS)) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ddpbench.json"
        command = [sys.executable, "-m", "pytest", "benchmarks/test_collectives.py", "-q",
                   "-p", "no:cacheprovider", "-m", "gpu", "--dist-backend=nccl",
                   "--dist-world-sizes=1", f"--dist-sizes={sizes}",
                   f"--dist-placements={placements}", f"--benchmark-json={path}"]
        if graphs:
            command.append("--dist-cuda-graphs")
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
        if log is not None:
            with log.open("a") as f:
                f.write(f"$ {' '.join(command)}\n{done.stdout[-5000:]}{done.stderr[-3000:]}\n")
        if done.returncode != 0:
            raise RuntimeError(f"ddpbench run exited {done.returncode}:\n{done.stdout[-3000:]}")
        data = json.loads(path.read_text())
    return read_ddpbench_json(data)


def summarize(records: list[dict]) -> list[dict]:
    """Per (graph mode, op, placement, size): each tool's median (min-max) over repeats and the
    median (min-max) of the per-repeat ratios ddpbench / nccl-tests."""
    keys = sorted({(r["graphs"], r["op"], r["placement"], r["size_bytes"]) for r in records})
    rows = []
    for key in keys:
        mine = [r for r in records if (r["graphs"], r["op"], r["placement"], r["size_bytes"]) == key]
        ref = [r["nccl_tests_us"] for r in mine if r["nccl_tests_us"] is not None]
        ours = [r["ddpbench_us"] for r in mine if r["ddpbench_us"] is not None]
        ratios = [r["ddpbench_us"] / r["nccl_tests_us"] for r in mine
                  if r["ddpbench_us"] is not None and r["nccl_tests_us"]]
        rows.append({"graphs": key[0], "op": key[1], "placement": key[2], "size_bytes": key[3],
                     "nccl_tests_us": _spread(ref), "ddpbench_us": _spread(ours),
                     "ratio": _spread(ratios)})
    return rows


def _spread(values: list[float]):
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _cell(spread, digits=2) -> str:
    if spread is None:
        return "—"
    return f"{spread['median']:.{digits}f} ({spread['min']:.{digits}f}–{spread['max']:.{digits}f})"


def table(rows: list[dict]) -> str:
    lines = ["| graphs | op | placement | size | nccl-tests (us) | ddpbench (us) | ddpbench / nccl-tests |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['graphs']} | {row['op']} | {row['placement']} | {row['size_bytes'] >> 20} MB | "
                     f"{_cell(row['nccl_tests_us'])} | {_cell(row['ddpbench_us'])} | {_cell(row['ratio'], 3)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nccl-tests", required=True, type=Path, help="folder holding the built *_perf binaries")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--graphs", default="off,on", help="off, on or off,on")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--graph-launches", type=int, default=10, help="nccl-tests -G in graph mode")
    parser.add_argument("--placements", default=",".join(PLACEMENTS),
                        help="ddpbench's placements (out-of-place, in-place or both; nccl-tests runs both)")
    parser.add_argument("--out", type=Path, help="folder for records.json, summary.md and the raw logs")
    args = parser.parse_args(argv)
    ops = [op for op in args.ops.split(",") if op]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"--ops: unknown {unknown}; choose from {', '.join(OPS)}")
    missing = [op for op in ops if not (args.nccl_tests / f"{op}_perf").is_file()]
    if missing:
        parser.error(f"--nccl-tests {args.nccl_tests}: no {', '.join(f'{op}_perf' for op in missing)} there; "
                     f"build nccl-tests first (make MPI=0 NCCL_HOME=... in its folder)")
    placements = [p for p in args.placements.split(",") if p]
    if not placements or set(placements) - set(PLACEMENTS):
        parser.error(f"--placements: {', '.join(PLACEMENTS)} or both")
    modes = [m for m in args.graphs.split(",") if m]
    if not modes or set(modes) - {"off", "on"}:
        parser.error("--graphs: off, on or off,on")
    log = None
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        log = args.out / "raw.log"
    records = []
    versions = set()
    for repeat in range(args.repeats):
        for mode_index, mode in enumerate(modes):
            graphs = mode == "on"
            reference: dict[str, dict] = {}
            ours: dict = {}

            def reference_side():
                for op in ops:
                    parsed = run_nccl_tests(args.nccl_tests, op, graphs, args.iters, args.warmup,
                                            args.graph_launches, log)
                    if parsed["wrong"]:
                        raise RuntimeError(f"nccl-tests {op}: {parsed['wrong']} wrong elements")
                    versions.add(parsed["version"])
                    reference[op] = parsed["rows"]

            def ddpbench_side():
                sizes = sorted({s for rows in reference.values() for s in rows}) or [1 << 20, 10 << 20, 100 << 20, 1000 << 20]
                ours.update(run_ddpbench(ddpbench_sizes(sizes), graphs, log, ",".join(placements)))

            sides = [reference_side, ddpbench_side]
            if first_side_swapped(repeat, mode_index):
                # nccl-tests' sizes are known before its first run: 1M x 10**k up to 1G
                sides.reverse()
            for side in sides:
                side()
            for op in ops:
                for size, placed in reference[op].items():
                    for placement in PLACEMENTS:
                        records.append({"repeat": repeat, "graphs": mode, "op": op, "placement": placement,
                                        "size_bytes": size, "nccl_tests_us": placed[placement],
                                        "ddpbench_us": ours.get((op, placement, size))})
            print(f"repeat {repeat + 1}/{args.repeats}, graphs {mode}: done", flush=True)
    rows = summarize(records)
    text = (f"nccl-tests {', '.join(sorted(v or '?' for v in versions))}; {args.repeats} repeats; "
            f"nccl-tests -n {args.iters} -w {args.warmup}" + (f" (-G {args.graph_launches} in graph mode)" if "on" in modes else "")
            + "\n\n" + table(rows))
    print(text)
    if args.out:
        (args.out / "records.json").write_text(json.dumps({"records": records, "summary": rows}, indent=1))
        (args.out / "summary.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
