"""Where the 1 MB all_reduce modes come from: the same plain gloo loop under different rank placements.

Each placement starts a fresh 2-rank gloo group (mp.spawn, FileStore, one torch thread per rank, as
the plain reference script) and times ``--rounds`` 1 MB all_reduce rounds (barrier -> perf_counter ->
all_reduce -> perf_counter, max over ranks). After every round each rank also reads the CPU its main
thread last ran on (/proc/thread-self/stat, outside the timed part), so rounds of the unpinned
placement can be split by whether the two ranks' main threads shared a CPU.

Placements: ``os`` (nothing set: what a plain script gets), ``split`` (rank r on CPU r, as
--dist-pin-cores=auto), ``shared`` (both ranks on CPU 0). They run in turn, ``--repeats`` times.

    .venv/bin/python lab/investigations/placement_1mb.py --repeats 3
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PLACEMENTS = ("os", "split", "shared")


def current_cpu() -> int:
    """The CPU this thread last ran on (/proc/thread-self/stat, field 39)."""
    with open("/proc/thread-self/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[36])


def timed_rounds(tensor, rounds):
    """``rounds`` rounds of barrier -> perf_counter -> all_reduce -> perf_counter; after each,
    outside the timed part, the CPU this rank's main thread is on. Returns (times, cpus)."""
    times, cpus = [], []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
        cpus.append(current_cpu())
    return times, cpus


def write_from_rank0(rank, world_size, result, out_path):
    """Gather every rank's ``result`` and have rank 0 write the list (rank order) to ``out_path``."""
    gathered = [None] * world_size
    dist.all_gather_object(gathered, result)
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(gathered, fh)


def worker(rank, world_size, store_path, placement, size, rounds, out_path):
    if placement == "split":
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    elif placement == "shared":
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank,
                            world_size=world_size)
    tensor = torch.ones(size // 4)
    timed_rounds(tensor, 5)  # warm-up
    write_from_rank0(rank, world_size, timed_rounds(tensor, rounds), out_path)
    dist.destroy_process_group()


def run(placement, size, rounds, world_size=2):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(worker, nprocs=world_size,
                 args=(world_size, os.path.join(tmp, "store"), placement, size, rounds, out))
        with open(out) as fh:
            gathered = json.load(fh)
    per_round = [max(values) for values in zip(*(times for times, _ in gathered))]
    same_cpu = [len(set(cpus)) == 1 for cpus in zip(*(c for _, c in gathered))]
    return per_round, same_cpu


def _ms(values):
    if not values:
        return "-"
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"{statistics.median(values) * 1e3:.2f} [{q[0] * 1e3:.2f}-{q[2] * 1e3:.2f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--size", type=int, default=1024**2)
    args = parser.parse_args(argv)
    print("| repeat | placement | median ms [IQR] | rounds with both main threads on one CPU | "
          "median ms there | median ms on different CPUs |")
    print("|---|---|---|---|---|---|")
    for repeat in range(args.repeats):
        for placement in PLACEMENTS:
            times, same = run(placement, args.size, args.rounds)
            together = [t for t, s in zip(times, same) if s]
            apart = [t for t, s in zip(times, same) if not s]
            print(f"| {repeat + 1} | {placement} | {_ms(times)} | {len(together) / len(times):.0%} | "
                  f"{_ms(together)} | {_ms(apart)} |", flush=True)
    print(f"(python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
