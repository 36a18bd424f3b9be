"""The torchrun worker's steps as values, without a controller or a process group: what torchrun
told the rank, the message for each way connecting can fail, and what a rank says before joining."""

from __future__ import annotations

from multiprocessing.connection import AuthenticationError

import pytest

from ddpbench import worker
from ddpbench.pool.channel import HandshakeTimeout, IncompatiblePeer

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}


def test_the_rank_facts_are_what_torchrun_set():
    facts = worker.rank_facts(TORCHRUN)
    assert {k: facts[k] for k in ("rank", "world_size", "local_rank", "local_world_size", "node_rank")} == {
        "rank": 3, "world_size": 4, "local_rank": 1, "local_world_size": 2, "node_rank": 1}
    alone = worker.rank_facts({k: v for k, v in TORCHRUN.items() if k not in ("LOCAL_WORLD_SIZE", "GROUP_RANK")})
    assert (alone["local_world_size"], alone["node_rank"]) == (4, 0)  # one node: the whole world


@pytest.mark.parametrize("exc, expected", [
    (AuthenticationError("digest"), "rejected the shared secret"),
    (HandshakeTimeout("connected to h:1, but nothing answered"), "rank 2: connected to h:1, but nothing answered "
                                                                 "(--connect-timeout 5;"),
    (IncompatiblePeer("protocol 1, ours 2"), "the controller at h:1: protocol 1, ours 2; install the controller's"),
    (ConnectionRefusedError("refused"), "cannot reach the controller at h:1: refused"),
])
def test_each_way_connecting_fails_has_its_message(exc, expected):
    assert expected in worker.connect_failure(exc, "h:1", 2, 5.0)
    assert worker.connect_failure(ValueError("other"), "h:1", 2, 5.0) is None


def _joining(master_is_loopback: bool) -> dict:
    return {"backend": "gloo", "device": "cpu", "master_addr": "localhost", "master_port": "29500",
            "master_ips": ["127.0.0.1"], "master_is_loopback": master_is_loopback, "socket_ifname": "eth0",
            "socket_addresses": ["10.0.0.2"], "socket_ifname_source": worker.AUTO_SOURCE}


def test_a_loopback_master_addr_across_nodes_is_warned_about_before_joining():
    info = {"world_size": 4, "local_world_size": 2, "address": "10.0.0.2"}
    first, warning = worker.joining_lines(_joining(True), info)
    assert first == ("joining the process group at MASTER_ADDR localhost:29500 (127.0.0.1), gloo on eth0 10.0.0.2 "
                     f"({worker.AUTO_SOURCE})")
    assert warning.startswith("warning: MASTER_ADDR localhost is a loopback address here")
    assert len(worker.joining_lines(_joining(False), info)) == 1
    assert len(worker.joining_lines(_joining(True), dict(info, local_world_size=4))) == 1  # one node
    assert len(worker.joining_lines(_joining(True), dict(info, address="127.0.0.1"))) == 1  # nodes on one machine
