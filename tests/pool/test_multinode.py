"""Multi-node pools: authentication of the controller's channel, the workers' interface choice,
the controller's wait error, a two-"node" torchrun run on loopback driven by a pytest controller
(including losing a node mid-task), and two real "hosts" made of network namespaces."""

import json
import os
import pickle
import re
import socket
import subprocess
import sys
import time
from multiprocessing.connection import AuthenticationError, Client

import psutil
import pytest

from helpers import netns
from ddpbench.identity import identity
from ddpbench.pool.channel import connect_signed
from ddpbench.pool.external import SecretError, _Listener, load_secret, parse_address
from ddpbench.pool.rendezvous import loopback_interface

SECRET = "a-test-secret-that-is-long-enough"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_addresses_and_secrets_are_validated(tmp_path, monkeypatch):
    assert parse_address("10.0.0.5:29600") == ("10.0.0.5", 29600)
    assert parse_address("[::1]:80") == ("::1", 80)
    for bad in ["localhost", ":80", "host:http", "host:70000"]:
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_address(bad)
    monkeypatch.delenv("DDPBENCH_SECRET", raising=False)
    with pytest.raises(SecretError, match="set DDPBENCH_SECRET"):
        load_secret()
    monkeypatch.setenv("DDPBENCH_SECRET", "short")
    with pytest.raises(SecretError, match="at least 16"):
        load_secret()
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o644)
    with pytest.raises(SecretError, match="chmod 600"):
        load_secret(str(secret_file))
    secret_file.chmod(0o600)
    assert load_secret(str(secret_file)) == SECRET.encode()


class WouldRunCode:
    """Unpickling this runs a command: the controller must never unpickle unauthenticated data."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_clients_without_the_secret_get_nothing_read(tmp_path):
    listener = _Listener(("127.0.0.1", 0), SECRET.encode())
    try:
        with pytest.raises(AuthenticationError):
            Client(listener.address, authkey=b"not-the-right-secret!")
        marker = tmp_path / "pwned"
        with socket.create_connection(listener.address) as raw:
            payload = pickle.dumps(("hello", "task", WouldRunCode(marker)))
            raw.sendall(len(payload).to_bytes(4, "big") + payload)
            time.sleep(1.0)
        deadline = time.monotonic() + 10
        while listener.rejected < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listener.rejected == 2
        assert listener.accepted.empty()
        assert not marker.exists()
        # The right secret is accepted.
        good = connect_signed(listener.address, SECRET.encode())
        good.send(("hello", "task", {"rank": 0, "world_size": 1}))
        (hello, conn) = listener.accepted.get(timeout=10)
        assert hello == ("hello", "task", {"rank": 0, "world_size": 1})
        conn.close()
        good.close()
    finally:
        listener.close()


def _silent_connections(address, count):
    """Clients that connect and never say anything (a port scanner, a stuck or hostile peer)."""
    return [socket.create_connection(address, timeout=10) for _ in range(count)]


def _closed_by_server(sock, within_s):
    """Whether the server hangs up on ``sock`` within ``within_s`` (its challenge may arrive first)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return False
    except ConnectionResetError:
        pass
    return True


def test_silent_clients_are_dropped_after_the_handshake_timeout_and_ranks_still_join():
    from ddpbench.pool.external import gather_ranks

    listener = _Listener(("127.0.0.1", 0), SECRET.encode(), handshake_timeout_s=1.0)
    silent = _silent_connections(listener.address, 50)
    conns = []
    try:
        conns += _fake_rank(listener.address, 0, 2, [("ready", _joining())])
        conns += _fake_rank(listener.address, 1, 2, [("ready", _joining())], host="hostB", node_rank=1)
        world_size, ranks = gather_ranks(listener, 30, expected=2)
        assert world_size == 2 and sorted(ranks) == [0, 1]
        assert all(_closed_by_server(sock, 10) for sock in silent)
        deadline = time.monotonic() + 10
        while listener.timed_out < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listener.timed_out == 50 and listener.rejected == 0
    finally:
        for sock in silent + conns:
            sock.close()
        listener.close()


