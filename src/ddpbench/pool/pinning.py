"""Core pinning of a local pool's ranks (--dist-pin-cores): whether to pin (decided by the
controller) and setting a rank's CPU affinity (done in the rank while it measures)."""

from __future__ import annotations

import os


def cores_available() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return []


def should_pin(world_size: int, requested: bool) -> bool:
    """Pinning is used only where every rank gets a core of its own."""
    cores = cores_available()
    return requested and bool(cores) and world_size <= len(cores)


def set_process_affinity(cores) -> None:
    """Set the CPU affinity of every thread of this process (gloo's threads included)."""
    cores = set(cores)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that just exited
            pass
