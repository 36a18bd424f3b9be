"""Workloads the ranks cannot receive fail their case with a message naming the object and the fix;
a check that returns False fails its case, one that returns True passes.

The classic mistakes -- a lambda, a class defined inside the test function, a module that is not
on the ranks' path, a check written as ``return ok`` -- run end to end in one pytest subprocess
(one 2-rank pool), followed by a case that shows the pool is still usable. The unit tests below
check the pieces without ranks.
"""

from __future__ import annotations

import functools
import importlib.util
import pickle
import sys
import threading

import pytest

import ddpbench
from ddpbench.pool.picklecheck import (LOAD_FAILURE_PREFIX, LoadFailure, TaskUnpickler, find_unpicklable,
                                  load_failure_message, unpicklable_message)

pytest_plugins = ["pytester"]

HIDDEN_MODULE = '''
def setup(ctx):
    return None

def one_round(state):
    pass
'''

MISTAKES = '''
import importlib.util
import pathlib
import sys

import ddpbench

# A module the controller loads from a file path: it is in the controller's sys.modules, so it
# pickles, but its directory is not on sys.path, so the ranks cannot import it.
_spec = importlib.util.spec_from_file_location(
    "hidden_work", pathlib.Path(__file__).parent / "hidden" / "hidden_work.py")
hidden_work = importlib.util.module_from_spec(_spec)
sys.modules["hidden_work"] = hidden_work
_spec.loader.exec_module(hidden_work)


def setup(ctx):
    return None


def one_round(state):
    pass


class HoldsALambda(ddpbench.Workload):
    def __init__(self):
        self.make_batch = lambda: None

    def setup(self, ctx):
        return None

    def run_round(self, state):
        pass


def test_1_lambda(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, lambda state: None))


def test_2_workload_holding_a_lambda(dist_benchmark):
    dist_benchmark(HoldsALambda())


def test_3_class_defined_in_the_test(dist_benchmark):
    class LocalStep(ddpbench.Workload):
        def setup(self, ctx):
            return None

        def run_round(self, state):
            pass

    dist_benchmark(LocalStep())


def test_4_module_not_on_the_ranks_path(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(hidden_work.setup, hidden_work.one_round))


def check_says_no(state):
    return False


def check_says_yes(state):
    return True


def test_6_check_returning_false(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, one_round, check_says_no))


def test_7_check_returning_true(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, one_round, check_says_yes))


def test_8_the_pool_still_works(dist_benchmark):
    result = dist_benchmark(ddpbench.FunctionWorkload(setup, one_round), rounds=3, warmup=0)
    assert len(result.round_times) == 3
'''


def _failure_section(output: str, test_name: str) -> str:
    """The part of pytest's output that reports one failed test."""
    start = output.index(f"_ {test_name}[")
    end = output.find("\n___", start + 1)
    return output[start:end if end != -1 else None]


def test_unpicklable_workloads_fail_their_case_with_the_object_and_the_fix(pytester):
    pytester.makepyfile(test_mistakes=MISTAKES)
    (pytester.path / "hidden").mkdir()
    (pytester.path / "hidden" / "hidden_work.py").write_text(HIDDEN_MODULE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not gpu",
                                           "--dist-warmup=0", "--dist-rounds=3", timeout=300)
    result.assert_outcomes(failed=5, passed=2, deselected=14)
    output = result.stdout.str()
    assert "FAILED test_mistakes.py::test_6_check_returning_false" in output  # False: a wrong result
    # No pickling traceback, and nothing waited for the timeout.
    assert "The above exception was the direct cause" not in output
    assert "Traceback (most recent call last)" not in output
    assert "did not finish within" not in output

    lam = _failure_section(output, "test_1_lambda")
    assert "TypeError: ddpbench: FunctionWorkload's run_round function cannot be sent to the ranks: " \
           "it is a lambda in module test_mistakes" in lam
    assert "Fix: Write it as a function with def at module level" in lam

    held = _failure_section(output, "test_2_workload_holding_a_lambda")
    assert "the HoldsALambda passed to task ddpbench.engine.timing.measure_workload cannot be sent to the " \
           "ranks: its part .make_batch is a lambda in module test_mistakes" in held

    local = _failure_section(output, "test_3_class_defined_in_the_test")
    assert "it is an instance of class LocalStep, defined inside test_3_class_defined_in_the_test() " \
           "in module test_mistakes" in local
    assert "Fix: Move LocalStep to module level (out of test_3_class_defined_in_the_test)" in local

    hidden = _failure_section(output, "test_4_module_not_on_the_ranks_path")
    assert (f"{LOAD_FAILURE_PREFIX}hidden_work.setup (ModuleNotFoundError: No module named "
            f"'hidden_work')") in hidden
    assert "Module 'hidden_work' cannot be imported in the rank processes" in hidden
    assert "Reported by every rank for task ddpbench.engine.timing.measure_workload" in hidden

    wrong = _failure_section(output, "test_6_check_returning_false")
    assert "task ddpbench.engine.timing.measure_workload raised on rank(s) [0, 1] of 2" in wrong
    assert "CheckFailed: check_says_no() returned False on rank 1: the workload computed a wrong result" in wrong
    assert "FAILED test_mistakes.py::test_7_check_returning_true" not in output  # True: passed, no crash