def test_accept_errors_are_logged_and_retried_never_a_dead_listener(caplog):
    import errno

    listener = _Listener(("127.0.0.1", 0), SECRET.encode())

    class OutOfDescriptors:
        """accept() failing with EMFILE a few times, as when the process ran out of descriptors."""

        def __init__(self, sock, failures):
            self._sock, self.failures = sock, failures

        def accept(self):
            if self.failures:
                self.failures -= 1
                raise OSError(errno.EMFILE, "Too many open files")
            return self._sock.accept()

        def close(self):
            self._sock.close()

    try:
        with caplog.at_level("WARNING", logger="ddpbench.pool.external"):
            listener._sock = OutOfDescriptors(listener._sock, 3)
            deadline = time.monotonic() + 20
            while listener.accept_errors.get("EMFILE", 0) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            # The listener has failed three times in a row: it must still accept.
            good = connect_signed(listener.address, SECRET.encode())
            good.send(("hello", "task", {"rank": 0, "world_size": 1}))
            (hello, conn) = listener.accepted.get(timeout=20)
        assert hello == ("hello", "task", {"rank": 0, "world_size": 1})
        assert listener.accept_errors == {"EMFILE": 3}
        assert any("accept() on 127.0.0.1" in r.message and "EMFILE" in r.message and "ulimit -n" in r.message
                   for r in caplog.records)
        conn.close()
        good.close()
    finally:
        listener.close()


# ----------------------------------------------------------------------------------------------
# After authentication: every message signed (ddpbench.pool.channel)
# ----------------------------------------------------------------------------------------------


def _recording(conn):
    """Keep a copy of every frame ``conn`` puts on the wire (what a listener on the path sees);
    returns (the frames, a function that writes raw bytes as one frame, bypassing signing)."""
    frames, raw_send = [], conn._conn.send_bytes

    def send_bytes(data):
        frames.append(bytes(data))
        raw_send(data)

    conn._conn.send_bytes = send_bytes
    return frames, raw_send


def _signed_pair(listener):
    """A worker's connection to ``listener`` and the controller's end of it, hello exchanged."""
    worker = connect_signed(listener.address, SECRET.encode())
    frames, raw_send = _recording(worker)
    worker.send(("hello", "task", {"rank": 0, "world_size": 1}))
    _, controller = listener.accepted.get(timeout=20)
    return worker, controller, frames, raw_send


def test_every_message_is_signed_and_forged_injected_or_replayed_ones_are_never_loaded(tmp_path):
    from ddpbench.pool.channel import ForgedMessage, SignedConnection

    marker = tmp_path / "pwned"
    listener = _Listener(("127.0.0.1", 0), SECRET.encode())
    try:
        # A signed message arrives as sent, both ways.
        worker, controller, frames, raw_send = _signed_pair(listener)
        assert isinstance(controller, SignedConnection)
        worker.send(("phase", "joining", {"x": 1}))
        assert controller.recv() == ("phase", "joining", {"x": 1})
        controller.send(("run", 1, [], b"task"))
        assert worker.poll(10) and worker.recv() == ("run", 1, [], b"task")

        # Injected into the authenticated stream: a pickle that would run code, with a made-up tag.
        raw_send(b"\0" * 32 + pickle.dumps(("run", 2, [], WouldRunCode(marker))))
        with pytest.raises(ForgedMessage, match="failed its signature check.*nothing of it was loaded"):
            controller.recv()
        assert controller.closed and not marker.exists()

        # Replayed: a message that verified once does not verify again (its number has passed).
        worker, controller, frames, raw_send = _signed_pair(listener)
        worker.send(("phase", "ready", {}))
        assert controller.recv() == ("phase", "ready", {})
        raw_send(frames[-1])
        with pytest.raises(ForgedMessage):
            controller.recv()

        # Altered on the way: one bit of the pickle flipped.
        worker, controller, frames, raw_send = _signed_pair(listener)
        worker._conn.send_bytes = raw_send  # stop recording, send by hand
        frame = bytearray(frames[-1])
        frame[-2] ^= 0x01
        raw_send(bytes(frame))
        with pytest.raises(ForgedMessage):
            controller.recv()

        # Moved to another connection (same message number, other keys), or reflected back.
        first, first_controller, first_frames, _ = _signed_pair(listener)
        second, second_controller, _, second_send = _signed_pair(listener)
        first.send(("phase", "ready", {}))
        second_send(first_frames[-1])
        with pytest.raises(ForgedMessage):
            second_controller.recv()
        controller_frames, controller_send = _recording(first_controller)
        first_controller.send(("stop",))
        assert first.poll(10) and first.recv() == ("stop",)
        first._conn.send_bytes(controller_frames[-1])  # the controller's own words, sent back to it
        assert first_controller.recv() == ("phase", "ready", {})
        with pytest.raises(ForgedMessage):
            first_controller.recv()
        assert not marker.exists()
    finally:
        listener.close()


