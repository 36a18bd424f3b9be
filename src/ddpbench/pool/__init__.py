"""Persistent rank processes: start them once, run tasks on all of them, notice when they break.

A :class:`RankPool` owns ``world_size`` spawned processes that have joined one process group. A
task is a picklable callable ``task(ctx, *args, **kwargs)``; :meth:`RankPool.run` runs it on every
rank and returns the per-rank return values in rank order. The pool knows nothing about
benchmarks.

Failure handling, in the order a caller sees it:

* a task raises on some rank -> :class:`TaskFailed` with each failing rank's traceback; if the
  other ranks finished the pool stays usable, otherwise they are stuck in a collective waiting
  for the failed rank and the pool is torn down;
* a rank process dies -> :class:`TaskFailed` naming the dead ranks and their exit status;
* a task runs past its timeout -> :class:`TaskFailed` naming the stuck ranks, with a faulthandler
  stack dump of where each one was.

A pool that hit a death or a timeout is killed (every rank and the rank's own children, by pid)
and reports ``alive == False``; :class:`PoolRegistry` then starts a fresh one on the next request.
Rank processes ignore SIGINT (the controlling process decides when they stop) and exit by
themselves if their parent disappears.
"""

from __future__ import annotations

import atexit
import faulthandler
import io
import itertools
import json
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

import psutil

from . import rendezvous
from .picklecheck import LOAD_FAILURE_PREFIX, LoadFailure, TaskUnpickler, load_failure_message, unpicklable_message

# After one rank fails or dies, how long the others get to finish before they count as stuck.
FAILURE_GRACE_S = 3.0
# The controller waits in slices this long: a Ctrl-C delivered to another thread of the process
# only raises KeyboardInterrupt once the main thread wakes up.
SIGNAL_POLL_S = 0.25
# Where the OS has no pidfds, how often a rank checks that its parent (the controller) still exists.
PARENT_POLL_S = 0.5
# How long a stuck rank gets to write its faulthandler stack dump.
STACK_DUMP_WAIT_S = 3.0


@dataclass(frozen=True)
class PoolSpec:
    """The shape of a pool: one pool exists per distinct spec."""

    backend: str  # "gloo" or "nccl"
    world_size: int
    device: str  # "cpu" or "cuda"

    @property
    def label(self) -> str:
        return f"{self.backend}, {self.world_size} ranks, {self.device}"


# Run first by every process a RankLaunch starts (``python -c``), before anything is imported:
# ``-c`` (like ``-m``) puts the working directory first on sys.path, where it would shadow the
# side's own code with whatever the directory pytest was started from holds (a flat-layout
# checkout of the other side). The import path then becomes what the launch planned
# (RankLaunch.sys_path_plan), passed in DDPBENCH_RANK_SYS_PATH.
RANK_BOOTSTRAP = r"""
import json, os, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
_plan = json.loads(os.environ.pop("DDPBENCH_RANK_SYS_PATH", "null"))
if _plan is not None:
    if _plan["exact"] is not None:
        sys.path[:] = _plan["exact"]
    else:
        sys.path[:] = _plan["prepend"] + [p for p in sys.path if p not in _plan["prepend"]]
"""

RANK_MAIN = "from ddpbench.rank_process import main\nsys.exit(main(sys.argv[1:]))\n"
SYS_PATH_ENV = "DDPBENCH_RANK_SYS_PATH"


def project_folders(entries: list[str]) -> list[str]:
    """The entries of the controller's sys.path that are the project's own folders (test folders,
    a checkout's src/), not this interpreter's standard library or installed packages: what another
    interpreter's ranks need from it so that workloads defined in test modules unpickle."""
    prefixes = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    return [p for p in entries if p and "-packages" not in p
            and not os.path.realpath(p).startswith(prefixes)]


