"""What the training families share (:class:`~.workload.Training`, :class:`~.transformer.TransformerTraining`):
a rank's loop whose ``step()`` is one optimizer step over ``grad_accum`` micro-batches
(:class:`TrainingLoop`), and a workload whose round is that step (:class:`TrainingWorkload`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any

from .. import COMMUNICATION_ONLY, COMPUTE_ONLY, Workload
from .compute_only import SkippedCollectives
from .replay import CollectiveReplay


class TrainingLoop:
    """One rank's training loop; ``step()`` is one optimizer step over ``grad_accum`` micro-batches.

    A loop sets ``optimizer`` and implements ``module()`` and ``_micro_step`` (forward and backward
    of one micro-batch); it may reduce gradients itself in ``_before_optimizer_step``."""

    def __init__(self, ctx, workload, data):
        self.ctx = ctx
        self.w = workload
        self.inputs, self.targets = data
        self.cursor = 0
        self.losses: list[float] = []
        # The (inputs, targets) micro-batches of the last finished optimizer step (Training.check).
        self.last_step_batches: list = []
        self.optimizer = None  # the torch optimizer (Training.check reads its momentum buffers)
        # compute-only: what the step's exchanges would have sent (.compute_only)
        self.skipped = SkippedCollectives() if workload.compute_only else None

    def next_batch(self):
        i = self.cursor % self.inputs.shape[0]
        self.cursor += 1
        return self.inputs[i], self.targets[i]

    @contextlib.contextmanager
    def training_on(self, inputs, targets):
        """Take micro-batches from ``inputs`` / ``targets`` (shaped as the loop's data) until the
        block ends, then go back to the loop's own data where it left off (the checks)."""
        saved = self.inputs, self.targets, self.cursor
        self.inputs, self.targets, self.cursor = inputs, targets, 0
        try:
            yield
        finally:
            self.inputs, self.targets, self.cursor = saved

    def module(self):
        """The model itself (unwrapped)."""
        raise NotImplementedError

    def trained_module(self):
        """The module as the step runs it (a DDP or DataParallel wrapper where there is one)."""
        return self.module()

    def ddp_module(self):
        """The DistributedDataParallel wrapper this loop trains through, or None."""
        return None

    def loss_value(self, loss) -> float:
        """A micro-batch's loss as a float (a simulation on fake tensors has no value to read)."""
        return float(loss.detach())

    def step(self) -> float:
        """One optimizer step: ``grad_accum`` micro-batches, each loss scaled by 1/grad_accum,
        then ``_before_optimizer_step`` (where a loop reduces gradients itself) and the step."""
        accum = self.w.grad_accum
        if self.skipped is not None:
            self.skipped.new_step()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        batches = []
        for i in range(accum):
            x, y = self.next_batch()
            batches.append((x, y))
            total += self._micro_step(x, y, accum, last=i == accum - 1)
        self._before_optimizer_step()
        self.optimizer.step()
        self.losses.append(total / accum)
        self.last_step_batches = batches
        return self.losses[-1]

    def _micro_step(self, x, y, accum: int, last: bool) -> float:
        """Forward and backward of one micro-batch; returns its (unscaled) loss."""
        raise NotImplementedError

    def _before_optimizer_step(self) -> None:
        pass

    def close(self) -> None:
        pass


class TrainingWorkload(Workload):
    """A workload whose round is one optimizer step of this rank's :class:`TrainingLoop`
    (``state["loop"]``, built by ``build_loop``), with the compute-only and communication-only
    variants where ``has_compute_only_form`` (docs/design/families.md#exposed-communication). A subclass
    is a frozen dataclass with a ``compute_only`` field."""

    def build_loop(self, ctx) -> TrainingLoop:
        raise NotImplementedError

    def setup(self, ctx) -> dict[str, Any]:
        started = time.perf_counter()
        loop = self.build_loop(ctx)
        return {"ctx": ctx, "loop": loop, "setup_seconds": time.perf_counter() - started}

    def run_round(self, state) -> float:
        return state["loop"].step()  # the step's loss: the numerics replay fingerprints it

    @property
    def single_process(self) -> bool:
        """Whether the loop trains in one process with no process group to reduce over."""
        return False

    def rank_metrics(self, state) -> dict[str, Any]:
        """The last step's loss averaged over ranks (each rank saw different data), the optimizer
        steps taken, the set-up's seconds."""
        import torch
        import torch.distributed as dist

        ctx, loop = state["ctx"], state["loop"]
        last = torch.tensor([loop.losses[-1] if loop.losses else float("nan")], dtype=torch.float64,
                            device=ctx.device)
        if not self.single_process:
            dist.all_reduce(last, op=dist.ReduceOp.SUM)
            last /= ctx.world_size
        return {"final_loss": float(last.item()), "optimizer_steps": len(loop.losses),
                "setup_seconds": round(state["setup_seconds"], 4)}

    def has_compute_only_form(self) -> bool:
        """Whether ddpbench can leave this configuration's exchanges out (its compute-only variant)."""
        return True

    def compute_only_variant(self) -> "TrainingWorkload":
        return dataclasses.replace(self, compute_only=True)

    def variants(self) -> dict[str, Workload]:
        """The compute-only step and its collectives replayed alone, where the configuration has a
        compute-only form."""
        if self.compute_only or not self.has_compute_only_form():
            return {}
        compute = self.compute_only_variant()
        return {COMPUTE_ONLY: compute, COMMUNICATION_ONLY: CollectiveReplay(compute)}

    def skipped_collectives(self, state) -> list[dict[str, Any]]:
        """The compute-only variant's record of its last step's skipped collectives (census-shaped)."""
        return state["loop"].skipped.record()

    def memory_census_targets(self, state) -> list:
        """The model as the loop trains it (its wrapper where it has one, so that DDP's buckets are
        named), the optimizer and the rank's micro-batches."""
        loop = state["loop"]
        return [loop.trained_module(), loop.optimizer, loop.inputs, loop.targets]

    def teardown(self, state) -> None:
        loop = state.get("loop")
        if loop is not None:
            loop.close()
        state.clear()


def check_finite_losses(who: str, losses: list[float]) -> None:
    bad = [loss for loss in losses if not math.isfinite(loss)]
    if bad:
        raise AssertionError(f"{who}: non-finite loss {bad[0]}")
