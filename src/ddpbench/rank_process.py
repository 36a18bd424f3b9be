"""Entry point of a rank started by RankLaunch in another interpreter (A/B sides).

Its module path and RANK_PROTOCOL are a contract with other ddpbench versions:
docs/design/ab.md#the-rank-protocol-rank_processpy.
"""

from __future__ import annotations

import argparse
import os
import sys

RANK_PROTOCOL = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddpbench rank", description=__doc__.splitlines()[0])
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
    from .pool.base import PoolSpec
    from .pool.local_rank import run_local_rank

    run_local_rank(PoolSpec(args.backend, args.world_size, args.device), args.rank, args.store_dir,
               Connection(args.fd), args.parent_pid, args.pg_timeout, args.pin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
