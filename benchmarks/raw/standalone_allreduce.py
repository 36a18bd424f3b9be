"""A plain torch.distributed all_reduce timing, independent of ddpbench (the fidelity reference).

What a user would write: mp.spawn, a FileStore rendezvous, gloo, ``torch.set_num_threads(1)``,
barrier -> perf_counter -> all_reduce -> perf_counter inside every rank, the maximum over ranks per
round, the median over rounds; nothing else configured (no pinning, no interface variables).
``--backend nccl``: CUDA tensors (rank r on GPU r) timed with CUDA events around the all_reduce
after a barrier and a synchronize, as an NCCL user would.
Two switches, off by default, measure what ddpbench's optional set-up costs against it:
``--pin auto`` (rank r on the r-th CPU, as ``--dist-pin-cores=auto``) and ``--loopback``
(GLOO_SOCKET_IFNAME set to the loopback interface, as ddpbench's single-node pools always do).

    python benchmarks/raw/standalone_allreduce.py --sizes 1MB,10MB,100MB --world-size 2
prints one JSON object: {"<size in bytes>": {"median_s": ..., "rounds": ...}, ...}
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

UNITS = {"KB": 1024, "MB": 1024**2, "GB": 1024**3}


def parse_size(text):
    text = text.strip().upper()
    return int(text[:-2]) * UNITS[text[-2:]] if text[-2:] in UNITS else int(text)


def timed_all_reduce_cpu(tensor):
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(tensor)
    return time.perf_counter() - start


def timed_all_reduce_cuda(tensor):
    """CUDA events around the all_reduce on the current stream, as nccl-tests and most NCCL
    scripts time it."""
    dist.barrier(device_ids=[tensor.device.index])
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dist.all_reduce(tensor)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1000.0


def worker(rank, world_size, store_path, sizes, warmup, min_time, max_rounds, out_path, pin, loopback,
           backend="gloo"):
    if loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    if pin:  # as ddpbench's --dist-pin-cores=auto: rank r on the r-th CPU, set before gloo's threads start
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    torch.set_num_threads(1)
    device = torch.device("cpu")
    timed = timed_all_reduce_cpu
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device, timed = torch.device("cuda", rank), timed_all_reduce_cuda
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    results = {}
    for size in sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            last = timed(tensor)
        estimate = torch.tensor([last], dtype=torch.float64, device=device)
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
        rounds = max(5, min(max_rounds, int(min_time / max(estimate.item(), 1e-9)) + 1))
        times = [timed(tensor) for _ in range(rounds)]
        gathered = [None] * world_size
        dist.all_gather_object(gathered, times)
        if rank == 0:
            per_round = [max(values) for values in zip(*gathered)]
            results[str(size)] = {"median_s": statistics.median(per_round), "rounds": rounds}
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(results, fh)
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1MB,10MB,100MB")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=1.0)
    parser.add_argument("--max-rounds", type=int, default=1000)
    parser.add_argument("--pin", choices=("auto", "off"), default="off",
                        help="auto: one core per rank when there are enough cores (as "
                             "--dist-pin-cores=auto); default off, as a plain script")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="nccl: CUDA tensors, rank r on GPU r, CUDA-event timing (default gloo)")
    parser.add_argument("--loopback", action="store_true",
                        help="bind gloo to the loopback interface (GLOO_SOCKET_IFNAME=lo), as ddpbench's "
                             "single-node pools do")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    pin = args.pin == "auto" and args.world_size <= len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        mp.spawn(worker, nprocs=args.world_size,
                 args=(args.world_size, os.path.join(tmp, "store"), sizes, args.warmup,
                       args.min_time, args.max_rounds, out_path, pin, args.loopback, args.backend))
        with open(out_path) as fh:
            json.dump(json.load(fh), sys.stdout)
    print()


if __name__ == "__main__":
    main()
