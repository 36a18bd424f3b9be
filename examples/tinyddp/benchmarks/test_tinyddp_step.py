"""tinyddp's benchmarks: each test runs once per --dist-world-sizes (gloo on CPU) and on NCCL
under the gpu markers; the rounds land in pytest-benchmark like any other benchmark."""

import functools

import pytest

import ddpbench
from tinyddp import bench


@pytest.mark.parametrize("batch_size", [32, 128])
def test_ddp_step(dist_benchmark, batch_size):
    setup = functools.partial(bench.setup_ddp_step, batch_size=batch_size)  # parameters: a partial
    dist_benchmark(ddpbench.FunctionWorkload(setup, bench.run_ddp_step, name="tinyddp-step"))


@pytest.mark.parametrize("hidden", [128, 512])
def test_ddp_step_by_width(dist_benchmark, hidden):
    result = dist_benchmark(bench.DDPStep(hidden))
    assert result.extra_info["samples_per_second"] > 0
    assert result.extra_info["final_loss"] > 0
