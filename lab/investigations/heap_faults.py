"""Minor page faults per all_gather round in a plain 2-rank gloo script (the ``adaptive`` vs
``steady`` heap of A/B mode, ddpbench.gates.ab.heap): do identical processes fault in fresh pages every
round alike?

Each rank runs four "cases" one after another, each with its own tensors (10, 5, 3.3 and 2.5 MB
per rank for ``--mb 10``): 3 untimed rounds, then 20 rounds, each timed with the minor faults it
cost (getrusage). Prints, per rank and case, the median faults per round and the median round.

    .venv/bin/python lab/investigations/heap_faults.py --mb 10
    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TOP_PAD_=0 MALLOC_TRIM_THRESHOLD_=68719476736 \\
        .venv/bin/python lab/investigations/heap_faults.py --mb 10      # the steady heap's settings
"""

import argparse
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
from plain_ranks import run_ranks

CASES, ROUNDS, WARMUP = 4, 20, 3


def rank_main(rank, world_size, store_path, results, mb):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    found = []
    for case in range(CASES):
        elements = mb * 2**20 // 4 // (case + 1)
        tensor = torch.ones(elements)
        outputs = [torch.empty(elements) for _ in range(world_size)]
        for _ in range(WARMUP):
            dist.all_gather(outputs, tensor)
        faults, times = [], []
        for _ in range(ROUNDS):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            dist.all_gather(outputs, tensor)
            times.append(time.perf_counter() - start)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        found.append((elements * 4 / 2**20, statistics.median(faults), statistics.median(times)))
        del tensor, outputs
    results.put((rank, found))
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=10, help="the first case's MB per rank")
    args = parser.parse_args(argv)
    heap = "steady" if os.environ.get("MALLOC_MMAP_THRESHOLD_") else "adaptive"
    found = sorted(run_ranks(rank_main, 2, args.mb).items())
    for rank, cases in found:
        print(f"{heap} heap, rank {rank}: " + "  ".join(
            f"{size:.1f} MB: {faults:.0f} faults/round, {seconds * 1e3:.2f} ms" for size, faults, seconds in cases))


if __name__ == "__main__":
    main()
