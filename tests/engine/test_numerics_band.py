"""The numerics band and the exact figures (issue 63), in this process on one rank: what the
perturbed replays measure, the gradients as the optimizer receives them, the figures rounding
cannot move, and bf16 autocast widening the band by its unit in the last place."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ddpbench.engine.numerics import (BAND_REPLAYS, Perturbation, combine_numerics, replay_once, take_numerics)
from ddpbench.gates.numerics import compare_numerics
from ddpbench.workloads import Workload


class _Ctx:
    rank, world_size, backend, device_type, core, device = 0, 1, "gloo", "cpu", None, torch.device("cpu")


class Step(Workload):
    """AdamW on a small MLP, nanoGPT's way: a warm-up schedule, a clip at norm ``clip``, ``zero_grad``
    after the step (so no gradient is left when the round ends); ``lr_shift`` moves the schedule by
    steps, ``scale`` the loss, ``bf16`` runs the forward under bf16 autocast."""

    def __init__(self, lr_shift=0, scale=1.0, clip=1.0, bf16=False, nudge=False):
        self.lr_shift, self.scale, self.clip, self.bf16, self.nudge = lr_shift, scale, clip, bf16, nudge

    def setup(self, ctx):
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return {"model": model, "optimizer": optimizer, "x": torch.randn(32, 16), "it": [0], "fired": [None]}

    def run_round(self, state):
        it = state["it"][0]
        if self.nudge and it == 0:  # one tensor one unit in the last place off: less than rounding everywhere
            from ddpbench.engine.numerics import _nudge

            _nudge(state["model"][2].bias, torch.Generator().manual_seed(9), 24)
        for group in state["optimizer"].param_groups:
            group["lr"] = 1e-3 * min(1.0, (it + 1 + self.lr_shift) / 4)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        with autocast:
            loss = state["model"](state["x"]).float().square().mean() * self.scale
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(state["model"].parameters(), self.clip)
        state["fired"][0] = bool(norm > self.clip)
        state["optimizer"].step()
        state["optimizer"].zero_grad(set_to_none=True)
        state["it"][0] += 1
        return loss

    def numerics_scalars(self, state):
        return {"clip fired": state["fired"][0]}


def _record(workload, steps=3):
    return combine_numerics([take_numerics(workload, _Ctx(), steps)])


def test_gradients_are_taken_as_the_optimizer_receives_them_and_exact_figures_each_step():
    record = _record(Step())
    assert {"grad 0.weight", "grad 2.bias"} <= set(record["names"])  # zero_grad came after the step
    first, third = record["scalars"][0][1], record["scalars"][0][3]
    assert first["group 0 lr"] == pytest.approx(2.5e-4) and third["group 0 lr"] == pytest.approx(7.5e-4)
    assert first["group 0 params"] == 4 and first["group 0 with grad"] == 4 and first["optimizer steps"] == 1
    assert "group 0 foreach" not in first and "group 0 fused" not in first  # implementation flags
    assert first["workload clip fired"] in (True, False)
    assert record["scalars"][0][0]["optimizer steps"] == 0


def test_the_band_is_measured_per_step_and_group_after_the_set_up_s_fingerprint():
    record = _record(Step())
    assert record["band_replays"] == BAND_REPLAYS and record["band_bits"] == 24
    assert record["band"][0] == {}  # the perturbation comes after the set-up's fingerprint
    grads = [step.get("grad", 0.0) for step in record["band"][1:]]
    assert all(0 < g < 1e-3 for g in grads), record["band"]
    assert record["band"][1]["loss"] > 0  # the first step's loss moved with the parameters


def test_a_perturbed_replay_moves_each_element_by_one_unit_in_the_last_place():
    plain = replay_once(Step(), _Ctx(), 0)
    moved = replay_once(Step(), _Ctx(), 1, perturbation=Perturbation(1))
    assert plain.figures[0] == moved.figures[0]  # the set-up's fingerprint is taken first
    weight = torch.nn.Linear(16, 64).weight.detach().clone()
    nudged = weight.clone()
    from ddpbench.engine.numerics import _nudge

    _nudge(nudged, torch.Generator().manual_seed(3), 24)
    ulps = ((nudged - weight).abs() / torch.ldexp(torch.ones_like(weight), torch.frexp(weight)[1] - 24))
    assert torch.all(ulps == 1)


def test_rounding_reads_rounding_a_scaled_loss_and_a_schedule_one_step_off_read_changed():
    base = _record(Step())
    nudged = compare_numerics(base, _record(Step(nudge=True)))
    assert nudged.outcome == "rounding" and nudged.ratio < 1, nudged.line
    halved = compare_numerics(base, _record(Step(scale=0.5)))
    assert halved.outcome == "changed" and halved.ratio > 10 and halved.resolving_step == 1, halved.line
    shifted = compare_numerics(base, _record(Step(lr_shift=1)))
    assert shifted.outcome == "changed" and "group 0 lr 0.00025 → 0.0005 at step 1" in shifted.line, shifted.line


class NamesItsNorm(Step):
    """Names a figure rounding does move: the gradient's norm (as a clip on the edge of firing is)."""

    def run_round(self, state):
        loss = super().run_round(state)
        state["norm"] = float(sum(p.detach().square().sum() for p in state["model"].parameters()))
        return loss

    def numerics_scalars(self, state):
        return {**super().numerics_scalars(state), "norm": state["norm"]}


def test_a_named_figure_the_perturbed_replays_move_is_not_compared_exactly():
    record = _record(NamesItsNorm())
    assert record["rounding_scalars"] == ["workload norm"]
    nudged = compare_numerics(record, _record(NamesItsNorm(nudge=True)))
    assert nudged.outcome == "rounding", nudged.line  # the norm moved, but rounding moves it too


def test_bf16_autocast_widens_the_band_by_its_unit_in_the_last_place():
    fp32, bf16 = _record(Step()), _record(Step(bf16=True))
    assert bf16["band_bits"] == 8 and "bfloat16" in bf16["compute_dtypes"]
    assert bf16["band"][1]["grad"] > 100 * fp32["band"][1]["grad"]
    lossy = compare_numerics(bf16, _record(Step(bf16=True, scale=1 + 2**-11)))  # fp16 rounding of the loss
    assert lossy.outcome == "rounding", lossy.line
    assert compare_numerics(fp32, _record(Step(scale=1 + 2**-11))).outcome == "changed"


def test_gradients_are_judged_as_the_backward_left_them_before_a_clip_hides_a_scale():
    # A clip that fires at every step and Adam both cancel a constant scale of the gradient (a sum
    # over the ranks instead of their mean): after the clip the step is the same up to rounding.
    base = _record(Step(clip=1e-3))
    doubled = compare_numerics(base, _record(Step(clip=1e-3, scale=2.0)))
    assert doubled.outcome == "changed" and doubled.resolving_step == 1, doubled.line
    # the gradient as the backward left it (before the clip) moved by 100%; the clip hid it from the step
    assert "in backward-grad " in doubled.line and "largest relative difference 1 (100%)" in doubled.line, doubled.line
