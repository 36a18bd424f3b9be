"""What the collective cases need from a pytest run: the message sizes collected by default and
the memory pre-flight that stops a run before any rank starts when a selected size cannot fit.
The plugin wires these to its options; it decides nothing about collectives itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ..devices import cuda_device_count
from ..options import DEFAULT_SIZES, format_size, parse_sizes
from .collectives import rank_memory_bytes

if TYPE_CHECKING:
    from ..pool import PoolSpec

SLOW_SIZES = (1024**3,)  # 1 GB: collected with the `slow` marker when --dist-sizes is not given


def size_params(sizes: list[int] | None) -> list:
    """The ``dist_message_size`` parameters: --dist-sizes as given, else the defaults and 1 GB
    under the ``slow`` marker."""
    if sizes is not None:
        return [pytest.param(s, id=format_size(s)) for s in sizes]
    return ([pytest.param(s, id=format_size(s)) for s in parse_sizes(DEFAULT_SIZES)]
            + [pytest.param(s, id=format_size(s), marks=pytest.mark.slow) for s in SLOW_SIZES])


# Each rank process holds this much besides its buffers (the interpreter, torch, gloo).
RANK_BASE_MEMORY_BYTES = 384 * 1024**2
# Leave this share of the available memory free.
MEMORY_MARGIN = 0.9


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def memory_needs(items, pools_at_once: int = 1) -> list[tuple[int, PoolSpec, int]]:
    """(message size, spec, bytes needed) for the collected collective cases, largest need per
    (size, spec). CPU pools need world size x (base + buffers) of host memory (x pools_at_once:
    A/B mode keeps two pools alive); NCCL ranks need the buffers on their own GPU."""
    from ..pool import PoolSpec  # not at import: the plugin loads this module in every session

    needs = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        size, spec = params.get("dist_message_size"), params.get("dist_spec")
        if not isinstance(size, int) or not isinstance(spec, PoolSpec) or item.get_closest_marker("skip"):
            continue
        if spec.device == "cpu":
            need = pools_at_once * spec.world_size * (RANK_BASE_MEMORY_BYTES + rank_memory_bytes(size))
        else:
            need = rank_memory_bytes(size)
        needs[(size, spec)] = need
    return [(size, spec, need) for (size, spec), need in needs.items()]


def check_memory(items, pools_at_once: int, host_available: int, gpu_free) -> None:
    """Raise pytest.UsageError naming the largest case that cannot fit (host memory, or the free
    memory of the smallest GPU for NCCL cases)."""
    for size, spec, need in sorted(memory_needs(items, pools_at_once), key=lambda x: -x[2]):
        if spec.device == "cpu":
            available = int(host_available * MEMORY_MARGIN)
            where = f"{_gib(host_available)} of host memory is available"
            who = f"{spec.world_size} ranks" + (f" x {pools_at_once} pools (A/B mode: both sides' pools "
                                                f"alive at once)" if pools_at_once > 1 else "")
        else:
            free = gpu_free()
            if free is None:
                continue
            available = int(free * MEMORY_MARGIN)
            where = f"the smallest GPU has {_gib(free)} free"
            who = "each NCCL rank on its GPU"
        if need > available:
            raise pytest.UsageError(
                f"--dist-sizes: the {format_size(size)} collective cases on {spec.label} need about "
                f"{_gib(need)} ({who}: the buffers, the backend's copy and the check's expected "
                f"result), but {where}. Use smaller --dist-sizes (e.g. --dist-sizes=1MB,10MB,100MB) "
                f"or fewer ranks (--dist-world-sizes)"
                + (", or fewer A/B pools (--dist-ab-pools-per-side=1)." if pools_at_once > 2 else "."))


def smallest_gpu_free_bytes():
    """The free memory of the smallest visible GPU (None without CUDA)."""
    if not cuda_device_count():
        return None
    import torch

    return min(torch.cuda.mem_get_info(i)[0] for i in range(cuda_device_count()))


