"""Descriptors and shared memory of this process: counts, limits, the sharing strategy, and the
error a handover raises when the open-file limit cannot hold it."""

from __future__ import annotations

import contextlib
import os
import resource

from ...pool import SendRefused

STRATEGIES = ("file_descriptor", "file_system")
# Descriptors kept free for what else happens during a transfer (the connection to the sender's
# resource sharer, DataLoader pipes): a handover that would leave fewer is refused up front.
FD_MARGIN = 32


class DatasetShareError(SendRefused):
    """A handover cannot happen (the open-file limit would be exceeded)."""


def fd_limit_message(side: str, tensors: int, needed: int, limit: int, open_now: int) -> str:
    """The message of the fd-limit error: the cause and the three fixes."""
    return (
        f"ddpbench: {side}: handing over this dataset needs {needed} file descriptors under the "
        f"'file_descriptor' sharing strategy ({tensors} tensors need {tensors} descriptors, one "
        f"shared-memory segment each), but the open-file limit (RLIMIT_NOFILE soft limit) is "
        f"{limit} with {open_now} already open. Fixes: pack the samples into one tensor "
        f"(ddpbench.PackedTensorDataset, layout 'packed': 4 descriptors whatever the sample count); "
        f"or torch.multiprocessing.set_sharing_strategy('file_system') in the sender and the "
        f"receivers (no descriptor per tensor); or raise the limit "
        f"(ulimit -n {_suggested_limit(needed + open_now)})."
    )


def _suggested_limit(needed: int) -> int:
    limit = 1024
    while limit < needed + FD_MARGIN:
        limit *= 2
    return limit


def open_fd_count() -> int:
    """Open file descriptors of this process (psutil's num_fds)."""
    import psutil

    return psutil.Process().num_fds()


def soft_fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def mapped_shm_segments() -> set[str]:
    """The shared-memory segments (/dev/shm files, unlinked or not) mapped into this process."""
    segments = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            at = line.find("/dev/shm/")
            if at >= 0:
                segments.add(line[at:].rstrip("\n").removesuffix(" (deleted)"))
    return segments


def torch_shm_files(pids) -> set[str]:
    """/dev/shm files torch created for the given pids (``torch_<pid>_...``; file_system strategy)."""
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefixes)}
    except OSError:
        return set()


@contextlib.contextmanager
def sharing_strategy(strategy: str):
    """Set torch.multiprocessing's sharing strategy in this process; restore it afterwards."""
    import torch.multiprocessing as tmp

    check_strategy(strategy)
    previous = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy(strategy)
    try:
        yield
    finally:
        tmp.set_sharing_strategy(previous)


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sharing strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


