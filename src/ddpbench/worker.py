"""A rank started by torchrun that serves a ddpbench controller (multi-node pools).

`torchrun ... -m ddpbench.worker --controller HOST:PORT`; docs/design/multi-node-and-gpu.md#the-torchrun-worker-workerpy.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import ipaddress
import os
import socket
import sys
import tempfile
import threading
import time
from multiprocessing.connection import AuthenticationError

import psutil

from .identity import identity
from .options import parse_timeout
from .pool.base import RankContext
from .pool.channel import HANDSHAKE_TIMEOUT_S, HandshakeTimeout, IncompatiblePeer, connect_signed
from .pool.external import SecretError, load_secret, parse_address
from .pool.task_loop import serve_tasks

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# The variable each backend's transport reads its interface from.
IFNAME_VARIABLES = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}
AUTO_SOURCE = "auto (route to controller)"


def _connect(address: tuple[str, int], secret: bytes, timeout_s: float):
    """Connect and open the signed channel (:mod:`ddpbench.pool.channel`), retrying while the
    controller is not listening yet, for ``timeout_s`` in all. Once a connection is accepted, the
    handshake must finish within ``timeout_s`` or :data:`HANDSHAKE_TIMEOUT_S`, the smaller: a
    port that accepts and never answers raises HandshakeTimeout, naming the address, instead of
    holding the rank for ever. AuthenticationError and IncompatiblePeer are not retried."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return connect_signed(address, secret, min(timeout_s, HANDSHAKE_TIMEOUT_S))
        except (HandshakeTimeout, AuthenticationError, IncompatiblePeer):
            raise
        except OSError:  # not listening yet (refused, unreachable, the SYN timed out)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def local_address(conn) -> str:
    """The local address of a connected multiprocessing Connection's socket: the address the
    kernel routed the connection through."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return sock.getsockname()[0]


def _plain_ip(address: str) -> str:
    address = address.split("%", 1)[0]  # IPv6 scope (fe80::1%eth0)
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped:
        return str(parsed.ipv4_mapped)
    return str(parsed)


def interface_of(address: str) -> str | None:
    """Name of the local network interface that carries ``address`` (None if none does)."""
    wanted = _plain_ip(address)
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family in (socket.AF_INET, socket.AF_INET6) and _plain_ip(entry.address) == wanted:
                return name
    return None


def interface_addresses(names: str) -> list[str]:
    """The IP addresses of the interface(s) in a *_SOCKET_IFNAME value ("eth0", "eth0,eth1";
    NCCL's "=eth0" / "^docker" forms are matched loosely), link-local IPv6 ones left out."""
    found = []
    all_addresses = psutil.net_if_addrs()
    for name in names.split(","):
        name = name.strip().lstrip("=")
        if not name or name.startswith("^"):
            continue
        for entry in all_addresses.get(name, []):
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                address = _plain_ip(entry.address)
                with contextlib.suppress(ValueError):
                    if ipaddress.ip_address(address).is_link_local and ":" in address:
                        continue
                found.append(address)
    return found


def resolve(host: str) -> list[str]:
    """The addresses ``host`` resolves to here (empty if it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(_plain_ip(info[4][0]) for info in infos))


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(_plain_ip(address)).is_loopback
    except ValueError:
        return False


def choose_socket_interface(backend: str, controller_local_address: str,
                            environ=os.environ) -> dict:
    """Make the transport use the interface that reaches the controller, unless told otherwise.

    For each of GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME that is unset, set it (in ``environ``)
    to the interface carrying ``controller_local_address``. Returns what the backend's transport
    will use: ``socket_ifname``, ``socket_ifname_source`` (the variable's name when it was given,
    ``AUTO_SOURCE`` when picked here) and ``socket_addresses``.
    """
    variable = IFNAME_VARIABLES[backend]
    given = environ.get(variable)
    picked = interface_of(controller_local_address)
    for name in IFNAME_VARIABLES.values():
        if picked and not environ.get(name):
            environ[name] = f"={picked}" if name == "NCCL_SOCKET_IFNAME" else picked  # "=": exact name
    if given:
        return {"socket_ifname": given, "socket_ifname_source": variable,
                "socket_addresses": interface_addresses(given)}
    if picked:
        return {"socket_ifname": picked, "socket_ifname_source": AUTO_SOURCE,
                "socket_addresses": interface_addresses(picked)}
    # No interface carries that address (unusual: NAT inside the host?): the transport's own
    # default, which for gloo is the address the hostname resolves to.
    hostname = socket.gethostname()
    return {"socket_ifname": None,
            "socket_ifname_source": f"{backend} default (hostname {hostname})",
            "socket_addresses": resolve(hostname)}


def _stack_dump() -> str:
    with tempfile.TemporaryFile("w+") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.seek(0)
        return fh.read()


def _serve_control(conn, finished: threading.Event) -> None:
    """Answer stack-dump requests; exit the process on abort, or when the controller disappears
    while this rank is still joining or serving tasks (e.g. stuck in a collective)."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            if finished.is_set():
                return
            os._exit(4)
        if message[0] == "stacks":
            conn.send(("stacks", _stack_dump()))
        elif message[0] == "abort":
            if len(message) > 1:
                print(f"ddpbench.worker: the controller stopped this rank: {message[1]}",
                      file=sys.stderr, flush=True)
            os._exit(5)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ddpbench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--controller", required=True, help="HOST:PORT the pytest controller listens on")
    parser.add_argument("--secret-file", help=f"0600 file with the shared secret (default: ${'DDPBENCH_SECRET'})")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl with CUDA, else gloo")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--connect-timeout", type=parse_timeout, default=300.0,
                        help=f"seconds to keep trying to reach the controller (default 300); a port "
                             f"that accepts but does not answer the handshake fails after this or "
                             f"{HANDSHAKE_TIMEOUT_S:g} s, the smaller")
    return parser


