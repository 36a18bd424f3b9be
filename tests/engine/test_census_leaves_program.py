"""The censuses measure the program without changing it (issue 52): a compiled step stays compiled
through the collective and memory censuses, and the recorded rounds are refused when they ran other
code than the warm-up (a recompile, compiled code that fell back to eager); the memory census counts
every phase of a step that varies (gradient accumulation) and, with --dist-ops-per-round=auto, is
taken after the same steps on every pool. One rank in this process (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from ddpbench.engine.compiled_frames import EntryHistory, ProgramChanged, check_rounds
from ddpbench.engine.timing import RankSession, RoundPlan
from ddpbench.gates.memory import compare_memory
from ddpbench.workloads import Workload


class _Ctx:
    rank, world_size, backend, device_type, core = 0, 1, "gloo", "cpu", None


def _session(workload, plan, time_round=None) -> RankSession:
    session = RankSession(_Ctx(), workload, plan)
    session._time_round = time_round or (lambda ctx, run_round, state: (run_round(state), 0.001)[1])
    session._agree = lambda ctx, values: list(values)  # one rank: the max over ranks is itself
    return session


class _Compiled(Workload):
    """A step through a torch.compile'd module whose backend counts the compiled graph's calls;
    ``mode_from``: from that step on, the step runs under a (non-infra) dispatch mode."""

    def __init__(self, mode_from: int | None = None, grow_from: int | None = None, every: int = 1):
        self.mode_from, self.grow_from, self.every = mode_from, grow_from, every

    def setup(self, ctx):
        calls = [0]

        def backend(gm, example_inputs):
            def run(*args):
                calls[0] += 1
                return gm.forward(*args)

            return run

        torch._dynamo.reset()
        model = torch.nn.Linear(16, 16)
        return {"model": model, "compiled": torch.compile(model, backend=backend), "calls": calls, "steps": 0,
                "x": torch.randn(4, 16)}

    def run_round(self, state):
        from torch.utils._python_dispatch import TorchDispatchMode

        class _Passing(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        state["steps"] += 1
        if state["steps"] % self.every:  # a step that runs its compiled part only every Nth round
            return
        x = state["x"]
        if self.grow_from is not None and state["steps"] >= self.grow_from:
            x = torch.randn(4 + state["steps"], 16)  # a new shape: dynamo compiles again
        with torch.no_grad():
            if self.mode_from is not None and state["steps"] >= self.mode_from:
                with _Passing():
                    state["compiled"](x)
            else:
                state["compiled"](x)

    def memory_census_targets(self, state):
        return [state["model"], state["x"]]


class _Idle(Workload):
    def setup(self, ctx):
        return None

    def run_round(self, state):
        pass


class _CompiledWithVariant(_Compiled):
    def variants(self):
        return {"idle": _Idle()}


@pytest.mark.parametrize("plan", [RoundPlan(warmup=2, rounds=25), RoundPlan(warmup=2, rounds=25, memory_census=False)],
                         ids=["both-censuses", "collective-census-only"])
def test_a_compiled_step_stays_compiled_through_the_censuses_and_the_variant_rounds(plan):
    session = _session(_CompiledWithVariant(), plan)
    session.start()
    assert session.census is not None and (session.memory_census is not None) == plan.memory_census
    calls = session.state["calls"]
    before = calls[0]
    session.record(25)
    # Main, with the memory census: 0 of 25 (it left dynamo skipping the frame: every round ran
    # eager); the collective census alone (an infra mode) never did.
    assert calls[0] - before == 25
    before = calls[0]
    session.time_variants(5)  # the exposed-communication probe's rounds: the step's run compiled too
    assert calls[0] - before == 5
    if plan.memory_census:
        assert session.memory_census["peak_at"]["module"] is not None
    session.finish(check=False)


def test_rounds_whose_compiled_code_fell_back_to_eager_are_refused():
    # From step 12 on (after warm-up and the censuses) the step runs under a dispatch mode: dynamo
    # skips the compiled frame for good and the later rounds run eager.
    session = _session(_Compiled(mode_from=12), RoundPlan(warmup=2, rounds=20, census=False, memory_census=False))
    session.start()
    with pytest.raises(ProgramChanged, match=r"compiled code stopped running: recorded rounds \d+ to 20 of 20"):
        session.record(20)
    session.close()


def test_a_step_that_enters_compiled_code_every_4th_round_is_judged_by_whole_cycles():
    # Issue 60: a compiled part every 4th round, --dist-warmup=4 --dist-rounds=6. Main refused it
    # ("compiled code stopped running: recorded rounds 5 to 6 of 6"): the warm-up's round 4
    # compiled (no cache hit counted), so rounds 9-11 read as a stop, 8 rounds passed.
    session = _session(_Compiled(every=4), RoundPlan(warmup=4, rounds=6))
    session.start()
    before = session.state["calls"][0]
    times, _ = session.record(6)
    assert len(times) == 6 and session.state["calls"][0] - before == 1  # round 12 of the step's count
    session.close()


def test_the_first_compile_s_advice_leads_to_a_plan_that_runs():
    # The compile falls in the recorded rounds: the message names the warm-up that works...
    session = _session(_Compiled(every=4), RoundPlan(warmup=2, rounds=6, census=False, memory_census=False))
    session.start()
    with pytest.raises(ProgramChanged, match=r"dynamo compiled 1 frame\(s\) during the recorded rounds.*"
                                             r"compiles it in its Nth round: --dist-warmup=N"):
        session.record(6)
    session.close()
    # ...which then runs (main: it led into "compiled code stopped running").
    session = _session(_Compiled(every=4), RoundPlan(warmup=4, rounds=6, census=False, memory_census=False))
    session.start()
    session.record(6)
    session.close()


def test_a_periodic_step_whose_compiled_code_stops_is_still_refused():
    # Compiled code every 2nd round, seen twice in the warm-up (a cycle of 2); from step 10 on it
    # runs under a dispatch mode: dynamo skips the frame and the rounds after run eager.
    session = _session(_Compiled(mode_from=10, every=2), RoundPlan(warmup=4, rounds=10, census=False,
                                                                   memory_census=False))
    session.start()
    with pytest.raises(ProgramChanged, match=r"compiled code stopped running: recorded rounds \d+ to 10 of 10 .*"
                                             r"\(at most 1\)"):
        session.record(10)
    session.close()


def test_rounds_that_compiled_are_refused():
    session = _session(_Compiled(grow_from=8), RoundPlan(warmup=2, rounds=10, census=False, memory_census=False))
    session.start()
    with pytest.raises(ProgramChanged, match=r"dynamo compiled \d+ frame\(s\) during the recorded rounds"):
        session.record(10)
    session.close()


def test_the_program_check_reads_the_counts():
    def history(*counts):
        seen = EntryHistory()
        seen.add(list(counts))
        return seen

    check_rounds([1, 1, 1], 3, 3, history(0, 1))  # steady
    check_rounds([1, 0, 1, 0], 3, 3, history(0, 1))  # compiled frames every other step (accumulation)
    check_rounds([0, 0, 1, 0, 0], 3, 3, history(0, 1, 0, 0))  # ...every third
    check_rounds([0, 0], None, None, history(0, 0))  # nothing compiled anywhere
    check_rounds([None, None], None, None, history(None, None))  # not counting (no dynamo hook)
    # One round that entered compiled code (its compile) tells no cycle: rounds without are not judged...
    check_rounds([0, 0, 0], 3, 3, history(0, 0, 0, 1))
    check_rounds([0, 0, 0, 1, 0, 0], 3, 3, history(0, 0, 0, 1))  # ...and then the cycle is 4 rounds
    with pytest.raises(ProgramChanged, match="rounds 1 to 2 of 2 entered no compiled frame"):
        check_rounds([0, 0], 3, 3, history(1, 1))  # the compile's round, then a cache hit: a cycle of 1
    with pytest.raises(ProgramChanged, match="rounds 3 to 5 of 5 entered no compiled frame"):
        check_rounds([1, 1, 0, 0, 0], 3, 3, history(0, 1))
    with pytest.raises(ProgramChanged, match="dynamo compiled 2 frame"):
        check_rounds([1, 1], 3, 5, history(0, 1))


class _Accumulating(Workload):
    """Gradient accumulation over two rounds: the sync round allocates ``sync_bytes``, the other
    1 MiB (torch.empty: no page is touched)."""

    def __init__(self, sync_bytes: int):
        self.sync_bytes = sync_bytes

    def setup(self, ctx):
        return {"steps": 0}

    def run_round(self, state):
        state["steps"] += 1
        sync = state["steps"] % 2 == 0
        scratch = torch.empty(self.sync_bytes if sync else 1 << 20, dtype=torch.uint8)
        del scratch


def test_accumulation_whose_sync_round_allocates_more_is_a_memory_regression():
    records = {}
    for name, sync_bytes in (("baseline", 1 << 20), ("candidate", 512 << 20)):
        session = _session(_Accumulating(sync_bytes), RoundPlan(warmup=1, rounds=2))
        session.start()
        records[name] = session.memory_census
        session.close()
    # Main: both records showed the no-sync step (1 MiB): `same`.
    assert records["candidate"]["steps_counted"] == 2
    assert records["candidate"]["peak_bytes"] - records["baseline"]["peak_bytes"] == (512 << 20) - (1 << 20)
    assert compare_memory(records["baseline"], records["candidate"]).verdict == "regression"


class _Growing(Workload):
    """Each step makes a temporary of (steps since set-up) KiB: the memory census's peak tells after
    how many steps it ran."""

    def setup(self, ctx):
        return {"steps": 0}

    def run_round(self, state):
        state["steps"] += 1
        scratch = torch.empty(state["steps"] << 10, dtype=torch.uint8)
        del scratch


def _fixed_cost_round(ctx, run_round, state):
    before = state["steps"]
    run_round(state)
    return 50e-6 + (state["steps"] - before) * 100e-6  # 50 us fixed, 100 us an op: "auto" picks 64


def test_auto_ops_per_round_takes_the_censuses_after_the_same_steps_as_a_pool_given_the_count():
    chosen = _session(_Growing(), RoundPlan(warmup=2, rounds=2, ops_per_round="auto"), _fixed_cost_round)
    chosen.start()
    assert chosen.ops_per_round == 64
    given = _session(_Growing(), RoundPlan(warmup=2, rounds=2, ops_per_round=64), _fixed_cost_round)
    given.start()
    # Main: the first pool (which searched) was censused hundreds of steps later than the others.
    assert chosen.memory_census["peak_bytes"] == given.memory_census["peak_bytes"]
    assert chosen.census == given.census
    for session in (chosen, given):
        session.close()
