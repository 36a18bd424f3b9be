"""own_model's training steps as ddpbench cases: each round is one optimizer step, as the project
trains (DDP, FSDP2, a Lightning Trainer); the rounds land in pytest-benchmark like any other. The
first three are the README's lines."""

import functools

import torch

import ddpbench
from own_model import model as m

SGD = functools.partial(torch.optim.SGD, lr=0.05)
ADAMW = functools.partial(torch.optim.AdamW, lr=1e-3)


def test_ddp_mlp(dist_benchmark):
    dist_benchmark(ddpbench.ModelTraining(m.mlp, m.image_batch, SGD, ddp_options={"bucket_cap_mb": 25}))


def test_fsdp2_gpt(dist_benchmark):
    dist_benchmark(ddpbench.ModelTraining(m.TinyGPT, m.token_batch, ADAMW, wrap="fsdp2", seq_len=m.SEQ_LEN))


def test_lightning_module(dist_benchmark):
    dist_benchmark(ddpbench.LightningTraining(m.LitClassifier, datamodule=m.ImagesData, grad_accum=2))


def test_fsdp2_gpt_bf16_accumulated(dist_benchmark):
    """Two micro-batches a step (gradients synced on the second), forward and loss in bf16
    autocast, the project's own loss; the model's FLOPs per sequence give the case its MFU."""
    dist_benchmark(ddpbench.ModelTraining(m.TinyGPT, m.token_batch, ADAMW, wrap="fsdp2", loss=m.next_token_loss,
                                          grad_accum=2, autocast="bf16", seq_len=m.SEQ_LEN,
                                          flops_per_sample=m.flops_per_sequence()))
