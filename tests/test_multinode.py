"""Multi-node pools: authentication of the controller's channel, and a two-"node" torchrun run on
loopback driven by a pytest controller, including losing a node mid-task."""

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from multiprocessing.connection import AuthenticationError, Client

import psutil
import pytest

from ddpbench.controller import SecretError, _Listener, load_secret, parse_address

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
        good = Client(listener.address, authkey=SECRET.encode())
        good.send(("hello", "task", {"rank": 0}))
        (hello, conn) = listener.accepted.get(timeout=10)
        assert hello == ("hello", "task", {"rank": 0})
        conn.close()
        good.close()
    finally:
        listener.close()


BENCH = '''
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

def test_all_reduce(dist_benchmark):
    dist_benchmark(Collective("all_reduce", 65536), rounds=5, warmup=1)

def test_node_loss(dist_benchmark):
    if {hang!r}:
        dist_benchmark(Hang(), rounds=1, warmup=0)

def test_after(dist_benchmark):
    dist_benchmark(Collective("broadcast", 4096), rounds=3, warmup=0)
'''


def _launch(tmp_path, hang):
    (tmp_path / "test_bench.py").write_text(BENCH.format(where=str(tmp_path), hang=hang))
    env = dict(os.environ, DDPBENCH_SECRET=SECRET, PYTHONUNBUFFERED="1")
    controller_port, rdzv_port = _free_port(), _free_port()
    controller = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_bench.py", "-p", "no:cacheprovider", "-m", "not gpu",
         "-v", f"--dist-controller=127.0.0.1:{controller_port}", "--dist-world-sizes=2",
         "--dist-timeout=60", "--dist-controller-wait=120", "--benchmark-json=out.json"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
         f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv_port}",
         "-m", "ddpbench.worker", f"--controller=127.0.0.1:{controller_port}"],
        cwd=tmp_path, env=env, stdout=open(tmp_path / f"node{node}.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True) for node in (0, 1)]
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


def test_two_nodes_on_loopback_run_the_cases_with_nodes_recorded(tmp_path):
    controller, nodes = _launch(tmp_path, hang=False)
    try:
        output, _ = controller.communicate(timeout=300)
        assert controller.returncode == 0, output
        data = json.loads((tmp_path / "out.json").read_text())
        infos = {case["name"]: case["extra_info"] for case in data["benchmarks"]}
        assert infos["test_all_reduce[gloo-2p]"]["nodes"] == 2
        assert infos["test_all_reduce[gloo-2p]"]["world_size"] == 2
        assert infos["test_all_reduce[gloo-2p]"]["busbw_GBps"] > 0
        for node in nodes:  # the controller told the workers to stop: torchrun ends cleanly
            assert node.wait(timeout=60) == 0
    finally:
        _cleanup(nodes + [controller])


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
