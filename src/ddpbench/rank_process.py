"""Entry point of a rank started by :class:`ddpbench.pool.RankLaunch` (A/B sides): another
interpreter or environment than the controller's. It runs the same rank main as a spawned rank
(:func:`ddpbench.pool.local_rank.run_local_rank`). Its module path never changes: a controller
starts it by that name in another ddpbench, possibly an older or newer one.

The pool starts it as ``python -c "<ddpbench.pool.RANK_BOOTSTRAP>; main(...)"`` with::

    --fd FD --rank R --world-size N --backend gloo --device cpu --store-dir DIR --parent-pid PID
    --pg-timeout S [--pin]

never by hand: FD is the rank's end of a socket pair to the controller.

:data:`RANK_PROTOCOL` names the contract between a controller and ranks that may run another
ddpbench (A/B mode's baseline side): these arguments, the task and reply messages of
``ddpbench.pool.serve_tasks``, the A/B tasks of ``ddpbench.gates.ab.tasks`` with their arguments and
results (``ddpbench.engine.timing.RoundPlan``, round times, metrics) and what a round means
(``ddpbench.engine.timing``'s timing rule). Raise it whenever one of them changes in a way the other side
cannot follow; an A/B run refuses sides whose protocols differ. A ddpbench without it speaks 1.

2: rounds time ``RoundPlan.ops_per_round`` ops and record the time per op; ``RoundPlan`` carries
``ops_per_round`` and ``cuda_graphs``; the A/B task ``start`` returns ``{estimate_s, ops_per_round}``.
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
