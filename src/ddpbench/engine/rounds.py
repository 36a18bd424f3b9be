"""How one round runs and is timed inside a rank: the barrier, the timer (perf_counter on the CPU,
CUDA events on a GPU), ops back to back, their CUDA graph, and the rank kept on its own core while
it measures. :class:`ddpbench.engine.timing.RankSession` puts these together."""

from __future__ import annotations

import contextlib
import os
import time

from ..pool import set_process_affinity


def barrier(ctx) -> None:
    import torch.distributed as dist

    if ctx.backend == "nccl":
        dist.barrier(device_ids=[ctx.device.index])
    else:
        dist.barrier()


def time_round_cpu(ctx, run_round, state) -> float:
    """Barrier, then ``run_round(state)`` between two perf_counter reads; returns the seconds."""
    barrier(ctx)
    start = time.perf_counter()
    run_round(state)
    return time.perf_counter() - start


def time_round_cuda(ctx, run_round, state) -> float:
    """Barrier and synchronize, then ``run_round(state)`` between two CUDA events; returns the seconds."""
    import torch

    barrier(ctx)
    torch.cuda.synchronize(ctx.device)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run_round(state)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1000.0


def repeated(run_round, ops: int):
    """``run_round`` ``ops`` times back to back, as one call (one timed region)."""
    if ops == 1:
        return run_round

    def ops_back_to_back(state):
        for _ in range(ops):
            run_round(state)

    return ops_back_to_back


def agreed_max(ctx, values: list[float]) -> list[float]:
    """Element-wise maximum of ``values`` over all ranks (every rank gets the same list)."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


class ThreadCpuReader:
    """Reads the CPU the opening thread last ran on (Linux /proc): the file is opened once and each
    read is one pread, so sampling it after every round costs a single system call. Where /proc
    cannot tell, every read returns None."""

    def __init__(self):
        try:
            self._fd: int | None = os.open("/proc/thread-self/stat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> int | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 1024, 0).rsplit(b")", 1)[1].split()[36])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ----------------------------------------------------------------------------------------------
# CUDA graphs (--dist-cuda-graphs): a round's ops captured once, each round replays them
# ----------------------------------------------------------------------------------------------


def refuse_uncapturable(workload, on_cuda: bool) -> None:
    """ValueError where a CUDA graph cannot hold the workload's rounds: a CPU case, or a workload
    that does not declare ``cuda_graph_safe``."""
    if not on_cuda:
        raise ValueError("CUDA graph mode captures GPU work; this case runs on the CPU")
    if not getattr(workload, "cuda_graph_safe", False):
        raise ValueError(f"{type(workload).__name__} cannot be captured in a CUDA graph (its rounds "
                         f"do more than GPU work); run it without --dist-cuda-graphs")


def capture_cuda_graph(ctx, run_round, state, ops: int):
    """``ops`` calls of ``run_round(state)`` captured into a CUDA graph (warmed up on a side stream
    first, as CUDA graph capture requires)."""
    import torch

    stream = torch.cuda.Stream(ctx.device)
    stream.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            run_round(state)
    torch.cuda.current_stream(ctx.device).wait_stream(stream)
    torch.cuda.synchronize(ctx.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        repeated(run_round, ops)(state)
    torch.cuda.synchronize(ctx.device)
    return graph


def replay(graph) -> None:
    """One round of a captured graph (the ``run_round`` a timer calls)."""
    graph.replay()


# ----------------------------------------------------------------------------------------------
# Pinning (--dist-pin-cores)
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def pinned_to(core: int | None):
    """This process (every thread of it) on ``core`` while the block runs, its previous affinity
    back afterwards; None leaves the process where it is."""
    if core is None:
        yield
        return
    previous = sorted(os.sched_getaffinity(0))
    set_process_affinity([core])
    try:
        yield
    finally:
        set_process_affinity(previous)
