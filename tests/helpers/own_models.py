"""A user's own small models, as ddpbench.ModelTraining takes them (module-level factories, so the
ranks import them): an MLP for DDP, a stack of transformer blocks for FSDP2 (own_lightning.py: a
LightningModule and its LightningDataModule), and rank tasks that look into them."""

import torch
import torch.nn as nn

IN_FEATURES, CLASSES = 32, 10
SEQ_LEN, VOCAB, WIDTH = 16, 64, 32


def mlp():
    return nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def image_batch(ctx, index, batch_size=16):
    """Random inputs and labels: each rank draws its own (the workload seeds each rank apart)."""
    return torch.randn(batch_size, IN_FEATURES), torch.randint(0, CLASSES, (batch_size,))


class Block(nn.Module):
    """A pre-LayerNorm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, width=WIDTH, heads=2):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), 1)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def token_batch(ctx, index, batch_size=4):
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1))
    return tokens[:, :-1], tokens[:, 1:]


# ----------------------------------------------------------------------------------------------
# Rank tasks
# ----------------------------------------------------------------------------------------------


def trained_batches_digest(ctx, workload, steps=2):
    """This rank's digest of the micro-batches its last of ``steps`` optimizer steps trained on."""
    from ddpbench.workloads.training.own_code import batches_digest

    state = workload.setup(ctx)
    try:
        for _ in range(steps):
            workload.run_round(state)
        return batches_digest(state["loop"].last_step_batches)
    finally:
        workload.teardown(state)


def context_ranks(ctx):
    return ctx.rank, ctx.local_rank


def first_step_loss(ctx, workload):
    """This rank's loss of the workload's first optimizer step, and whether dynamo compiled a frame."""
    import sys

    state = workload.setup(ctx)
    try:
        loss = float(workload.run_round(state))
    finally:
        workload.teardown(state)
    dynamo = sys.modules.get("torch._dynamo")
    frames = int(dynamo.utils.counters["frames"]["total"]) if dynamo is not None else 0
    return loss, frames > 0 if workload.compile else None
