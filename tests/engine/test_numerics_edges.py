"""The numerics replay's edges (issue 60): a step drawing unseeded randomness, a state the replay
cannot see, refactors that compute the same values, a set-up that stops being reproducible, and
the record's own checks. In this process, one rank, no process group."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy
import pytest
import torch

from ddpbench.engine.numerics import combine_numerics, take_numerics
from ddpbench.gates.numerics import compare_numerics
from ddpbench.storage.records import RecordError
from ddpbench.workloads import Workload


class _Ctx:
    rank, world_size, backend, device_type, core, device = 0, 1, "gloo", "cpu", None, torch.device("cpu")


def _record(workload, steps=3):
    return combine_numerics([take_numerics(workload, _Ctx(), steps)])


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


class Noisy(Workload):
    """SGD on a small MLP whose step scales its data by a draw from ``np.random.default_rng()``
    (fresh OS entropy: no seed reaches it); ``scale`` multiplies the loss (0.5: a real change)."""

    def __init__(self, scale=1.0):
        self.scale = scale

    def setup(self, ctx):
        model = _mlp()
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "x": torch.randn(4, 8)}

    def run_round(self, state):
        noise = float(numpy.random.default_rng().random())
        state["optimizer"].zero_grad()
        loss = state["model"](state["x"] * (1 + 0.3 * noise)).square().mean() * self.scale
        loss.backward()
        state["optimizer"].step()
        return loss


def test_a_step_drawing_unseeded_randomness_is_not_counted_from_its_first_nondeterministic_step():
    base = _record(Noisy())
    assert base["first_nondeterministic_step"] == 1
    verdicts = [compare_numerics(base, _record(Noisy())) for _ in range(3)]  # identical programs
    assert [v.verdict for v in verdicts] == ["not counted"] * 3, [v.line for v in verdicts]
    assert "differ from step 1" in verdicts[0].line
    halved = compare_numerics(base, _record(Noisy(scale=0.5)))  # a real x0.5: never `same`
    assert halved.verdict == "not counted", halved.line


class Trainer:
    """A callable state object (a user's trainer): its model and optimizer are attributes."""

    def __init__(self, lr):
        self.model = _mlp()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.x = torch.randn(4, 8)

    def __call__(self):
        self.optimizer.zero_grad()
        self.model(self.x).square().mean().backward()
        self.optimizer.step()


class CallableState(Workload):
    def __init__(self, lr=0.1):
        self.lr = lr

    def setup(self, ctx):
        return Trainer(self.lr)

    def run_round(self, state):
        state()


EMA: dict = {}


class HiddenState(Workload):
    """The model and its EMA kept in a module-level dict: the state the replay sees holds no tensor."""

    def __init__(self, lr=0.1):
        self.lr = lr

    def setup(self, ctx):
        EMA["model"] = _mlp()
        EMA["ema"] = _mlp()
        EMA["optimizer"] = torch.optim.SGD(EMA["model"].parameters(), lr=self.lr)
        EMA["x"] = torch.randn(4, 8)
        return "a token"

    def run_round(self, state):
        EMA["optimizer"].zero_grad()
        EMA["model"](EMA["x"]).square().mean().backward()
        EMA["optimizer"].step()
        with torch.no_grad():
            for e, p in zip(EMA["ema"].parameters(), EMA["model"].parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)


def test_a_callable_state_object_is_fingerprinted_and_the_line_says_how_many_tensors():
    base = _record(CallableState())
    same = compare_numerics(base, _record(CallableState()))
    assert same.line.startswith("same (bitwise): 3 steps on 1 rank, ") and " tensors" in same.line, same.line
    doubled = compare_numerics(base, _record(CallableState(lr=0.2)))
    assert doubled.verdict == "regression", doubled.line


def test_a_replay_that_compared_no_tensors_is_not_counted():
    base = _record(HiddenState())
    verdict = compare_numerics(base, _record(HiddenState(lr=0.2)))
    assert verdict.verdict == "not counted" and "no tensor" in verdict.line, verdict.line


class Refactored(Workload):
    """One step, written several ways that compute the same values: the loss returned as a number
    (``item``), the modules listed in the other order (``reverse``), the model compiled."""

    def __init__(self, item=False, reverse=False, compiled=False):
        self.item, self.reverse, self.compiled = item, reverse, compiled

    def setup(self, ctx):
        body, head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)
        params = [*body.parameters(), *head.parameters()]
        model = torch.nn.Sequential(body, torch.nn.ReLU(), head)
        forward = torch.compile(model, backend="eager") if self.compiled else model
        return {"body": body, "head": head, "forward": forward, "x": torch.randn(4, 8),
                "optimizer": torch.optim.SGD(params, lr=0.1, momentum=0.9)}

    def numerics_targets(self, state):
        modules = [state["body"], state["head"]] if not self.compiled else [state["forward"]]
        return [*(reversed(modules) if self.reverse else modules), state["optimizer"], state["x"]]

    def run_round(self, state):
        state["optimizer"].zero_grad()
        loss = state["forward"](state["x"]).square().mean()
        loss.backward()
        state["optimizer"].step()
        return loss.item() if self.item else loss


def test_a_loss_returned_as_a_number_or_as_a_tensor_is_the_same_value():
    assert compare_numerics(_record(Refactored()), _record(Refactored(item=True))).line.startswith("same (bitwise)")


