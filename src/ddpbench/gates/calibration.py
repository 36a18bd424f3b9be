"""Machine-drift calibration: a short, fixed local benchmark recorded with every saved run, by which
``ddpbench compare`` corrects a uniformly slower machine (docs/design/gates.md#machine-drift)."""

from __future__ import annotations

import os
import time
from typing import Any

PROBE_KIND = "memcpy-4MiB+matmul-128-float32-1thread"
PROBE_VERSION = 1


def run_probe(max_seconds: float = 0.3, max_repeats: int = 200, min_repeats: int = 5) -> dict[str, Any]:
    """Run the probe; returns ``{"kind", "version", "min_s", "median_s", "repeats"}``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.arange(1024 * 1024, dtype=torch.float32)  # 4 MiB
        dst = torch.empty_like(src)
        a = torch.rand(128, 128, generator=torch.Generator().manual_seed(0))
        out = torch.empty_like(a)

        def once() -> None:
            dst.copy_(src)
            torch.mm(a, a, out=out)

        once()  # warm-up: page faults, allocator, kernel selection
        times: list[float] = []
        deadline = time.perf_counter() + max_seconds
        while len(times) < max_repeats and (len(times) < min_repeats or time.perf_counter() < deadline):
            start = time.perf_counter()
            once()
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    ordered = sorted(times)
    try:
        load_1m = os.getloadavg()[0]
    except (AttributeError, OSError):
        load_1m = None
    return {
        "kind": PROBE_KIND,
        "version": PROBE_VERSION,
        "min_s": ordered[0],
        "median_s": ordered[len(ordered) // 2],
        "repeats": len(ordered),
        "loadavg_1m": load_1m,
        "cpu_count": os.cpu_count(),
    }


# A probe whose median repetition is more than this multiple of its fastest ran on a busy machine:
# its minimum then mixes machine speed with load, and normalising by it would only add noise.
MAX_PROBE_SPREAD = 1.25


def probe_spread(probe: dict | None) -> float | None:
    """median / min of the probe's repetitions (1.0: perfectly steady), None if unknown."""
    if probe is None or not isinstance(probe.get("median_s"), (int, float)):
        return None
    return float(probe["median_s"]) / float(probe["min_s"])


def overload(probe: dict | None) -> str | None:
    """'load 12.4 on 2 CPUs' when the 1-minute load average exceeded the CPU count, else None."""
    if probe is None:
        return None
    load, cpus = probe.get("loadavg_1m"), probe.get("cpu_count")
    if isinstance(load, (int, float)) and isinstance(cpus, int) and cpus > 0 and load > cpus:
        return f"load {load:.1f} on {cpus} CPUs"
    return None


# The largest machine drift the probe may correct, either way: a probe ratio outside
# [1 / MAX_CORRECTION, MAX_CORRECTION] = [0.8, 1.25] is not a drift but another machine, or one under
# load that one 0.3 s probe cannot describe.
MAX_CORRECTION = 1.25


def within_correction(drift: float) -> bool:
    """Whether the probe may correct a drift of ``drift`` (current / baseline probe time)."""
    return 1 / MAX_CORRECTION <= drift <= MAX_CORRECTION


def drift_factor(baseline_probe: dict | None, current_probe: dict | None) -> float | None:
    """current / baseline probe time (>1: the current machine is slower), or None if not comparable."""
    if baseline_probe is None or current_probe is None:
        return None
    if (baseline_probe.get("kind"), baseline_probe.get("version")) != (
            current_probe.get("kind"), current_probe.get("version")):
        return None
    return float(current_probe["min_s"]) / float(baseline_probe["min_s"])
