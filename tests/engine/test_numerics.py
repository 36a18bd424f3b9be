"""The numerics replay (ddpbench.engine.numerics): what it fingerprints, that it measures its own
determinism (two replays; a set-up its seeds cannot reproduce is marked, a step that is not
bitwise repeatable gives a band), that it puts every generator back, and the planted bugs only it
catches on a 2-rank gloo pool: gradients summed instead of averaged, a loss scaled by 0.5, a
parameter left out of the optimizer (ddpbench.testing.SelfmadeTraining), each a regression while an
A/A is same (bitwise). Most of it runs in this process on one rank with no process group."""

from __future__ import annotations

import os
import random

import pytest
import torch

from ddpbench.engine.numerics import combine_numerics, take_numerics
from ddpbench.engine.timing import RoundPlan, combine_rank_metrics, measure_workload
from ddpbench.gates.numerics import compare_numerics
from ddpbench.storage.records import read_numerics
from ddpbench.pool import PoolRegistry, PoolSpec
from ddpbench.testing import SelfmadeTraining
from ddpbench.workloads import Workload


class _Ctx:
    rank, world_size, backend, device_type, core, device = 0, 1, "gloo", "cpu", None, torch.device("cpu")


class Tiny(Workload):
    """One rank's SGD-with-momentum step on a small MLP; ``urandom_init``: its weights drawn from the
    OS (not reproducible under seeds); ``jitter``: the loss scaled by 1 + jitter in every second
    set-up (the first when ``jitter_first``), as a kernel whose sums land differently would."""

    def __init__(self, urandom_init=False, jitter=0.0, jitter_first=False):
        self.urandom_init, self.jitter, self.setups = urandom_init, jitter, int(jitter_first)

    def setup(self, ctx):
        self.setups += 1
        self.scale = 1 + self.jitter if self.setups % 2 == 0 else 1.0
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        if self.urandom_init:
            with torch.no_grad():
                model[0].weight.add_(int.from_bytes(os.urandom(2), "little") * 1e-6)
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                "x": torch.randn(4, 8)}

    def run_round(self, state):
        state["optimizer"].zero_grad()
        loss = state["model"](state["x"]).square().mean()
        if self.scale != 1.0:
            loss = loss * self.scale
        loss.backward()
        state["optimizer"].step()
        return loss


def _record(workload, steps=3):
    return combine_numerics([take_numerics(workload, _Ctx(), steps)])


def test_the_replay_fingerprints_the_trainable_state_after_set_up_and_each_step():
    record = _record(Tiny())
    assert record["steps"] == 3 and len(record["digests"]) == 4 and record["replays"] == 2
    assert record["replay_spread"] == 0.0 and record["first_nondeterministic_step"] is None
    first, last = read_numerics(record).ranks[0][0], read_numerics(record).ranks[0][3]
    assert set(first) == {"param 0.weight", "param 0.bias", "param 2.weight", "param 2.bias", "tensor x"}
    assert {"grad 0.weight", "opt 0.weight.momentum_buffer", "loss"} <= set(last)
    digest, l2, l1, total = last["param 0.weight"]
    assert len(digest) == 16 and l2 > 0 and l1 >= abs(total)
    assert len(set(record["digests"])) == 4  # every step moved the state
    assert compare_numerics(record, _record(Tiny())).line == "same (bitwise): 3 steps on 1 rank, 14 tensors"


def test_the_generators_are_put_back_after_the_replay():
    torch.manual_seed(5)
    random.seed(5)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(5)
    random.seed(5)
    take_numerics(Tiny(), _Ctx(), 1)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_a_set_up_its_seeds_cannot_reproduce_is_not_counted():
    record = _record(Tiny(urandom_init=True))
    assert "freshly set-up state differs between two replays" in record["not_reproducible"]
    verdict = compare_numerics(record, _record(Tiny(urandom_init=True)))
    assert verdict.verdict == "not counted" and "not reproducible under fixed seeds" in verdict.line
    one_side = compare_numerics(_record(Tiny()), record)  # counted on the baseline only
    assert one_side.verdict == "regression" and "a regression until accepted" in one_side.line


