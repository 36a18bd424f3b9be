"""A rank started by torchrun that serves a ddpbench controller (multi-node pools).

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m ddpbench.worker --controller CONTROLLER_HOST:29600

torchrun provides RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR and MASTER_PORT; this
process joins the process group through env://, connects to the controller (pytest run with
``--dist-controller``) with the shared secret ($DDPBENCH_SECRET or ``--secret-file``), and runs
the tasks it is sent until the controller says stop or disappears.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import os
import socket
import sys
import tempfile
import threading
import time
from multiprocessing.connection import AuthenticationError, Client

from .controller import SecretError, load_secret, parse_address
from .pool import RankContext, serve_tasks

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _connect(address: tuple[str, int], secret: bytes, timeout_s: float):
    """Connect and authenticate, retrying while the controller is not listening yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client(address, authkey=secret)
        except OSError:  # not listening yet; an AuthenticationError is not retried
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _stack_dump() -> str:
    with tempfile.TemporaryFile("w+") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.seek(0)
        return fh.read()


def _serve_control(conn, finished: threading.Event) -> None:
    """Answer stack-dump requests; exit the process on abort, or when the controller disappears
    while this rank is still serving tasks (e.g. stuck in a collective)."""
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
            os._exit(5)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ddpbench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--controller", required=True, help="HOST:PORT the pytest controller listens on")
    parser.add_argument("--secret-file", help=f"0600 file with the shared secret (default: ${'DDPBENCH_SECRET'})")
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl with CUDA, else gloo")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--connect-timeout", type=float, default=300.0,
                        help="seconds to keep trying to reach the controller (default 300)")
    return parser


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

    import torch
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = "cuda" if backend == "nccl" else "cpu"
    torch.set_num_threads(args.threads)
    if device == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(minutes=30))

    info = {"rank": rank, "world_size": world_size, "backend": backend, "device": device,
            "host": socket.gethostname(), "node_rank": int(os.environ.get("GROUP_RANK", "0")),
            "pid": os.getpid()}
    try:
        task_conn = _connect(address, secret, args.connect_timeout)
        control_conn = _connect(address, secret, args.connect_timeout)
    except AuthenticationError:
        print("ddpbench.worker: the controller rejected the shared secret (or answered with a "
              "different one)", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"ddpbench.worker: cannot reach the controller at {args.controller}: {exc}", file=sys.stderr)
        return 3
    task_conn.send(("hello", "task", info))
    control_conn.send(("hello", "control", info))
    finished = threading.Event()
    threading.Thread(target=_serve_control, args=(control_conn, finished), daemon=True).start()

    ctx = RankContext(rank, world_size, backend, device, local_rank=local_rank)
    try:
        serve_tasks(task_conn, ctx)
    finally:
        finished.set()
        task_conn.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