@dataclass(frozen=True)
class RankLaunch:
    """How a pool's rank processes are started when not by plain multiprocessing spawn: with this
    interpreter (None: the controller's), these entries first on sys.path and these environment
    overrides. The pool knows nothing else about why (see ddpbench.gates.ab).

    A rank's import path, in order: ``paths``; then, with the controller's interpreter, the
    controller's own sys.path (as a spawned rank gets it); with another interpreter, that
    interpreter's own sys.path, to which each task appends the controller's project folders
    (``append``) once the rank's own ddpbench is loaded. Never the working directory implicitly:
    only where the controller itself imports from it, and after ``paths``.
    """

    python: str | None = None
    paths: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def environment(self, controller_sys_path: list[str] | None = None) -> dict[str, str]:
        """The environment of a process this launch starts (``controller_sys_path``: the
        controller's sys.path to plan the import path from; default: the current one)."""
        env = dict(os.environ)
        env.update(dict(self.env))
        env[SYS_PATH_ENV] = json.dumps(self.sys_path_plan(controller_sys_path))
        return env

    def sys_path_plan(self, controller_sys_path: list[str] | None = None) -> dict:
        """What RANK_BOOTSTRAP makes of sys.path: ``exact`` (the whole list) with the controller's
        interpreter, else ``prepend`` before the interpreter's own entries; ``append`` is what each
        task adds after them (serve_tasks), listed for probes that must see what a task sees."""
        entries = [os.path.abspath(p) if p else os.getcwd()
                   for p in (sys.path if controller_sys_path is None else controller_sys_path)]
        paths = list(self.paths)
        if not self.foreign_interpreter:
            return {"exact": _unique(paths + entries), "prepend": [], "append": []}
        return {"exact": None, "prepend": paths, "append": [p for p in project_folders(entries) if p not in paths]}

    def command(self, code: str, *args: str) -> list[str]:
        """``python -c`` running RANK_BOOTSTRAP, then ``code`` (sys.argv[1:] == args)."""
        return [self.python or sys.executable, "-c", RANK_BOOTSTRAP + code, *args]

    @property
    def foreign_interpreter(self) -> bool:
        return self.python is not None and os.path.realpath(self.python) != os.path.realpath(sys.executable)


def _unique(entries: list[str]) -> list[str]:
    return list(dict.fromkeys(entries))


@dataclass
class RankContext:
    """What a task receives as its first argument on every rank."""

    rank: int
    world_size: int
    backend: str
    device_type: str
    # Per-rank storage that survives between tasks of the same pool (e.g. cached datasets).
    scratch: dict = field(default_factory=dict)
    # The rank's index on its node (torchrun's LOCAL_RANK); None for single-node pools.
    local_rank: int | None = None
    # The CPU the engine pins this rank to while it measures (None: not pinned); see
    # ddpbench.engine.timing.measure_workload and --dist-pin-cores.
    core: int | None = None

    @property
    def device(self):
        import torch

        if self.device_type == "cuda":
            index = self.rank if self.local_rank is None else self.local_rank
            return torch.device("cuda", index % torch.cuda.device_count())
        return torch.device("cpu")


class PoolError(RuntimeError):
    """Base class of the pool's failures."""


class PoolStartError(PoolError):
    """The rank processes could not be started or could not form the process group."""


class SendRefused(RuntimeError):
    """Raised while a task is being pickled by an object that refuses to be sent, with its own
    reason and fix (e.g. a dataset whose handover would exceed the open-file limit).
    :meth:`PoolBase.run` lets it through unchanged instead of reporting an unpicklable part."""


class TaskFailed(PoolError):
    """A task raised, a rank died, or ranks were stuck past the timeout."""

    def __init__(self, message: str, *, errors=None, dead=None, stuck=None, pool_torn_down=False):
        super().__init__(message)
        self.errors: dict[int, str] = dict(errors or {})
        self.dead: dict[int, int | None] = dict(dead or {})
        self.stuck: dict[int, str] = dict(stuck or {})
        self.pool_torn_down = pool_torn_down


# ----------------------------------------------------------------------------------------------
# Rank side
# ----------------------------------------------------------------------------------------------


