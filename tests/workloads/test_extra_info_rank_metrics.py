"""``Workload.extra_info`` receives what the ranks measured: the controller passes their
``rank_metrics`` combined (numbers: the max over ranks) to an override that names a
``rank_metrics`` parameter, and calls one written as ``extra_info(world_size, median_s)`` as
before. The transformer workload computes its MFU this way, from the peaks its ranks probed."""

from __future__ import annotations

import pytest

import ddpbench
from ddpbench.engine.timing import RoundPlan
from ddpbench.fixture import DistBenchmark
from ddpbench.pool import PoolSpec, RankPool
from ddpbench.testing import SlowedDown
from ddpbench.workloads import case_extra_info
from ddpbench.workloads.training.transformer import TransformerTraining

SPEC = PoolSpec("gloo", 2, "cpu")


class OldForm(ddpbench.Workload):
    """A user's workload written before the ranks' metrics were passed."""

    def setup(self, ctx):
        return ctx.rank

    def run_round(self, state):
        pass

    def rank_metrics(self, state):
        return {"rank_probe": 10.0 + state}

    def extra_info(self, world_size, median_s):
        return {"old_form": world_size}


class NewForm(OldForm):
    def extra_info(self, world_size, median_s, rank_metrics=None):
        return {"seen_probe": (rank_metrics or {}).get("rank_probe"), "seen_world_size": world_size}


class KeywordsOnly(OldForm):
    def extra_info(self, world_size, median_s, **kwargs):
        return {"seen_keys": sorted(kwargs)}


class _DisabledBenchmark:
    """pytest-benchmark's fixture as --benchmark-disable leaves it: one unrecorded run."""

    disabled = True
    group = None

    def __init__(self):
        self.extra_info = {}

    def pedantic(self, target, rounds, iterations, **kwargs):
        target()


@pytest.fixture(scope="module")
def pool():
    p = RankPool(SPEC)
    yield p
    p.close()


def _run(pool, workload) -> dict:
    bench = DistBenchmark(_DisabledBenchmark(), pool, SPEC, RoundPlan(warmup=0, rounds=1, numerics_steps=0), timeout_s=300)
    return bench(workload).extra_info


def test_each_signature_is_called_its_own_way():
    metrics = {"rank_probe": 11.0}
    assert case_extra_info(OldForm(), 2, 0.1, metrics) == {"old_form": 2}
    assert case_extra_info(NewForm(), 2, 0.1, metrics) == {"seen_probe": 11.0, "seen_world_size": 2}
    assert case_extra_info(KeywordsOnly(), 2, 0.1, metrics) == {"seen_keys": ["rank_metrics"]}
    # the base class and FunctionWorkload take the older form's two arguments as well
    assert case_extra_info(ddpbench.Workload(), 2, 0.1, metrics) == {}
    assert ddpbench.Workload().extra_info(2, 0.1) == {}
    # a wrapper passes them on to the workload it wraps, in that workload's form
    assert case_extra_info(SlowedDown(NewForm()), 2, 0.1, metrics)["seen_probe"] == 11.0
    assert case_extra_info(SlowedDown(OldForm()), 2, 0.1, metrics) == {"old_form": 2}


def test_the_controller_passes_the_ranks_metrics_combined_and_old_overrides_still_run(pool):
    old = _run(pool, OldForm())
    assert old["old_form"] == 2 and old["rank_probe"] == 11.0  # rank 1's is the max
    new = _run(pool, NewForm())
    assert new["seen_probe"] == 11.0 and new["seen_world_size"] == 2
    assert "old_form" not in new


def test_transformer_mfu_comes_from_the_peaks_its_ranks_measured(pool):
    info = _run(pool, TransformerTraining(batch_size=2))
    assert info["peak_flops_measured"] > 0  # the ranks' probe, combined
    expected = info["achieved_flops_per_second"] / (2 * info["peak_flops_measured"])
    assert info["mfu"] == pytest.approx(expected, rel=1e-4)
    assert "mfu_datasheet" not in info  # no datasheet figure for a CPU
    # no probe on the ranks: no MFU, rather than one against a made-up peak
    assert "mfu" not in _run(pool, TransformerTraining(batch_size=2, measure_peak=False))


def test_transformer_extra_info_takes_mfu_from_the_rank_metrics_it_is_given():
    info = TransformerTraining().extra_info(2, 0.5, rank_metrics={"peak_flops_measured": 1e12})
    assert info["mfu"] == round(info["achieved_flops_per_second"] / 2e12, 6)
    assert "mfu" not in TransformerTraining().extra_info(2, 0.5)  # the older call: no ranks' figures
