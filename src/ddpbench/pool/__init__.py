"""Persistent rank processes: start them once, run tasks on all of them, notice when they break
(docs/design.md#the-rank-pool)."""

from .base import (FAILURE_GRACE_S, SIGNAL_POLL_S, PoolBase, PoolError, PoolSpec, PoolStartError, RankContext,
                   SendRefused, TaskError, TaskFailed, sticky_device_error)
from .launch import RANK_BOOTSTRAP, RankLaunch, project_folders
from .local import PoolRegistry, RankPool
from .ranks import cores_available, serve_tasks, set_process_affinity, should_pin

__all__ = ["FAILURE_GRACE_S", "SIGNAL_POLL_S", "PoolBase", "PoolError", "PoolRegistry", "PoolSpec",
           "PoolStartError", "RANK_BOOTSTRAP", "RankContext", "RankLaunch", "RankPool", "SendRefused",
           "TaskError", "TaskFailed", "cores_available", "project_folders", "serve_tasks", "set_process_affinity",
           "should_pin", "sticky_device_error"]