def _exit_when_parent_dies(parent_pid: int, store_dir: str | None = None) -> None:
    """Exit (status 3) once the controller process is gone, even in the middle of a task, removing
    the pool's store directory on the way (the controller, killed, could not: every rank tries,
    whichever comes first removes it).

    Where the OS has pidfds (Linux >= 5.3) the watching thread sleeps in select() on a pidfd of the
    parent, which becomes readable when the parent exits: the thread never wakes up before that.
    Elsewhere it polls ``os.getppid()`` every PARENT_POLL_S. An idle rank then adds no wake-ups of
    its own beside the ones its backend makes (gloo's TCP loop thread wakes every 10 ms); the
    former twice-a-second poll was measured not to move the 1 MB modes (docs/results.md, "Where
    the 1 MB modes come from"), but a rank has no reason to wake a CPU for nothing."""
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
    except BaseException:  # noqa: BLE001 - everything goes back to the controller
        return ("error", task_id, traceback.format_exc())


# ----------------------------------------------------------------------------------------------
# Controller side
# ----------------------------------------------------------------------------------------------

_live_pools: "weakref.WeakSet[PoolBase]" = weakref.WeakSet()


@atexit.register
def _kill_pools_left_running() -> None:
    for pool in list(_live_pools):
        pool.kill()


def _task_name(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}.{name}"


def _unsendable_message(fn: Callable, args: tuple, kwargs: dict, exc: Exception) -> str:
    """Which part of a task does not pickle (a lambda, a class defined in a function...) and the fix."""
    name = _task_name(fn)
    parts = [(fn, f"task {name}")]
    parts += [(arg, f"the {type(arg).__name__} passed to task {name}") for arg in args]
    parts += [(value, f"the {type(value).__name__} passed to task {name} as {key}=")
              for key, value in kwargs.items()]
    for obj, subject in parts:
        message = unpicklable_message(obj, subject, dumps=ForkingPickler.dumps)
        if message:
            return message
    return (f"ddpbench: task {name} cannot be sent to the ranks because it does not pickle ({exc}). "
            f"Tasks must be module-level functions or picklable objects.")


def _unloadable_reply_message(fn: Callable, exc: Exception) -> str:
    """The error a rank's reply becomes when it arrived but cannot be unpickled in the controller."""
    return (f"ddpbench: the controller could not load this rank's reply to task {_task_name(fn)} "
            f"({type(exc).__name__}: {exc}). A task's return value is unpickled in the controller, "
            f"so it may only hold types the controller's interpreter can import (plain numbers, "
            f"lists, dicts, tensors); a class that exists only in this rank's code (another side's "
            f"ddpbench or workload, in A/B mode) cannot come back.")


# CUDA errors after which a process's CUDA context is unusable (the CUDA runtime calls them
# sticky: every later call fails too), and NCCL failures that leave the communicator broken.
_STICKY_DEVICE_ERRORS = (
    "an illegal memory access was encountered", "unspecified launch failure",
    "device-side assert triggered", "misaligned address", "an illegal instruction was encountered",
    "the launch timed out and was terminated", "uncorrectable ECC error encountered",
    "hardware stack error", "invalid program counter", "ncclUnhandledCudaError", "ncclSystemError",
    "ncclInternalError", "ncclRemoteError",
)


def sticky_device_error(traceback_text: str) -> str | None:
    """'a sticky CUDA error (an illegal memory access was encountered)' when a rank's traceback
    shows an error that leaves its CUDA context or NCCL communicator unusable, else None."""
    for marker in _STICKY_DEVICE_ERRORS:
        if marker in traceback_text:
            kind = "an NCCL communicator error" if marker.startswith("nccl") else "a sticky CUDA error"
            return f"{kind} ({marker})"
    return None


