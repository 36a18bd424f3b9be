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

Run by the controller: :mod:`.base`, :mod:`.local` (pools on this machine), :mod:`.rank_launch`
(their ranks in another interpreter), :mod:`.external` (ranks torchrun started). Run in a rank:
:mod:`.local_rank` (a local pool's), :mod:`ddpbench.worker` (torchrun's), :mod:`.task_loop` (both).
"""

from .base import (FAILURE_GRACE_S, SIGNAL_POLL_S, PoolBase, PoolError, PoolSpec, PoolStartError, RankContext,
                   SendRefused, TaskError, TaskFailed, sticky_device_error)
from .local import PoolRegistry, RankPool
from .pinning import cores_available, set_process_affinity, should_pin
from .rank_launch import RANK_BOOTSTRAP, RankLaunch, project_folders
from .task_loop import serve_tasks

__all__ = ["FAILURE_GRACE_S", "SIGNAL_POLL_S", "PoolBase", "PoolError", "PoolRegistry", "PoolSpec",
           "PoolStartError", "RANK_BOOTSTRAP", "RankContext", "RankLaunch", "RankPool", "SendRefused",
           "TaskError", "TaskFailed", "cores_available", "project_folders", "serve_tasks", "set_process_affinity",
           "should_pin", "sticky_device_error"]
