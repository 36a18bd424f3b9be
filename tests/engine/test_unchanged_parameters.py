"""A step that trains nothing is said (ddpbench.engine.unchanged_parameters): from a case's numerics
replay, every parameter bitwise the same after each step on every rank names why (all gradients
zero, no gradient at all, gradients an optimizer never applied); a step that trains, a state
without parameters and a record that cannot say stay silent. In this process, one rank, no group."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ddpbench.engine.numerics import combine_numerics, take_numerics
from ddpbench.engine.unchanged_parameters import unchanged_parameters
from ddpbench.run_summary import case_lines
from ddpbench.workloads import Workload


class _Ctx:
    rank, world_size, backend, device_type, core, device = 0, 1, "gloo", "cpu", None, torch.device("cpu")


class Step(Workload):
    """One SGD step of a small classifier; ``kind`` plants what makes it train nothing."""

    def __init__(self, kind="trains"):
        self.kind = kind

    def setup(self, ctx):
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        trained = model
        if self.kind == "frozen":
            model.requires_grad_(False)
        if self.kind == "other-parameters":  # the optimizer holds a copy, not the model that steps
            trained = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        return {"model": model, "optimizer": torch.optim.SGD(trained.parameters(), lr=0.1),
                "x": torch.randn(6, 8), "y": torch.randint(0, 4, (6,))}

    def run_round(self, state):
        model, optimizer = state["model"], state["optimizer"]
        optimizer.zero_grad()
        logits = model(state["x"])
        if self.kind == "one-logit":  # pytorch/examples' one-logit cross-entropy: its gradient is zero
            loss = F.cross_entropy(logits[:, :1], torch.zeros(len(logits), dtype=torch.long))
        else:
            loss = F.cross_entropy(logits, state["y"])
        if loss.requires_grad:
            loss.backward()
        optimizer.step()
        return loss


def _record(kind, steps=3):
    return combine_numerics([take_numerics(Step(kind), _Ctx(), steps)])


def test_a_step_that_trains_says_nothing():
    assert unchanged_parameters(_record("trains")) is None


def test_zero_gradients_no_gradients_and_an_optimizer_of_other_parameters_are_each_named():
    assert unchanged_parameters(_record("one-logit")) == (
        "no parameter changed over 3 replayed steps on 1 rank: every gradient was zero")
    assert unchanged_parameters(_record("frozen")) == (
        "no parameter changed over 3 replayed steps on 1 rank: no parameter received a gradient (a frozen "
        "model, or a loss that does not reach them)")
    assert unchanged_parameters(_record("other-parameters", steps=1)).startswith(
        "no parameter changed over 1 replayed step on 1 rank: the gradients were not zero, yet nothing moved")


def test_a_state_without_parameters_and_records_that_cannot_say_stay_silent():
    class Buffers(Workload):
        def setup(self, ctx):
            return {"buffer": torch.zeros(4)}

        def run_round(self, state):
            return None

    assert unchanged_parameters(combine_numerics([take_numerics(Buffers(), _Ctx(), 2)])) is None
    assert unchanged_parameters(None) is None
    assert unchanged_parameters({"version": 2, "incomplete": "1 of 2 ranks recorded no numerics", "steps": 3,
                                 "digests": ["a"], "tensors": [[]]}) is None
    assert unchanged_parameters(_record("one-logit", steps=0)) is None  # no step: nothing to compare


def test_the_run_summary_shows_it_beside_the_case():
    class Bench:
        name = "test_step[gloo-2p]"
        extra_info = {"census": None, "memory": None, "numerics": None,
                      "parameters_unchanged": "no parameter changed over 3 replayed steps on 2 ranks: every "
                                              "gradient was zero"}

    (line,) = case_lines([Bench()])
    assert line.startswith("test_step[gloo-2p]  ") and line.endswith(
        "; no parameter changed over 3 replayed steps on 2 ranks: every gradient was zero"), line


RUN = '''
import functools

import torch

import torch.nn.functional as F

import ddpbench
from ddpbench.workloads import Workload

SGD = functools.partial(torch.optim.SGD, lr=0.05)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(ctx, index):
    return torch.randn(6, 8), torch.randint(0, 4, (6,))


def one_logit_loss(model, batch):
    """pytorch/examples' DDP tutorial: cross-entropy over one logit, whose gradient is zero."""
    logits = model(batch[0])[:, :1]
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))


class ForwardBackward(Workload):
    """Forward and backward of a layer, no optimizer step (as SyncBN's cases): it says so."""

    updates_parameters = False

    def setup(self, ctx):
        return {"layer": torch.nn.Linear(4, 4), "x": torch.randn(2, 4)}

    def run_round(self, state):
        state["layer"].zero_grad()
        state["layer"](state["x"]).sum().backward()


def test_trains(dist_benchmark):
    dist_benchmark(ddpbench.ModelTraining(mlp, batch, SGD))


def test_one_logit(dist_benchmark):
    dist_benchmark(ddpbench.ModelTraining(mlp, batch, SGD, loss=one_logit_loss))


def test_forward_backward(dist_benchmark):
    dist_benchmark(ForwardBackward())
'''


@pytest.mark.numerics  # the replay stays on in the run
def test_a_run_says_beside_the_case_that_its_step_trains_nothing(pytester):
    """pytorch/examples' one-logit cross-entropy passes every check, with all-zero gradients: the
    run's summary and the case's extra_info say so; a step that trains and a workload whose rounds
    are not meant to train (``updates_parameters = False``) say nothing."""
    pytester.makepyfile(test_steps=RUN)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not gpu", "--dist-warmup=2",
                                           "--dist-rounds=2", "--benchmark-json=out.json", timeout=300)
    result.assert_outcomes(passed=3, deselected=6)
    result.stdout.fnmatch_lines(["test_one_logit[[]gloo-2p[]] *; no parameter changed over 3 replayed steps on 2 "
                                 "ranks: every gradient was zero"])
    cases = {c["name"]: c["extra_info"] for c in json.loads((pytester.path / "out.json").read_text())["benchmarks"]}
    assert cases["test_one_logit[gloo-2p]"]["parameters_unchanged"].endswith("every gradient was zero")
    assert "parameters_unchanged" not in cases["test_trains[gloo-2p]"]
    assert "parameters_unchanged" not in cases["test_forward_backward[gloo-2p]"]
    assert "no parameter changed" not in "".join(line for line in result.outlines if "test_one_logit" not in line)
