"""Do two identical pools of ranks keep a lasting offset? Two 2-rank gloo pools (X, Y) alternate
blocks of one op (XY YX ...), 16 pairs per epoch of ~3 s, 8 epochs; per epoch the median log ratio
X / Y of the block medians. Between epochs the pools keep their process groups (``keep``) or
re-create them (``reinit``). A lasting per-process offset shows as epoch ratios that stay on one
side of 1; noise alone scatters them as wide as 16 pairs' noise allows (docs/results.md).

    .venv/bin/python benchmarks/raw/pool_epochs.py all_reduce 10 keep     # op, MB, keep|reinit
"""
import os, sys, time, statistics, math, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp

OP = sys.argv[1] if len(sys.argv) > 1 else "broadcast"
MB = int(sys.argv[2]) if len(sys.argv) > 2 else 10
MODE = sys.argv[3] if len(sys.argv) > 3 else "reinit"   # reinit | keep
EPOCHS, BLOCKS, ROUNDS = 8, 16, 15

def init(pool, rank, d, epoch):
    store = dist.FileStore(os.path.join(d, f"s{pool}-{epoch}"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)

def worker(idx, d, turn, q):
    pool, rank = divmod(idx, 2)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    init(pool, rank, d, 0)
    t = torch.ones(MB * 2**20 // 4)
    for epoch in range(EPOCHS):
        if epoch and MODE == "reinit":
            dist.destroy_process_group(); init(pool, rank, d, epoch)
        for i in range(3):
            getattr(dist, OP)(t, 0) if OP == "broadcast" else dist.all_reduce(t)
        for b in range(BLOCKS * 2):
            who = b % 2 if (b // 2) % 2 == 0 else 1 - b % 2   # XY YX XY ...
            turn.wait()  # all 4 meet
            if who == pool:
                times = []
                for r in range(ROUNDS):
                    dist.barrier(); s = time.perf_counter()
                    dist.broadcast(t, 0) if OP == "broadcast" else dist.all_reduce(t)
                    times.append(time.perf_counter() - s)
                q.put((epoch, b, pool, rank, times))
            turn.wait()
    dist.destroy_process_group()

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    d = tempfile.mkdtemp(); turn = ctx.Barrier(4); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(i, d, turn, q)) for i in range(4)]
    [p.start() for p in ps]
    rows = {}
    n = EPOCHS * BLOCKS * 2 * 2
    for _ in range(n):
        e, b, pool, rank, times = q.get()
        rows.setdefault((e, b, pool), []).append(times)
    [p.join() for p in ps]
    out = []
    for e in range(EPOCHS):
        meds = {0: [], 1: []}
        for b in range(BLOCKS * 2):
            for pool in (0, 1):
                if (e, b, pool) in rows:
                    mx = [max(v) for v in zip(*rows[(e, b, pool)])]
                    meds[pool].append(statistics.median(mx))
        lr = [math.log(x / y) for x, y in zip(meds[0], meds[1])]
        m = statistics.median(lr)
        out.append(m)
        print(f"{MODE} {OP} {MB}MB epoch {e}: X/Y {math.exp(m):.3f}  pair IQR {math.exp(statistics.quantiles(lr, n=4)[0]):.3f}-{math.exp(statistics.quantiles(lr, n=4)[2]):.3f}  X {statistics.median(meds[0])*1e3:.2f} ms", flush=True)
    print("epoch ratios", [round(math.exp(v), 3) for v in out])
