"""What the rank loops and the reference step read from a :class:`~.workload.Training` workload,
as a protocol: they depend on these fields, not on the workload module, which imports them (the
package's imports run one way: workload -> lightning -> loops -> models)."""

from __future__ import annotations

from typing import Protocol


class TrainingSettings(Protocol):
    """A training configuration's fields that a loop or the reference step uses."""

    model: str  # a name in models.MODELS
    seed: int
    lr: float
    momentum: float
    bucket_cap_mb: float
    grad_accum: int
    compute_only: bool  # the compute-only variant (.compute_only)
