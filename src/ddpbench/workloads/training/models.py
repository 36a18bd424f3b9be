"""The models and their synthetic data (no downloads; deterministic per seed and rank): ``mlp``
and ``cnn`` on CIFAR-100-shaped images labelled by a fixed random linear teacher, ``lstm`` on
characters from a fixed random Markov chain, so the loss really goes down."""

from __future__ import annotations

from typing import Any

MODELS = ("mlp", "cnn", "lstm")
IMPLS = ("manual", "ddp", "lightning", "dataparallel")

IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 100
VOCAB = 64
SEQ_LEN = 32  # characters per training sequence (the target is the next character)


def build_model(name: str):
    import torch.nn as nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, NUM_CLASSES))
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 8 * 8, NUM_CLASSES),
        )
    if name == "lstm":
        return CharLSTM()
    raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")


def _char_lstm_class():
    import torch.nn as nn

    class _CharLSTM(nn.Module):
        """Embedding -> LSTM -> per-position logits over the alphabet, shape (B, T, VOCAB)."""

        def __init__(self, embed: int = 32, hidden: int = 128):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, embed)
            self.lstm = nn.LSTM(embed, hidden, batch_first=True)
            self.head = nn.Linear(hidden, VOCAB)

        def forward(self, x):
            out, _ = self.lstm(self.embed(x))
            return self.head(out)

    return _CharLSTM


def CharLSTM():  # noqa: N802 - a factory, so importing this module does not import torch
    return _char_lstm_class()()


def loss_fn(output, target):
    """Cross-entropy for both shapes: (B, C) vs (B,) and (B, T, V) vs (B, T)."""
    import torch.nn.functional as F

    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _generator(*parts: int):
    import torch

    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + int(part)) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


# Training.check's extra step draws its micro-batches (and their teacher) from seed + this.
CHECK_DATA_SEED_OFFSET = 7919


def make_data(model: str, batch_size: int, num_batches: int, seed: int, rank: int):
    """(inputs, targets) of shape (num_batches, batch_size, ...): this rank's micro-batches.

    The labelling rule (teacher / Markov chain) depends on ``seed`` only; the samples depend on
    ``(seed, rank)``, so every rank trains on different data.
    """
    import torch

    shared = _generator(seed, 1)
    own = _generator(seed, 2, rank)
    if model in ("mlp", "cnn"):
        teacher = torch.randn(3 * 32 * 32, NUM_CLASSES, generator=shared)
        x = torch.randn(num_batches, batch_size, *IMAGE_SHAPE, generator=own)
        y = (x.reshape(num_batches, batch_size, -1) @ teacher).argmax(-1)
        return x, y
    if model == "lstm":
        transition = torch.softmax(3.0 * torch.randn(VOCAB, VOCAB, generator=shared), dim=-1)
        count = num_batches * batch_size
        seq = torch.empty(count, SEQ_LEN + 1, dtype=torch.int64)
        seq[:, 0] = torch.randint(0, VOCAB, (count,), generator=own)
        for t in range(SEQ_LEN):
            seq[:, t + 1] = torch.multinomial(transition[seq[:, t]], 1, generator=own).squeeze(1)
        seq = seq.reshape(num_batches, batch_size, SEQ_LEN + 1)
        return seq[..., :-1].contiguous(), seq[..., 1:].contiguous()
    raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")


def _parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def flat_parameters(model) -> Any:
    import torch

    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
