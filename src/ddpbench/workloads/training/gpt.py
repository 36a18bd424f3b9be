"""A GPT-style decoder and its synthetic token data, deterministic per seed and rank
(docs/design/families.md#transformers)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    """One named size: vocabulary, context (tokens per sequence), width, depth and heads."""

    vocab: int
    seq_len: int
    dim: int
    layers: int
    heads: int
    batch_size: int  # default sequences per rank and micro-batch for this size

    def __post_init__(self):
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not a multiple of heads {self.heads}")

    @property
    def parameter_count(self) -> int:
        """Parameters of :func:`build_gpt` (the tied head counted once)."""
        d = self.dim
        per_block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
        return self.vocab * d + self.seq_len * d + self.layers * per_block + 2 * d


# Named sizes: the CPU default for the 2-core machine, a larger CPU size (slow), GPT-2 small for
# GPU cases and a ~1B size (gpu and slow). GPT-2's vocabulary is padded to 50304 (a multiple of 64).
GPT_SIZES: dict[str, GPTConfig] = {
    "cpu-small": GPTConfig(vocab=256, seq_len=64, dim=192, layers=4, heads=4, batch_size=8),
    "cpu-large": GPTConfig(vocab=512, seq_len=128, dim=384, layers=6, heads=6, batch_size=8),
    "gpt2-124m": GPTConfig(vocab=50304, seq_len=1024, dim=768, layers=12, heads=12, batch_size=8),
    "gpt-1b": GPTConfig(vocab=50304, seq_len=1024, dim=2048, layers=18, heads=16, batch_size=4),
}

FOLLOW_PROBABILITY = 0.9


def gpt_config(size: str) -> GPTConfig:
    try:
        return GPT_SIZES[size]
    except KeyError:
        raise ValueError(f"unknown GPT size {size!r}; expected one of {', '.join(GPT_SIZES)}") from None


def _classes():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    class CausalSelfAttention(nn.Module):
        def __init__(self, cfg: GPTConfig):
            super().__init__()
            self.heads = cfg.heads
            self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
            self.proj = nn.Linear(cfg.dim, cfg.dim)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self, cfg: GPTConfig):
            super().__init__()
            self.ln1 = nn.LayerNorm(cfg.dim)
            self.attn = CausalSelfAttention(cfg)
            self.ln2 = nn.LayerNorm(cfg.dim)
            self.fc = nn.Linear(cfg.dim, 4 * cfg.dim)
            self.out = nn.Linear(4 * cfg.dim, cfg.dim)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        """Tokens (B, T) -> logits (B, T, vocab)."""

        def __init__(self, cfg: GPTConfig, activation_checkpointing: bool = False):
            super().__init__()
            self.cfg = cfg
            self.activation_checkpointing = activation_checkpointing
            self.wte = nn.Embedding(cfg.vocab, cfg.dim)
            self.wpe = nn.Embedding(cfg.seq_len, cfg.dim)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
            self.ln_f = nn.LayerNorm(cfg.dim)
            self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
            self.head.weight = self.wte.weight  # tied input/output embeddings
            for name, p in self.named_parameters():
                if name.endswith("weight") and p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx):
            positions = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(positions)
            for block in self.blocks:
                if self.activation_checkpointing and torch.is_grad_enabled():
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return self.head(self.ln_f(x))

    return GPT


def build_gpt(size: str | GPTConfig, activation_checkpointing: bool = False):
    """The decoder of a named size (or a :class:`GPTConfig`), initialised from torch's global RNG."""
    cfg = gpt_config(size) if isinstance(size, str) else size
    return _classes()(cfg, activation_checkpointing)


def make_tokens(cfg: GPTConfig, batch_size: int, num_batches: int, seed: int, rank: int):
    """(inputs, targets), each int64 of shape (num_batches, batch_size, seq_len): this rank's
    micro-batches; targets are the inputs shifted by one token. The successor chain depends on
    ``seed`` only, the sequences on ``(seed, rank)``."""
    import torch

    from .models import _generator

    successor = torch.randperm(cfg.vocab, generator=_generator(seed, 11))
    own = _generator(seed, 12, rank)
    count = num_batches * batch_size
    length = cfg.seq_len + 1
    follow = torch.rand(count, length, generator=own) < FOLLOW_PROBABILITY
    noise = torch.randint(0, cfg.vocab, (count, length), generator=own)
    seq = torch.empty(count, length, dtype=torch.int64)
    seq[:, 0] = noise[:, 0]
    for t in range(1, length):
        seq[:, t] = torch.where(follow[:, t], successor[seq[:, t - 1]], noise[:, t])
    seq = seq.view(num_batches, batch_size, length)
    return seq[..., :-1].contiguous(), seq[..., 1:].contiguous()
