"""Time `ddpbench history` on a large synthetic storage: build_history + writing the page.

Generates RUNS saved runs x CASES cases (ROUNDS raw rounds each, a 1.3x slowdown planted in every
tenth case and a 0.8x speed-up in every tenth case from the sixth, some runs saved without raw
rounds) into a temporary pytest-benchmark storage, then prints the wall seconds of build_history +
write_page (median and min-max over the repeats), the page size in MB and the number of steps found.
With --browser it also times loading the page in headless Chromium until every chart has drawn.
Targets: under 5 s and under 10 MB at 200 runs x 100 cases.

    .venv/bin/python lab/reference/history_scale.py [--runs 200] [--cases 100] [--rounds 50] [--repeats 3] [--browser]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from ddpbench.history import build_history, write_page

MACHINE_DIR = "Linux-CPython-3.11-64bit"
START = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
FAMILY_INFO = (  # (name pattern, extra_info) per family, cycled through the cases
    ("test_all_reduce[gloo-2p-{i}]", {"op": "all_reduce", "size_bytes": 1 << 20}),
    ("test_broadcast[gloo-2p-{i}]", {"op": "broadcast", "size_bytes": 1 << 20}),
    ("test_syncbn[fused-{i}]", {"variant": "fused", "hidden_dim": 256, "batch_size": 32}),
    ("test_dataset_sharing[list-{i}]", {"layout": "list", "num_samples": 2048}),
    ("test_training[ddp-2p-{i}]", {"impl": "ddp", "model": "mlp"}),
)


def chromium_path() -> str | None:
    """Debian's chromium (apt-get install chromium), the browser the page is checked in."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _stats(rounds: np.ndarray, with_data: bool) -> dict:
    q1, median, q3 = (float(v) for v in np.percentile(rounds, [25, 50, 75]))
    stats = {"min": float(rounds.min()), "max": float(rounds.max()), "mean": float(rounds.mean()),
             "stddev": float(rounds.std(ddof=1)), "rounds": len(rounds), "median": median, "iqr": q3 - q1,
             "q1": q1, "q3": q3, "iqr_outliers": 0, "stddev_outliers": 0, "outliers": "0;0",
             "ld15iqr": float(rounds.min()), "hd15iqr": float(rounds.max()), "ops": float(1 / rounds.mean()),
             "total": float(rounds.sum()), "iterations": 1}
    if with_data:
        stats["data"] = [round(float(x), 9) for x in rounds]
    return stats


def planted_factor(case: int, run: int, runs: int) -> float:
    """The planted level of a case at a run: x1.3 from 40% of the runs in cases 0, 10, 20...; x0.8
    from 70% in cases 5, 15, 25..."""
    if case % 10 == 0 and run >= int(runs * 0.4):
        return 1.3
    if case % 10 == 5 and run >= int(runs * 0.7):
        return 0.8
    return 1.0


def make_storage(root: Path, runs: int, cases: int, rounds: int = 50, seed: int = 0,
                 machines: int = 1, ab_every: int = 0) -> Path:
    """A pytest-benchmark storage of synthetic saved runs under ``root``; returns it. ``machines``
    > 1 spreads the runs over that many machine folders; ``ab_every`` > 0 makes every such run an
    A/B run (its cases carry extra_info["ab"], a regression where a slowdown was just planted)."""
    rng = np.random.default_rng(seed)
    base = np.exp(rng.uniform(np.log(0.5e-3), np.log(50e-3), cases))
    for run in range(runs):
        commit = hashlib.sha1(f"commit {run}".encode()).hexdigest()
        when = START + timedelta(hours=8 * run)
        machine = run % machines
        with_data = run % 30 != 20  # one run in 30 saved without --benchmark-save-data
        benchmarks = []
        for case in range(cases):
            pattern, info = FAMILY_INFO[case % len(FAMILY_INFO)]
            level = base[case] * planted_factor(case, run, runs) * (1 + 0.15 * machine)
            level *= np.exp(rng.normal(0, 0.02))  # run-to-run noise
            times = level * np.exp(rng.normal(0, 0.05, rounds))
            times[rng.integers(rounds)] *= 1.8  # one slow round
            extra = {"backend": "gloo", "world_size": 2, "device": "cpu", "nodes": 1, **info}
            if ab_every and run % ab_every == ab_every - 1:
                before = planted_factor(case, run - ab_every, runs)
                ratio = planted_factor(case, run, runs) / before
                verdict = "regression" if ratio > 1.05 else "improvement" if ratio < 0.95 else "same"
                extra["ab"] = {"verdict": verdict, "ratio": ratio}
            name = pattern.format(i=case)
            benchmarks.append({"group": None, "name": name, "fullname": f"benchmarks/test_synthetic.py::{name}",
                               "params": None, "param": None, "extra_info": extra, "options": {},
                               "stats": _stats(times, with_data)})
        doc = {"machine_info": {"node": f"bench-{machine + 1}", "processor": "x86_64", "machine": "x86_64",
                                "system": "Linux", "python_implementation": "CPython",
                                "python_version": "3.11.7", "cpu": {"brand_raw": f"Synthetic CPU {machine + 1}"}},
               "commit_info": {"id": commit, "time": when.isoformat(), "author_time": when.isoformat(),
                               "dirty": False, "project": "ddpbench", "branch": "main"},
               "benchmarks": benchmarks, "datetime": (when + timedelta(hours=1)).isoformat(), "version": "5.3.1"}
        folder = root / f"{MACHINE_DIR}-m{machine + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{run + 1:04d}_{commit}.json").write_text(json.dumps(doc))
    return root


def time_build(storage: Path, page: Path, repeats: int) -> tuple[list[float], object]:
    seconds, history = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        history = build_history(storage)
        write_page(history, page)
        seconds.append(time.perf_counter() - start)
    return seconds, history


def time_browser(page: Path, charts: int, repeats: int) -> list[float]:
    """Seconds from navigation to every chart drawn, in headless Chromium."""
    from playwright.sync_api import sync_playwright

    seconds = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        for _ in range(repeats):
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            start = time.perf_counter()
            tab.goto(page.resolve().as_uri())
            tab.wait_for_function(f"document.querySelectorAll('figure.chart[data-drawn=\"true\"]').length === {charts}",
                                  timeout=60_000)
            seconds.append(time.perf_counter() - start)
            tab.close()
        browser.close()
    return seconds


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f}, {len(values)} repeats)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--browser", action="store_true", help="also time loading the page in headless Chromium")
    args = parser.parse_args(argv)
    if args.browser and not chromium_path():
        parser.error("--browser needs chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        storage = make_storage(Path(tmp) / ".benchmarks", args.runs, args.cases, args.rounds)
        page = Path(tmp) / "history.html"
        seconds, history = time_build(storage, page, args.repeats)
        print(f"{args.runs} runs x {args.cases} cases x {args.rounds} rounds: {len(history.series)} series, "
              f"{len(history.steps)} steps")
        print(f"build_history + write_page: {_spread(seconds)} (target < 5 s)")
        print(f"page size: {page.stat().st_size / 1e6:.2f} MB (target < 10 MB)")
        if args.browser:
            print(f"headless Chromium, load until every chart drew: "
                  f"{_spread(time_browser(page, len(history.series), args.repeats))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
