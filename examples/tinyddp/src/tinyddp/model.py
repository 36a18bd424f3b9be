"""The project's model and training step: the code whose speed the benchmarks guard."""

import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.layers(x)


def make_batch(batch_size: int, features: int, classes: int, seed: int, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(batch_size, features, generator=generator)
    targets = torch.randint(0, classes, (batch_size,), generator=generator)
    return inputs.to(device), targets.to(device)


def train_step(model, optimizer, inputs, targets):
    """One optimizer step; under DistributedDataParallel, backward() all-reduces the gradients."""
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss
