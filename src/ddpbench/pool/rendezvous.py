"""Loopback-only process-group set-up for the rank pool.

torch's TCPStore listens on every interface even when it is given 127.0.0.1, so single-node pools
rendezvous through a FileStore kept in a private (0700) temporary directory instead: nothing
listens for the rendezvous at all. The gloo and NCCL transports are bound to the loopback
interface through GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, so their per-pair listeners bind to
127.0.0.1 only.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile

import psutil

STORE_FILE_NAME = "filestore"


def loopback_interface() -> str:
    """Name of the network interface that carries 127.0.0.1 ("lo" on Linux, "lo0" on macOS)."""
    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.address == "127.0.0.1":
                return name
    return "lo"


def make_private_store_dir() -> str:
    """A fresh directory only the current user can read (mkdtemp creates it 0700)."""
    path = tempfile.mkdtemp(prefix="ddpbench-pool-")
    os.chmod(path, 0o700)
    return path


def remove_store_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def bind_transports_to_loopback() -> None:
    """Make gloo and NCCL bind their sockets to the loopback interface (call before init)."""
    interface = loopback_interface()
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    os.environ["NCCL_SOCKET_IFNAME"] = interface
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")


def init_loopback_process_group(
    backend: str, rank: int, world_size: int, store_dir: str, timeout_s: float
) -> None:
    """Join the pool's process group through the FileStore in ``store_dir``."""
    import torch.distributed as dist

    bind_transports_to_loopback()
    store = dist.FileStore(os.path.join(store_dir, STORE_FILE_NAME), world_size)
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
