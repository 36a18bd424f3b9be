"""Benchmark workloads, one module per family.

A workload is a small picklable descriptor (the nccl-tests model): the engine in
:mod:`ddpbench.timing` calls ``setup`` once per rank, ``run_round`` once per round, then
``rank_metrics``, ``check`` and ``teardown``; the controller calls ``extra_info`` with the measured
median. A workload never times itself and the engine never knows what a workload does.
"""

from __future__ import annotations

from typing import Any


class Workload:
    """Base class with the optional hooks filled in. Subclasses must be picklable."""

    #: pytest-benchmark group the case is shown in (None: pytest-benchmark's default grouping).
    group: str | None = None
    #: On pools with --dist-pin-cores=auto, keep each rank on its own core while measuring.
    #: Workloads that start processes of their own (DataLoader workers) set this to False.
    pin_to_core: bool = True

    def setup(self, ctx) -> Any:
        """Build this rank's state (tensors, models...) outside the timed rounds."""
        raise NotImplementedError

    def run_round(self, state: Any) -> None:
        """One timed round. Must issue the same collectives on every rank."""
        raise NotImplementedError

    def rank_metrics(self, state: Any) -> dict[str, Any]:
        """Extra numbers measured on this rank (numbers are combined as the max over ranks)."""
        return {}

    def check(self, state: Any) -> None:
        """Raise (AssertionError with a message) if the workload computed a wrong result."""

    def teardown(self, state: Any) -> None:
        """Free what setup made; runs even when a round or the check raised."""

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        """Case-level extra_info computed in the controller from the median round time."""
        return {}