def test_a_peer_that_knows_the_secret_but_not_the_signed_channel_is_named_not_blamed_on_the_secret():
    listener = _Listener(("127.0.0.1", 0), SECRET.encode(), handshake_timeout_s=5.0)
    try:
        old_worker = Client(listener.address, authkey=SECRET.encode())  # the handshake alone
        old_worker.send(("hello", "task", {"rank": 0, "world_size": 1}))
        deadline = time.monotonic() + 20
        while listener.incompatible < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (listener.incompatible, listener.rejected) == (1, 0)
        assert listener.accepted.empty()
        old_worker.close()
    finally:
        listener.close()


@pytest.mark.pool
def test_a_worker_whose_controller_port_never_answers_times_out_naming_it(tmp_path):
    """A port that accepts connections and never says a word (here: a listening socket nobody
    reads) must not hold a rank for ever: the worker gives up after --connect-timeout."""
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    env = dict(_clean_env(), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()))
    try:
        worker = subprocess.run([sys.executable, "-m", "ddpbench.worker", f"--controller=127.0.0.1:{port}",
                                 "--connect-timeout=2"], env=env, cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
    finally:
        silent.close()
    assert worker.returncode == 3, worker.stderr
    assert (f"connected to 127.0.0.1:{port}, but nothing answered the ddpbench handshake within 2 s "
            f"(--connect-timeout 2;") in worker.stderr, worker.stderr
    assert "Traceback" not in worker.stderr


# A workload whose rank 0 never finishes a round (the lost-node tests kill a node meanwhile).
HANG_WORKLOAD = '''
import os, time
from ddpbench.workloads import Workload
from ddpbench.workloads.collectives import Collective

class Hang(Workload):
    def setup(self, ctx):
        open(os.path.join({where!r}, f"started{{ctx.rank}}"), "w").close()
        return ctx.rank
    def run_round(self, rank):
        import torch.distributed as dist
        if rank == 0:
            time.sleep(600)
        dist.barrier()
'''

BENCH = HANG_WORKLOAD + '''
def test_all_reduce(dist_benchmark):
    dist_benchmark(Collective("all_reduce", 65536), rounds=5, warmup=1)

def test_node_loss(dist_benchmark):
    if {hang!r}:
        dist_benchmark(Hang(), rounds=1, warmup=0)

def test_after(dist_benchmark):
    dist_benchmark(Collective("broadcast", 4096), rounds=3, warmup=0)
'''


def _clean_env() -> dict:
    """The test's environment without anything that would pick an interface or a rendezvous."""
    env = {key: value for key, value in os.environ.items()
           if key not in {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT",
                          "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
           and not key.startswith("TORCHELASTIC_")}
    return dict(env, DDPBENCH_SECRET=SECRET, PYTHONUNBUFFERED="1")


def _torchrun_env(tmp_path) -> dict:
    """:func:`_clean_env` for a torchrun agent: its log folder (``torchelastic_*``, which torchrun
    makes in the temporary folder and never removes) goes under the test's own folder."""
    return dict(_clean_env(), TMPDIR=str(tmp_path))


def _launch(tmp_path, hang, silent_clients=0, world_sizes="2"):
    """The controller (pytest, ``--dist-world-sizes`` given) and two torchrun "nodes" of one rank
    each on loopback; ``silent_clients`` connections that never speak are opened to the
    controller before the workers start."""
    (tmp_path / "test_bench.py").write_text(BENCH.format(where=str(tmp_path), hang=hang))
    env = _clean_env()
    controller_port, rdzv_port = _free_port(), _free_port()
    controller = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_bench.py", "-p", "no:cacheprovider", "-m", "not gpu",
         "-v", f"--dist-controller=127.0.0.1:{controller_port}", f"--dist-world-sizes={world_sizes}",
         "--dist-timeout=60", "--dist-controller-wait=120", "--benchmark-json=out.json"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    silent = []
    deadline = time.monotonic() + 60
    while len(silent) < silent_clients and time.monotonic() < deadline:
        try:
            silent += _silent_connections(("127.0.0.1", controller_port), silent_clients - len(silent))
        except ConnectionRefusedError:  # the controller is not listening yet
            time.sleep(0.2)
    assert len(silent) == silent_clients
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
         f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv_port}",
         "-m", "ddpbench.worker", "--backend=gloo", f"--controller=127.0.0.1:{controller_port}"],
        cwd=tmp_path, env=_torchrun_env(tmp_path), stdout=open(tmp_path / f"node{node}.log", "w"),
        stderr=subprocess.STDOUT, start_new_session=True) for node in (0, 1)]
    controller.silent_clients = silent  # held open while the workers join
    return controller, nodes


def _cleanup(processes):
    """Kill each launched process and everything it started (torchrun's ranks live in sessions
    of their own, so a process-group kill would miss them)."""
    for proc in processes:
        try:
            parent = psutil.Process(proc.pid)
            tree = parent.children(recursive=True) + [parent]
        except psutil.NoSuchProcess:
            tree = []
        for member in tree:
            try:
                member.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=30)


