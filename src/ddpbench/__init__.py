"""ddpbench: a pytest-benchmark regression suite for PyTorch distributed training.

The public API for benchmarking your own distributed code (README, "A first benchmark"):

* ``Workload`` -- base class of a workload: ``setup(ctx) -> state``, ``run_round(state)`` and the
  optional ``check``, ``teardown``, ``rank_metrics``, ``extra_info``, ``group``, ``pin_to_core``;
* ``FunctionWorkload(setup, run_round, check=None, *, teardown=None, name=None, group=None)`` --
  the same from module-level functions;
* ``RankContext`` -- what ``setup`` receives on every rank (rank, world_size, backend, device...);
* ``DistBenchmark`` -- the ``dist_benchmark`` fixture's value; calling it returns a ``CaseResult``;
* ``PackedTensorDataset`` / ``pack_tensors`` -- one storage for many tensors (cheap to share);
* ``__version__``.

Everything is imported lazily, so ``import ddpbench`` (and loading the pytest plugin) does not
import torch.
"""

_EXPORTS = {
    "Workload": "ddpbench.workloads",
    "FunctionWorkload": "ddpbench.workloads",
    "RankContext": "ddpbench.pool",
    "CaseResult": "ddpbench.fixture",
    "DistBenchmark": "ddpbench.fixture",
    "PackedTensorDataset": "ddpbench.data.packed",
    "pack_tensors": "ddpbench.data.packed",
}

__all__ = [*_EXPORTS, "__version__"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ddpbench")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def __getattr__(name):
    # Lazy, so that loading the pytest plugin does not import torch.
    if name == "__version__":
        value = _version()
    elif name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'ddpbench' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
