"""What a plain torch.distributed script gets for NCCL ops issued back to back on one GPU.

The reference that separates torch's per-call cost from ddpbench's: a world of one rank (NCCL, file
rendezvous), and per op and size ``--ops`` calls of torch's collective between two CUDA events after
a warm-up, as nccl-tests times ``-n`` iterations, ``--repeats`` times; with ``--graphs`` the calls
are captured once into a CUDA graph and each repeat replays it. Prints per op and size the median
(min-max) of the per-op event time and of the host time the calls took to return, in
microseconds; where the host time is the larger, the ops are host-bound and the event time is
torch's per-call cost, not the GPU's work (nccl-tests calls NCCL directly and pays none of it).

    python3 lab/reference/torch_back_to_back.py --sizes 1MB,10MB,100MB,1000MB [--graphs] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def parse_size(text: str) -> int:
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    return int(text[:-2]) * units[text[-2:].upper()]


def issue(op: str, out, inp):
    import torch.distributed as dist

    if op == "all_reduce":
        return lambda: dist.all_reduce(out)
    if op == "broadcast":
        return lambda: dist.broadcast(out, src=0)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, inp)
    return lambda: dist.reduce_scatter_tensor(out, inp)


def measure(call, ops: int, repeats: int, graphs: bool) -> dict:
    import torch

    for _ in range(10):
        call()
    graph = None
    if graphs:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(ops):
                call()
        graph.replay()
    event_us, host_us = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        host_start = time.perf_counter()
        if graph is not None:
            graph.replay()
        else:
            for _ in range(ops):
                call()
        host_us.append((time.perf_counter() - host_start) / ops * 1e6)
        stop.record()
        stop.synchronize()
        event_us.append(start.elapsed_time(stop) * 1e3 / ops)
    return {"event_us": event_us, "host_us": host_us}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1MB,10MB,100MB,1000MB")
    parser.add_argument("--ops", type=int, default=100, help="calls between the two events")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--json", help="write the per-repeat figures here")
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (NCCL)")
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0,
                                world_size=1, device_id=torch.device("cuda", 0))
        results = []
        for op in OPS:
            for size_text in args.sizes.split(","):
                size = parse_size(size_text)
                out = torch.ones(size // 4, device="cuda")
                inp = torch.ones(size // 4, device="cuda")
                figures = measure(issue(op, out, inp), args.ops, args.repeats, args.graphs)
                results.append({"op": op, "size_bytes": size, "graphs": args.graphs, **figures})
                del out, inp
        dist.destroy_process_group()
    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"{torch.cuda.get_device_name(0)}; {args.ops} ops between events, {args.repeats} repeats"
          f"{', CUDA graph replay' if args.graphs else ''}")
    print("| op | size | event time per op (us) | host time per call (us) |\n|---|---|---|---|")
    for r in results:
        e, h = r["event_us"], r["host_us"]
        print(f"| {r['op']} | {r['size_bytes'] >> 20} MB | {statistics.median(e):.2f} ({min(e):.2f}–{max(e):.2f}) | "
              f"{statistics.median(h):.2f} ({min(h):.2f}–{max(h):.2f}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