@pytest.mark.pool
def test_two_nodes_on_loopback_run_the_cases_with_nodes_recorded(tmp_path):
    # 50 connections that never speak are held open the whole time: the real workers still join.
    controller, nodes = _launch(tmp_path, hang=False, silent_clients=50)
    try:
        output, _ = controller.communicate(timeout=300)
        assert controller.returncode == 0, output
        data = json.loads((tmp_path / "out.json").read_text())
        infos = {case["name"]: case["extra_info"] for case in data["benchmarks"]}
        assert infos["test_all_reduce[gloo-2p]"]["nodes"] == 2
        assert infos["test_all_reduce[gloo-2p]"]["world_size"] == 2
        assert infos["test_all_reduce[gloo-2p]"]["busbw_GBps"] > 0
        # No interface variable was set: the workers took the one that reaches the controller.
        assert infos["test_all_reduce[gloo-2p]"]["socket_ifname"] == loopback_interface()
        assert infos["test_all_reduce[gloo-2p]"]["socket_ifname_source"] == "auto (route to controller)"
        # What the ranks ran with, said once the pool formed (their hello carried it).
        ours = identity()
        assert (f"every rank runs the controller's software: torch {ours['torch_version']}, ddpbench "
                f"{ours['ddpbench_version']} #{ours['ddpbench_source_sha256'][:12]}, rank protocol "
                f"{ours['rank_protocol']}") in output, output
        for node in nodes:  # the controller told the workers to stop: torchrun ends cleanly
            assert node.wait(timeout=60) == 0
    finally:
        for sock in getattr(controller, "silent_clients", []):
            sock.close()
        _cleanup(nodes + [controller])


@pytest.mark.pool
def test_losing_a_node_mid_task_fails_the_case_and_the_controller_finishes(tmp_path):
    controller, nodes = _launch(tmp_path, hang=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "started1").exists() or not (tmp_path / "started0").exists():
            assert controller.poll() is None and time.monotonic() < deadline, controller.stdout.read()
            time.sleep(0.2)
        time.sleep(0.5)
        # Node 1 disappears: its torchrun agent and the rank it started (torchrun starts ranks
        # in sessions of their own, so the whole process tree is killed, as a lost host would be).
        agent = psutil.Process(nodes[1].pid)
        for proc in agent.children(recursive=True) + [agent]:
            proc.kill()
        killed_at = time.monotonic()
        output, _ = controller.communicate(timeout=120)
        assert time.monotonic() - killed_at < 30, "the controller took too long to notice"
        assert "test_node_loss[gloo-2p] FAILED" in output
        assert "its connection to the controller closed" in output
        assert "test_after[gloo-2p] ERROR" in output and "is gone after an earlier failure" in output
        assert "test_all_reduce[gloo-2p] PASSED" in output
        assert "relaunch the torchrun workers" in output
    finally:
        _cleanup(nodes + [controller])


@pytest.mark.pool
def test_world_sizes_that_match_no_pool_the_workers_form_are_a_usage_error_not_an_empty_pass(tmp_path):
    """Two one-rank nodes form a pool of 2; --dist-world-sizes=4 selects only 4-rank cases. Every
    case would skip and the run pass having measured nothing: it must stop with exit 4 and the fix."""
    controller, nodes = _launch(tmp_path, hang=False, world_sizes="4")
    try:
        output, _ = controller.communicate(timeout=300)
        assert controller.returncode == pytest.ExitCode.USAGE_ERROR, output
        assert ("the torchrun workers formed a pool of 2 gloo ranks on cpu (2 node(s)), but no selected "
                "case runs on it: they ask for gloo with 4 ranks on cpu. Pass --dist-world-sizes=2") in output
        assert "nothing ran" in output and "PASSED" not in output and "SKIPPED" not in output
        assert not (tmp_path / "out.json").exists() or not json.loads((tmp_path / "out.json").read_text())["benchmarks"]
        for node in nodes:  # the workers were told to stop: torchrun ends by itself
            assert node.wait(timeout=60) == 0
    finally:
        _cleanup(nodes + [controller])