def test_modules_listed_in_another_order_are_the_same_tensors():
    verdict = compare_numerics(_record(Refactored()), _record(Refactored(reverse=True)))
    assert verdict.line.startswith("same (bitwise)"), verdict.line


class _SquareLossStep(Workload):
    """One SGD step on ``state``'s model, input and optimizer: the mean square of the output."""

    def run_round(self, state):
        state["optimizer"].zero_grad()
        loss = state["model"](state["x"]).square().mean()
        loss.backward()
        state["optimizer"].step()
        return loss


class Compiled(_SquareLossStep):
    def __init__(self, compiled=False):
        self.compiled = compiled

    def setup(self, ctx):
        model = _mlp()
        return {"model": torch.compile(model, backend="eager") if self.compiled else model, "x": torch.randn(4, 8),
                "optimizer": torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)}


def test_a_compiled_model_s_parameters_keep_their_names():
    compiled = _record(Compiled(compiled=True))
    assert not any("_orig_mod" in name for name in compiled["names"])
    verdict = compare_numerics(_record(Compiled()), compiled)
    assert verdict.verdict == "same", verdict.line


class Urandom(_SquareLossStep):
    """A set-up that draws from the OS on the candidate (``urandom``): not reproducible."""

    def __init__(self, urandom=False):
        self.urandom = urandom

    def setup(self, ctx):
        model = _mlp()
        if self.urandom:
            with torch.no_grad():
                model[0].weight.add_(int.from_bytes(os.urandom(2), "little") * 1e-6)
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "x": torch.randn(4, 8)}


def test_a_candidate_whose_set_up_stops_being_reproducible_is_a_regression_until_accepted():
    verdict = compare_numerics(_record(Urandom()), _record(Urandom(urandom=True)))
    assert verdict.verdict == "regression" and "a regression until accepted" in verdict.line, verdict.line
    assert "not reproducible" in verdict.line
    both = compare_numerics(_record(Urandom(urandom=True)), _record(Urandom(urandom=True)))
    assert both.verdict == "not counted"


class Growing(Workload):
    """A set-up drawn from the OS (the bias) whose optimizer state, which appears only at step 1 and
    moves more than the bias, must not be blamed: the reason names a tensor of the set-up."""

    def setup(self, ctx):
        model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            model.bias.fill_(1e-3 * (1 + int.from_bytes(os.urandom(2), "little") / 65536))
        return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-6), "x": torch.zeros(2, 4)}

    def run_round(self, state):
        state["optimizer"].zero_grad()
        state["model"](state["x"]).square().sum().backward()  # the bias's gradient: 4 x the bias
        state["optimizer"].step()


def test_an_unreproducible_set_up_is_blamed_on_a_tensor_of_the_set_up():
    record = _record(Growing())
    assert "bias" in record["not_reproducible"] and "exp_avg" not in record["not_reproducible"], record


def test_a_replay_of_no_steps_is_not_counted():
    record = _record(Compiled(), steps=0)
    verdict = compare_numerics(record, _record(Compiled(), steps=0))
    assert verdict.verdict == "not counted" and "no step" in verdict.line, verdict.line


def test_replays_with_other_seeds_are_not_compared():
    base = _record(Compiled())
    verdict = compare_numerics(base, dict(_record(Compiled()), seed=1))
    assert verdict.verdict == "not counted" and "seed" in verdict.line, verdict.line


def test_duplicate_names_and_a_first_nondeterministic_step_past_the_steps_are_bad_input():
    record = _record(Compiled())
    duplicated = dict(record, names=[record["names"][0]] * len(record["names"]))
    with pytest.raises(RecordError, match="names"):
        compare_numerics(record, duplicated)
    with pytest.raises(RecordError, match="first_nondeterministic_step"):
        compare_numerics(record, dict(record, first_nondeterministic_step=7, replay_spread=0.1))


SALTED = '''
import json, sys, torch
sys.path[:0] = {paths!r}
from ddpbench.engine.numerics import combine_numerics, take_numerics
from ddpbench.workloads import Workload

class Ctx:
    rank, world_size, backend, device_type, core, device = 0, 1, "gloo", "cpu", None, torch.device("cpu")

class Salted(Workload):
    def setup(self, ctx):
        torch.manual_seed(hash("data") % 2**31)  # a per-process salt: the same in every replay here
        model = torch.nn.Linear(4, 2)
        return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}}

    def run_round(self, state):
        state["optimizer"].zero_grad()
        loss = state["model"](torch.ones(2, 4)).sum()
        loss.backward()
        state["optimizer"].step()
        return loss

print(json.dumps(combine_numerics([take_numerics(Salted(), Ctx(), 2)])))
'''


def test_a_per_process_salt_is_told_by_replays_in_two_processes():
    import json

    from ddpbench.engine.numerics import across_processes

    script = SALTED.format(paths=[p for p in sys.path if p])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    records = []
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                             env={**env, "PYTHONHASHSEED": seed}, check=True).stdout
        records.append(json.loads(out.strip().splitlines()[-1]))
    assert records[0]["first_nondeterministic_step"] is None  # each process alone: bitwise repeatable
    checked = across_processes(records)
    assert "two processes" in checked["not_reproducible"], checked
    same = across_processes([records[0], records[0]])
    assert "not_reproducible" not in same
    verdict = compare_numerics(checked, checked)
    assert verdict.verdict == "not counted" and "two processes" in verdict.line
