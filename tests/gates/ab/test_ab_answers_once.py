"""An A/B case takes the exact answers once per side (issue 62): only each side's first pool takes
the censuses and the numerics replay (the other pools' would be thrown away, and their state would
be torn down and built again for the replay); the candidate replays the numerics once, and a second
time only where that replay differs from the baseline's (whose two replays give the band). The loop
runs on fake pools that record what each pool was asked; the rank side of the second replay runs on
a real 2-rank gloo pool."""

from __future__ import annotations

import random

import pytest
import torch

from ddpbench.engine.numerics import combine_numerics, take_numerics
from ddpbench.engine.timing import RoundPlan
from ddpbench.gates.ab import tasks
from ddpbench.gates.ab.pairs_loop import ABSettings, lone_replay_differs, pool_plan, run_case
from ddpbench.gates.numerics import compare_numerics
from ddpbench.pool import PoolRegistry, PoolSpec
from ddpbench.workloads import Workload

from helpers.fake_pools import ROUND_S, FakePool


def _numerics(digest: str, replays: int) -> dict:
    """A rank's record of one step whose one tensor's figures differ with ``digest``."""
    value = float(ord(digest[0]))
    return {"version": 1, "seed": 0, "steps": 1, "replays": replays, "digests": [digest, digest],
            "tensors": [{"param w": ["p0", 1.0, 1.0, 1.0]}, {"param w": [f"p1{digest}", value, value, value]}],
            "replay_spread": 0.0, "first_nondeterministic_step": None}


class AnswerPool(FakePool):
    """A fake 2-rank pool that answers as an engine does: the censuses and numerics only where the
    plan asks; a lone replay's digest is ``digest``; records every task and plan it is sent."""

    def __init__(self, rng, digest="a"):
        super().__init__(rng, noise=0.01)
        self.digest, self.sent, self.replays = digest, [], 0

    def run(self, fn, *args, timeout_s=None):
        self.sent.append((fn, args))
        if fn is tasks.start:
            plan = args[2]
            self.replays = plan.numerics_replays if plan.numerics_steps else 0
            return [{"estimate_s": ROUND_S, "ops_per_round": 1,
                     "census": {"taken": True} if plan.census else None,
                     "memory": None, "numerics": _numerics(self.digest, self.replays) if self.replays else None}] * 2
        if fn is tasks.numerics_again:
            self.replays = 2
            return [{"numerics": _numerics(self.digest, 2)}] * 2
        if fn is tasks.finish:
            return [{"numerics": _numerics(self.digest, self.replays)} if self.replays else {}] * 2
        return super().run(fn, *args, timeout_s=timeout_s)


SETTINGS = ABSettings(block_time_s=3 * ROUND_S, max_time_s=600.0, first_pairs=4, more_pairs=4, max_pairs=4,
                      max_extended_pairs=4)


def _run(candidate_digest: str):
    rng = random.Random(1)
    pools = {"baseline": [AnswerPool(rng), AnswerPool(rng)],
             "candidate": [AnswerPool(rng, candidate_digest), AnswerPool(rng, candidate_digest)]}
    outcome = run_case(pools, workload=None, plan=RoundPlan(warmup=1), settings=SETTINGS, timeout_s=60,
                       case_id="answers-once", seed=1)
    return pools, outcome


def _plan(pool) -> RoundPlan:
    (plan,) = [args[2] for fn, args in pool.sent if fn is tasks.start]
    return plan


def test_only_each_side_s_first_pool_takes_the_answers():
    pools, outcome = _run("a")
    for side in ("baseline", "candidate"):
        first, other = _plan(pools[side][0]), _plan(pools[side][1])
        assert first.census and first.memory_census and first.numerics_steps == 3
        assert not other.census and not other.memory_census and other.numerics_steps == 0
    assert _plan(pools["baseline"][0]).numerics_replays == 2  # the band
    assert _plan(pools["candidate"][0]).numerics_replays == 1
    assert outcome.summary({})["numerics_baseline"]["replays"] == 2


