"""Multi-node pools: pytest is the controller, torchrun starts the ranks on every node.

The ranks (``python -m ddpbench.worker``, see :mod:`ddpbench.worker`) connect to the controller's
address twice: a task channel and a control channel (stack dumps, abort). The task channel carries
pickled code, so both channels authenticate with a shared secret (HMAC challenge-response in both
directions) and then sign every message with a key of their own (:mod:`ddpbench.pool.channel`):
nothing is unpickled on either side that did not come, unaltered and in order, from a holder of
the secret. A client without the secret is disconnected and nothing it sends is read. The
controller listens only on the address the user gave.

Trust boundary: the secret's holders (the controller and every worker) trust one another; the
network between them is not trusted with code (signatures), but it does see the tasks and results
(no encryption), and torch's own traffic between the ranks (torchrun's rendezvous store, gloo /
NCCL) is neither authenticated nor encrypted: the nodes must share a network that only the job's
machines can reach (README, *Across nodes*).

A worker connects before it joins the process group and reports its phases on the task channel
(connected -> joining, with MASTER_ADDR and the interface its transport uses -> ready, or failed),
so that when the pool does not form, the wait error names each expected rank's last phase and
host and says what to check for that phase (start the workers, --local-addr, the interface
variables, a firewall). Its hello carries its torch, ddpbench engine hash and rank protocol
(:mod:`ddpbench.identity`): a worker that runs other software than the controller is refused
by name, both values shown, since its timings and checks would not be this code's.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import queue
import socket
import stat
import threading
import time
from dataclasses import dataclass
from typing import Callable
from multiprocessing.connection import AuthenticationError, wait

from ..identity import identity_differences
from .base import SIGNAL_POLL_S, PoolBase, PoolError, PoolSpec, PoolStartError
from .channel import HANDSHAKE_TIMEOUT_S, IncompatiblePeer, SignedConnection, accept_signed

SECRET_ENV = "DDPBENCH_SECRET"
MIN_SECRET_LENGTH = 16


class SecretError(PoolError):
    """The shared secret is missing, too short, or stored in a file others can read."""


class PoolUnavailable(PoolError):
    """The externally launched pool does not have the shape a case asks for."""


class PoolMatchesNoCase(PoolError):
    """The workers formed a pool that no selected case runs on: the run would measure nothing
    (a usage error: the message says which option to change)."""


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port); '[::1]:PORT' for IPv6."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 10.0.0.5:29600 or 127.0.0.1:29600)")
    return host, int(port)


def load_secret(secret_file: str | None = None) -> bytes:
    """The shared secret: from ``secret_file`` (mode 0600 or stricter) or $DDPBENCH_SECRET."""
    if secret_file:
        try:
            mode = os.stat(secret_file).st_mode
        except OSError as exc:
            raise SecretError(f"cannot read the secret file {secret_file}: {exc.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecretError(f"the secret file {secret_file} is readable by others "
                              f"(mode {stat.S_IMODE(mode):o}); run: chmod 600 {secret_file}")
        with open(secret_file, "rb") as fh:
            secret = fh.read().strip()
    else:
        secret = os.environ.get(SECRET_ENV, "").strip().encode()
        if not secret:
            raise SecretError(f"no shared secret: set {SECRET_ENV} or pass a 0600 secret file "
                              f"(e.g. python -c 'import secrets; print(secrets.token_hex(32))' > f; chmod 600 f)")
    if len(secret) < MIN_SECRET_LENGTH:
        raise SecretError(f"the shared secret is {len(secret)} characters long; use at least "
                          f"{MIN_SECRET_LENGTH} (e.g. secrets.token_hex(32))")
    return secret


# How long the listener backs off after accept() failed for lack of resources (EMFILE...).
ACCEPT_RETRY_S = 0.5
log = logging.getLogger("ddpbench.pool.external")


def _is_hello(message) -> bool:
    """("hello", "task" | "control", {"rank": int, "world_size": int, ...})"""
    if not (isinstance(message, tuple) and len(message) == 3 and message[0] == "hello"
            and message[1] in ("task", "control") and isinstance(message[2], dict)):
        return False
    info = message[2]
    return all(isinstance(info.get(key), int) and not isinstance(info.get(key), bool)
               for key in ("rank", "world_size"))


class _Listener:
    """Accepts and authenticates worker connections in the background; queues (hello, conn).

    A client gets ``handshake_timeout_s`` to authenticate and say hello, or it is dropped (a
    connection that sends nothing holds nothing for long). When accept() fails for lack of
    resources (too many open files, no buffers), the error is logged and counted and accepting
    resumes once they are back: the listener only ends when it is closed."""

    def __init__(self, address: tuple[str, int], secret: bytes, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S):
        self._secret = secret
        self._handshake_timeout_s = handshake_timeout_s
        self._sock = socket.create_server(address, family=socket.AF_INET6 if ":" in address[0]
                                          else socket.AF_INET)
        self.address = self._sock.getsockname()[:2]  # the real port when 0 was asked for
        self._sock.settimeout(0.5)
        self.accepted: "queue.Queue[tuple[tuple, SignedConnection]]" = queue.Queue()
        self.rejected = 0  # wrong secret, or a message that failed its signature check
        self.incompatible = 0  # knew the secret but not the signed channel: another ddpbench
        self.timed_out = 0  # clients dropped for not completing the handshake in time
        self.accept_errors: dict[str, int] = {}  # accept() failures by errno name
        self._closed = False
        threading.Thread(target=self._accept_loop, name="ddpbench-listener", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._closed:
                    return
                name = errno.errorcode.get(exc.errno, str(exc.errno))
                self.accept_errors[name] = self.accept_errors.get(name, 0) + 1
                log.warning("ddpbench controller: accept() on %s:%s failed (%s: %s); retrying in "
                            "%.1f s%s", self.address[0], self.address[1], name, exc.strerror or exc,
                            ACCEPT_RETRY_S, " (raise the open-file limit: ulimit -n)"
                            if exc.errno in (errno.EMFILE, errno.ENFILE) else "")
                time.sleep(ACCEPT_RETRY_S)
                continue
            client.settimeout(None)
            threading.Thread(target=self._handshake, args=(client,), daemon=True).start()

    def _handshake(self, client: socket.socket) -> None:
        try:
            conn = accept_signed(client, self._secret, self._handshake_timeout_s)
        except (BlockingIOError, TimeoutError):  # the peer said nothing for handshake_timeout_s
            self.timed_out += 1
            return
        except IncompatiblePeer:
            self.incompatible += 1
            return
        except (AuthenticationError, EOFError, OSError, ValueError):
            self.rejected += 1
            return
        try:
            if not conn.poll(self._handshake_timeout_s):
                raise EOFError("no hello")
            hello = conn.recv()
            if not _is_hello(hello):
                raise EOFError("bad hello")
        except (BlockingIOError, TimeoutError):
            self.timed_out += 1
            conn.close()
            return
        except Exception:  # noqa: BLE001 - a forged or malformed hello: never a dead listener thread
            self.rejected += 1
            conn.close()
            return
        conn.set_io_timeout(0)  # the connection is trusted now: reads wait for tasks however long
        self.accepted.put((hello, conn))

    def close(self) -> None:
        self._closed = True
        self._sock.close()


@dataclass
class _RankState:
    """What the controller knows about one rank while the pool forms."""

    info: dict  # the hello's info, updated with each phase's details
    since: float  # monotonic time the current phase was reported
    task: SignedConnection | None = None
    control: SignedConnection | None = None
    phase: str = "connected"  # connected -> joining -> ready; or failed / lost
    error: str = ""

    @property
    def rank(self) -> int:
        return self.info["rank"]

    @property
    def where(self) -> str:
        """'hostname 10.0.0.2': the host's name and the address it reached the controller from."""
        return " ".join(str(self.info[key]) for key in ("host", "address") if self.info.get(key))

    @property
    def node(self) -> str:
        return f"node {self.info.get('node_rank', '?')} ({self.where})"

    def close(self) -> None:
        for conn in (self.task, self.control):
            if conn is not None:
                conn.close()


