"""Multi-node pools: pytest is the controller, torchrun starts the ranks on every node
(``python -m ddpbench.worker``). Each rank connects twice (tasks, control) over a channel that
authenticates with a shared secret and signs every message (:mod:`ddpbench.pool.channel`); the
controller gathers them phase by phase and refuses a rank that runs other software. Why and how:
docs/design/multi-node-and-gpu.md#the-controller-and-its-signed-channel; the wait's error text: :mod:`.troubleshooting`."""

from __future__ import annotations

import errno
import logging
import os
import queue
import socket
import stat
import threading
import time
from typing import Callable, NoReturn
from multiprocessing.connection import AuthenticationError, wait

from ..identity import identity as local_identity, identity_differences
from .base import SIGNAL_POLL_S, PoolBase, PoolError, PoolSpec, PoolStartError
from .channel import HANDSHAKE_TIMEOUT_S, IncompatiblePeer, SignedConnection, accept_signed
from .joining import JoiningRank
from .troubleshooting import identity_error, ranks_text, start_error

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


def gather_ranks(listener: _Listener, wait_s: float, expected: int | None = None,
                 identity: dict | None = None) -> tuple[int, dict[int, JoiningRank]]:
    """Wait until every rank of a torchrun job has connected and joined its process group
    (:class:`Gathering`); its world size and ranks."""
    return Gathering(listener, wait_s, expected, identity).run()


class Gathering:
    """The controller's wait for a torchrun job's ranks: what it knows on this object, one method
    per event (a hello, a phase, a lost connection, the wait running out).

    :meth:`run` raises PoolStartError when ``wait_s`` runs out, naming each expected rank's last
    phase and host with what to check; at once when a rank reports that joining failed or its
    connection closes before it is ready, or when its hello says it runs another torch, ddpbench
    engine or rank protocol than ``identity`` (default: this process's,
    :func:`ddpbench.identity.identity`). Ranks already connected are told to exit, with the
    reason, on any failure.
    """

    def __init__(self, listener: _Listener, wait_s: float, expected: int | None = None,
                 identity: dict | None = None):
        self.listener = listener
        self.address = listener.address
        self.wait_s = wait_s
        self.expected = expected  # the world size the first case asks for (named when none came)
        self.identity = local_identity() if identity is None else identity
        self.deadline = time.monotonic() + wait_s
        self.world_size: int | None = None  # the first hello's
        self.ranks: dict[int, JoiningRank] = {}
        self.ignored = 0  # connections from a torchrun job of another size

    def run(self) -> tuple[int, dict[int, JoiningRank]]:
        try:
            while not self.formed():
                self.wait_for_events()
        except BaseException as exc:
            self.abort_all(str(exc) or type(exc).__name__)  # the worker prints it: the node's log says why
            raise
        return self.world_size, self.ranks

    def formed(self) -> bool:
        return (self.world_size is not None and len(self.ranks) == self.world_size
                and all(s.phase == "ready" and s.control is not None for s in self.ranks.values()))

    def wait_for_events(self) -> None:
        """Handles the connections that arrived, then waits up to SIGNAL_POLL_S for the next hello
        (when no rank is joining) or for the joining ranks' messages."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.on_timeout()
        while True:
            try:
                self.on_hello(*self.listener.accepted.get_nowait())
            except queue.Empty:
                break
        joining = {s.task: s for s in self.ranks.values() if s.task is not None and s.phase != "ready"}
        if not joining:
            try:
                self.on_hello(*self.listener.accepted.get(timeout=min(remaining, SIGNAL_POLL_S)))
            except queue.Empty:
                pass
            return
        for conn in wait(list(joining), min(remaining, SIGNAL_POLL_S)):
            self.on_message(joining[conn])

    # -- events -----------------------------------------------------------------------------------

    def on_hello(self, hello: tuple, conn: SignedConnection) -> None:
        """A rank's task or control connection: kept (a relaunched rank's replaces its old one),
        ignored when its job has another world size; PoolStartError when it runs other software."""
        _, kind, info = hello
        self.world_size = self.world_size or info["world_size"]
        if info["world_size"] != self.world_size or not 0 <= info["rank"] < self.world_size:
            self.ignored += 1
            conn.close()
            return
        state = self.ranks.get(info["rank"])
        if state is None:
            state = self.ranks[info["rank"]] = JoiningRank(dict(info), time.monotonic())
        old = state.task if kind == "task" else state.control
        if old is not None:
            old.close()
        if kind == "task":
            state.task, state.phase, state.since = conn, info.get("phase", "ready"), time.monotonic()
            state.info.update(info)
        else:
            state.control = conn
        mismatch = identity_differences(self.identity, info)
        if mismatch:
            raise PoolStartError(identity_error(state, self.address, mismatch))

    def on_message(self, state: JoiningRank) -> None:
        """A joining rank's task connection has something: a phase, or its end."""
        try:
            message = state.task.recv()
        except (EOFError, OSError):
            return self.on_lost(state)
        if message[0] == "phase":
            _, phase, details = message
            self.on_phase(state, phase, details)

    def on_phase(self, state: JoiningRank, phase: str, details: dict) -> None:
        state.info.update(details)
        state.phase, state.since = phase, time.monotonic()
        if phase == "failed":
            state.error = details.get("error", "(no error text)")
            raise self.error(f"ddpbench: {ranks_text([state.rank])} of the torchrun workers could not "
                             f"join the process group (controller {self.address[0]}:{self.address[1]}):")

    def on_lost(self, state: JoiningRank) -> NoReturn:
        state.error = (f"its connection closed while it was {state.phase} (the rank exited or "
                       f"its node was lost; its torchrun output says why)")
        state.phase, state.since = "lost", time.monotonic()
        raise self.error(f"ddpbench: {ranks_text([state.rank])} of the torchrun workers "
                         f"disconnected before joining the process group (controller "
                         f"{self.address[0]}:{self.address[1]}):") from None

    def on_timeout(self) -> NoReturn:
        ready = sum(s.phase == "ready" for s in self.ranks.values())
        raise self.error(
            f"ddpbench: waited {self.wait_s:.0f} s on {self.address[0]}:{self.address[1]} for the torchrun "
            f"workers; "
            + (f"{ready} of {self.world_size} ranks ready:" if self.world_size else "no rank connected:"))

    # -- ending -----------------------------------------------------------------------------------

    def error(self, headline: str) -> PoolStartError:
        listener = self.listener
        return PoolStartError(start_error(headline, self.address, self.world_size, self.ranks, listener.rejected,
                                          self.ignored, self.expected, listener.timed_out, listener.accept_errors,
                                          listener.incompatible))

    def abort_all(self, reason: str) -> None:
        """Tells the ranks that connected, and those whose connections arrived unread, to exit."""
        for state in self.ranks.values():
            abort(state.control, reason)
            state.close()
        while True:
            try:
                (_, kind, _), conn = self.listener.accepted.get_nowait()
            except queue.Empty:
                break
            if kind == "control":
                abort(conn, reason)
            conn.close()


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
                         f"{ranks_text([i['rank'] for i in infos])}, {info.get('backend')} on "
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
