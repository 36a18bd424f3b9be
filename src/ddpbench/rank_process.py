"""Entry point of a rank started by :class:`ddpbench.pool.RankLaunch` (A/B sides): another
interpreter or environment than the controller's. It runs the same rank main as a spawned rank.

    python -m ddpbench.rank_process --fd FD --rank R --world-size N --backend gloo --device cpu \\
        --store-dir DIR --parent-pid PID --pg-timeout S [--pin]

Started by the pool, never by hand: FD is the rank's end of a socket pair to the controller.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpbench.rank_process", description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--pg-timeout", type=float, required=True)
    parser.add_argument("--pin", action="store_true")
    args = parser.parse_args(argv)

    from multiprocessing import current_process
    from multiprocessing.connection import Connection

    authkey = os.environ.pop("DDPBENCH_RANK_AUTHKEY", None)
    if authkey:
        current_process().authkey = bytes.fromhex(authkey)
    from .pool import PoolSpec, _rank_main

    _rank_main(PoolSpec(args.backend, args.world_size, args.device), args.rank, args.store_dir,
               Connection(args.fd), args.parent_pid, args.pg_timeout, args.pin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