def _one_rank_session(check):
    from ddpbench.engine.timing import RankSession, RoundPlan

    class Ctx:
        rank, world_size, backend, device_type, core = 0, 1, "gloo", "cpu", None

    session = RankSession(Ctx(), ddpbench.FunctionWorkload(module_level_setup, module_level_round, check),
                          RoundPlan(warmup=0, rounds=2))
    session._time_round = lambda ctx, run_round, state: 0.001
    session._agree = lambda ctx, values: list(values)
    session.start()
    session.record(2)
    return session


def returns_false(state):
    return False


def returns_true(state):
    return True


def returns_measured(state):
    return {"check_peak_bytes": 7}


def returns_numpy_false(state):
    import numpy

    return numpy.bool_(False)


def returns_tensor_true(state):
    import torch

    return torch.tensor(True)


def returns_text(state):
    return "looks fine"


def test_what_a_check_returns_passes_or_fails_the_case_never_crashes_it():
    from ddpbench.engine.timing import CheckFailed

    for check in (returns_false, returns_numpy_false):
        with pytest.raises(CheckFailed, match=rf"{check.__name__}\(\) returned False on rank 0: the workload "
                                              r"computed a wrong result"):
            _one_rank_session(check).finish()
    assert "check_peak_bytes" not in _one_rank_session(returns_true).finish()
    assert "check_peak_bytes" not in _one_rank_session(returns_tensor_true).finish()
    assert _one_rank_session(returns_measured).finish()["check_peak_bytes"] == 7
    assert "engine_check_s" in _one_rank_session(None).finish()
    with pytest.raises(TypeError, match=r"returns_text\(\) returned str 'looks fine': a check returns None or True"):
        _one_rank_session(returns_text).finish()


# ----------------------------------------------------------------------------------------------
# The pieces, without ranks
# ----------------------------------------------------------------------------------------------


def module_level_setup(ctx):
    return ctx


def module_level_round(state, scale=1):
    return state


def test_function_workload_takes_module_level_functions_and_partials():
    workload = ddpbench.FunctionWorkload(module_level_setup, functools.partial(module_level_round, scale=2),
                                         check=module_level_round, name="mine", group="g")
    assert workload.setup is module_level_setup and workload.check is module_level_round
    assert workload.extra_info(2, 0.1) == {"workload": "mine"} and workload.group == "g"
    workload.teardown(None)  # the base class's no-op
    copy = pickle.loads(pickle.dumps(workload))
    assert copy.setup is module_level_setup and copy.run_round.keywords == {"scale": 2}
    default = ddpbench.FunctionWorkload(module_level_setup, module_level_round)
    assert default.extra_info(2, 0.1) == {"workload": f"{__name__}.module_level_round"}
    assert default.group is None and isinstance(default, ddpbench.Workload)


def test_function_workload_refuses_what_the_ranks_cannot_receive_up_front():
    with pytest.raises(TypeError, match="setup function cannot be sent to the ranks: it is a lambda"):
        ddpbench.FunctionWorkload(lambda ctx: None, module_level_round)

    def nested_round(state):
        pass

    with pytest.raises(TypeError, match=r"the function nested_round, defined inside "
                                        r"test_function_workload_refuses_\w+\(\)"):
        ddpbench.FunctionWorkload(module_level_setup, nested_round)
    with pytest.raises(TypeError, match="check must be a function, got 3"):
        ddpbench.FunctionWorkload(module_level_setup, module_level_round, check=3)
    with pytest.raises(TypeError, match=r"its part .args\[0\] is a _thread.lock object"):
        ddpbench.FunctionWorkload(module_level_setup, functools.partial(module_level_round, threading.Lock()))


def test_find_unpicklable_names_the_innermost_part():
    lock = threading.Lock()
    path, part, error = find_unpicklable({"a": [1, (2, lock)]})
    assert path == "['a'][1][1]" and part is lock and isinstance(error, TypeError)
    assert find_unpicklable({"fine": [1, 2]}) is None
    assert unpicklable_message([1, 2], "x") is None


def test_a_module_the_ranks_cannot_import_is_named_with_the_fix(tmp_path, monkeypatch):
    (tmp_path / "vanishing_mod.py").write_text("def work(state):\n    pass\n")
    spec = importlib.util.spec_from_file_location("vanishing_mod", tmp_path / "vanishing_mod.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "vanishing_mod", module)
    spec.loader.exec_module(module)
    payload = pickle.dumps((module.work, (), {}))
    monkeypatch.delitem(sys.modules, "vanishing_mod")  # as in a rank: not importable by name
    with pytest.raises(LoadFailure) as info:
        TaskUnpickler(__import__("io").BytesIO(payload)).load()
    assert (info.value.module, info.value.name) == ("vanishing_mod", "work")
    message = load_failure_message(info.value)
    assert message.startswith(f"{LOAD_FAILURE_PREFIX}vanishing_mod.work (ModuleNotFoundError")
    assert "cannot be imported in the rank processes" in message and "pythonpath" in message

    # A module that imports but lacks the name, and one whose own imports fail.
    missing_attr = load_failure_message(LoadFailure("json", "nope", AttributeError("no nope")))
    assert "Module 'json' has no 'nope' when the ranks import it" in missing_attr
    broken_dep = load_failure_message(
        LoadFailure("mypkg.mod", "f", ModuleNotFoundError("No module named 'dep'", name="dep")))
    assert "something it imports is missing in the rank processes" in broken_dep
