"""Do two identical pools of ranks keep a lasting offset? Two 2-rank gloo pools (X, Y) alternate
blocks of one op (XY YX ...), 16 pairs per epoch of ~3 s, 8 epochs; per epoch the median log ratio
X / Y of the block medians. Between epochs the pools keep their process groups (``keep``) or
re-create them (``reinit``). A lasting per-process offset shows as epoch ratios that stay on one
side of 1; noise alone scatters them as wide as 16 pairs' noise allows (docs/results.md).

    .venv/bin/python benchmarks/raw/pool_epochs.py all_reduce 10 keep     # op, MB, keep|reinit
"""
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OP = sys.argv[1] if len(sys.argv) > 1 else "broadcast"  # broadcast | all_reduce
MB = int(sys.argv[2]) if len(sys.argv) > 2 else 10
MODE = sys.argv[3] if len(sys.argv) > 3 else "reinit"  # reinit | keep
EPOCHS, PAIRS, ROUNDS, WARMUP = 8, 16, 15, 3
POOLS, WORLD_SIZE = 2, 2


def join_group(pool, rank, store_dir, epoch):
    store = dist.FileStore(os.path.join(store_dir, f"s{pool}-{epoch}"), WORLD_SIZE)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE)


def run_op(tensor):
    if OP == "broadcast":
        dist.broadcast(tensor, 0)
    else:
        dist.all_reduce(tensor)


def pool_of_block(block):
    """Blocks run X Y, Y X, X Y, ...: pool 0 first in even pairs, second in odd ones."""
    pair, position = divmod(block, 2)
    return position if pair % 2 == 0 else 1 - position


def worker(index, store_dir, turn, results):
    pool, rank = divmod(index, WORLD_SIZE)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    join_group(pool, rank, store_dir, 0)
    tensor = torch.ones(MB * 2**20 // 4)
    for epoch in range(EPOCHS):
        if epoch and MODE == "reinit":
            dist.destroy_process_group()
            join_group(pool, rank, store_dir, epoch)
        for _ in range(WARMUP):
            run_op(tensor)
        for block in range(PAIRS * 2):
            turn.wait()  # all pools' ranks meet; only the block's pool runs
            if pool_of_block(block) == pool:
                times = []
                for _ in range(ROUNDS):
                    dist.barrier()
                    start = time.perf_counter()
                    run_op(tensor)
                    times.append(time.perf_counter() - start)
                results.put((epoch, block, pool, times))
            turn.wait()
    dist.destroy_process_group()


def main():
    ctx = mp.get_context("spawn")
    ranks = POOLS * WORLD_SIZE
    turn, results = ctx.Barrier(ranks), ctx.Queue()
    store_dir = tempfile.mkdtemp()
    workers = [ctx.Process(target=worker, args=(i, store_dir, turn, results)) for i in range(ranks)]
    for process in workers:
        process.start()
    per_rank = {}
    for _ in range(EPOCHS * PAIRS * WORLD_SIZE * 2):  # every block: one report per rank of its pool
        epoch, block, pool, times = results.get()
        per_rank.setdefault((epoch, block), []).append(times)
    for process in workers:
        process.join()
    epoch_logs = []
    for epoch in range(EPOCHS):
        medians = {0: [], 1: []}
        for block in range(PAIRS * 2):
            rounds = [max(values) for values in zip(*per_rank[(epoch, block)])]  # max over ranks
            medians[pool_of_block(block)].append(statistics.median(rounds))
        logs = [math.log(x / y) for x, y in zip(medians[0], medians[1])]
        q1, _, q3 = statistics.quantiles(logs, n=4)
        epoch_logs.append(statistics.median(logs))
        print(f"{MODE} {OP} {MB}MB epoch {epoch}: X/Y {math.exp(epoch_logs[-1]):.3f}  "
              f"pair IQR {math.exp(q1):.3f}-{math.exp(q3):.3f}  X {statistics.median(medians[0]) * 1e3:.2f} ms",
              flush=True)
    print("epoch ratios", [round(math.exp(v), 3) for v in epoch_logs])


if __name__ == "__main__":
    main()