def _say(rank: int, text: str) -> None:
    print(f"ddpbench.worker: rank {rank}: {text}", file=sys.stderr, flush=True)


def rank_facts(environ=os.environ) -> dict:
    """What torchrun told this rank (its rank, world, node, local rank): the first thing it tells
    the controller."""
    world_size = int(environ["WORLD_SIZE"])
    return {"rank": int(environ["RANK"]), "world_size": world_size, "host": socket.gethostname(),
            "node_rank": int(environ.get("GROUP_RANK", "0")), "local_rank": int(environ["LOCAL_RANK"]),
            "local_world_size": int(environ.get("LOCAL_WORLD_SIZE", world_size)), "pid": os.getpid(),
            "phase": "connected"}


def connect_failure(exc: BaseException, controller: str, rank: int, connect_timeout: float) -> str | None:
    """The message for a connection to the controller that failed with ``exc`` (exit status 3), or
    None for an error that is no failure to connect."""
    if isinstance(exc, AuthenticationError):
        return "ddpbench.worker: the controller rejected the shared secret (or answered with a different one)"
    if isinstance(exc, HandshakeTimeout):
        return (f"ddpbench.worker: rank {rank}: {exc} (--connect-timeout {connect_timeout:g}; the "
                f"handshake gets at most {HANDSHAKE_TIMEOUT_S:g} s). Something accepts connections on "
                f"{controller} without answering: check that --controller names the address and "
                f"port pytest --dist-controller listens on, and that no other program holds that "
                f"port")
    if isinstance(exc, IncompatiblePeer):
        return (f"ddpbench.worker: the controller at {controller}: {exc}; install the "
                f"controller's ddpbench on every node")
    if isinstance(exc, OSError):
        return f"ddpbench.worker: cannot reach the controller at {controller}: {exc}"
    return None


