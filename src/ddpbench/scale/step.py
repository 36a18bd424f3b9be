"""The census of one training step of the transformer family, on a real rank or a simulated one.

:func:`step_census` runs on any rank context: the workload's own ``setup`` (its model, DDP or
FSDP2 wrapping, AdamW), ``warmup_steps`` optimizer steps, then one more step whose collectives are
counted, and the training state this rank then holds. The same function runs on gloo ranks (the
tests' reference) and, through :func:`simulate`, as rank 0 of N under the fake process group.

A simulated micro-batch is one sequence of :data:`SIMULATED_TOKENS` tokens: DDP's and FSDP2's
collectives carry parameters and gradients, whose sizes do not depend on the batch, so a short
sequence issues the same collectives as the family's default batch at a fraction of the compute
(tests/scale/test_census_scale.py holds the two equal against real gloo ranks).
"""

from __future__ import annotations

import contextlib
from dataclasses import fields
from typing import Any

from ..workloads.training.metrics import rank_state_bytes
from ..workloads.training.transformer import COMM_HOOKS, TransformerTraining, _TransformerLoop

# Tokens per simulated micro-batch (one sequence).
SIMULATED_TOKENS = 8
# Steps before the counted one: the engine's default warm-up (--dist-warmup). DDP rebuilds its
# buckets in gradient order after its first step, and PowerSGD compresses from its third.
DEFAULT_WARMUP_STEPS = 2
# Where the memory simulation leaves the DeviceMesh it built before entering fake mode.
MESH_KEY = "ddpbench.scale.fsdp2_mesh"


def step_census(ctx, workload: TransformerTraining, warmup_steps: int = DEFAULT_WARMUP_STEPS,
                tokens: int | None = None) -> dict[str, Any]:
    """This rank's census of one optimizer step (after ``warmup_steps``) and the state bytes it
    holds after it: ``{"census": <census record>, "param_bytes_per_rank": ...,
    "grad_bytes_per_rank": ..., "optimizer_state_bytes_per_rank": ...}``. ``tokens``: train on one
    sequence of that many tokens per micro-batch instead of the workload's batch."""
    from ..engine.census import dynamo_snapshot

    # Compile figures count from this case's start, as the engine's do, not from whatever this
    # process compiled before (null when nothing was compiled since).
    at_start = dynamo_snapshot() or {"frames": 0, "graph_breaks": 0}
    state = workload.setup(ctx)
    try:
        loop = state["loop"]
        with _short_sequences(loop, workload, ctx, tokens):
            for _ in range(warmup_steps):
                workload.run_round(state)
            census = count_collectives(lambda: workload.run_round(state),
                                       loop.wrapped if workload.impl == "ddp" else None, at_start)
        return {"census": census, **rank_state_bytes(loop.model, loop.optimizer)}
    finally:
        workload.teardown(state)


def _short_sequences(loop, workload: TransformerTraining, ctx, tokens: int | None):
    """The loop trains on ``grad_accum`` micro-batches of one ``tokens``-long sequence while open."""
    if tokens is None:
        return contextlib.nullcontext()
    from ..workloads.training.gpt import make_tokens

    inputs, targets = make_tokens(workload.config, 1, workload.grad_accum, workload.seed, ctx.rank)
    return loop.training_on(inputs[..., :tokens].contiguous().to(ctx.device),
                            targets[..., :tokens].contiguous().to(ctx.device))


def count_collectives(step, ddp_module, dynamo_at_start: dict | None = None) -> dict[str, Any]:
    """The census record (:mod:`ddpbench.engine.census`) of the collectives ``step()`` issues on
    this rank, with DDP's bucket sizes when ``ddp_module`` is a DistributedDataParallel: read after
    the step, as the engine reads them (a step may rebuild the buckets as it starts).
    ``dynamo_at_start``: dynamo's counters when the case began."""
    from ..engine.census import ddp_bucket_sizes, take_census

    record = take_census(step, dynamo_at_start=dynamo_at_start)
    if ddp_module is not None:
        record["ddp_buckets"] = ddp_bucket_sizes(ddp_module)
    return record


def _register_python_allreduce(ddp, ctx) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp.register_comm_hook(None, default_hooks.allreduce_hook)


class SimulatedLoop(_TransformerLoop):
    """The family's loop, for FakeTensorMode too: FSDP2 shards over the DeviceMesh the simulation
    built before the mode (``ctx.scratch``, :data:`MESH_KEY`), and a fake
    loss has no value to read (nan)."""

    def fsdp_mesh(self):
        return self.ctx.scratch.get(MESH_KEY)

    def loss_value(self, loss) -> float:
        from torch._subclasses.fake_tensor import is_fake

        return float("nan") if is_fake(loss) else super().loss_value(loss)


class SimulatedTransformer(TransformerTraining):
    """The same workload for the fake process group: DDP's built-in all-reduce (which reads the
    reduced bucket out of the collective's future, empty under the fake backend) becomes torch's
    Python twin of it, one all_reduce of each bucket's buffer; every other hook is the family's."""

    comm_hooks = dict(COMM_HOOKS, none=_register_python_allreduce)
    loop_class = SimulatedLoop

    def training_data(self, ctx):
        """The family's data; under FakeTensorMode made on real tensors (token by token, which the
        mode would make slow) and handed over as fake ones of the same shapes."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch._guards import active_fake_mode

        mode = active_fake_mode()
        if mode is None:
            return super().training_data(ctx)
        with unset_fake_temporarily():
            real = super().training_data(ctx)
        return tuple(mode.from_tensor(t) for t in real)


def simulated(workload: TransformerTraining) -> SimulatedTransformer:
    """``workload``'s knobs on :class:`SimulatedTransformer`, one sequence a micro-batch (data
    made once, cut to :data:`SIMULATED_TOKENS` by :func:`step_census`), no peak-FLOPs probe."""
    knobs = {f.name: getattr(workload, f.name) for f in fields(workload)}
    knobs.update(batch_size=1, data_batches=1, measure_peak=False)
    return SimulatedTransformer(**knobs)


def simulate(workload: TransformerTraining, world_size: int,
             warmup_steps: int = DEFAULT_WARMUP_STEPS) -> dict[str, Any]:
    """:func:`step_census` of rank 0 of ``world_size`` ranks, in this process (fake process group)."""
    from ..pool.base import RankContext
    from .fakepg import simulated_world

    with simulated_world(world_size):
        ctx = RankContext(rank=0, world_size=world_size, backend="fake", device_type="cpu")
        return step_census(ctx, simulated(workload), warmup_steps, tokens=SIMULATED_TOKENS)
