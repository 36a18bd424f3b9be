"""How reliable is the A/B gate? False regressions (A/A) and power (a slowdown injected on one side).

Runs ``--runs`` pytest A/B runs of the same cases and counts each case's verdicts.

* A/A (default): both sides identical (``--dist-baseline-python`` = this interpreter); every
  ``regression`` verdict is a false alarm.
* ``--inject all_reduce:10%``: the candidate side's ranks get DDPBENCH_INJECT_SLOWDOWN (every timed
  all_reduce round busy-waits 10% of the op's time); every verdict other than ``regression`` on an
  injected case is a miss.
* ``--load``: a background process keeps one core busy ~3 s, then idle ~3 s, for the whole run.

    .venv/bin/python lab/reference/ab_reliability.py --runs 10
    .venv/bin/python lab/reference/ab_reliability.py --runs 10 --load
    .venv/bin/python lab/reference/ab_reliability.py --runs 10 --inject all_reduce:10% --cases all_reduce

Prints, per case, the verdict counts, the ratio (median, min-max) and the wall time per case in
A/B mode (median, IQR); writes each run's JSON to --out (default /tmp/ddpbench-ab-reliability).
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

# The A/B verdicts (ddpbench.gates.stats.VERDICTS); every one but inconclusive decides the case.
VERDICTS = ("regression", "improvement", "same", "not-slower", "inconclusive")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

CASE_SETS = {
    # 10 cases: three collectives at the three default sizes, and one training step (DDP, MLP).
    "default": ("benchmarks/test_collectives.py benchmarks/test_training.py",
                "test_all_reduce or test_all_gather or test_broadcast or "
                "(test_training and gloo-2p-mlp-ddp-accum1-b32)"),
    "all_reduce": ("benchmarks/test_collectives.py", "test_all_reduce"),
    # 7 cases: ab.yml's selection (AB_FILES, AB_SELECT; run it with ab.yml's -m and run budget after --).
    "ab_yml": ("benchmarks/test_collectives.py benchmarks/test_training.py",
               "test_all_reduce or test_all_gather or (test_training and gloo-2p-mlp-ddp-accum1-b32)"),
}

# The load ends with its parent, however the parent ends (a load left behind once ran on through
# every later measurement of a session unnoticed).
LOAD_SCRIPT = """
import os, time
parent = os.getppid()
while os.getppid() == parent:
    end = time.perf_counter() + 3.0
    while time.perf_counter() < end:
        pass
    time.sleep(3.0)
