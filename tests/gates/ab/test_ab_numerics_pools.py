"""The numerics replay in A/B mode, on fake pools (tests/helpers/fake_pools.py): only the baseline's
first pool measures the band (the verdict judges against the baseline's), and a side whose two
pools (two processes) replay differently while each pool's own replays agree, a per-process salt
such as ``hash()`` of a text, is not reproducible: identical programs read `not counted`, never
`changed`."""

import random

from ddpbench.engine.numerics import BAND_REPLAYS
from ddpbench.engine.timing import RoundPlan
from ddpbench.gates.ab import tasks
from ddpbench.gates.ab.pairs_loop import ABSettings, run_case
from ddpbench.gates.numerics import compare_numerics

from helpers.fake_pools import ROUND_S, FakePool


def _rank(salt: str) -> dict:
    steps = [{"param w": [f"p0{salt}", 1.0, 1.0, 1.0]}, {"param w": [f"p1{salt}", 2.0, 2.0, 2.0]}]
    return {"version": 1, "seed": 0, "steps": 1, "replays": 2, "digests": [f"d0{salt}", f"d1{salt}"],
            "tensors": steps, "replay_spread": 0.0, "first_nondeterministic_step": None}


class NumericsPool(FakePool):
    """A fake pool whose set-up replies with a numerics record (its digests carry ``salt``) and
    notes the plan it was started with."""

    def __init__(self, rng, salt: str, plans: list):
        super().__init__(rng, noise=0.6, slower=1.0)
        self.salt, self.plans = salt, plans

    def run(self, fn, *args, timeout_s=None):
        if fn is tasks.start:
            plan = args[2]  # None: no replay asked of this pool
            self.plans.append((plan.numerics_replays, plan.numerics_band_replays) if plan.numerics_steps else None)
            return [{"estimate_s": ROUND_S, "ops_per_round": 1, "numerics": _rank(self.salt)} for _ in range(2)]
        if fn is tasks.finish:
            return [{"numerics": _rank(self.salt)} for _ in range(2)]
        return super().run(fn, *args, timeout_s=timeout_s)


def _case(salts: dict[str, list[str]]):
    rng, plans = random.Random(5), {"baseline": [], "candidate": []}
    pools = {side: [NumericsPool(rng, salt, plans[side]) for salt in salts[side]] for side in salts}
    outcome = run_case(pools, workload=None, plan=RoundPlan(warmup=1),
                       settings=ABSettings(block_time_s=3 * ROUND_S, max_time_s=0.5), timeout_s=60,
                       case_id="numerics-pools", seed=5)
    return outcome, plans


def test_only_the_baseline_s_first_pool_measures_the_band():
    outcome, plans = _case({"baseline": ["a", "a"], "candidate": ["a", "a"]})
    # (plain replays, perturbed ones) per pool: the band once, on the baseline's first pool; the
    # candidate's first pool replays once (issue 62); sides that agree ask no later pool to replay
    assert plans == {"baseline": [(2, BAND_REPLAYS), None], "candidate": [(1, 0), None]}
    assert outcome.stopped_by_numerics is None


def test_sides_whose_first_replays_differ_replay_once_more_on_a_later_pool():
    _, plans = _case({"baseline": ["a", "b"], "candidate": ["c", "d"]})
    assert plans == {"baseline": [(2, BAND_REPLAYS), (1, 0)], "candidate": [(1, 0), (1, 0)]}


def test_pools_of_one_side_that_replay_differently_are_a_per_process_salt():
    # each process draws its own salt: the sides' first pools differ from each other as well
    outcome, _ = _case({"baseline": ["a", "b"], "candidate": ["c", "d"]})
    assert outcome.stopped_by_numerics is None  # identical programs: not a change
    baseline = outcome.summary({})["numerics_baseline"]
    assert "its replays in two processes differ from the freshly set-up state" in baseline["not_reproducible"]
    from ddpbench.engine.numerics import combine_numerics

    candidate = combine_numerics([m.get("numerics") for m in outcome.candidate_metrics])
    verdict = compare_numerics(baseline, candidate)
    assert verdict.verdict == "not counted" and "per-process salt" in verdict.line
