"""The multi-node channel between the controller and a torchrun worker: authenticated, then every
message signed (docs/design/multi-node-and-gpu.md#the-controller-and-its-signed-channel)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import threading
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from multiprocessing.reduction import ForkingPickler

# How long a peer gets to complete the handshake (both challenges and the nonces).
HANDSHAKE_TIMEOUT_S = 30.0
# The first bytes of each side's nonce message: a peer without the signed channel (another
# ddpbench) is told apart from one with the wrong secret.
CHANNEL_MAGIC = b"ddpbench-signed-channel-1\0"
NONCE_BYTES = 32
TAG_BYTES = 32  # HMAC-SHA256
_CLIENT, _SERVER = b"C", b"S"  # the direction a message travels in: from the worker, from the controller

log = logging.getLogger("ddpbench.pool.channel")


class HandshakeTimeout(TimeoutError):
    """The peer accepted the connection but did not complete the handshake in time."""


class IncompatiblePeer(ConnectionError):
    """The peer knows the secret but does not speak the signed channel (another ddpbench)."""


class ForgedMessage(ConnectionError):
    """A message whose signature does not verify (altered, injected, replayed or reordered on the
    way); the connection is closed. A ConnectionError, so every reader treats it as a lost peer."""


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Kernel-side send/receive timeouts on a blocking socket (0: none): a read that waits longer
    fails with EAGAIN, so a silent peer cannot hold a handshake forever."""
    value = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


class SignedConnection:
    """A multiprocessing Connection whose messages are signed with the connection's key: send,
    recv, poll, fileno (multiprocessing.connection.wait works on it) and close."""

    def __init__(self, conn: Connection, key: bytes, outgoing: bytes, incoming: bytes, peer: str):
        self._conn, self._key, self._out, self._in = conn, key, outgoing, incoming
        self.peer = peer  # who is on the other end, for messages
        self._sent = self._received = 0
        self._send_lock, self._recv_lock = threading.Lock(), threading.Lock()

    def _tag(self, direction: bytes, number: int, payload) -> bytes:
        mac = hmac.new(self._key, direction + number.to_bytes(8, "big"), hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def send(self, obj) -> None:
        payload = ForkingPickler.dumps(obj)
        with self._send_lock:
            self._conn.send_bytes(self._tag(self._out, self._sent, payload) + bytes(payload))
            self._sent += 1

    def recv(self):
        with self._recv_lock:
            message = memoryview(self._conn.recv_bytes())
            tag, payload = message[:TAG_BYTES], message[TAG_BYTES:]
            if not hmac.compare_digest(tag, self._tag(self._in, self._received, payload)):
                number = self._received
                self._conn.close()
                text = (f"ddpbench: message #{number} from {self.peer} failed its signature check "
                        f"(altered, injected or replayed on the way, or a peer with another secret); "
                        f"nothing of it was loaded and the connection was closed")
                log.warning("%s", text)
                raise ForgedMessage(text)
            self._received += 1
        return ForkingPickler.loads(payload)

    def set_io_timeout(self, seconds: float) -> None:
        """Kernel-side timeouts of this connection's reads and writes (0: none)."""
        with socket.socket(fileno=os.dup(self.fileno())) as view:
            set_io_timeout(view, seconds)

    def poll(self, timeout: float | None = 0.0) -> bool:
        return self._conn.poll(timeout)

    def fileno(self) -> int:
        return self._conn.fileno()

    @property
    def closed(self) -> bool:
        return self._conn.closed

    def close(self) -> None:
        self._conn.close()


def _connection_key(conn: Connection, secret: bytes, client: bool) -> bytes:
    """Swap nonces with the peer; the connection's key from the secret and both nonces."""
    mine = os.urandom(NONCE_BYTES)
    conn.send_bytes(CHANNEL_MAGIC + mine)
    size = len(CHANNEL_MAGIC) + NONCE_BYTES
    try:
        theirs = conn.recv_bytes(size)
    except (BlockingIOError, TimeoutError, ConnectionError):
        raise
    except OSError:  # longer than a nonce message: a peer speaking something else
        theirs = b""
    if len(theirs) != size or not theirs.startswith(CHANNEL_MAGIC):
        raise IncompatiblePeer("the peer authenticated but does not speak ddpbench's signed channel "
                               "(another ddpbench version)")
    nonce = theirs[len(CHANNEL_MAGIC):]
    client_nonce, server_nonce = (mine, nonce) if client else (nonce, mine)
    return hmac.new(secret, b"ddpbench channel key\0" + client_nonce + server_nonce, hashlib.sha256).digest()


def accept_signed(sock: socket.socket, secret: bytes, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> SignedConnection:
    """The controller's side of a new connection: the handshake within ``timeout_s`` (raises
    multiprocessing's AuthenticationError on a wrong secret, :class:`IncompatiblePeer`, or an
    OSError: BlockingIOError when the peer stayed silent)."""
    peer = "%s:%s" % sock.getpeername()[:2]
    set_io_timeout(sock, timeout_s)
    conn = Connection(sock.detach())
    try:
        deliver_challenge(conn, secret)
        answer_challenge(conn, secret)
        key = _connection_key(conn, secret, client=False)
    except BaseException:
        conn.close()
        raise
    return SignedConnection(conn, key, _SERVER, _CLIENT, f"the worker at {peer}")


def connect_signed(address: tuple[str, int], secret: bytes, timeout_s: float = HANDSHAKE_TIMEOUT_S,
                   after_handshake_timeout_s: float = 0) -> SignedConnection:
    """A worker's connection to the controller: connect and complete the handshake, each within
    ``timeout_s``. Raises ConnectionRefusedError and the like (not listening yet),
    AuthenticationError (another secret), :class:`IncompatiblePeer`, or :class:`HandshakeTimeout`
    naming the address when the peer accepted and never answered. Afterwards reads wait as long as
    ``after_handshake_timeout_s`` (0: for ever; a worker waits for its next task however long)."""
    where = f"{address[0]}:{address[1]}"
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.settimeout(None)
    set_io_timeout(sock, timeout_s)
    conn = Connection(sock.detach())
    try:
        answer_challenge(conn, secret)
        deliver_challenge(conn, secret)
        key = _connection_key(conn, secret, client=True)
    except (BlockingIOError, TimeoutError):
        conn.close()
        raise HandshakeTimeout(f"connected to {where}, but nothing answered the ddpbench handshake "
                               f"within {timeout_s:g} s") from None
    except BaseException:
        conn.close()
        raise
    signed = SignedConnection(conn, key, _CLIENT, _SERVER, f"the controller at {where}")
    signed.set_io_timeout(after_handshake_timeout_s)
    return signed


__all__ = ["ForgedMessage", "HANDSHAKE_TIMEOUT_S", "HandshakeTimeout", "IncompatiblePeer", "SignedConnection",
           "accept_signed", "connect_signed", "set_io_timeout"]