class PoolBase:
    """Runs tasks on ``spec.world_size`` connected ranks; subclasses say how ranks live and die."""

    spec: PoolSpec
    alive: bool
    nodes: int = 1
    pinned: bool = False  # ranks pinned to one core each
    _conns: list

    def __init__(self, spec: PoolSpec, name: str | None = None):
        self.spec = spec
        # How messages name this pool when several serve one spec (A/B: "baseline pool 1").
        self.name = name
        self._task_ids = itertools.count(1)
        self._conns = []
        self.alive = False
        self.retired_because: str | None = None  # why a task's failure made the pool unusable

    @property
    def label(self) -> str:
        return f"{self.name} ({self.spec.label})" if self.name else f"the {self.spec.label} pool"

    def _rank_label(self, rank: int) -> str:
        return f"{self.name}, rank {rank}" if self.name else f"rank {rank}"

    # What a subclass provides.
    _after_teardown = "the next case starts a fresh one."

    def _task_sys_path(self) -> list[str]:
        """The controller's sys.path entries a task's ranks append to theirs (test folders, so
        that workloads defined in test modules unpickle)."""
        return list(sys.path)

    def _death_waitables(self, rank: int) -> list:
        """Objects multiprocessing.connection.wait can watch that become ready when a rank dies."""
        return []

    def _exit_code(self, rank: int) -> int | None:
        return None

    def _describe_death(self, code: int | None) -> str:
        return _describe_exit(code)

    def _last_words(self, rank: int) -> str:
        """Whatever the dead rank left behind (e.g. a fatal-signal stack dump)."""
        return ""

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        raise NotImplementedError

    def _wait_for_exit(self, timeout_s: float) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------

    def run(self, fn: Callable, *args: Any, timeout_s: float = 120.0, **kwargs: Any) -> list[Any]:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the results in rank order."""
        if not self.alive:
            raise PoolError(f"ddpbench: {self.label} has been shut down")
        try:
            # ForkingPickler, once per rank: tensors in the arguments travel through shared memory
            # the way torch.multiprocessing hands them to spawned processes (a shared file
            # descriptor can be received only once, so each rank gets its own pickle).
            payloads = [bytes(ForkingPickler.dumps((fn, args, kwargs))) for _ in range(self.spec.world_size)]
        except SendRefused:
            raise
        except Exception as exc:
            raise PoolError(_unsendable_message(fn, args, kwargs, exc)) from None
        task_id = next(self._task_ids)
        try:
            return self._run(fn, task_id, payloads, timeout_s)
        except TaskFailed:
            raise
        except BaseException:
            # Interrupted half-way (Ctrl-C, pytest-timeout...): the ranks' state is unknown.
            self.kill()
            raise

    def _run(self, fn, task_id, payloads, timeout_s):
        world = self.spec.world_size
        results: list[Any] = [None] * world
        errors: dict[int, str] = {}
        dead: dict[int, int | None] = {}
        pending = set(range(world))
        sys_path = self._task_sys_path()
        for rank in range(world):
            try:
                self._conns[rank].send(("run", task_id, sys_path, payloads[rank]))
            except (BrokenPipeError, OSError):
                dead[rank] = self._exit_code(rank)
                pending.discard(rank)

        start = time.monotonic()
        deadline = start + timeout_s
        grace_deadline = start + FAILURE_GRACE_S if dead else None
        while pending:
            now = time.monotonic()
            limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
            if now >= limit:
                break
            waitables = {self._conns[r]: r for r in pending}
            waitables.update({w: r for r in pending for w in self._death_waitables(r)})
            for ready in wait(list(waitables), min(limit - now, SIGNAL_POLL_S)):
                rank = waitables[ready]
                if rank not in pending:
                    continue
                reply = None
                if ready is self._conns[rank] or self._conns[rank].poll():
                    try:
                        reply = self._conns[rank].recv()
                    except (EOFError, OSError):
                        reply = None
                    except Exception as exc:  # noqa: BLE001 - the reply arrived whole but does not load here
                        reply = ("error", task_id, _unloadable_reply_message(fn, exc))
                if reply is None:
                    dead[rank] = self._exit_code(rank)
                elif reply[1] != task_id:
                    continue  # a stale reply cannot happen on a healthy pool; ignore defensively
                elif reply[0] == "ok":
                    results[rank] = reply[2]
                else:
                    errors[rank] = reply[2]
                pending.discard(rank)
            if (errors or dead) and grace_deadline is None:
                grace_deadline = time.monotonic() + FAILURE_GRACE_S

        if not errors and not dead and not pending:
            return results

        stuck = self._dump_stacks(sorted(pending)) if pending else {}
        dead_stacks = {rank: self._last_words(rank) for rank in dead}
        sticky = next((why for why in map(sticky_device_error, errors.values()) if why), None)
        torn_down = bool(pending or dead or sticky)
        if sticky:
            self.retired_because = sticky
        if torn_down:
            self.kill()
        elapsed = time.monotonic() - start
        raise TaskFailed(
            self._failure_message(fn, timeout_s, elapsed, errors, dead, dead_stacks, stuck, torn_down),
            errors=errors, dead=dead, stuck=stuck, pool_torn_down=torn_down,
        )

    def _failure_message(self, fn, timeout_s, elapsed, errors, dead, dead_stacks, stuck, torn_down):
        world = self.spec.world_size
        name = _task_name(fn)
        who = f"ddpbench: {self.name}: " if self.name else "ddpbench: "
        texts = set(errors.values())
        if not dead and not stuck and len(texts) == 1 and next(iter(texts)).startswith(LOAD_FAILURE_PREFIX):
            # The ranks could not import what the task names: one message says what and the fix.
            where = "every rank" if len(errors) == world else f"rank(s) {sorted(errors)} of {world}"
            pool = f" of {self.label}" if self.name else ""
            return f"{texts.pop()}\n(Reported by {where}{pool} for task {name}.)"
        lines = []
        if errors:
            lines.append(f"{who}task {name} raised on rank(s) {sorted(errors)} of {world}.")
        if dead:
            lines.append(f"{who}rank(s) {sorted(dead)} of {world} died while running task {name}.")
        if stuck:
            if errors or dead:
                lines.append(f"{who}rank(s) {sorted(stuck)} were still waiting "
                             f"{FAILURE_GRACE_S:.0f} s later (stuck in a collective with the failed rank?).")
            else:
                lines.append(f"{who}task {name} did not finish within {timeout_s:g} s "
                             f"(--dist-timeout); stuck rank(s): {sorted(stuck)}.")
        for rank, tb in sorted(errors.items()):
            lines.append(f"\n--- {self._rank_label(rank)} traceback ---\n{tb.rstrip()}")
        for rank, code in sorted(dead.items()):
            lines.append(f"\n--- {self._rank_label(rank)}: {self._describe_death(code)} ---{dead_stacks.get(rank, '')}")
        for rank, stack in sorted(stuck.items()):
            lines.append(f"\n--- {self._rank_label(rank)} was stuck here (faulthandler dump) ---\n{stack.rstrip()}")
        if self.retired_because:
            lines.append(f"\n{self.retired_because}: the device's state cannot be trusted by later "
                         f"tasks in these processes, so the pool was retired.")
        if torn_down:
            lines.append(f"\n{self.label[0].upper()}{self.label[1:]} was torn down after {elapsed:.1f} s; "
                         f"{self._after_teardown}")
        return "\n".join(lines)

    # ------------------------------------------------------------------------------------------

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the ranks politely; kill whatever does not exit in time."""
        if self.alive:
            self.alive = False
            for conn in self._conns:
                try:
                    conn.send(("stop",))
                except OSError:
                    pass
            self._wait_for_exit(timeout_s)
        self.kill()



