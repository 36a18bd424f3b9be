"""Message sizes that cannot fit stop pytest with a usage error before any rank starts."""

import pytest

from ddpbench.workloads.collective_cases import check_memory
from ddpbench.pool import PoolSpec

GIB = 1024**3


class _Item:
    def __init__(self, size, spec, skipped=False):
        self.callspec = type("CallSpec", (), {"params": {"dist_message_size": size, "dist_spec": spec}})()
        self._skipped = skipped

    def get_closest_marker(self, name):
        return object() if (name == "skip" and self._skipped) else None


CPU2 = PoolSpec("gloo", 2, "cpu")


def test_sizes_that_fit_pass():
    check_memory([_Item(100 * 1024**2, CPU2)], 1, host_available=8 * GIB, gpu_free=lambda: None)


def test_a_size_that_cannot_fit_names_the_need_and_what_is_available():
    with pytest.raises(pytest.UsageError) as info:
        check_memory([_Item(1024**2, CPU2), _Item(4 * GIB, CPU2)], 1, host_available=16 * GIB,
                     gpu_free=lambda: None)
    message = str(info.value)
    assert "4GB" in message and "gloo, 2 ranks" in message
    assert "need about 32.8 GiB" in message and "16.0 GiB of host memory is available" in message
    assert "--dist-sizes" in message


def test_ab_mode_counts_every_pool_of_both_sides():
    items = [_Item(1 * GIB, CPU2)]
    check_memory(items, 1, host_available=16 * GIB, gpu_free=lambda: None)
    with pytest.raises(pytest.UsageError, match="x 2 pools") as one_each:
        check_memory(items, 2, host_available=16 * GIB, gpu_free=lambda: None)
    assert "--dist-ab-pools-per-side" not in str(one_each.value)  # one pool per side already
    check_memory(items, 2, host_available=24 * GIB, gpu_free=lambda: None)
    with pytest.raises(pytest.UsageError, match="x 4 pools") as two_each:
        check_memory(items, 4, host_available=24 * GIB, gpu_free=lambda: None)
    assert "need about 35.0 GiB" in str(two_each.value) and "--dist-ab-pools-per-side=1" in str(two_each.value)


def test_nccl_cases_are_held_against_the_smallest_gpus_free_memory():
    items = [_Item(1 * GIB, PoolSpec("nccl", 1, "cuda"))]
    check_memory(items, 1, host_available=1 * GIB, gpu_free=lambda: 80 * GIB)  # host memory not used
    with pytest.raises(pytest.UsageError, match="smallest GPU has 2.0 GiB free"):
        check_memory(items, 1, host_available=64 * GIB, gpu_free=lambda: 2 * GIB)


def test_skipped_cases_are_not_counted():
    check_memory([_Item(64 * GIB, CPU2, skipped=True)], 1, host_available=1 * GIB, gpu_free=lambda: None)


def test_the_whole_run_stops_with_a_usage_error(pytester):
    pytester.makepyfile(test_bench='''
from ddpbench.workloads.collectives import Collective

def test_all_reduce(dist_benchmark, dist_message_size):
    dist_benchmark(Collective("all_reduce", dist_message_size))
''')
    result = pytester.runpytest_subprocess("--dist-sizes=1MB,4096GB", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dist-sizes: the 4096GB collective cases on gloo, 2 ranks, cpu need about*"
                                 "*of host memory is available*"])
    assert "passed" not in result.stdout.str()  # no case ran, so no rank started


def test_listing_the_cases_is_not_refused(pytester):
    # --collect-only starts no rank and allocates nothing: a size that cannot fit is still listed,
    # whatever memory the machine has free at that moment.
    pytester.makepyfile(test_bench='''
from ddpbench.workloads.collectives import Collective

def test_all_reduce(dist_benchmark, dist_message_size):
    dist_benchmark(Collective("all_reduce", dist_message_size))
''')
    result = pytester.runpytest_subprocess("--dist-sizes=1MB,4096GB", "-p", "no:cacheprovider", "--collect-only",
                                           "-q", timeout=120)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*test_all_reduce*4096GB*"])


# ``ddpbench census``'s pre-flight: what the simulation itself will allocate, FSDP2's padding included.

def test_the_census_preflight_counts_fsdp2s_padding_which_grows_with_n():
    """FSDP2 pads each parameter's first dimension to a multiple of N rows: at N = 2**20 one block of
    cpu-small gathers 1352 columns x 2**20 rows of fp32 (5.67 GB), whatever its 1.84 M parameters."""
    from ddpbench.scale import fsdp2_padded_bytes, memory_needed_bytes
    from ddpbench.workloads.training.transformer import TransformerTraining

    workload = TransformerTraining(impl="fsdp2")
    _, gathered = fsdp2_padded_bytes(workload, 2**20)
    assert gathered == 1352 * 2**20 * 4
    assert memory_needed_bytes(workload, 2**20) > 2 * gathered
    assert memory_needed_bytes(workload, 2**20) > memory_needed_bytes(workload, 1024) > 0


def test_the_census_preflight_covers_what_fsdp2s_gathers_hold_at_large_n():
    """Held against the memory census of the same step at N = 2**16 (fake tensors, every buffer's
    bytes counted): the estimate is at least its gathered parameters and buffers."""
    from ddpbench.scale import memory_needed_bytes
    from ddpbench.scale.memory import simulate_memory
    from ddpbench.workloads.training.transformer import TransformerTraining

    workload = TransformerTraining(impl="fsdp2", batch_size=1, data_batches=1)
    peak = simulate_memory(workload, 2**16, warmup_steps=1)
    gathered = sum(peak["peak_breakdown"].get(key, 0) for key in
                   ("unsharded_parameters", "all_gather_buffers", "reduce_scatter_buffers", "unsharded_gradients"))
    assert gathered > 300 * 2**20  # a block's padded gather: 1352 x 65536 rows x 4 B = 354 MB
    assert memory_needed_bytes(workload, 2**16) >= peak["peak_bytes"]


def test_the_census_is_refused_naming_the_padding_when_it_cannot_fit(monkeypatch, capsys):
    import psutil

    import ddpbench.scale
    from ddpbench import cli

    class Memory:
        available = 4 * GIB

    def simulate(*args, **kwargs):
        raise AssertionError("the pre-flight let through a simulation this machine cannot hold")

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)
    monkeypatch.setattr(ddpbench.scale, "census_at_scale", simulate)
    assert cli.main(["census", "--impl", "fsdp2", "--world-sizes", "8,1048576", "--no-chart"]) == 2
    err = capsys.readouterr().err
    assert "ddpbench census: error: simulating cpu-small with fsdp2 at 1048576 ranks needs about" in err
    assert "each parameter padded to a multiple of 1048576 rows" in err
    assert "this machine has 4.0 GiB available; use a smaller --size or smaller --world-sizes" in err
