"""A user's own LightningModule and LightningDataModule, as ddpbench.LightningTraining takes them
(module-level classes, so the ranks import them), and a rank task that makes a Trainer the way a
user's own set-up might inside a rank."""

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from helpers.own_models import CLASSES, IN_FEATURES, mlp


class LitClassifier(pl.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.model = mlp()
        self.lr = lr

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class RandomImages(torch.utils.data.Dataset):
    """``size`` samples drawn once from a fixed seed: the same dataset on every rank, so a sampler
    is what gives each rank its own."""

    def __init__(self, size=256):
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, IN_FEATURES, generator=generator)
        self.y = torch.randint(0, CLASSES, (size,), generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class ImagesData(pl.LightningDataModule):
    def __init__(self, batch_size=16, size=256):
        super().__init__()
        self.batch_size, self.size = batch_size, size

    def setup(self, stage=None):
        self.train = RandomImages(self.size)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train, batch_size=self.batch_size, shuffle=True)


def make_trainer_in_a_rank(ctx, devices):
    """What a user's own set-up might do: a Trainer(strategy="ddp", devices=...) inside a rank."""
    pl.Trainer(accelerator="cpu", strategy="ddp", devices=devices, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False)
    return "made"
