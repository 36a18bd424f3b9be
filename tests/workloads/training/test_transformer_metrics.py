"""The training metrics module: FLOP counting, MFU arithmetic, the peak probe, memory and
parameter bytes (no timing asserted)."""

from __future__ import annotations

import pytest
import torch

from ddpbench.workloads.training import metrics
from ddpbench.workloads.training.gpt import gpt_config


def test_flops_of_a_known_linear_layer():
    layer = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    assert metrics.count_flops(layer, x) == 2 * 8 * 64 * 32  # forward: one matmul

    def fwd_bwd(inp):
        layer(inp).sum().backward()

    assert metrics.count_flops(fwd_bwd, x) == 3 * 2 * 8 * 64 * 32  # + grad input + grad weight


def test_gpt_flops_are_near_six_n_t_plus_attention():
    cfg = gpt_config("cpu-small")
    flops = metrics.gpt_flops_per_sequence("cpu-small")
    six_nt = 6 * cfg.parameter_count * cfg.seq_len
    assert six_nt < flops < 1.2 * six_nt


def test_mfu_arithmetic_with_a_fake_peak():
    # 1e12 model FLOPs per step in 0.5 s on 2 ranks of 4e12 FLOP/s each: 2e12 / 8e12.
    assert metrics.mfu(1e12, 0.5, 2, 4e12) == pytest.approx(0.25)
    assert metrics.tokens_per_second(4096, 0.5) == 8192
    # 2e12 FLOP/s achieved on 2 ranks whose largest probe read 4e12 FLOP/s: 2e12 / 8e12.
    ranks = {"peak_flops_measured": 4e12, "peak_flops_datasheet": 989e12}
    assert metrics.mfu_info(2e12, 2, ranks) == {"mfu": 0.25,
                                                "mfu_datasheet": pytest.approx(2e12 / (2 * 989e12), abs=1e-6)}
    assert metrics.mfu_info(2e12, 2, {}) == {}


def test_peak_probe_and_datasheet_on_the_cpu():
    cpu = torch.device("cpu")
    assert metrics.measure_peak_flops(cpu, torch.float32, size=128, repeats=2) > 0
    assert metrics.datasheet_peak_flops(cpu, torch.bfloat16) is None


def test_memory_and_parameter_bytes_on_the_cpu():
    model = torch.nn.Linear(10, 10)
    assert metrics.parameter_bytes(model) == {"param_bytes": 440, "sharded_param_bytes": 440}
    # on the CPU the memory census counts the step; a process's RSS high-water mark is no case's figure
    assert metrics.peak_memory(torch.device("cpu")) == {}


def test_extra_info_carries_tokens_and_flops():
    from ddpbench.workloads.training.transformer import TransformerTraining

    info = TransformerTraining(grad_accum=2).extra_info(world_size=2, median_s=0.5)
    cfg = gpt_config("cpu-small")
    assert info["tokens_per_step"] == cfg.batch_size * 2 * 2 * cfg.seq_len
    assert info["tokens_per_second"] == info["tokens_per_step"] / 0.5
    assert info["model_flops_per_step"] == metrics.gpt_flops_per_sequence("cpu-small") * cfg.batch_size * 4
    assert info["achieved_flops_per_second"] == info["model_flops_per_step"] / 0.5
    assert info["comm_hook"] == "none" and "reshard_after_forward" not in info