def test_the_candidate_replays_a_second_time_only_where_its_first_replay_differs():
    same, _ = _run("a")
    assert not any(fn is tasks.numerics_again for pool in same["candidate"] for fn, _ in pool.sent)
    differs, outcome = _run("b")
    again = [[fn for fn, _ in pool.sent].count(tasks.numerics_again) for pool in differs["candidate"]]
    assert again == [1, 0]  # on its first pool, right after its start, before any block
    sent = [fn for fn, _ in differs["candidate"][0].sent]
    assert sent[:2] == [tasks.start, tasks.numerics_again]
    assert not any(fn is tasks.numerics_again for pool in differs["baseline"] for fn, _ in pool.sent)
    assert combine_numerics([m["numerics"] for m in outcome.candidate_metrics])["replays"] == 2
    assert outcome.stopped_by_numerics is not None  # the change still ends the case at its first look


def test_an_engine_that_replays_twice_anyway_or_a_baseline_without_numerics_asks_for_no_second():
    differing = [{"numerics": _numerics("b", 1)}] * 2
    assert lone_replay_differs({"baseline": combine_numerics([_numerics("a", 2)] * 2)}, differing)
    assert not lone_replay_differs({"baseline": combine_numerics([_numerics("a", 2)] * 2)},
                                   [{"numerics": _numerics("b", 2)}] * 2)  # an older engine: two already
    assert not lone_replay_differs({"baseline": None}, differing)  # not counted whatever the replays
    assert not lone_replay_differs({"baseline": combine_numerics([_numerics("a", 2)] * 2)},
                                   [{"numerics": _numerics("a", 1)}] * 2)
    plan = RoundPlan(numerics_steps=0)
    assert pool_plan(plan, "candidate", 0) is plan  # no replay asked: nothing to change


# ---- the rank side: tasks.start with one replay, then tasks.numerics_again -----------------------


class Jittery(Workload):
    """SGD on a small MLP whose loss is scaled by 1 + ``jitter`` in every second numerics replay (a
    set-up under the replay's seed 0), as a kernel whose sums land differently would (module level:
    the ranks import it)."""

    def __init__(self, jitter=1e-6):
        self.jitter, self.replays = jitter, 0

    def setup(self, ctx):
        self.replays += torch.initial_seed() == 0
        self.scale = 1 + self.jitter if self.replays % 2 == 0 and torch.initial_seed() == 0 else 1.0
        model = torch.nn.Linear(8, 2)
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "x": torch.randn(4, 8)}

    def run_round(self, state):
        state["optimizer"].zero_grad()
        loss = state["model"](state["x"]).square().mean() * self.scale
        loss.backward()
        state["optimizer"].step()
        return loss


@pytest.fixture(scope="module")
def pool():
    registry = PoolRegistry()
    yield registry.get(PoolSpec("gloo", 2, "cpu"))
    registry.close()


class _Ctx:
    rank, world_size, backend, device_type, core, device = 0, 1, "gloo", "cpu", None, torch.device("cpu")


@pytest.mark.pool
def test_a_second_replay_asked_for_gives_the_record_two_replays_give(pool):
    plan = RoundPlan(warmup=1, rounds=2, census=False, memory_census=False, numerics_replays=1)
    for jitter in (0.0, 1e-6):
        key = f"answers-once-{jitter}"
        lone = [reply["numerics"] for reply in pool.run(tasks.start, key, Jittery(jitter), plan, timeout_s=120)]
        assert all(r["replays"] == 1 and r["replay_spread"] == 0.0 for r in lone)
        both = [reply["numerics"] for reply in pool.run(tasks.numerics_again, key, timeout_s=120)]
        pool.run(tasks.block, key, 2, timeout_s=120)  # the timed state was built anew
        final = [m["numerics"] for m in pool.run(tasks.finish, key, timeout_s=120)]
        assert final == both and all(r["replays"] == 2 for r in both)
        assert [r["digests"] for r in both] == [r["digests"] for r in lone]  # the first replay kept as it was
        two = take_numerics(Jittery(jitter), _Ctx(), 3)  # what two replays in one go give
        assert both[0]["replay_spread"] == two["replay_spread"]
        assert (both[0]["first_nondeterministic_step"] is None) == (jitter == 0.0)
        record = combine_numerics(both)
        assert compare_numerics(record, record).verdict == "same"
