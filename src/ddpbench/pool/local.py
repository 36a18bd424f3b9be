"""Pools of rank processes on this machine: spawned by multiprocessing, or started by a
:class:`~ddpbench.pool.rank_launch.RankLaunch` (another interpreter or environment), and the registry
that keeps one live pool per shape."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import wait

import psutil

from . import rendezvous
from .base import SIGNAL_POLL_S, STACK_DUMP_WAIT_S, PoolBase, PoolSpec, PoolStartError, _describe_exit, _live_pools
from .local_rank import run_local_rank
from .pinning import should_pin
from .rank_launch import RankLaunch, project_folders, start_rank_subprocess


class RankPool(PoolBase):
    """``world_size`` persistent rank processes on this machine, spawned by the controller."""

    def __init__(self, spec: PoolSpec, start_timeout_s: float = 120.0, pg_timeout_s: float = 1800.0,
                 pin_cores: bool = False, launch: RankLaunch | None = None, name: str | None = None):
        super().__init__(spec, name)
        self.pin_cores = should_pin(spec.world_size, pin_cores)
        self.launch = launch
        self._store_dir = rendezvous.make_private_store_dir()
        self._procs: list = []
        context = multiprocessing.get_context("spawn")
        try:
            for rank in range(spec.world_size):
                if launch is not None:
                    proc, parent_end = start_rank_subprocess(spec, rank, self._store_dir, pg_timeout_s,
                                                              self.pin_cores, launch)
                else:
                    parent_end, child_end = context.Pipe(duplex=True)
                    proc = context.Process(
                        target=run_local_rank,
                        args=(spec, rank, self._store_dir, child_end, os.getpid(), pg_timeout_s,
                              self.pin_cores),
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
