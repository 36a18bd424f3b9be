"""ddpbench: a pytest-benchmark regression suite for PyTorch distributed training."""

__all__ = ["PackedTensorDataset", "pack_tensors"]


def __getattr__(name):
    # Lazy, so that loading the pytest plugin does not import torch.
    if name in ("PackedTensorDataset", "pack_tensors"):
        from . import packed

        return getattr(packed, name)
    raise AttributeError(f"module 'ddpbench' has no attribute {name!r}")