def _transport_text(info: dict) -> str:
    """'MASTER_ADDR vm:41234 (127.0.0.1), gloo on eth0 10.0.0.2 [auto (route to controller)]'"""
    ips = ",".join(info.get("master_ips") or []) or "does not resolve"
    addresses = ",".join(info.get("socket_addresses") or []) or "(no address)"
    return (f"MASTER_ADDR {info.get('master_addr')}:{info.get('master_port')} ({ips}), "
            f"{info.get('backend')} on {info.get('socket_ifname') or '?'} {addresses} "
            f"[{info.get('socket_ifname_source')}]")


def _rank_line(state: _RankState, now: float) -> str:
    head = (f"  rank {state.rank} on node {state.info.get('node_rank', '?')} ({state.where}, "
            f"pid {state.info.get('pid', '?')}): ")
    for_s = f"{now - state.since:.0f} s"
    if state.phase == "connected":
        return head + (f"connected {for_s} ago, not joining the process group yet (still "
                       f"initialising CUDA?)")
    if state.phase == "joining":
        return head + f"joining the process group for {for_s}: {_transport_text(state.info)}"
    if state.phase == "ready":
        return head + "ready (joined the process group)" + (
            "" if state.control is not None else "; its control connection did not arrive")
    if state.phase == "failed":
        return head + f"could not join the process group: {state.error}; {_transport_text(state.info)}"
    return head + state.error  # lost


