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


def python_thread_ids(ctx):
    """The native ids of the rank's Python threads: every thread ddpbench starts is one (gloo's and
    torch's own threads are C++ threads, named or not depending on the torch release)."""
    import threading

    return sorted(t.native_id for t in threading.enumerate())


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


# -- exposed communication (tests/workloads/training/test_exposed_comm.py) -------------------------

def collectives_in_steps(ctx, workload, steps):
    """Set ``workload`` up, run 2 rounds (DDP rebuilds its buckets at the second, broadcasting the
    new order once), then ``steps`` rounds under torch.profiler; return the collectives the
    profiler saw (gloo / c10d ops, by name and count) and, for a compute-only variant, its record of
    the last step's skipped collectives."""
    from torch.profiler import ProfilerActivity, profile

    state = workload.setup(ctx)
    try:
        for _ in range(2):
            workload.run_round(state)
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(steps):
                workload.run_round(state)
        seen = {event.key: int(event.count) for event in profiler.key_averages()
                if event.key.startswith(("gloo:", "c10d::", "nccl:"))}
        skipped = getattr(workload, "compute_only", False) and workload.skipped_collectives(state)
        calls = len(state["calls"]) if "calls" in state else None
    finally:
        workload.teardown(state)
    return {"collectives": seen, "skipped": skipped or None, "replay_calls": calls}


ROUND_LOG: list = []


class LoggedRounds:
    """A workload whose rounds append its name to ROUND_LOG (in the rank); the main one's check
    returns the log, so the test sees the order the engine ran the rounds in."""

    def __init__(self, name, variant_names=()):
        self.name, self.variant_names = name, tuple(variant_names)
        self.group, self.pin_to_core, self.cuda_graph_safe = None, True, False

    def setup(self, ctx):
        if self.variant_names:
            ROUND_LOG.clear()
        return {"torn_down": False}

    def run_round(self, state):
        ROUND_LOG.append(self.name)

    def rank_metrics(self, state):
        return {}

    def check(self, state):
        return {"round_log": list(ROUND_LOG)}

    def teardown(self, state):
        ROUND_LOG.append(f"teardown {self.name}")

    def variants(self):
        return {name: LoggedRounds(name) for name in self.variant_names}

    def extra_info(self, world_size, median_s):
        return {}