class RankPool(PoolBase):
    """``world_size`` persistent rank processes on this machine, spawned by the controller."""

    def __init__(self, spec: PoolSpec, start_timeout_s: float = 120.0, pg_timeout_s: float = 1800.0,
                 pin_cores: bool = False, launch: RankLaunch | None = None, name: str | None = None):
        super().__init__(spec, name)
        self.pinned = should_pin(spec.world_size, pin_cores)
        self.launch = launch
        self._store_dir = rendezvous.make_private_store_dir()
        self._procs: list = []
        context = multiprocessing.get_context("spawn")
        try:
            for rank in range(spec.world_size):
                if launch is not None:
                    proc, parent_end = _start_rank_subprocess(spec, rank, self._store_dir, pg_timeout_s,
                                                              self.pinned, launch)
                else:
                    parent_end, child_end = context.Pipe(duplex=True)
                    proc = context.Process(
                        target=_rank_main,
                        args=(spec, rank, self._store_dir, child_end, os.getpid(), pg_timeout_s,
                              self.pinned),
                        name=f"ddpbench-rank{rank}",
                        daemon=False,  # ranks may start DataLoader workers of their own
                    )
                    proc.start()
                    child_end.close()
                self._procs.append(proc)
                self._conns.append(parent_end)
            _live_pools.add(self)
            self._wait_until_ready(start_timeout_s)
        except BaseException:
            self.kill()
            raise
        self.alive = True

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def _task_sys_path(self) -> list[str]:
        if self.launch is not None and self.launch.foreign_interpreter:
            # Another interpreter keeps its own packages: forward only the project's folders.
            return project_folders(sys.path)
        return list(sys.path)

    def _wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = set(range(self.spec.world_size))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PoolStartError(
                    f"ddpbench: ranks {sorted(pending)} of {self.label} did not join the "
                    f"process group within {timeout_s:.0f} s."
                )
            waitables = {self._conns[r]: r for r in pending}
            waitables.update({self._procs[r].sentinel: r for r in pending})
            for ready in wait(list(waitables), min(remaining, SIGNAL_POLL_S)):
                rank = waitables[ready]
                if rank not in pending:
                    continue
                if ready is self._conns[rank] or self._conns[rank].poll():
                    try:
                        self._conns[rank].recv()
                        pending.discard(rank)
                        continue
                    except (EOFError, OSError):
                        pass
                self._procs[rank].join(0.5)
                raise PoolStartError(
                    f"ddpbench: rank {rank} of {self.label} exited while starting "
                    f"({_describe_exit(self._procs[rank].exitcode)}); its stderr is in the captured "
                    f"output above.{self._read_stack(rank)}"
                )

    def _death_waitables(self, rank: int) -> list:
        return [self._procs[rank].sentinel]

    def _exit_code(self, rank: int) -> int | None:
        self._procs[rank].join(0.5)
        return self._procs[rank].exitcode

    def _last_words(self, rank: int) -> str:
        return self._read_stack(rank)

    def _wait_for_exit(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))

    def _stack_path(self, rank: int) -> str:
        return os.path.join(self._store_dir, f"rank{rank}.stack")

    def _read_stack(self, rank: int) -> str:
        try:
            with open(self._stack_path(rank)) as fh:
                text = fh.read().strip()
        except OSError:
            return ""
        return f"\n{text}" if text else ""

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        sizes = {}
        for rank in ranks:
            try:
                sizes[rank] = os.path.getsize(self._stack_path(rank))
            except OSError:
                sizes[rank] = 0
            try:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
            except OSError:
                pass
        deadline = time.monotonic() + STACK_DUMP_WAIT_S
        stacks = {}
        for rank in ranks:
            text, previous = "", None
            while True:
                try:
                    with open(self._stack_path(rank)) as fh:
                        fh.seek(sizes[rank])
                        text = fh.read()
                except OSError:
                    text = ""
                # faulthandler writes thread after thread, the signalled ("Current") one last:
                # the dump is complete once that section is there and the file stopped growing.
                if ("Current thread" in text and text == previous) or time.monotonic() >= deadline:
                    break
                previous = text
                time.sleep(0.05)
            stacks[rank] = text or "(no stack dump was written)"
        return stacks

    def kill(self) -> None:
        """Kill every rank and every process a rank started, by pid; remove the store directory."""
        self.alive = False
        victims = []
        for proc in self._procs:
            if proc.pid is None:
                continue
            try:
                parent = psutil.Process(proc.pid)
                victims.extend(parent.children(recursive=True))
                victims.append(parent)
            except psutil.Error:
                pass
        for victim in victims:
            try:
                victim.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(victims, timeout=5)
        for proc in self._procs:
            proc.join(1)
            getattr(proc, "close_handles", lambda: None)()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        rendezvous.remove_store_dir(self._store_dir)
        _live_pools.discard(self)


