"""Benchmark workloads, one module per family (collectives, training, syncbn), their datasets, and
the public base classes, defined in :mod:`.base` and re-exported here and as ``ddpbench.Workload``
and ``ddpbench.FunctionWorkload``."""

from .base import COMMUNICATION_ONLY, COMPUTE_ONLY, FunctionWorkload, Workload, case_extra_info

__all__ = ["COMMUNICATION_ONLY", "COMPUTE_ONLY", "FunctionWorkload", "Workload", "case_extra_info"]