def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _hints(address: tuple[str, int], world_size: int | None, ranks: dict[int, _RankState],
           missing: list[int]) -> list[str]:
    """What to try, matching where the ranks are."""
    controller = f"{address[0]}:{address[1]}"
    states = list(ranks.values())
    joining = [s for s in states if s.phase in ("joining", "failed")]
    # Ranks on several machines (torchrun "nodes" that all reach the controller over loopback
    # share one machine, where loopback addresses work).
    multi_node = (any(s.info.get("world_size", 1) > s.info.get("local_world_size", 1) for s in states)
                  and not all(_is_loopback(s.info.get("address", "")) for s in states))
    hints = []
    if missing or world_size is None:
        subject = ("No rank connected" if world_size is None
                   else f"{_ranks_text(missing).capitalize()} never connected")
        hints.append(
            f"{subject}. Start them with: torchrun ... -m ddpbench.worker --controller "
            f"{controller} (on every node, with the same --nnodes). If they are running, they "
            f"cannot reach {controller}: check that it is this host's address on the network the "
            f"nodes share and that no firewall blocks TCP port {address[1]}; their torchrun "
            f"output shows the connection error."
            + (" The ranks that are joining wait for them." if joining else ""))
    loopback_master = [s for s in joining if s.info.get("master_is_loopback")]
    if loopback_master and multi_node:
        sample = loopback_master[0].info
        hints.append(
            f"MASTER_ADDR {sample.get('master_addr')} resolves to a loopback address "
            f"({','.join(sample.get('master_ips') or [])}) on {_nodes_text(loopback_master)}, but "
            f"the group spans several nodes: torchrun advertised the rank-0 node by its hostname, "
            f"which resolves to loopback there, so the other nodes cannot reach its store. Give "
            f"each node's torchrun --local-addr <that node's address on the nodes' network>; on "
            f"the node whose address is the --rdzv-endpoint, also --rdzv-conf is_host=1 (torchrun "
            f"recognises the endpoint as its own only when the hostname resolves to it).")
    loopback_transport = [s for s in joining if s.info.get("socket_addresses")
                          and all(_is_loopback(a) for a in s.info["socket_addresses"])]
    if loopback_transport and multi_node:
        sample = loopback_transport[0].info
        variable = _ifname_variable(sample.get("backend"))
        source = sample.get("socket_ifname_source")
        hints.append(
            f"{_ranks_text([s.rank for s in loopback_transport]).capitalize()} would exchange data "
            f"over a loopback interface ({sample.get('socket_ifname')}, "
            f"{'set by ' + source if source == variable else source}) that the other nodes "
            f"cannot reach: set {variable} on {_nodes_text(loopback_transport)} to the interface "
            f"on the nodes' network (or unset it: the worker then uses the interface that "
            f"reaches the controller).")
    if joining and not missing and world_size is not None and len(hints) == 0:
        sample = joining[0].info
        hints.append(
            f"Every rank connected here, but the process group did not form: each rank must reach "
            f"MASTER_ADDR {sample.get('master_addr')}:{sample.get('master_port')} and every other "
            f"rank's address on the interface listed above. If those interfaces are not on the "
            f"network the nodes share, set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME for NCCL) on "
            f"each node to the one that is; if MASTER_ADDR is not the rank-0 node's address on "
            f"that network, pass --local-addr to each node's torchrun; otherwise a firewall "
            f"between the nodes blocks MASTER_PORT or the ports gloo / NCCL listen on (allow TCP "
            f"between the nodes).")
    starting = [s.rank for s in states if s.phase == "connected"]
    if starting and not hints:
        hints.append(f"{_ranks_text(starting).capitalize()} connected but did not start joining: "
                     f"a slow start (CUDA initialisation) needs a longer "
                     f"--dist-controller-wait.")
    return hints