def test_a_pool_matching_no_case_names_the_fix_for_world_size_or_backend():
    from ddpbench.pool import PoolSpec
    from ddpbench.pool.external import unmatched_pool

    gloo2, gloo4, nccl2 = PoolSpec("gloo", 2, "cpu"), PoolSpec("gloo", 4, "cpu"), PoolSpec("nccl", 2, "cuda")
    assert unmatched_pool(gloo2, 2, [gloo2, gloo4]) is None
    assert unmatched_pool(gloo2, 2, []) is None  # nothing selected asks for a pool
    sizes = unmatched_pool(gloo2, 2, [gloo4, PoolSpec("gloo", 8, "cpu")])
    assert "Pass --dist-world-sizes=2" in sizes and "--nproc-per-node = 4 or 8" in sizes
    backend = unmatched_pool(nccl2, 2, [gloo2])
    assert "Start the workers with --backend=gloo" in backend and "--dist-backend=nccl -m gpu" in backend


# ----------------------------------------------------------------------------------------------
# The worker's interface choice and the controller's wait error (fake ranks, no torch processes)
# ----------------------------------------------------------------------------------------------


def test_the_worker_picks_the_interface_that_reaches_the_controller_unless_told():
    from ddpbench.worker import AUTO_SOURCE, choose_socket_interface, interface_of

    lo = loopback_interface()
    assert interface_of("127.0.0.1") == lo and interface_of("::ffff:127.0.0.1") == lo
    assert interface_of("192.0.2.123") is None  # TEST-NET-1: on no interface here
    environ = {}
    chosen = choose_socket_interface("gloo", "127.0.0.1", environ)
    assert chosen == {"socket_ifname": lo, "socket_ifname_source": AUTO_SOURCE,
                      "socket_addresses": chosen["socket_addresses"]}
    assert "127.0.0.1" in chosen["socket_addresses"]
    assert environ == {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": f"={lo}"}
    # An explicit variable always wins (and the other backend's unset one is still filled in).
    environ = {"GLOO_SOCKET_IFNAME": "eth7"}
    chosen = choose_socket_interface("gloo", "127.0.0.1", environ)
    assert chosen["socket_ifname"] == "eth7" and chosen["socket_ifname_source"] == "GLOO_SOCKET_IFNAME"
    assert environ == {"GLOO_SOCKET_IFNAME": "eth7", "NCCL_SOCKET_IFNAME": f"={lo}"}
    environ = {"NCCL_SOCKET_IFNAME": "ib0"}
    chosen = choose_socket_interface("nccl", "127.0.0.1", environ)
    assert chosen["socket_ifname"] == "ib0" and chosen["socket_ifname_source"] == "NCCL_SOCKET_IFNAME"
    # No interface carries the address: nothing is set, the transport's default is reported.
    environ = {}
    chosen = choose_socket_interface("gloo", "192.0.2.123", environ)
    assert environ == {} and chosen["socket_ifname"] is None
    assert chosen["socket_ifname_source"].startswith("gloo default (hostname ")


def _connect_when_listening(address, within_s=60):
    """The worker's signed connection, retried while the controller is not listening yet."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return connect_signed(address, SECRET.encode())
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nothing listened on {address}"
            time.sleep(0.2)


def _joining(master_addr="hostA", master_ips=("10.0.0.1",), ifname="eth0", address="10.0.0.1",
             source="auto (route to controller)"):
    from ddpbench.pool.troubleshooting import is_loopback

    return {"backend": "gloo", "device": "cpu", "master_addr": master_addr, "master_port": "29500",
            "master_ips": list(master_ips), "master_is_loopback": all(map(is_loopback, master_ips)),
            "socket_ifname": ifname, "socket_ifname_source": source,
            "socket_addresses": [address]}


def _fake_rank(address, rank, world_size, phases, host="hostA", node_rank=0, local_world_size=1, **software):
    """A rank speaking the worker's protocol: hello on both channels, then ``phases``. Its
    software is this process's (the controller's) unless ``software`` overrides identity keys."""
    info = {"rank": rank, "world_size": world_size, "host": host, "node_rank": node_rank,
            "local_rank": 0, "local_world_size": local_world_size, "pid": 1000 + rank,
            "phase": "connected", "address": f"10.0.0.{node_rank + 1}", **identity(), **software}
    task = _connect_when_listening(address)
    control = _connect_when_listening(address)
    task.send(("hello", "task", info))
    control.send(("hello", "control", info))
    for phase, details in phases:
        task.send(("phase", phase, details))
    return task, control


def test_the_wait_error_says_where_each_rank_is_and_what_to_check():
    from ddpbench.pool.external import gather_ranks
    from ddpbench.pool import PoolStartError

    listener = _Listener(("127.0.0.1", 0), SECRET.encode())
    controller = f"127.0.0.1:{listener.address[1]}"
    conns = []
    try:
        # Nobody came: the old advice, with the address to give the workers.
        with pytest.raises(PoolStartError) as nobody:
            gather_ranks(listener, 0.5, expected=4)
        text = str(nobody.value)
        assert f"waited 0 s on {controller} for the torchrun workers; no rank connected" in text
        assert "connected ranks: none (this case needs 4)" in text
        assert f"Start them with: torchrun ... -m ddpbench.worker --controller {controller}" in text

        # Rank 0 joins through a MASTER_ADDR that is loopback on a 2-node group; rank 1 never came.
        conns += _fake_rank(listener.address, 0, 2,
                            [("joining", _joining(master_ips=("127.0.1.1",)))])
        with pytest.raises(PoolStartError) as stuck:
            gather_ranks(listener, 1.5, expected=2)
        text = str(stuck.value)
        assert f"waited 2 s on {controller} for the torchrun workers; 0 of 2 ranks ready:" in text
        assert re.search(r"rank 0 on node 0 \(hostA 10\.0\.0\.1, pid 1000\): joining the process "
                         r"group for \d+ s: MASTER_ADDR hostA:29500 \(127\.0\.1\.1\), gloo on eth0 "
                         r"10\.0\.0\.1 \[auto \(route to controller\)\]", text), text
        assert "rank 1: never connected" in text
        assert (f"Rank 1 never connected. Start them with: torchrun ... -m ddpbench.worker "
                f"--controller {controller}") in text
        assert "The ranks that are joining wait for them" in text
        assert "MASTER_ADDR hostA resolves to a loopback address (127.0.1.1) on node 0 (hostA 10.0.0.1)," in text
        assert "--local-addr" in text and "--rdzv-conf is_host=1" in text
        # ... and the rank that had connected is told to exit.
        assert conns[1].poll(10) and conns[1].recv()[0] == "abort"

        # Every rank connected and joining, nothing obviously wrong: interfaces, --local-addr, firewall.
        conns += _fake_rank(listener.address, 0, 2, [("joining", _joining())])
        conns += _fake_rank(listener.address, 1, 2, [("joining", _joining(ifname="eth1", address="10.0.0.2"))],
                            host="hostB", node_rank=1)
        with pytest.raises(PoolStartError) as joining:
            gather_ranks(listener, 1.5)
        text = str(joining.value)
        assert "rank 1 on node 1 (hostB 10.0.0.2, pid 1001): joining the process group" in text
        assert "Every rank connected here, but the process group did not form" in text
        assert "GLOO_SOCKET_IFNAME" in text and "--local-addr" in text and "firewall" in text
        assert "never connected" not in text and "Start them with" not in text

        # A node told to use its loopback interface cannot be reached by the other node.
        conns += _fake_rank(listener.address, 0, 2, [("joining", _joining())])
        conns += _fake_rank(listener.address, 1, 2, [("joining", _joining(
            ifname="lo", address="127.0.0.1", source="GLOO_SOCKET_IFNAME"))], host="hostB", node_rank=1)
        with pytest.raises(PoolStartError) as loopback:
            gather_ranks(listener, 1.5)
        text = str(loopback.value)
        assert ("Rank 1 would exchange data over a loopback interface (lo, set by GLOO_SOCKET_IFNAME) "
                "that the other nodes cannot reach: set GLOO_SOCKET_IFNAME on node 1 (hostB 10.0.0.2)"
                in text), text
        assert "Every rank connected here" not in text

        # A rank whose join fails ends the wait at once, with the error.
        conns += _fake_rank(listener.address, 0, 1, [
            ("joining", _joining()), ("failed", {"error": "RuntimeError: connection refused"})])
        started = time.monotonic()
        with pytest.raises(PoolStartError) as failed:
            gather_ranks(listener, 60)
        assert time.monotonic() - started < 30
        text = str(failed.value)
        assert "rank 0 of the torchrun workers could not join the process group" in text
        assert "could not join the process group: RuntimeError: connection refused" in text
    finally:
        for conn in conns:
            conn.close()
        listener.close()


def test_a_rank_running_other_software_than_the_controller_is_refused_with_both_values():
    from ddpbench.pool import PoolStartError
    from ddpbench.pool.external import gather_ranks

    ours = identity()
    listener = _Listener(("127.0.0.1", 0), SECRET.encode())
    conns = []
    try:
        conns += _fake_rank(listener.address, 0, 2, [("ready", _joining())])
        conns += _fake_rank(listener.address, 1, 2, [("ready", _joining())], host="hostB", node_rank=1,
                            torch_version="2.0.0+cpu", ddpbench_source_sha256="0" * 64, rank_protocol=1)
        deadline = time.monotonic() + 20
        while listener.accepted.qsize() < 4 and time.monotonic() < deadline:  # all four hellos read
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(PoolStartError) as refused:
            gather_ranks(listener, 60, expected=2)
        assert time.monotonic() - started < 30  # at once, not after the wait
        text = str(refused.value)
        assert "rank 1 of the torchrun workers (node 1 (hostB 10.0.0.2), pid 1001) runs other software" in text
        assert f"torch: 2.0.0+cpu on the rank, {ours['torch_version']} on the controller" in text
        assert (f"ddpbench engine (source hash): #000000000000 on the rank, "
                f"#{ours['ddpbench_source_sha256'][:12]} on the controller") in text
        assert f"rank protocol: 1 on the rank, {ours['rank_protocol']} on the controller" in text
        assert "install the controller's torch and ddpbench" in text and "relaunch the torchrun workers" in text
        # Both ranks are told to exit, and why.
        for control in (conns[1], conns[3]):
            assert control.poll(10)
            message = control.recv()
            assert message[0] == "abort" and "runs other software than the controller" in message[1]

        # A worker that does not say (a ddpbench from before hellos carried it) is refused too.
        conns += _fake_rank(listener.address, 0, 1, [("ready", _joining())], torch_version=None)
        with pytest.raises(PoolStartError, match=r"torch: \(not said"):
            gather_ranks(listener, 60)
    finally:
        for conn in conns:
            conn.close()
        listener.close()


# ----------------------------------------------------------------------------------------------
# Two hosts: network namespaces joined by a veth pair (root only; see tests/helpers/netns.py)
# ----------------------------------------------------------------------------------------------

CONTROLLER_PORT, RDZV_PORT = 29600, 29500  # inside fresh namespaces: nothing else listens there

TWO_HOST_BENCH = HANG_WORKLOAD + '''
def test_all_reduce(dist_benchmark, dist_message_size):
    dist_benchmark(Collective("all_reduce", dist_message_size), rounds=20, warmup=3)

def test_host_loss(dist_benchmark):
    dist_benchmark(Hang(), rounds=1, warmup=0)
'''


@pytest.fixture
def two_hosts():
    reason = netns.unavailable()
    if reason:
        if os.environ.get("DDPBENCH_REQUIRE_NETNS"):  # CI: this test must run, not skip
            pytest.fail(f"DDPBENCH_REQUIRE_NETNS is set but {reason}")
        pytest.skip(reason)
    with netns.two_hosts() as hosts:
        yield hosts


def _controller(tmp_path, host, *options):
    return subprocess.Popen(
        host.command(sys.executable, "-m", "pytest", "test_bench.py", "-p", "no:cacheprovider",
                     "-m", "not gpu", "-v", f"--dist-controller={host.address}:{CONTROLLER_PORT}",
                     "--dist-world-sizes=2", *options),
        cwd=tmp_path, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _torchrun_nodes(tmp_path, a, b, local_addr: bool):
    """torchrun on host A (which hosts the rendezvous) and on host B, no interface variables."""
    nodes = []
    for host in (a, b):
        options = [f"--local-addr={host.address}"] if local_addr else []
        if host is a:  # A's hostname does not resolve to 10.77.0.1: tell torchrun it hosts the store
            options.append("--rdzv-conf=is_host=1")
        nodes.append(subprocess.Popen(
            host.command(sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                         "--nproc-per-node=1", "--rdzv-backend=c10d",
                         f"--rdzv-endpoint={a.address}:{RDZV_PORT}", *options,
                         "-m", "ddpbench.worker", "--backend=gloo", f"--controller={a.address}:{CONTROLLER_PORT}"),
            cwd=tmp_path, env=_torchrun_env(tmp_path), stdout=open(tmp_path / f"host_{host.address}.log", "w"),
            stderr=subprocess.STDOUT))
    return nodes


def _logs(tmp_path) -> str:
    return "".join(f"\n--- {p.name} ---\n{p.read_text()}" for p in sorted(tmp_path.glob("host_*.log")))


@pytest.mark.pool
def test_across_hosts_in_network_namespaces_without_interface_variables(tmp_path, two_hosts):
    """Controller and node 0 on host A, node 1 on host B: the cases pass across the veth with
    nodes == 2, the controller listens only on its address, losing host B fails the case in
    seconds naming the lost rank."""
    a, b = two_hosts
    (tmp_path / "test_bench.py").write_text(TWO_HOST_BENCH.format(where=str(tmp_path)))
    controller = _controller(tmp_path, a, "--dist-sizes=1MB,10MB", "--dist-timeout=60",
                             "--dist-controller-wait=180", "--benchmark-json=out.json")
    nodes = _torchrun_nodes(tmp_path, a, b, local_addr=True)
    try:
        deadline = time.monotonic() + 240
        while not all((tmp_path / f"started{rank}").exists() for rank in (0, 1)):
            assert controller.poll() is None and time.monotonic() < deadline, (
                controller.communicate(timeout=60)[0] if controller.poll() is not None else "timed out")
            time.sleep(0.2)
        assert netns.listening_addresses(controller.pid) == [(a.address, CONTROLLER_PORT)]

        time.sleep(0.5)
        netns.kill_namespace_processes(b.namespace)  # host B is lost: its torchrun and its rank
        killed_at = time.monotonic()
        output, _ = controller.communicate(timeout=120)
        noticed_s = time.monotonic() - killed_at
        assert noticed_s < 30, f"the controller took {noticed_s:.0f} s to notice\n{output}"
        print(f"two hosts: losing host B failed the case and ended the run {noticed_s:.1f} s later")
        output_and_logs = output + _logs(tmp_path)
        assert "test_all_reduce[gloo-2p-1MB] PASSED" in output, output_and_logs
        assert "test_all_reduce[gloo-2p-10MB] PASSED" in output, output_and_logs
        assert "test_host_loss[gloo-2p] FAILED" in output
        assert "rank(s) [1] of 2 died while running task" in output
        assert "--- rank 1: its connection to the controller closed" in output
        # Where the ranks talk, said once the pool formed.
        assert re.search(r"2 torchrun ranks on 2 node\(s\) joined the process group at MASTER_ADDR "
                         r"10\.77\.0\.[12]:\d+", output), output
        for host in (a, b):
            assert f"gloo on {host.interface} {host.address} [auto (route to controller)]" in output

        cases = {c["name"]: c for c in json.loads((tmp_path / "out.json").read_text())["benchmarks"]}
        for size in ("1MB", "10MB"):
            info = cases[f"test_all_reduce[gloo-2p-{size}]"]["extra_info"]
            assert info["nodes"] == 2 and info["world_size"] == 2 and info["backend"] == "gloo"
            assert sorted(info["socket_ifname"].split(",")) == sorted([a.interface, b.interface])
            assert info["socket_ifname_source"] == "auto (route to controller)"
            stats = cases[f"test_all_reduce[gloo-2p-{size}]"]["stats"]
            print(f"two hosts over a veth pair: all_reduce {size}: median {stats['median'] * 1e3:.2f} ms "
                  f"(min {stats['min'] * 1e3:.2f}, max {stats['max'] * 1e3:.2f}, {stats['rounds']} rounds)")
    finally:
        _cleanup(nodes + [controller])


@pytest.mark.pool
def test_across_hosts_a_node_that_cannot_reach_master_addr_is_named_with_the_fix(tmp_path, two_hosts):
    """Without --local-addr, torchrun advertises node 0 by its hostname, which resolves to
    127.0.1.1 on both hosts (as on Debian / Ubuntu): the ranks connect to the controller but
    cannot form the group. The wait error says so, with the fix, and the ranks are told to exit."""
    a, b = two_hosts
    (tmp_path / "test_bench.py").write_text(TWO_HOST_BENCH.format(where=str(tmp_path)))
    nodes = _torchrun_nodes(tmp_path, a, b, local_addr=False)
    controller = None
    try:
        # The workers are up (torch imported, retrying the controller) before the controller
        # starts, so its short wait is spent on the join alone.
        deadline = time.monotonic() + 240
        while _logs(tmp_path).count("connecting to the controller") < 2:
            assert time.monotonic() < deadline and all(n.poll() is None for n in nodes), _logs(tmp_path)
            time.sleep(0.2)
        controller = _controller(tmp_path, a, "--dist-controller-wait=15", "-k", "all_reduce",
                                 "--dist-sizes=1MB")
        output, _ = controller.communicate(timeout=180)
        assert controller.returncode != 0
        assert f"waited 15 s on {a.address}:{CONTROLLER_PORT} for the torchrun workers; 0 of 2 ranks ready" \
            in output, output + _logs(tmp_path)
        for host in (a, b):
            assert re.search(rf"rank [01] on node [01] \(\S+ {re.escape(host.address)}, pid \d+\): "
                             rf"joining the process group for \d+ s: MASTER_ADDR \S+:\d+ "
                             rf"\(127\.0\.1\.1\), gloo on {host.interface} {re.escape(host.address)} "
                             rf"\[auto \(route to controller\)\]", output), output
        assert re.search(r"MASTER_ADDR \S+ resolves to a loopback address \(127\.0\.1\.1\) on node", output)
        assert "--local-addr" in output and "--rdzv-conf is_host=1" in output
        print(output)
        # The ranks were told to exit: both torchruns end by themselves.
        for node in nodes:
            assert node.wait(timeout=60) != 0
    finally:
        _cleanup(nodes + ([controller] if controller else []))