def test_steps_that_are_not_bitwise_repeatable_are_not_counted_from_the_first_that_differs():
    noisy = _record(Tiny(jitter=1e-6))
    assert noisy["first_nondeterministic_step"] == 1 and 1e-7 < noisy["replay_spread"] < 1e-5
    again = compare_numerics(noisy, _record(Tiny(jitter=1e-6, jitter_first=True)))
    assert again.verdict == "not counted" and "its replays differ from step 1" in again.line
    moved = compare_numerics(noisy, _record(Tiny(jitter=1e-3, jitter_first=True)))
    assert moved.verdict == "not counted"


def test_a_replay_that_raises_names_the_option_that_turns_it_off():
    class Broken(Tiny):
        def run_round(self, state):
            raise ValueError("no data")

    with pytest.raises(RuntimeError, match=r"numerics replay of Broken failed on rank 0: ValueError: no data "
                                           r"\(--dist-numerics-steps 0 runs the case without it\)"):
        take_numerics(Broken(), _Ctx(), 1)


@pytest.fixture(scope="module")
def registry():
    registry = PoolRegistry()
    yield registry
    registry.close()


@pytest.fixture(scope="module")
def pool(registry):
    return registry.get(PoolSpec("gloo", 2, "cpu"))


def _numerics(pool, workload) -> dict:
    plan = RoundPlan(warmup=1, rounds=2, census=False, memory_census=False)
    return combine_rank_metrics([m.metrics for m in pool.run(measure_workload, workload, plan, timeout_s=120)])["numerics"]


def test_planted_bugs_only_the_numerics_catch_are_regressions_and_an_a_a_is_same(pool):
    from ddpbench.testing import SelfmadeTraining

    baseline = _numerics(pool, SelfmadeTraining())
    assert compare_numerics(baseline, _numerics(pool, SelfmadeTraining())).line == "same (bitwise): 3 steps on 2 ranks, 15 tensors"
    lines = {bug: compare_numerics(baseline, _numerics(pool, SelfmadeTraining(bug=bug)))
             for bug in ("sum-grads", "half-loss", "frozen-param")}
    assert all(v.verdict == "regression" for v in lines.values()), lines
    assert lines["sum-grads"].line.startswith("changed from step 1 of 3: largest relative difference 1 (100%) in grad")
    assert "largest relative difference 0.5 (50%)" in lines["half-loss"].line and "loss at step 1" in lines["half-loss"].line
    # a parameter left out of the optimizer: its group holds one parameter less, exact from the set-up
    assert lines["frozen-param"].line.startswith("changed from the freshly set-up state: group 0 params 4 → 3 at "
                                                 "the set-up")


class NotReplayed(SelfmadeTraining):
    """A trainable workload that opts out of the replay (module level: the ranks import it)."""

    numerics_replay = False


def test_a_workload_that_opts_out_is_not_replayed_and_has_no_record(pool):
    # The dataset family sets numerics_replay = False: no trainable state, its check verifies every
    # sample; a replay would only cost two more handovers and six epochs.
    from ddpbench.workloads.datasets.epoch import DatasetEpoch

    assert DatasetEpoch.numerics_replay is False

    plan = RoundPlan(warmup=1, rounds=2, census=False, memory_census=False)
    ranks = pool.run(measure_workload, NotReplayed(), plan, timeout_s=120)
    assert all("numerics" not in m.metrics for m in ranks)


BENCH = '''
from ddpbench.testing import SelfmadeTraining


def test_step(dist_benchmark):
    dist_benchmark(SelfmadeTraining())
'''


