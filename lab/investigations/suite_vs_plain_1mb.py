"""What moves ddpbench's 1 MB all_reduce off a plain script's? The plain loop with each of the suite's additions.

The plain reference loop (mp.spawn, FileStore, one torch thread per rank, barrier -> perf_counter ->
all_reduce -> perf_counter, max over ranks, 1 s of rounds) and the suite, in a rotated
order, ``--repeats`` times:

* ``plain``: nothing else runs (the parent blocks in join, the ranks have no other thread);
* ``rank-thread``: every rank also runs a thread that wakes every 0.5 s (as a parent-death watch
  that polls ``os.getppid()``);
* ``parent-poll``: the parent waits for its ranks in 0.25 s slices (as a controller that wakes
  to notice Ctrl-C);
* ``loopback``: GLOO_SOCKET_IFNAME=lo, as ddpbench's single-node pools set;
* ``suite``: ``pytest benchmarks/test_collectives.py -k test_all_reduce`` at that size with
  ``--dist-precision=0`` (its rounds fill 1 s, as the plain loop's do), for comparison.

After every round each rank reads the CPU its main thread is on (outside the timed part), so each run
also gives the share of rounds in which both ranks' main threads shared a CPU (on the 2-core VM the
~1.3 ms mode) and the median of the rounds apart (the ~3.7 ms mode).

    .venv/bin/python lab/investigations/suite_vs_plain_1mb.py --repeats 8
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from placement_1mb import timed_rounds, write_from_rank0  # the same timed loop, from its folder

VARIANTS = ("plain", "rank-thread", "parent-poll", "loopback", "suite")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _wake_every(seconds: float) -> None:
    def loop():
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(seconds)

    threading.Thread(target=loop, daemon=True).start()


def worker(rank, world_size, store_path, variant, size, min_time, out_path):
    if variant == "rank-thread":
        _wake_every(0.5)
    if variant == "loopback":
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank,
                            world_size=world_size)
    tensor = torch.ones(size // 4)
    # Warm-up; the last round estimates a round, as the plain reference script does.
    warmup, _ = timed_rounds(tensor, 2)
    estimate = torch.tensor([warmup[-1]], dtype=torch.float64)
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX)  # every rank runs the same number of rounds
    rounds = max(5, min(1000, int(min_time / max(estimate.item(), 1e-9)) + 1))
    write_from_rank0(rank, world_size, timed_rounds(tensor, rounds), out_path)
    dist.destroy_process_group()


def run_suite(size, min_time):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "suite.json")
        subprocess.run([sys.executable, "-m", "pytest", "benchmarks/test_collectives.py", "-q", "-p", "no:cacheprovider",
                        "-k", "test_all_reduce and gloo", f"--dist-sizes={size}", "--dist-world-sizes=2",
                        "--dist-precision=0", f"--dist-max-time={min_time}", f"--benchmark-json={path}"],
                       check=True, cwd=ROOT, capture_output=True, text=True)
        with open(path) as fh:
            (case,) = json.load(fh)["benchmarks"]
    info = case["extra_info"]
    return {"median_s": case["stats"]["median"], "shared_share": info["ranks_shared_cpu_share"],
            "median_apart_s": info.get("median_s_ranks_apart"), "rounds": case["stats"]["rounds"]}


def run(variant, size, min_time):
    if variant == "suite":
        return run_suite(size, min_time)
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "out.json")
        context = mp.start_processes(worker, args=(2, os.path.join(tmp, "store"), variant, size, min_time, out_path),
                                     nprocs=2, join=False, start_method="spawn")
        poll = 0.25 if variant == "parent-poll" else None
        while not context.join(timeout=poll):
            pass
        with open(out_path) as fh:
            (times0, cpus0), (times1, cpus1) = json.load(fh)
    rounds = [max(a, b) for a, b in zip(times0, times1)]
    together = [t for t, c0, c1 in zip(rounds, cpus0, cpus1) if c0 == c1]
    apart = [t for t, c0, c1 in zip(rounds, cpus0, cpus1) if c0 != c1]
    return {"median_s": statistics.median(rounds), "shared_share": len(together) / len(rounds),
            "median_apart_s": statistics.median(apart) if apart else None, "rounds": len(rounds)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--size-mb", type=float, default=1.0)
    parser.add_argument("--min-time", type=float, default=1.0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    size = int(args.size_mb * 1024**2)
    results = {v: [] for v in variants}
    for i in range(args.repeats):
        for variant in variants[i % len(variants):] + variants[:i % len(variants)]:
            results[variant].append(run(variant, size, args.min_time))
        print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    print(f"{args.repeats} repeats, {args.size_mb:g} MB all_reduce, 2 ranks, gloo; per variant the median of "
          f"the per-run values (min-max)\n")
    print("| variant | median ms | rounds with ranks on one CPU | median of the rounds apart, ms | per-run medians ms |")
    print("|---|---|---|---|---|")
    for variant in variants:
        medians = [r["median_s"] * 1e3 for r in results[variant]]
        shares = [r["shared_share"] for r in results[variant]]
        apart = [r["median_apart_s"] * 1e3 for r in results[variant] if r["median_apart_s"]]
        apart_cell = f"{statistics.median(apart):.2f} ({min(apart):.2f}-{max(apart):.2f})" if apart else "-"
        print(f"| {variant} | {statistics.median(medians):.2f} ({min(medians):.2f}-{max(medians):.2f}) | "
              f"{statistics.median(shares):.0%} ({min(shares):.0%}-{max(shares):.0%}) | {apart_cell} | "
              f"{', '.join(f'{m:.2f}' for m in medians)} |")


if __name__ == "__main__":
    main()
