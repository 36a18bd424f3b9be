"""Module-level tasks the tests send to rank processes (tasks must be importable in the ranks)."""

import os
import signal
import time

import psutil


def rank_and_sum(ctx, offset):
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(ctx.rank + offset)])
    dist.all_reduce(value)
    return {"rank": ctx.rank, "pid": os.getpid(), "sum": value.item(), "threads": __import__("torch").get_num_threads()}


def raise_on_rank_one(ctx):
    if ctx.rank == 1:
        raise ValueError("rank one refuses")
    return ctx.rank


def raise_on_rank_one_then_collective(ctx):
    import torch.distributed as dist

    if ctx.rank == 1:
        raise ValueError("rank one fails before the barrier")
    dist.barrier()


def die_on_rank_one(ctx):
    import torch.distributed as dist

    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def sleep_past_timeout(ctx, seconds):
    if ctx.rank == 0:
        time.sleep(seconds)
    return ctx.rank


def listening_addresses(ctx):
    """(pid, listening local addresses) of this rank."""
    proc = psutil.Process()
    return os.getpid(), [(c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                         if c.status == psutil.CONN_LISTEN]


def sum_of_tensor(ctx, tensor):
    return float(tensor.sum())


def return_unpicklable(ctx):
    return lambda: None


def start_child_sleeper(ctx):
    """Start a grandchild process (like a DataLoader worker) and report its pid."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ctx.scratch["child"] = child
    return child.pid


def return_object_only_the_rank_can_import(ctx, folder):
    """An instance of a class from a module the rank writes and imports itself: the controller has
    no such module (as a baseline's own classes are absent from the candidate's code)."""
    import importlib
    import sys

    path = os.path.join(folder, f"rank_only_{ctx.rank}.py")
    with open(path, "w") as fh:
        fh.write("class Result:\n    pass\n")
    sys.path.insert(0, folder)
    return importlib.import_module(f"rank_only_{ctx.rank}").Result()


def raise_sticky_cuda_error_on_rank_zero(ctx):
    """What a rank reports after an illegal memory access (its CUDA context is unusable now)."""
    if ctx.rank == 0:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                           "CUDA kernel errors might be asynchronously reported at some other API call")
    return ctx.rank
