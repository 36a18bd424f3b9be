"""ddpbench: a pytest-benchmark regression suite for PyTorch distributed training. The public API is
imported lazily, so ``import ddpbench`` does not import torch (docs/design/where-things-live.md#the-public-api)."""

_EXPORTS = {
    "Workload": "ddpbench.workloads",
    "FunctionWorkload": "ddpbench.workloads",
    "RankContext": "ddpbench.pool",
    "CaseResult": "ddpbench.fixture",
    "DistBenchmark": "ddpbench.fixture",
    "ModelTraining": "ddpbench.workloads.training.model_training",
    "LightningTraining": "ddpbench.workloads.training.lightning_training",
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
