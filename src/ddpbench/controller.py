"""Multi-node pools: pytest is the controller, torchrun starts the ranks on every node.

The ranks (``python -m ddpbench.worker``, see :mod:`ddpbench.worker`) connect to the controller's
address twice: a task channel and a control channel (stack dumps, abort). The task channel carries
pickled code, so both channels authenticate with a shared secret (HMAC challenge-response in both
directions, multiprocessing.connection's handshake) before anything is unpickled on either side;
a client without the secret is disconnected and nothing it sends is read. The controller listens
only on the address the user gave.
"""

from __future__ import annotations

import os
import queue
import socket
import stat
import threading
import time
from multiprocessing.connection import (AuthenticationError, Connection, answer_challenge,
                                        deliver_challenge, wait)

from .pool import PoolBase, PoolError, PoolSpec, PoolStartError

SECRET_ENV = "DDPBENCH_SECRET"
MIN_SECRET_LENGTH = 16
HANDSHAKE_TIMEOUT_S = 30.0


class SecretError(PoolError):
    """The shared secret is missing, too short, or stored in a file others can read."""


class PoolUnavailable(PoolError):
    """The externally launched pool does not have the shape a case asks for."""


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


def authenticate_as_server(conn: Connection, secret: bytes) -> None:
    """Both directions of multiprocessing's HMAC handshake; raises AuthenticationError."""
    deliver_challenge(conn, secret)
    answer_challenge(conn, secret)


class _Listener:
    """Accepts and authenticates worker connections in the background; queues (hello, conn)."""

    def __init__(self, address: tuple[str, int], secret: bytes):
        self._secret = secret
        self._sock = socket.create_server(address, family=socket.AF_INET6 if ":" in address[0]
                                          else socket.AF_INET)
        self.address = self._sock.getsockname()[:2]  # the real port when 0 was asked for
        self._sock.settimeout(0.5)
        self.accepted: "queue.Queue[tuple[tuple, Connection]]" = queue.Queue()
        self.rejected = 0
        self._closed = False
        threading.Thread(target=self._accept_loop, name="ddpbench-listener", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            threading.Thread(target=self._handshake, args=(client,), daemon=True).start()

    def _handshake(self, client: socket.socket) -> None:
        conn = Connection(client.detach())
        try:
            authenticate_as_server(conn, self._secret)
            if not conn.poll(HANDSHAKE_TIMEOUT_S):
                raise EOFError("no hello")
            hello = conn.recv()
            if not (isinstance(hello, tuple) and hello and hello[0] == "hello"):
                raise EOFError("bad hello")
        except (AuthenticationError, EOFError, OSError, ValueError):
            self.rejected += 1
            conn.close()
            return
        self.accepted.put((hello, conn))

    def close(self) -> None:
        self._closed = True
        self._sock.close()


class ExternalPool(PoolBase):
    """The ranks torchrun started on one or more nodes, connected to this controller."""

    _after_teardown = "its ranks were told to exit; relaunch the torchrun workers for more cases."

    def __init__(self, listener: _Listener, wait_s: float):
        self._listener = listener
        task_conns: dict[int, Connection] = {}
        control_conns: dict[int, Connection] = {}
        infos: dict[int, dict] = {}
        world_size = None
        deadline = time.monotonic() + wait_s
        while world_size is None or len(task_conns) < world_size or len(control_conns) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                have = sorted(set(task_conns) & set(control_conns))
                raise PoolStartError(
                    f"ddpbench: waited {wait_s:.0f} s on {listener.address[0]}:{listener.address[1]} "
                    f"for the torchrun workers; connected ranks: {have or 'none'}"
                    f"{f' of {world_size}' if world_size else ''}; rejected connections (wrong "
                    f"secret): {listener.rejected}. Start them with: torchrun ... -m ddpbench.worker "
                    f"--controller {listener.address[0]}:{listener.address[1]}")
            try:
                (_, kind, info), conn = listener.accepted.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            world_size = world_size or info["world_size"]
            (task_conns if kind == "task" else control_conns)[info["rank"]] = conn
            infos[info["rank"]] = info
        first = infos[0]
        super().__init__(PoolSpec(first["backend"], world_size, first["device"]))
        self._conns = [task_conns[r] for r in range(world_size)]
        self._control = [control_conns[r] for r in range(world_size)]
        self.infos = [infos[r] for r in range(world_size)]
        self.nodes = len({(i["host"], i["node_rank"]) for i in self.infos})
        self.alive = True

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
            if _closed_by_peer(task_conn):
                continue
            try:
                control_conn.send(("abort",))
            except OSError:
                pass
        for conn in self._conns + getattr(self, "_control", []):
            conn.close()
        self._conns, self._control = [], []


def _closed_by_peer(conn: Connection) -> bool:
    try:
        if conn.poll(0):
            conn.recv()
        return False
    except (EOFError, OSError):
        return True


class ExternalPoolRegistry:
    """Stands in for PoolRegistry when pytest runs with --dist-controller: one external pool."""

    def __init__(self, address: tuple[str, int], secret: bytes, wait_s: float):
        self._listener = _Listener(address, secret)
        self._wait_s = wait_s
        self._pool: ExternalPool | None = None
        self._lost: str | None = None

    def get(self, spec: PoolSpec) -> ExternalPool:
        if self._lost:
            raise PoolError(self._lost)
        if self._pool is None:
            self._pool = ExternalPool(self._listener, self._wait_s)
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