@pytest.mark.numerics
def test_an_ab_run_whose_candidate_sums_gradients_fails_at_its_first_look_naming_it(pytester):
    import json

    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest_subprocess(
        "--dist-candidate-env", "DDPBENCH_PLANT_NUMERICS=sum-grads", "--dist-ab-pools-per-side=1",
        "--dist-ab-block-time=0.02", "--dist-ab-max-time=8", "--dist-ab-profile=off", "--dist-census=none",
        "--benchmark-json=ab.json", "-m", "not gpu", "-p", "no:cacheprovider", timeout=300)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_step*regression (numerics)*", "    why: numerics; timing inconclusive*",
                                 "    numerics: changed from step 1 of 3: largest relative difference 1 (100%)*",
                                 "*1 numerics change(s)*"])
    (case,) = json.loads((pytester.path / "ab.json").read_text())["benchmarks"]
    ab = case["extra_info"]["ab"]
    assert ab["numerics_verdict"] == "regression" and ab["stages"] == 1  # decided at its first look
    assert ab["stopped_by_numerics"].startswith("changed from step 1 of 3")
    assert ab["numerics_baseline"]["digests"][0] == case["extra_info"]["numerics"]["digests"][0]  # same set-up
    assert ab["numerics_outcome"] == "changed" and ab["numerics_ratio"] > 10 and ab["numerics_resolving_step"] == 1
    # the band is measured once, on the baseline's first pool: the candidate's replay has none
    assert ab["numerics_baseline"]["band_replays"] == 2 and "band" not in case["extra_info"]["numerics"]


def test_only_the_baseline_s_first_pool_measures_the_band():
    from ddpbench.engine.numerics import BAND_REPLAYS, numerics_band_plan

    plan = RoundPlan()
    assert (plan.numerics_band_replays, plan.numerics_replays) == (BAND_REPLAYS, 2)
    assert numerics_band_plan(plan, "baseline", 0) is plan
    assert {numerics_band_plan(plan, side, j).numerics_band_replays
            for side, j in (("baseline", 1), ("candidate", 0), ("candidate", 1))} == {0}
    # a later pool replays once: its first pool's two tell determinism, it only tells another process
    assert [numerics_band_plan(plan, side, j).numerics_replays
            for side, j in (("baseline", 1), ("candidate", 0), ("candidate", 1))] == [1, 2, 1]


def _marked(x):
    # 1 where dynamo traced this call (compiled), 0 where it ran eagerly
    return x + (1.0 if torch.compiler.is_compiling() else 0.0)


class Compiled(Workload):
    """A step through torch.compile (the eager backend: no C++ build) that records whether each
    round ran compiled."""

    def setup(self, ctx):
        return {"fn": torch.compile(_marked, backend="eager"), "x": torch.zeros(4), "compiled": []}

    def run_round(self, state):
        state["compiled"].append(bool(state["fn"](state["x"])[0] == 1.0))


def test_a_replay_through_a_compiled_step_leaves_the_timed_rounds_compiled():
    from ddpbench.engine.timing import RankSession

    session = RankSession(_Ctx(), Compiled(), RoundPlan(warmup=1, rounds=3, census=False, memory_census=False,
                                                        numerics_steps=2))
    session._time_round = lambda ctx, run_round, state: (run_round(state), 0.001)[1]  # no process group here
    session._agree = lambda ctx, values: list(values)
    session.start()
    session.replay_numerics(rebuild=True)  # A/B mode: the replay comes before the blocks
    session.record(3)
    assert session.state["compiled"] == [True] * 4  # the rebuilt state's warm-up and its 3 rounds
    session.finish(check=False)
    again = RankSession(_Ctx(), Compiled(), RoundPlan(warmup=1, rounds=2, census=False, memory_census=False,
                                                      numerics_steps=0))
    again._time_round = session._time_round
    again._agree = lambda ctx, values: list(values)
    again.start()
    again.record(2)
    assert again.state["compiled"] == [True] * 3  # the next case in this process: compiled too
    again.finish(check=False)
