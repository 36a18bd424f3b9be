"""How reliable is the stored-baseline gate (``ddpbench compare``, ``make compare``, the table under
``--benchmark-compare``)? False regressions of unchanged reruns and power at an injected slowdown,
against one saved run, read as the gate reads them today and as it read them before, lever by lever.

    .venv/bin/python lab/reference/gate_reliability.py --reruns 30 --trials 10              # quiet
    .venv/bin/python lab/reference/gate_reliability.py --reruns 10 --trials 5 --load        # under load
    .venv/bin/python lab/reference/gate_reliability.py --reruns 30 --trials 10 --estimate   # wall only
    .venv/bin/python lab/reference/gate_reliability.py --phase compare --out DIR            # re-read DIR

1. collect: one baseline run of the selected cases (``--cases``: ``all``, the 12 default CPU
   collectives and three training steps (DDP on the MLP and the CNN, the small transformer);
   ``collectives``; ``training``; or ``--select EXPR``, a -k expression over all of them), then
   ``--reruns`` unchanged reruns and ``--trials`` runs with ``--inject`` (DDPBENCH_INJECT_SLOWDOWN,
   20% on every collective and training step by default; ``-p ddpbench.testing`` on every run, so all
   runs time the same wrapped workloads), alternating so that a changing load hits both kinds alike;
   each saved with its raw rounds under ``--out``/.benchmarks and timed (``walls.json``).
   ``--load``: a second process busy on one core for the whole collection (``--load onoff``: busy 3 s,
   idle 3 s). ``--pools N`` passes ``--dist-case-pools N`` (default: the plugin's, 2). A run already
   saved under ``--out`` is kept: an interrupted collection resumes.
2. compare: each rerun and trial against the baseline, with the history ``ddpbench compare`` would
   read (the runs saved before it) less the injected trials (a storage of unchanged code), read:
   ``before`` (the rounds' own interval, Mann-Whitney p < 0.05: the gate before the run-to-run
   component), ``floor`` (the stated 5% only), ``pools`` (the runs' pool spread, no history),
   ``history`` (no pools), ``after`` (both: what ``ddpbench compare`` does), ``after, no probe``
   (without the calibration probe's correction). Per case: false regressions (count / reruns), power
   (injected trials read ``regression``, count / trials, for the >= 10 MB collectives and the training
   steps) and the smallest slowdown each rerun's comparison could flag (median); then the totals and
   the wall time of one run of the selection.

Wall estimate (``--estimate`` prints it): (1 + reruns + trials) runs of the selection; ``all``
takes ~80 s a run on the quiet 2-core machine with 2 pools (~35 s collectives, ~45 s training;
~2.5-5 min a run when it is heavily loaded); the compare phase ~2 s per comparison and reading.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

CASE_SETS = {
    # the 12 default CPU collective cases
    "collectives": (["benchmarks/test_collectives.py"], "not gpu and not slow", None),
    # training steps: DDP on an MLP and a CNN, and the small transformer under DDP
    "training": (["benchmarks/test_training.py", "benchmarks/test_transformer.py"], "not gpu and not slow",
                 "gloo-2p-mlp-ddp-accum1-b32 or gloo-2p-cnn-ddp-accum1-b32 or gloo-2p-cpu-small-ddp]"),
}
CASE_SETS["all"] = (CASE_SETS["collectives"][0] + CASE_SETS["training"][0], "not gpu and not slow",
                    "test_all_reduce or test_all_gather or test_reduce_scatter or test_broadcast or "
                    + CASE_SETS["training"][2])
DEFAULT_INJECT = "all_reduce:20%,all_gather:20%,reduce_scatter:20%,broadcast:20%,training:20%"

# The load ends with its parent, however the parent ends.
LOAD_SCRIPTS = {
    "busy": "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    sum(range(100000))\n",
    "onoff": ("import os, time\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
              "    end = time.perf_counter() + 3.0\n    while time.perf_counter() < end:\n        pass\n"
              "    time.sleep(3.0)\n"),
}


# Seconds a run of each selection takes on the quiet 2-core machine with 2 pools (--estimate's
# figure; a collection's own walls.json replaces it).
QUIET_RUN_S = {"collectives": 35.0, "training": 45.0, "all": 80.0}


def pytest_command(args, label: str) -> list[str]:
    files, marks, keyword = CASE_SETS["all" if args.select else args.cases]
    cmd = [args.python, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-p", "ddpbench.testing",
           "-m", marks, "--benchmark-autosave", "--benchmark-save-data",
           f"--benchmark-storage=file://{args.out}/.benchmarks", f"--benchmark-save={label}"]
    if args.select or keyword:
        cmd += ["-k", args.select or keyword]
    if args.pools:
        cmd.append(f"--dist-case-pools={args.pools}")
    return cmd + list(args.pytest_args)


def estimate(args) -> str:
    walls = Path(args.out) / "walls.json"
    known = list(json.loads(walls.read_text()).values()) if walls.exists() else []
    per_run = statistics.median(known) if known else QUIET_RUN_S.get(args.cases, QUIET_RUN_S["all"])
    runs = 1 + args.reruns + args.trials
    where = f"the median of {len(known)} runs in {walls}" if known else "the quiet 2-core machine's figure"
    return (f"estimate: {runs} runs x {per_run:.0f} s ({where}) = {runs * per_run / 60:.0f} min to collect, "
            f"then ~{2 * len(READINGS) * (runs - 1) / 60:.0f} min to compare")


def saved(out: Path, label: str) -> Path | None:
    found = sorted(out.glob(f".benchmarks/*/*_{label}.json"))
    return found[-1] if found else None


def collect(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    walls_path = out / "walls.json"
    walls = json.loads(walls_path.read_text()) if walls_path.exists() else {}
    load = None
    if args.load:
        load = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPTS[args.load]])
    try:
        labels = ["baseline"]
        for i in range(1, max(args.reruns, args.trials) + 1):
            if i <= args.reruns:
                labels.append(f"rerun{i:02d}")
            if i <= args.trials:
                labels.append(f"inject{i:02d}")
        for label in labels:
            if saved(out, label) is not None:
                continue
            env = dict(os.environ)
            if label.startswith("inject"):
                env["DDPBENCH_INJECT_SLOWDOWN"] = args.inject
            else:
                env.pop("DDPBENCH_INJECT_SLOWDOWN", None)
            started = time.perf_counter()
            with open(out / f"{label}.log", "w") as log:
                rc = subprocess.call(pytest_command(args, label), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            walls[label] = time.perf_counter() - started
            walls_path.write_text(json.dumps(walls, indent=1))
            print(f"{label}: exit {rc}, {walls[label]:.0f} s", flush=True)
    finally:
        if load is not None:
            load.kill()


# ----------------------------------------------------------------------------------------------
# compare: each rerun and trial against the baseline, read several ways
# ----------------------------------------------------------------------------------------------

# How a comparison is read: today's gate (the rounds' own interval), then the run-to-run component
# from one source at a time, then all of them (what ddpbench compare does), and that without the
# calibration probe's correction.
READINGS = {
    "before": dict(run_to_run="off"),
    "floor": dict(history=False, pools=False),
    "pools": dict(history=False),
    "history": dict(pools=False),
    "after": dict(),
    "after, no probe": dict(calibration="never"),
}


def injected_case(name: str, inject: str) -> bool:
    """Whether a case's op is slowed by ``inject`` and it is one the power goal covers (the
    collectives at 10 MB and above, the training steps)."""
    ops = {item.split(":")[0] for item in inject.split(",") if item}
    if name.startswith(("test_training", "test_transformer")):
        return "training" in ops
    op = name.removeprefix("test_").split("[")[0]
    return op in ops and not name.endswith("-1MB]")


def read_runs(out: Path):
    from ddpbench.storage.runs import load_run

    runs = {}
    for path in sorted(out.glob(".benchmarks/*/*.json")):
        label = path.stem.split("_", 1)[1]
        runs[label] = load_run(path)
    order = sorted(runs, key=lambda label: runs[label].path.name)
    return runs, order


def compare(args) -> None:
    import copy

    from ddpbench.gates import stored_run_gate as gate

    out = Path(args.out)
    runs, order = read_runs(out)
    if "baseline" not in runs:
        sys.exit(f"no baseline run in {out}")
    base = runs["baseline"]
    plain = [label for label in order if label != "baseline" and not label.startswith("inject")]
    trials = [label for label in order if label.startswith("inject")]

    def without_pools(run):
        run = copy.copy(run)
        run.cases = {name: copy.copy(case) for name, case in run.cases.items()}
        for case in run.cases.values():
            case.pool_split = None
        return run

    def read(label, how):
        cur = runs[label]
        before = [runs[other] for other in order[:order.index(label)] if not other.startswith("inject")]
        b, history = base, before
        if not how.get("pools", True):
            b, cur, history = without_pools(b), without_pools(cur), [without_pools(r) for r in history]
            history = [b if r.path == b.path else r for r in history]
        if not how.get("history", True):
            history = [b]
        result = gate.compare_runs(b, cur, history=history, run_to_run=how.get("run_to_run", "auto"),
                                   calibration=how.get("calibration", "auto"))
        return {case.name: case for case in result.cases}

    names = [case.name for case in base.cases.values()]
    table = {reading: {name: {"false": 0, "hit": 0, "detectable": []} for name in names} for reading in READINGS}
    components: dict[str, list[str]] = {}  # unchanged reruns failed by the structure, memory or numerics
    for reading, how in READINGS.items():
        for label in plain:
            for name, case in read(label, how).items():
                row = table[reading].get(name)
                if row is None:
                    continue
                timing = case.timing_verdict or case.verdict  # the timing's own word: components apart
                row["false"] += timing == "regression"
                if case.failed_by:
                    components.setdefault(reading, []).append(f"{label} {name}: {', '.join(case.failed_by)}")
                if case.ratio is not None and case.ci_low:
                    detectable = case.details.get("detectable_slowdown")
                    if detectable is None and case.ci_low > 0:
                        detectable = max(0.10, case.ratio / case.ci_low - 1)
                    row["detectable"].append(detectable)
        for label in trials:
            for name, case in read(label, how).items():
                if name in table[reading] and (case.timing_verdict or case.verdict) == "regression":
                    table[reading][name]["hit"] += 1
    walls = json.loads((out / "walls.json").read_text()) if (out / "walls.json").exists() else {}
    print_table(args, table, names, len(plain), len(trials), walls, plain)
    for line in components.get("after", []):
        print(f"unchanged rerun failed by an exact verdict, not the timing: {line}")


def print_table(args, table, names, reruns, trials, walls, plain) -> None:
    readings = list(READINGS)
    print(f"stored-baseline gate, {reruns} unchanged reruns and {trials} injected trials ({args.inject}) "
          f"against one saved run; --out {args.out}{'; under load (' + args.load + ')' if args.load else ''}")
    print("false regressions of the timing (count / reruns) | power: injected trials' timing reads regression "
          "(count / trials) | smallest slowdown flagged, median over reruns")
    head = f"{'case':42}" + "".join(f" | {r[:15]:>15}" for r in readings)
    print(head)
    print("-" * len(head))
    totals = {r: [0, 0, 0, 0] for r in readings}  # false, comparisons, hits, injected comparisons
    for name in names:
        injected = injected_case(name, args.inject)
        cells = []
        for r in readings:
            row = table[r][name]
            detect = statistics.median(row["detectable"]) if row["detectable"] else float("nan")
            power = f"{row['hit']}/{trials}" if injected else "-"
            shown = ">999%" if detect > 9.99 else f"{detect * 100:.0f}%"
            cells.append(f"{row['false']}/{reruns} {power} {shown}")
            totals[r][0] += row["false"]
            totals[r][1] += reruns
            if injected:
                totals[r][2] += row["hit"]
                totals[r][3] += trials
        print(f"{name[:42]:42}" + "".join(f" | {c:>15}" for c in cells))
    print("-" * len(head))
    for r in readings:
        false, comparisons, hits, injected = totals[r]
        print(f"{r:16} false regressions {false}/{comparisons} case comparisons "
              f"({100 * false / max(comparisons, 1):.1f}%); power at the injected slowdown {hits}/{injected} "
              f"({100 * hits / max(injected, 1):.0f}%)")
    rerun_walls = [walls[label] for label in plain if label in walls]
    if rerun_walls:
        print(f"wall per run of the selection: median {statistics.median(rerun_walls):.0f} s "
              f"(min-max {min(rerun_walls):.0f}-{max(rerun_walls):.0f}, {len(rerun_walls)} reruns)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reruns", type=int, default=30)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--cases", choices=sorted(CASE_SETS), default="all")
    parser.add_argument("--select", default=None, metavar="EXPR", help="a -k expression over all the cases instead")
    parser.add_argument("--pools", type=int, default=None, help="--dist-case-pools for every run")
    parser.add_argument("--estimate", action="store_true", help="print the wall estimate and stop")
    parser.add_argument("--inject", default=DEFAULT_INJECT)
    parser.add_argument("--load", nargs="?", const="busy", choices=sorted(LOAD_SCRIPTS), default=None,
                        help="a second process busy on one core while collecting (onoff: 3 s busy, 3 s idle)")
    parser.add_argument("--phase", choices=("all", "collect", "compare"), default="all")
    parser.add_argument("--out", default="/tmp/ddpbench-gate-reliability")
    parser.add_argument("--python", default=str(ROOT / ".venv/bin/python"))
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    args.out = str(Path(args.out).resolve())
    print(estimate(args), flush=True)
    if args.estimate:
        return 0
    if args.phase in ("all", "collect"):
        collect(args)
    if args.phase in ("all", "compare"):
        compare(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
