"""Persistent rank processes: start them once, run tasks on all of them, notice when they break
(docs/design/plugin-and-pool.md#the-rank-pool).

Run by the controller: :mod:`.base`, :mod:`.local` (pools on this machine), :mod:`.rank_launch`
(their ranks in another interpreter), :mod:`.external` (ranks torchrun started). Run in a rank:
:mod:`.local_rank` (a local pool's), :mod:`ddpbench.worker` (torchrun's), :mod:`.task_loop` (both).
"""

from .base import (FAILURE_GRACE_S, SIGNAL_POLL_S, PoolBase, PoolError, PoolSpec, PoolStartError, RankContext,
                   SendRefused, TaskError, TaskFailed, WorkloadRefused, sticky_device_error)
from .local import PoolRegistry, RankPool
from .pinning import cores_available, set_process_affinity, should_pin
from .rank_launch import RANK_BOOTSTRAP, RankLaunch, project_folders
from .task_loop import serve_tasks

__all__ = ["FAILURE_GRACE_S", "SIGNAL_POLL_S", "PoolBase", "PoolError", "PoolRegistry", "PoolSpec",
           "PoolStartError", "RANK_BOOTSTRAP", "RankContext", "RankLaunch", "RankPool", "SendRefused",
           "TaskError", "TaskFailed", "WorkloadRefused", "cores_available", "project_folders", "serve_tasks",
           "set_process_affinity", "should_pin", "sticky_device_error"]