def joining_facts(backend: str, device: str, own_address: str, environ=os.environ) -> dict:
    """How this rank joins the process group: MASTER_ADDR and what it resolves to, and the
    interface the backend's transport uses (picked here, unless the user's variable names one)."""
    master_addr, master_port = environ["MASTER_ADDR"], environ["MASTER_PORT"]
    master_ips = resolve(master_addr)
    return {"backend": backend, "device": device, "master_addr": master_addr,
            "master_port": master_port, "master_ips": master_ips,
            "master_is_loopback": bool(master_ips) and all(map(is_loopback, master_ips)),
            **choose_socket_interface(backend, own_address, environ)}


def joining_lines(joining: dict, info: dict) -> list[str]:
    """What a rank says before joining: where, through which interface, and a warning where a
    loopback MASTER_ADDR cannot reach the other nodes."""
    transport = (f"{joining['backend']} on {joining['socket_ifname'] or '?'} "
                 f"{','.join(joining['socket_addresses']) or '(no address)'} ({joining['socket_ifname_source']})")
    lines = [f"joining the process group at MASTER_ADDR {joining['master_addr']}:{joining['master_port']} "
             f"({','.join(joining['master_ips']) or 'does not resolve'}), {transport}"]
    # Several nodes, and the controller is not on this machine's loopback (where a test runs
    # several "nodes" on one machine): a loopback MASTER_ADDR cannot be reached from the others.
    if (joining["master_is_loopback"] and info["world_size"] > info["local_world_size"]
            and not is_loopback(info["address"])):
        lines.append(f"warning: MASTER_ADDR {joining['master_addr']} is a loopback address here but the group "
                     f"spans several nodes; if joining hangs, give each node's torchrun --local-addr "
                     f"(its address on the nodes' network)")
    return lines


def _join(backend: str, task_conn, finished: threading.Event) -> None:
    """Join the process group; a failure is told to the controller before it is raised."""
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(minutes=30))
    except Exception as exc:
        finished.set()
        try:
            task_conn.send(("phase", "failed", {"error": f"{type(exc).__name__}: {exc}".strip()}))
        except OSError:
            pass
        raise
    task_conn.send(("phase", "ready", {}))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        print(f"ddpbench.worker: {', '.join(missing)} not set; start this module with torchrun "
              f"(torchrun ... -m ddpbench.worker --controller HOST:PORT)", file=sys.stderr)
        return 2
    try:
        address = parse_address(args.controller)
        secret = load_secret(args.secret_file)
    except (ValueError, SecretError) as exc:
        print(f"ddpbench.worker: {exc}", file=sys.stderr)
        return 2
    info = rank_facts()
    rank = info["rank"]

    import torch
    import torch.distributed as dist

    # 1. Connect before joining the process group, so that a rank stuck joining is visible.
    _say(rank, f"connecting to the controller at {args.controller}")
    try:
        task_conn = _connect(address, secret, args.connect_timeout)
        control_conn = _connect(address, secret, args.connect_timeout)
    except (AuthenticationError, HandshakeTimeout, IncompatiblePeer, OSError) as exc:
        print(connect_failure(exc, args.controller, rank, args.connect_timeout), file=sys.stderr)
        return 3
    info["address"] = local_address(task_conn)
    info.update(identity())  # torch, engine hash, rank protocol: the controller refuses others
    task_conn.send(("hello", "task", info))
    control_conn.send(("hello", "control", info))
    finished = threading.Event()
    threading.Thread(target=_serve_control, args=(control_conn, finished), daemon=True).start()

    # 2. Join the process group, through the interface that reaches the controller by default.
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = "cuda" if backend == "nccl" else "cpu"
    torch.set_num_threads(args.threads)
    if device == "cuda":
        torch.cuda.set_device(info["local_rank"])
    joining = joining_facts(backend, device, info["address"])
    for line in joining_lines(joining, info):
        _say(rank, line)
    task_conn.send(("phase", "joining", joining))
    _join(backend, task_conn, finished)

    # 3. Serve the controller's tasks until it closes the connection.
    ctx = RankContext(rank, info["world_size"], backend, device, local_rank=info["local_rank"])
    try:
        serve_tasks(task_conn, ctx)
    finally:
        finished.set()
        task_conn.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
