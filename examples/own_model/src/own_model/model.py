"""The project's own code, as it trains: a classifier MLP (trained with DDP), a small GPT of
transformer blocks in an ``nn.ModuleList`` (trained with FSDP2), and the same MLP as a
LightningModule with its LightningDataModule. The factories are module-level, as ddpbench's ranks
import them by module and name."""

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F

FEATURES, CLASSES = 64, 10
VOCAB, WIDTH, SEQ_LEN = 128, 64, 32


def mlp():
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES))


def image_batch(ctx, index, batch_size=32):
    """Micro-batch ``index`` of rank ``ctx.rank``: ddpbench draws it under a seed of its own per rank
    and index, so these random samples differ between ranks."""
    return torch.randn(batch_size, FEATURES), torch.randint(0, CLASSES, (batch_size,))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, 4, WIDTH // 4).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))  # FSDP2 shards each, then the root
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def token_batch(ctx, index, batch_size=8):
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1))
    return tokens[:, :-1], tokens[:, 1:]


def next_token_loss(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def flops_per_sequence():
    """Model FLOPs of forward and backward of one sequence: 6 per parameter and token (the usual
    estimate, attention's own left out)."""
    return 6 * sum(p.numel() for p in TinyGPT().parameters()) * SEQ_LEN


class LitClassifier(pl.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.model = mlp()
        self.lr = lr

    def training_step(self, batch, batch_idx):
        inputs, labels = batch
        loss = F.cross_entropy(self.model(inputs), labels)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Images(torch.utils.data.Dataset):
    """One fixed set of samples on every rank; Lightning's DistributedSampler deals each its shard."""

    def __init__(self, size=1024):
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(size, FEATURES, generator=generator)
        self.labels = torch.randint(0, CLASSES, (size,), generator=generator)

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, i):
        return self.inputs[i], self.labels[i]


class ImagesData(pl.LightningDataModule):
    def __init__(self, batch_size=32):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        self.train = Images()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train, batch_size=self.batch_size, shuffle=True)
