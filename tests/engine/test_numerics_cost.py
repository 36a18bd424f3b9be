"""The numerics replay sums each tensor's figures once (issue 62): a tensor a replay finds as an earlier
one left it (a second replay that reproduces the first, a buffer no step writes) is hashed, and its
figures are the ones already summed, so the record is the same as summing every tensor anew."""

from __future__ import annotations

import torch

from ddpbench.engine import numerics
from ddpbench.engine.numerics import take_numerics
from ddpbench.workloads import Workload


class _Ctx:
    rank, world_size, backend, device_type, core, device = 0, 1, "gloo", "cpu", None, torch.device("cpu")


class Steady(Workload):
    """SGD on a small MLP beside a buffer no step writes."""

    def setup(self, ctx):
        model = torch.nn.Linear(8, 2)
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "x": torch.randn(4, 8), "table": torch.arange(64.0)}

    def run_round(self, state):
        state["optimizer"].zero_grad()
        loss = state["model"](state["x"]).square().mean()
        loss.backward()
        state["optimizer"].step()
        return loss


def test_a_second_replay_that_reproduces_the_first_sums_nothing_again(monkeypatch):
    # plain replays only: the band's perturbed replays move every tensor, so each is summed anew
    calls = []
    real = numerics._sums
    monkeypatch.setattr(numerics, "_sums", lambda flat: calls.append(flat.numel()) or real(flat))
    one = take_numerics(Steady(), _Ctx(), 3, replays=1, band_replays=0)
    summed_once = len(calls)
    two = take_numerics(Steady(), _Ctx(), 3, replays=2, band_replays=0)
    assert len(calls) == 2 * summed_once  # the second replay summed nothing
    assert two["replay_spread"] == 0.0 and two["replays"] == 2
    assert two["tensors"] == one["tensors"] and two["digests"] == one["digests"]
    # x and the table are never written: summed at step 0 only, found as they were at steps 1-3
    names_per_step = [len(step) for step in one["tensors"]]
    assert summed_once < sum(names_per_step)
    monkeypatch.setattr(numerics, "_sums", real)
    assert take_numerics(Steady(), _Ctx(), 3, replays=1, band_replays=0)["tensors"] == one["tensors"]
    assert numerics._known_figures is None  # nothing kept past the replay
