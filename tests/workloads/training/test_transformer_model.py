"""The GPT-style decoder of the transformer family: shapes, parameter counts per named size, tied
embeddings, causality, and synthetic data whose loss really goes down (single process)."""

from __future__ import annotations

import pytest
import torch

from ddpbench.workloads.training.gpt import GPTConfig, build_gpt, gpt_config, make_tokens

TINY = GPTConfig(vocab=64, seq_len=16, dim=32, layers=2, heads=4, batch_size=4)


@pytest.mark.parametrize("size, low, high", [("cpu-small", 1e6, 5e6), ("cpu-large", 5e6, 20e6),
                                             ("gpt2-124m", 120e6, 128e6), ("gpt-1b", 0.9e9, 1.2e9)])
def test_named_sizes_have_their_parameter_counts(size, low, high):
    cfg = gpt_config(size)
    assert low <= cfg.parameter_count <= high
    if cfg.parameter_count < 20e6:  # build the small ones; the formula is checked on them
        model = build_gpt(size)
        assert sum(p.numel() for p in model.parameters()) == cfg.parameter_count
    else:
        with torch.device("meta"):
            model = build_gpt(size)
        assert sum(p.numel() for p in model.parameters()) == cfg.parameter_count


def test_unknown_size_is_rejected():
    with pytest.raises(ValueError, match="unknown GPT size 'nano'; expected one of cpu-small"):
        gpt_config("nano")


def test_logits_shape_tied_embeddings_and_causality():
    torch.manual_seed(0)
    model = build_gpt(TINY)
    assert model.head.weight is model.wte.weight
    x = torch.randint(0, TINY.vocab, (3, TINY.seq_len))
    out = model(x)
    assert out.shape == (3, TINY.seq_len, TINY.vocab)
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % TINY.vocab  # a later token never changes earlier logits
    torch.testing.assert_close(model(changed)[:, :-1], out[:, :-1])


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = build_gpt(TINY)
    ckpt = build_gpt(TINY, activation_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    x, y = make_tokens(TINY, 2, 1, seed=0, rank=0)
    grads = []
    for model in (plain, ckpt):
        torch.nn.functional.cross_entropy(model(x[0]).flatten(0, 1), y[0].flatten()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_tokens_are_deterministic_per_rank_and_shifted():
    a = make_tokens(TINY, 4, 2, seed=0, rank=0)
    b = make_tokens(TINY, 4, 2, seed=0, rank=0)
    other = make_tokens(TINY, 4, 2, seed=0, rank=1)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], other[0])
    assert a[0].shape == (2, 4, TINY.seq_len) and a[0].dtype == torch.int64
    torch.testing.assert_close(a[0][..., 1:], a[1][..., :-1])


def test_loss_goes_down_over_20_steps():
    torch.manual_seed(0)
    cfg = gpt_config("cpu-small")
    model = build_gpt(cfg)
    inputs, targets = make_tokens(cfg, 8, 4, seed=0, rank=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(20):
        x, y = inputs[step % 4], targets[step % 4]
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(torch.log(torch.tensor(float(cfg.vocab))).item(), rel=0.05)
    assert sum(losses[-4:]) / 4 < 0.8 * losses[0]