def _nodes_text(states) -> str:
    nodes = sorted({s.node for s in states})
    return nodes[0] if len(nodes) == 1 else " and ".join([", ".join(nodes[:-1]), nodes[-1]])


def _ifname_variable(backend) -> str:
    return "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"  # see worker.py


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _start_error(headline: str, address, world_size, ranks, rejected: int, ignored: int,
                 expected: int | None, timed_out: int = 0, accept_errors: dict | None = None,
                 incompatible: int = 0) -> str:
    now = time.monotonic()
    lines = [headline]
    missing = [r for r in range(world_size or 0) if r not in ranks]
    if world_size is None:
        lines.append(f"  connected ranks: none{f' (this case needs {expected})' if expected else ''}")
    lines.extend(_rank_line(ranks[rank], now) for rank in sorted(ranks))
    if missing:
        lines.append(f"  {_ranks_text(missing)}: never connected")
    notes = [f"rejected connections (wrong secret): {rejected}"]
    if incompatible:
        notes.append(f"connections from a ddpbench without the signed channel (install the "
                     f"controller's ddpbench on every node): {incompatible}")
    if timed_out:
        notes.append(f"connections dropped for not completing the handshake in time: {timed_out}")
    if accept_errors:
        notes.append("accept() errors (retried): " + ", ".join(f"{k} x{v}" for k, v in sorted(accept_errors.items())))
    if ignored:
        notes.append(f"ignored connections from a torchrun job of another size: {ignored}")
    lines.append("  " + "; ".join(notes))
    hints = _hints(address, world_size, ranks, missing)
    if hints:
        lines.append("What to check:")
        lines.extend(f"  - {hint}" for hint in hints)
    return "\n".join(lines)


def _identity_error(state: _RankState, address, mismatch: list[str]) -> str:
    return "\n".join([
        f"ddpbench: rank {state.rank} of the torchrun workers ({state.node}, pid "
        f"{state.info.get('pid', '?')}) runs other software than the controller "
        f"({address[0]}:{address[1]}):",
        *(f"  {line}" for line in mismatch),
        "A case's timings and checks are this code's only when every rank runs it: install the "
        "controller's torch and ddpbench (the same source: one commit or wheel) on every node, "
        "then relaunch the torchrun workers. The ranks that had connected were told to exit."])


