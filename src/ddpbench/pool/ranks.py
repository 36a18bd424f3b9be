"""The rank side of a pool: a rank's main (join the process group, then serve tasks until told
to stop), the watch that ends a rank whose controller is gone, and core pinning."""

from __future__ import annotations

import faulthandler
import io
import os
import select
import signal
import sys
import threading
import time
import traceback

from . import rendezvous
from .base import PoolSpec, RankContext, TaskError
from .picklecheck import LoadFailure, TaskUnpickler, load_failure_message

# Where the OS has no pidfds, how often a rank checks that its parent (the controller) still exists.
PARENT_POLL_S = 0.5


def _exit_when_parent_dies(parent_pid: int, store_dir: str | None = None) -> None:
    """Exit (status 3) once the controller process is gone, even in the middle of a task, removing
    the pool's store directory on the way (the controller, killed, could not: every rank tries,
    whichever comes first removes it).

    Where the OS has pidfds (Linux >= 5.3) the watching thread sleeps in select() on a pidfd of the
    parent, which becomes readable when the parent exits: the thread never wakes up before that.
    Elsewhere it polls ``os.getppid()`` every PARENT_POLL_S. An idle rank then adds no wake-ups of
    its own beside the ones its backend makes: a rank has no reason to wake a CPU for nothing."""
    try:
        parent_fd: int | None = os.pidfd_open(parent_pid)
    except (AttributeError, OSError):  # no pidfds here (macOS, old kernels), or the parent is gone
        parent_fd = None
    # Checked after the pidfd exists: if the parent is still our parent now, the pidfd is its own
    # (a pid is only reused after its process is gone).
    def leave():
        if store_dir is not None:
            rendezvous.remove_store_dir(store_dir)
        os._exit(3)

    if os.getppid() != parent_pid:
        leave()

    def watch():
        if parent_fd is not None:
            select.select([parent_fd], [], [])
            leave()
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        leave()

    threading.Thread(target=watch, name="ddpbench-parent-watch", daemon=True).start()


def cores_available() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return []


def should_pin(world_size: int, requested: bool) -> bool:
    """Pinning is used only where every rank gets a core of its own."""
    cores = cores_available()
    return requested and bool(cores) and world_size <= len(cores)


def set_process_affinity(cores) -> None:
    """Set the CPU affinity of every thread of this process (gloo's threads included)."""
    cores = set(cores)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that just exited
            pass


def _rank_main(spec: PoolSpec, rank: int, store_dir: str, conn, parent_pid: int, pg_timeout_s: float,
               pin_cores: bool):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_when_parent_dies(parent_pid, store_dir)
    dump_file = open(os.path.join(store_dir, f"rank{rank}.stack"), "w")
    faulthandler.enable(file=dump_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=dump_file, all_threads=True, chain=False)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if spec.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    rendezvous.init_loopback_process_group(spec.backend, rank, spec.world_size, store_dir, pg_timeout_s)
    ctx = RankContext(rank, spec.world_size, spec.backend, spec.device,
                      core=cores_available()[rank] if pin_cores else None)
    conn.send(("ready", rank, os.getpid()))
    try:
        serve_tasks(conn, ctx)
    finally:
        dist.destroy_process_group()
        conn.close()


def serve_tasks(conn, ctx: RankContext) -> None:
    """The rank's task loop: receive a task, run it, send back its result or traceback."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        _, task_id, sys_path, payload = message
        del message
        for entry in sys_path:
            if entry not in sys.path:
                sys.path.append(entry)
        reply = _run_task(ctx, task_id, payload)
        del payload
        try:
            conn.send(reply)
        except Exception:  # the result could not be pickled
            conn.send(("error", task_id, "the task's return value could not be sent back:\n"
                       + traceback.format_exc()))


def _run_task(ctx: RankContext, task_id: int, payload: bytes) -> tuple:
    """Load and run one task; its arguments are freed when this returns, not when the next task
    replaces them (a dataset a task received lets go of its memory and descriptors at once)."""
    try:
        fn, args, kwargs = TaskUnpickler(io.BytesIO(payload)).load()
        return ("ok", task_id, fn(ctx, *args, **kwargs))
    except LoadFailure as failure:  # a class or function the task names cannot be imported here
        return ("error", task_id, load_failure_message(failure))
    except TaskError as exc:  # its message says it all
        return ("error", task_id, f"{type(exc).__name__}: {exc}")
    except BaseException:  # noqa: BLE001 - everything goes back to the controller
        return ("error", task_id, traceback.format_exc())