class _SubprocessRank:
    """A rank started with ``python -c`` (RankLaunch), with the attributes of
    multiprocessing.Process that the pool uses: pid, sentinel, join, exitcode.

    Its sentinel is a pidfd where the OS has them; elsewhere the read end of a pipe whose write
    end only the rank holds, which reads end-of-file once the rank is gone."""

    def __init__(self, popen: "subprocess.Popen", exit_pipe: int):
        self._popen = popen
        self.pid = popen.pid
        self._exit_pipe: int | None = exit_pipe
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)  # readable once the process has exited
        except (AttributeError, OSError):
            self._pidfd = None

    @property
    def sentinel(self) -> int:
        return self._pidfd if self._pidfd is not None else self._exit_pipe

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def close_handles(self) -> None:
        for name in ("_pidfd", "_exit_pipe"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)


def _start_rank_subprocess(spec: PoolSpec, rank: int, store_dir: str, pg_timeout_s: float,
                           pin: bool, launch: RankLaunch):
    """Start one rank with the launch's interpreter, import path and environment; returns (rank,
    connection)."""
    import socket as _socket
    from multiprocessing import current_process
    from multiprocessing.connection import Connection

    parent_sock, child_sock = _socket.socketpair()
    exit_read, exit_write = os.pipe()  # the sentinel where there are no pidfds
    env = launch.environment()
    # The rank shares tensors with the controller through multiprocessing's resource sharer,
    # which authenticates with the process's authkey: hand ours over.
    env["DDPBENCH_RANK_AUTHKEY"] = bytes(current_process().authkey).hex()
    command = launch.command(
        RANK_MAIN, "--fd", str(child_sock.fileno()), "--rank", str(rank), "--world-size", str(spec.world_size),
        "--backend", spec.backend, "--device", spec.device, "--store-dir", store_dir,
        "--parent-pid", str(os.getpid()), "--pg-timeout", str(pg_timeout_s))
    if pin:
        command.append("--pin")
    try:
        popen = subprocess.Popen(command, env=env, pass_fds=(child_sock.fileno(), exit_write),
                                 stdin=subprocess.DEVNULL)
    except OSError as exc:
        parent_sock.close()
        os.close(exit_read)
        raise PoolStartError(f"ddpbench: cannot start rank {rank} with {command[0]}: {exc}") from exc
    finally:
        child_sock.close()
        os.close(exit_write)
    return _SubprocessRank(popen, exit_read), Connection(parent_sock.detach())


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


class PoolRegistry:
    """One live pool per :class:`PoolSpec`, reused until it breaks; a broken one is replaced."""

    def __init__(self, start_timeout_s: float = 120.0, pin_cores: bool = False):
        self._pools: dict[tuple, RankPool] = {}
        self._start_timeout_s = start_timeout_s
        self._pin_cores = pin_cores
        self.started = 0  # how many pools this registry has started (tests check reuse with it)

    def get(self, spec: PoolSpec, launch: RankLaunch | None = None, index: int = 0,
            owner: str | None = None) -> RankPool:
        """The live pool for ``spec`` (started with ``launch`` when given). ``owner`` and ``index``
        tell apart pools that must never be shared although spec and launch may be equal (A/B: the
        baseline's pool 1 and the candidate's pool 1 of identical sides); the pool is then named
        "<owner> pool <index>" in every message."""
        key = (spec, launch, index, owner)
        pool = self._pools.get(key)
        if pool is None or not pool.alive:
            pool = RankPool(spec, start_timeout_s=self._start_timeout_s, pin_cores=self._pin_cores,
                            launch=launch, name=f"{owner} pool {index}" if owner else None)
            self._pools[key] = pool
            self.started += 1
        return pool

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
