"""What the controller says when the torchrun workers do not form a pool: each expected rank's
last phase and host, and what to check for it (docs/design/multi-node-and-gpu.md#start-up-phase-by-phase)."""

from __future__ import annotations

import ipaddress
import time

from .joining import JoiningRank


def _transport_text(info: dict) -> str:
    """'MASTER_ADDR vm:41234 (127.0.0.1), gloo on eth0 10.0.0.2 [auto (route to controller)]'"""
    ips = ",".join(info.get("master_ips") or []) or "does not resolve"
    addresses = ",".join(info.get("socket_addresses") or []) or "(no address)"
    return (f"MASTER_ADDR {info.get('master_addr')}:{info.get('master_port')} ({ips}), "
            f"{info.get('backend')} on {info.get('socket_ifname') or '?'} {addresses} "
            f"[{info.get('socket_ifname_source')}]")


def _rank_line(state: JoiningRank, now: float) -> str:
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


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _hints(address: tuple[str, int], world_size: int | None, ranks: dict[int, JoiningRank],
           missing: list[int]) -> list[str]:
    """What to try, matching where the ranks are."""
    controller = f"{address[0]}:{address[1]}"
    states = list(ranks.values())
    joining = [s for s in states if s.phase in ("joining", "failed")]
    # Ranks on several machines (torchrun "nodes" that all reach the controller over loopback
    # share one machine, where loopback addresses work).
    multi_node = (any(s.info.get("world_size", 1) > s.info.get("local_world_size", 1) for s in states)
                  and not all(is_loopback(s.info.get("address", "")) for s in states))
    hints = []
    if missing or world_size is None:
        subject = ("No rank connected" if world_size is None
                   else f"{ranks_text(missing).capitalize()} never connected")
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
                          and all(is_loopback(a) for a in s.info["socket_addresses"])]
    if loopback_transport and multi_node:
        sample = loopback_transport[0].info
        variable = _ifname_variable(sample.get("backend"))
        source = sample.get("socket_ifname_source")
        hints.append(
            f"{ranks_text([s.rank for s in loopback_transport]).capitalize()} would exchange data "
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
        hints.append(f"{ranks_text(starting).capitalize()} connected but did not start joining: "
                     f"a slow start (CUDA initialisation) needs a longer "
                     f"--dist-controller-wait.")
    return hints


def _nodes_text(states) -> str:
    nodes = sorted({s.node for s in states})
    return nodes[0] if len(nodes) == 1 else " and ".join([", ".join(nodes[:-1]), nodes[-1]])


def _ifname_variable(backend) -> str:
    return "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"  # see worker.py


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def start_error(headline: str, address, world_size, ranks, rejected: int, ignored: int,
                 expected: int | None, timed_out: int = 0, accept_errors: dict | None = None,
                 incompatible: int = 0) -> str:
    now = time.monotonic()
    lines = [headline]
    missing = [r for r in range(world_size or 0) if r not in ranks]
    if world_size is None:
        lines.append(f"  connected ranks: none{f' (this case needs {expected})' if expected else ''}")
    lines.extend(_rank_line(ranks[rank], now) for rank in sorted(ranks))
    if missing:
        lines.append(f"  {ranks_text(missing)}: never connected")
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


def identity_error(state: JoiningRank, address, mismatch: list[str]) -> str:
    return "\n".join([
        f"ddpbench: rank {state.rank} of the torchrun workers ({state.node}, pid "
        f"{state.info.get('pid', '?')}) runs other software than the controller "
        f"({address[0]}:{address[1]}):",
        *(f"  {line}" for line in mismatch),
        "A case's timings and checks are this code's only when every rank runs it: install the "
        "controller's torch and ddpbench (the same source: one commit or wheel) on every node, "
        "then relaunch the torchrun workers. The ranks that had connected were told to exit."])