"""


def run_once(index, args, out_dir):
    path = os.path.join(out_dir, f"run{index:02d}.json")
    files, expr = CASE_SETS[args.cases]
    command = [sys.executable, "-m", "pytest", *files.split(), "-q", "-p", "no:cacheprovider", "-k", expr,
               f"--dist-baseline-python={sys.executable}", f"--benchmark-json={path}", *args.pytest_args]
    if args.inject:  # the testing plugin reads it in the candidate's ranks only
        command += ["-p", "ddpbench.testing", f"--dist-candidate-env=DDPBENCH_INJECT_SLOWDOWN={args.inject}"]
    started = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    with open(os.path.join(out_dir, f"run{index:02d}.log"), "w") as fh:
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode not in (0, 1) or not os.path.exists(path):
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"run {index} failed (exit {proc.returncode})")
    with open(path) as fh:
        data = json.load(fh)
    return data, time.monotonic() - started, proc.returncode


def _spread(values, fmt="{:.3f}"):
    if len(values) == 1:
        return fmt.format(values[0])
    q = statistics.quantiles(values, n=4)
    return f"{fmt.format(statistics.median(values))} (IQR {fmt.format(q[0])}-{fmt.format(q[2])})"


def held_back_by(ab) -> set[str]:
    """The rules that kept a case from being a regression or an improvement when it was otherwise
    one at its last look (significant at that look's level — older runs, which kept no per-look
    level, at the case's alpha —, the interval clear of 1, the estimate beyond the threshold):
    "pool pair" when some pool pair's own ratio fell short of what each must show, "block minima"
    when the ratio of the block minima did (stats.decide_paired)."""
    up = 1 + ab["threshold"]
    low, high = ab["ratio_ci"]
    slower, faster = ab["ratio"] > up and low > 1, ab["ratio"] < 1 / up and high < 1
    if ab["verdict"] not in ("inconclusive", "not-slower") or not ab["p_value"] < ab.get("alpha_at_last_look", ab["alpha"]) \
            or not (slower or faster):
        return set()
    beyond = (lambda r: r > up) if slower else (lambda r: r < 1 / up)
    each_up = 1 + ab.get("pool_pair_threshold", ab["threshold"])
    each_beyond = (lambda r: r > each_up) if slower else (lambda r: r < 1 / each_up)
    rules = set()
    each = ab.get("ratio_per_pool_pair") or []
    if len(each) > 1 and not all(each_beyond(r) for r in each):
        rules.add("pool pair")
    minima = ab.get("ratio_of_block_minima")
    if minima is not None and not beyond(minima):
        rules.add("block minima")
    return rules


def _held_count(held: list[set[str]], rule: str) -> int:
    return sum(rule in rules for rules in held)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cases", choices=sorted(CASE_SETS), default="default")
    parser.add_argument("--inject", default=None, help="e.g. all_reduce:10%% (candidate side only)")
    parser.add_argument("--load", action="store_true", help="busy 3 s / idle 3 s on one core meanwhile")
    parser.add_argument("--out", default="/tmp/ddpbench-ab-reliability")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: summarise the run*.json files already in --out (e.g. of an "
                             "interrupted measurement); run walls and exit statuses are then unknown")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below on a kill
    os.makedirs(args.out, exist_ok=True)
    if args.summarize:
        paths = sorted(p for p in os.listdir(args.out) if p.startswith("run") and p.endswith(".json"))
        if not paths:
            raise SystemExit(f"--summarize: no run*.json files in {args.out}")
        args.runs = len(paths)
        runs = ((json.load(open(os.path.join(args.out, p))), float("nan"), None) for p in paths)
    else:
        runs = (run_once(i, args, args.out) for i in range(args.runs))
    load = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT]) if args.load and not args.summarize else None
    verdicts, ratios, walls, exits, run_walls, held = {}, {}, {}, [], [], {}
    try:
        for i, (data, wall, rc) in enumerate(runs):
            exits.append(rc)
            run_walls.append(wall)
            for case in data["benchmarks"]:
                ab = case["extra_info"]["ab"]
                name = case["name"]
                verdicts.setdefault(name, []).append(ab["verdict"])
                ratios.setdefault(name, []).append(ab["ratio"])
                walls.setdefault(name, []).append(ab["wall_s"])
                held.setdefault(name, []).append(held_back_by(ab))
            print(f"run {i + 1}/{args.runs}: exit {rc}, {wall:.0f} s", file=sys.stderr, flush=True)
    finally:
        if load is not None:
            load.kill()
    kind = f"candidate slowed: {args.inject}" if args.inject else "A/A (identical sides)"
    print(f"{args.runs} runs, {kind}{', background load on/off' if args.load else ''}"
          f"{' (summarised from ' + args.out + ')' if args.summarize else ''}; "
          f"extra pytest args: {' '.join(args.pytest_args) or 'none'}\n")
    print("| case | regression | improvement | same | not-slower | inconclusive | of which held back by the "
          "pool-pair rule | by the block-minima rule | ratio median (min-max) | wall per case s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    totals = {v: 0 for v in VERDICTS}
    for name in sorted(verdicts):
        counts = {v: verdicts[name].count(v) for v in totals}
        for v in totals:
            totals[v] += counts[v]
        r = ratios[name]
        print(f"| {name} | {counts['regression']} | {counts['improvement']} | {counts['same']} | "
              f"{counts['not-slower']} | {counts['inconclusive']} | {_held_count(held[name], 'pool pair')} | "
              f"{_held_count(held[name], 'block minima')} | {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f}) | "
              f"{_spread(walls[name], '{:.1f}')} |")
    all_walls = [w for ws in walls.values() for w in ws]
    all_held = [rules for per_case in held.values() for rules in per_case]
    expected = args.runs * len(verdicts)
    print(f"\ntotal over {sum(totals.values())} case verdicts: " + ", ".join(f"{n} {v}" for v, n in totals.items())
          + f" (of the inconclusive, held back by the pool-pair rule: {_held_count(all_held, 'pool pair')}, "
            f"by the block-minima rule: {_held_count(all_held, 'block minima')})"
          + (f"; {expected - sum(totals.values())} case(s) gave no verdict (failed: see the run logs "
             f"in {args.out})" if sum(totals.values()) < expected else ""))
    decided = sum(totals.values()) - totals["inconclusive"]
    print(f"decided: {decided} of {sum(totals.values())} case verdicts "
          f"({100 * decided / max(1, sum(totals.values())):.0f}%)")
    print(f"wall per case: {_spread(all_walls, '{:.1f}')} s, min {min(all_walls):.1f}, max {max(all_walls):.1f}; "
          f"wall per run: {_spread(run_walls, '{:.0f}')} s; exit statuses: {exits}")


if __name__ == "__main__":
    main()
