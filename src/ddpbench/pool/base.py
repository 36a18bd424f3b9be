"""What every pool is: its shape (:class:`PoolSpec`), what a task receives on a rank
(:class:`RankContext`), the failures a caller sees, and :class:`PoolBase`, which runs a task on
every rank and turns errors, deaths and hangs into one :class:`TaskFailed` naming side, pool and
ranks. Local pools (:mod:`.local`) and torchrun-started ones (:mod:`.external`) say how ranks
live and die."""

from __future__ import annotations

import atexit
import itertools
import signal
import sys
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

from .picklecheck import LOAD_FAILURE_PREFIX, unpicklable_message

# After one rank fails or dies, how long the others get to finish before they count as stuck.
FAILURE_GRACE_S = 3.0
# The controller waits in slices this long: a Ctrl-C delivered to another thread of the process
# only raises KeyboardInterrupt once the main thread wakes up.
SIGNAL_POLL_S = 0.25
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


@dataclass
class RankContext:
    """What a task receives as its first argument on every rank."""

    rank: int
    world_size: int
    backend: str
    device_type: str
    # Per-rank storage that survives between tasks of the same pool (e.g. cached datasets).
    scratch: dict = field(default_factory=dict)
    # The rank's index on its node: torchrun's LOCAL_RANK, and ``rank`` itself in a local pool (every
    # rank on this machine), CPU or CUDA. None only where a caller made a context without one.
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


class TaskError(Exception):
    """Raised inside a task with a message that says everything (what went wrong and the fix):
    the rank sends back that message alone, without a traceback through ddpbench's own code."""


class WorkloadRefused(TaskError):
    """Raised on a rank when a workload uses the rank in a way that cannot measure what it claims
    (a Lightning Trainer that would launch processes or train as another rank inside it): a usage
    error, so the run stops with exit status 2 and this message (:meth:`TaskFailed.refusal`)."""


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

    def refusal(self) -> str | None:
        """The message of a :class:`WorkloadRefused` a rank raised (a usage error), or None."""
        prefix = f"{WorkloadRefused.__name__}: "
        return next((text.removeprefix(prefix) for _, text in sorted(self.errors.items())
                     if isinstance(text, str) and text.startswith(prefix)), None)



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
    pin_cores: bool = False  # each rank on a core of its own while it measures (--dist-pin-cores)
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



def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