def gather_ranks(listener: _Listener, wait_s: float, expected: int | None = None,
                 identity: dict | None = None) -> tuple[int, dict[int, _RankState]]:
    """Wait until every rank of a torchrun job has connected and joined its process group.

    Raises PoolStartError when ``wait_s`` runs out, naming each expected rank's last phase and
    host with what to check; at once when a rank reports that joining failed or its connection
    closes before it is ready, or when its hello says it runs another torch, ddpbench engine or
    rank protocol than ``identity`` (default: this process's, :func:`ddpbench.identity.identity`).
    Ranks already connected are told to exit, with the reason, on any failure.
    """
    if identity is None:
        from ..identity import identity as local_identity

        identity = local_identity()
    address = listener.address
    ranks: dict[int, _RankState] = {}
    world_size: int | None = None
    ignored = 0
    deadline = time.monotonic() + wait_s

    def fail(headline: str) -> PoolStartError:
        return PoolStartError(_start_error(headline, address, world_size, ranks, listener.rejected,
                                           ignored, expected, listener.timed_out, listener.accept_errors,
                                           listener.incompatible))

    def accept(hello, conn) -> None:
        nonlocal world_size, ignored
        _, kind, info = hello
        world_size = world_size or info["world_size"]
        if info["world_size"] != world_size or not 0 <= info["rank"] < world_size:
            ignored += 1
            conn.close()
            return
        state = ranks.get(info["rank"])
        if state is None:
            state = ranks[info["rank"]] = _RankState(dict(info), time.monotonic())
        old = state.task if kind == "task" else state.control
        if old is not None:  # a relaunched rank replaces the old one's connection
            old.close()
        if kind == "task":
            state.task, state.phase, state.since = conn, info.get("phase", "ready"), time.monotonic()
            state.info.update(info)
        else:
            state.control = conn
        mismatch = identity_differences(identity, info)
        if mismatch:
            raise PoolStartError(_identity_error(state, address, mismatch))

    def read_phase(state: _RankState) -> None:
        try:
            message = state.task.recv()
        except (EOFError, OSError):
            state.error = (f"its connection closed while it was {state.phase} (the rank exited or "
                           f"its node was lost; its torchrun output says why)")
            state.phase, state.since = "lost", time.monotonic()
            raise fail(f"ddpbench: {_ranks_text([state.rank])} of the torchrun workers "
                       f"disconnected before joining the process group (controller "
                       f"{address[0]}:{address[1]}):") from None
        if message[0] != "phase":
            return
        _, phase, details = message
        state.info.update(details)
        state.phase, state.since = phase, time.monotonic()
        if phase == "failed":
            state.error = details.get("error", "(no error text)")
            raise fail(f"ddpbench: {_ranks_text([state.rank])} of the torchrun workers could not "
                       f"join the process group (controller {address[0]}:{address[1]}):")

    try:
        while not (world_size is not None and len(ranks) == world_size
                   and all(s.phase == "ready" and s.control is not None for s in ranks.values())):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ready = sum(s.phase == "ready" for s in ranks.values())
                raise fail(
                    f"ddpbench: waited {wait_s:.0f} s on {address[0]}:{address[1]} for the torchrun "
                    f"workers; "
                    + (f"{ready} of {world_size} ranks ready:" if world_size else "no rank connected:"))
            while True:  # new connections
                try:
                    accept(*listener.accepted.get_nowait())
                except queue.Empty:
                    break
            joining = {s.task: s for s in ranks.values() if s.task is not None and s.phase != "ready"}
            if not joining:
                try:
                    accept(*listener.accepted.get(timeout=min(remaining, SIGNAL_POLL_S)))
                except queue.Empty:
                    pass
                continue
            for conn in wait(list(joining), min(remaining, SIGNAL_POLL_S)):
                read_phase(joining[conn])
    except BaseException as exc:
        reason = str(exc) or type(exc).__name__  # the worker prints it: the node's log says why
        for state in ranks.values():  # stop the ranks that did connect: their run is over
            abort(state.control, reason)
            state.close()
        while True:  # and those whose connections arrived but were not read yet
            try:
                (_, kind, _), conn = listener.accepted.get_nowait()
            except queue.Empty:
                break
            if kind == "control":
                abort(conn, reason)
            conn.close()
        raise
    return world_size, ranks


