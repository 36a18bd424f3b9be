"""A training step's collectives replayed alone: the communication-only variant, whose median round
is the step's isolated communication time (``comm_isolated_s``).

:class:`CollectiveReplay` learns the step's collectives from a compute-only variant (its
:class:`~.compute_only.SkippedCollectives` record of the last of two steps, so DDP's rebuilt buckets
are the ones replayed), frees that model, and each round issues the same calls, in the record's
order, on buffers of the same sizes and dtypes. :func:`replay_calls` is the one place that turns a
census-shaped record (per collective kind, dtype and group size, each call's bytes) into calls.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .. import Workload
from ..tensor_ops import all_gather_tensor, reduce_scatter_tensor

# Steps of the source run in set-up: DDP rebuilds its buckets, in the order gradients became
# ready, at the start of the second step; the record kept is the last step's.
SOURCE_STEPS = 2
REPLAYED_KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def replay_calls(record: list[dict[str, Any]], world_size: int, device) -> list:
    """One zero-argument function per call of ``record`` (census-shaped entries: ``kind``,
    ``dtype``, ``group_size``, ``call_bytes``, the input bytes of each call), each issuing that
    collective on the default group. Buffers are shared per (kind, dtype), sized for the largest
    call. A kind or group this replay cannot issue is a ValueError naming it."""
    import torch
    import torch.distributed as dist

    all_gather, reduce_scatter = all_gather_tensor(), reduce_scatter_tensor()
    calls = []
    for entry in record:
        kind, dtype_name, group_size = entry["kind"], entry["dtype"], entry["group_size"]
        if kind not in REPLAYED_KINDS:
            raise ValueError(f"cannot replay a {kind!r} collective; replayed kinds: {', '.join(REPLAYED_KINDS)}")
        if group_size != world_size:
            raise ValueError(f"cannot replay a {kind} over {group_size} ranks: the replay uses the default group "
                             f"of {world_size}")
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{kind} record names an unknown dtype {dtype_name!r}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        sizes = [int(nbytes) // itemsize for nbytes in entry["call_bytes"]]
        if not sizes:
            continue
        largest = max(sizes)
        source = torch.zeros(largest, dtype=dtype, device=device)
        if kind == "all_gather":
            target = torch.zeros(largest * world_size, dtype=dtype, device=device)
            calls += [functools.partial(all_gather, target[:n * world_size], source[:n])
                      for n in sizes]
        elif kind == "reduce_scatter":  # the input is every rank's chunk, the output this rank's
            target = torch.zeros(largest // world_size, dtype=dtype, device=device)
            calls += [functools.partial(reduce_scatter, target[:n // world_size],
                                        source[:n // world_size * world_size]) for n in sizes]
        else:
            calls += [functools.partial(dist.all_reduce, source[:n]) for n in sizes]
    return calls


@dataclass(frozen=True)
class CollectiveReplay(Workload):
    """The collectives of one step of ``source`` (a compute-only variant with a
    ``skipped_collectives(state)`` method), replayed alone; a round issues all of them."""

    source: Any

    def setup(self, ctx) -> dict[str, Any]:
        state = self.source.setup(ctx)
        try:
            for _ in range(SOURCE_STEPS):
                self.source.run_round(state)
            record = self.source.skipped_collectives(state)
        finally:
            self.source.teardown(state)
        return {"record": record, "calls": replay_calls(record, ctx.world_size, ctx.device)}

    def run_round(self, state) -> None:
        for call in state["calls"]:
            call()

    def teardown(self, state) -> None:
        state.clear()
