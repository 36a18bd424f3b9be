"""The main of a rank of a local pool, run in the rank process (spawned by :class:`~.local.RankPool`,
or started in another interpreter through :mod:`ddpbench.rank_process`): join the process group
on this machine, watch the controller, then serve tasks until told to stop."""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import threading
import time

from . import rendezvous
from .base import PoolSpec, RankContext
from .pinning import cores_available
from .task_loop import serve_tasks

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


def run_local_rank(spec: PoolSpec, rank: int, store_dir: str, conn, parent_pid: int, pg_timeout_s: float,
               pin_cores: bool):
    """A rank's whole life: ``conn`` is its end of the connection to the controller."""
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
    ctx = RankContext(rank, spec.world_size, spec.backend, spec.device, local_rank=rank,
                      core=cores_available()[rank] if pin_cores else None)
    conn.send(("ready", rank, os.getpid()))
    try:
        serve_tasks(conn, ctx)
    finally:
        dist.destroy_process_group()
        conn.close()
