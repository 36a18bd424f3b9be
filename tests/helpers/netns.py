"""Two "hosts" on one machine: network namespaces joined by a veth pair.

Host A is 10.77.0.1/24, host B 10.77.0.2/24; each namespace has its loopback and the veth end,
and nothing else (no route out): traffic from processes started in them can only reach the other
namespace. Inside both, the machine's hostname resolves to 127.0.1.1, the way Debian and Ubuntu
install it (``ip netns exec`` mounts /etc/netns/NAME/hosts over /etc/hosts), whatever this
machine's own /etc/hosts or DNS say: the tests see the same name resolution everywhere, and a
name lookup never leaves the namespace. Needs root and iproute2's ``ip``; :func:`unavailable`
says why not otherwise. Everything is removed on exit, processes still running in the
namespaces included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass

import psutil

SUBNET_PREFIX = "10.77.0."
NETNS_ETC = "/etc/netns"  # per-namespace files that `ip netns exec` mounts over /etc


@dataclass(frozen=True)
class Host:
    namespace: str
    interface: str
    address: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")


def unavailable() -> str | None:
    """Why two namespaces cannot be made here (None when they can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root for network namespaces (ip netns); CI runs this test with sudo"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command for network namespaces"
    probe = f"ddpbprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace here ({exc})"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        _ip("netns", "del", probe)
    return None


def namespace_pids(namespace: str) -> list[int]:
    result = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    return [int(pid) for pid in result.stdout.split()]


def kill_namespace_processes(namespace: str) -> None:
    """Kill every process that runs in ``namespace`` (all of them started by the test) and wait."""
    victims = []
    for pid in namespace_pids(namespace):
        with contextlib.suppress(psutil.Error):
            victims.append(psutil.Process(pid))
    for victim in victims:
        with contextlib.suppress(psutil.Error):
            victim.kill()
    psutil.wait_procs(victims, timeout=10)


@contextlib.contextmanager
def two_hosts():
    """Yield (host A, host B); remove both namespaces (and their processes) afterwards."""
    tag = str(os.getpid())
    a = Host(f"ddpb{tag}a", f"vd{tag}a", SUBNET_PREFIX + "1")
    b = Host(f"ddpb{tag}b", f"vd{tag}b", SUBNET_PREFIX + "2")
    made = []
    try:
        for host in (a, b):
            _ip("netns", "add", host.namespace)
            made.append(host.namespace)
            etc = os.path.join(NETNS_ETC, host.namespace)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as fh:
                fh.write(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")
        # Created directly inside the namespaces: no name ever appears in the host's own namespace.
        _ip("link", "add", a.interface, "netns", a.namespace, "type", "veth",
            "peer", "name", b.interface, "netns", b.namespace)
        for host in (a, b):
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
        yield a, b
    finally:
        for namespace in made:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                kill_namespace_processes(namespace)
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _ip("netns", "del", namespace)
            shutil.rmtree(os.path.join(NETNS_ETC, namespace), ignore_errors=True)


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses process ``pid`` listens on, read from its own network namespace's
    /proc tables (psutil reads the caller's namespace)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/{pid}/net/{table}") as fh:
            rows = fh.read().splitlines()[1:]
        for row in rows:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            host_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(host_hex)
            # /proc prints each 32-bit word of the address in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return sorted(found)