def abort(control: SignedConnection | None, reason: str) -> None:
    """Tell a worker to exit now, saying why (its stderr shows the reason)."""
    if control is not None:
        try:
            control.send(("abort", reason))
        except OSError:
            pass


class ExternalPool(PoolBase):
    """The ranks torchrun started on one or more nodes, connected to this controller."""

    _after_teardown = "its ranks were told to exit; relaunch the torchrun workers for more cases."

    def __init__(self, listener: _Listener, wait_s: float, expected: int | None = None):
        self._listener = listener
        world_size, ranks = gather_ranks(listener, wait_s, expected)
        self.infos = [ranks[r].info for r in range(world_size)]
        first = self.infos[0]
        super().__init__(PoolSpec(first["backend"], world_size, first["device"]))
        self._conns = [ranks[r].task for r in range(world_size)]
        self._control = [ranks[r].control for r in range(world_size)]
        self.nodes = len({(i["host"], i["node_rank"]) for i in self.infos})
        self.extra_info = self._interface_info()
        self.alive = True

    def _by_node(self) -> dict[tuple, list[dict]]:
        nodes: dict[tuple, list[dict]] = {}
        for info in self.infos:
            nodes.setdefault((info["node_rank"], info["host"]), []).append(info)
        return dict(sorted(nodes.items()))

    def _interface_info(self) -> dict:
        """extra_info keys: the interface(s) the transport uses and where each choice came from
        (one value when every node agrees, else the nodes' values in node order, comma-joined)."""
        def joined(key):
            values = [str(infos[0].get(key)) for infos in self._by_node().values()]
            return values[0] if len(set(values)) == 1 else ",".join(values)

        return {"socket_ifname": joined("socket_ifname"),
                "socket_ifname_source": joined("socket_ifname_source")}

    def describe(self) -> list[str]:
        """Lines for the terminal once the pool formed: where each node's ranks talk."""
        first = self.infos[0]
        lines = [f"ddpbench: {self.spec.world_size} torchrun ranks on {self.nodes} node(s) joined "
                 f"the process group at MASTER_ADDR {first.get('master_addr')}:{first.get('master_port')}:"]
        for (node_rank, host), infos in self._by_node().items():
            info = infos[0]
            lines.append(f"ddpbench:   node {node_rank} on {host} {info.get('address', '')}: "
                         f"{_ranks_text([i['rank'] for i in infos])}, {info.get('backend')} on "
                         f"{info.get('socket_ifname') or '?'} "
                         f"{','.join(info.get('socket_addresses') or []) or '(no address)'} "
                         f"[{info.get('socket_ifname_source')}]")
        lines.append(f"ddpbench:   every rank runs the controller's software: torch {first.get('torch_version')}, "
                     f"ddpbench {first.get('ddpbench_version')} "
                     f"#{str(first.get('ddpbench_source_sha256'))[:12]}, rank protocol {first.get('rank_protocol')}")
        return lines

    def _describe_death(self, code):
        return "its connection to the controller closed (node lost or process killed)"

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        stacks = {rank: "(no stack dump came back)" for rank in ranks}
        asked = {}
        for rank in ranks:
            try:
                self._control[rank].send(("stacks",))
                asked[self._control[rank]] = rank
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        while asked and time.monotonic() < deadline:
            for conn in wait(list(asked), deadline - time.monotonic()):
                rank = asked.pop(conn)
                try:
                    stacks[rank] = conn.recv()[1]
                except (EOFError, OSError):
                    pass
        return stacks

    def _wait_for_exit(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for conn in self._conns:
            try:
                conn.poll(max(0.0, deadline - time.monotonic()))  # EOF arrives when the rank exits
            except OSError:
                pass

    def kill(self) -> None:
        """Ask every rank still serving to exit now (the controller cannot reach the nodes'
        processes otherwise); ranks that already left after "stop" are left to finish."""
        self.alive = False
        for task_conn, control_conn in zip(self._conns, getattr(self, "_control", [])):
            if not _closed_by_peer(task_conn):
                abort(control_conn, "the controller tore the pool down after a failed case (its "
                                    "error says why)")
        for conn in self._conns + getattr(self, "_control", []):
            conn.close()
        self._conns, self._control = [], []


def _closed_by_peer(conn: SignedConnection) -> bool:
    try:
        if conn.poll(0):
            conn.recv()
        return False
    except (EOFError, OSError):
        return True


def unmatched_pool(pool: PoolSpec, nodes: int, case_specs) -> str | None:
    """Why no selected case can run on the pool the workers formed (with the option that fixes
    it), or None when one can. Without this, every case would skip and the run pass measuring
    nothing."""
    wanted = sorted(set(case_specs), key=lambda s: (s.backend, s.world_size, s.device))
    if not wanted or pool in wanted:
        return None
    asked = ", ".join(f"{s.backend} with {s.world_size} ranks on {s.device}" for s in wanted)
    head = (f"ddpbench: the torchrun workers formed a pool of {pool.world_size} {pool.backend} ranks on "
            f"{pool.device} ({nodes} node(s)), but no selected case runs on it: they ask for {asked}.")
    sizes = sorted({s.world_size for s in wanted})
    if pool.world_size not in sizes:
        fix = (f"Pass --dist-world-sizes={pool.world_size} to run the cases on these workers, or "
               f"relaunch torchrun so that --nnodes x --nproc-per-node = "
               f"{' or '.join(map(str, sizes))}.")
    else:
        backends = sorted({s.backend for s in wanted if s.world_size == pool.world_size})
        fix = (f"Start the workers with --backend={' or --backend='.join(backends)} (python -m "
               f"ddpbench.worker), or select the {pool.backend} cases (--dist-backend={pool.backend}"
               f"{' -m gpu' if pool.device == 'cuda' else ''}); GPU cases that this controller "
               f"marks skipped (it has no CUDA device) do not count.")
    return f"{head} {fix} The workers were told to exit; nothing ran."


class ExternalPoolRegistry:
    """Stands in for PoolRegistry when pytest runs with --dist-controller: one external pool.

    ``case_specs``: the specs of the selected cases that will run (not marked skipped); a pool
    that matches none of them raises :class:`PoolMatchesNoCase` once it forms."""

    def __init__(self, address: tuple[str, int], secret: bytes, wait_s: float,
                 announce: Callable[[list[str]], None] | None = None, case_specs=()):
        self._listener = _Listener(address, secret)
        self._wait_s = wait_s
        self._announce = announce
        self._case_specs = list(case_specs)
        self._pool: ExternalPool | None = None
        self._lost: str | None = None

    def get(self, spec: PoolSpec) -> ExternalPool:
        if self._lost:
            raise PoolError(self._lost)
        if self._pool is None:
            try:
                self._pool = ExternalPool(self._listener, self._wait_s, expected=spec.world_size)
            except PoolStartError:
                # The ranks that had connected were told to exit: later cases fail at once
                # instead of waiting again for workers that are gone.
                self._lost = ("ddpbench: the torchrun workers did not form a pool (the first "
                              "case's error says why); fix that, relaunch them and rerun")
                raise
            if self._announce is not None:
                self._announce(self._pool.describe())
            problem = unmatched_pool(self._pool.spec, self._pool.nodes, self._case_specs)
            if problem:
                self._lost = problem
                self._pool.close()
                raise PoolMatchesNoCase(problem)
        if not self._pool.alive:
            self._lost = (f"ddpbench: the torchrun-launched pool ({self._pool.spec.label}, "
                          f"{self._pool.nodes} nodes) is gone after an earlier failure; relaunch the "
                          f"workers to run more cases")
            raise PoolError(self._lost)
        if spec != self._pool.spec:
            raise PoolUnavailable(f"the torchrun-launched pool is {self._pool.spec.label}; this case "
                                  f"needs {spec.label}")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        self._listener.close()
