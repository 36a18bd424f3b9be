"""What adding a collective op takes: the entry at the bottom of this module, nothing else in
ddpbench (and, in the suite, a two-line benchmark function naming the case).

This module adds ``all_to_all`` to :data:`ddpbench.workloads.collectives.COLLECTIVES` when it is
imported, exactly as the same lines added to collectives.py would; tests/workloads/test_adding_a_collective.py
runs it through the engine, its check, the bandwidth figures and the report. The ranks import it
through the workload's class (:class:`ExtraCollective`), so they hold the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpbench.workloads.collectives import (COLLECTIVES, Collective, CollectiveSpec, _chunk,
                                            _fill_rank_data, _poison_output, fill_pattern, pattern_tables)


# ---- the change: one op's functions and its table entry -------------------------------------

def _all_to_all_buffers(state, empty) -> None:
    state["input"], state["output"] = empty(state["count"]), empty(state["count"])


def _run_all_to_all(state) -> None:
    import torch.distributed as dist

    dist.all_to_all_single(state["output"], state["input"])


def _expect_all_to_all(state, out) -> None:
    """Chunk s of this rank's output is chunk <this rank> of rank s's input."""
    ctx = state["ctx"]
    start, length = _chunk(state)
    for s in range(ctx.world_size):
        fill_pattern(out[s * length:(s + 1) * length], pattern_tables(s, ctx.device, state["dtype"], state["values"]),
                     start)


COLLECTIVES["all_to_all"] = CollectiveSpec(
    "all_to_all", lambda n: (n - 1) / n, False, ("out-of-place",), True,
    _all_to_all_buffers, _fill_rank_data, _poison_output, _run_all_to_all, _expect_all_to_all)

# ---- end of the change ------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtraCollective(Collective):
    """A plain :class:`Collective`; its module (this one) is what the ranks must import."""


def _run_own_input(state) -> None:
    """A planted bug: every rank keeps its own input instead of exchanging chunks."""
    state["output"].copy_(state["input"])


COLLECTIVES["all_to_all_without_exchange"] = CollectiveSpec(
    "all_to_all_without_exchange", lambda n: (n - 1) / n, False, ("out-of-place",), True,
    _all_to_all_buffers, _fill_rank_data, _poison_output, _run_own_input, _expect_all_to_all)
