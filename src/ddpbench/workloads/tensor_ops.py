"""The single-tensor all_gather and reduce_scatter, under the name the running torch gives them.

torch 2.13 added ``dist.all_gather_single`` / ``dist.reduce_scatter_single``; torch 2.11 and 2.12
have only ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (same arguments: output, input).
Every workload that issues them takes them from here, so one torch in the declared range
(pyproject: torch >= 2.11) never reaches for a name it lacks."""

from __future__ import annotations


def all_gather_tensor():
    """``all_gather_single`` where torch has it, else ``all_gather_into_tensor``: (output, input)."""
    import torch.distributed as dist

    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter_tensor():
    """``reduce_scatter_single`` where torch has it, else ``reduce_scatter_tensor``: (output, input, op=)."""
    import torch.distributed as dist

    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
