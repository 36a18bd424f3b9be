"""Datasets users import: :class:`~ddpbench.data.packed.PackedTensorDataset`, many tensors in one
storage (cheap to hand to other processes)."""
