"""The two round times of a large gloo broadcast in a plain 2-rank script: how often a round is
slow, whether that share belongs to a pair of processes, and what a slow round does differently.

Each run starts a fresh pair of rank processes (rank 0 the root), which time ``--rounds`` rounds of
``dist.broadcast`` of ``--mb`` MB after a barrier, on each of ``--groups`` process groups in turn
(every group has its own TCP connections; the rounds of the groups interleave). A round is *slow*
when it takes over 1.5x the run's fastest tenth. Per run and group it prints the share of slow
rounds, the median fast and slow round, and in each kind of round the median of: the root's
voluntary context switches (a sender blocks when the receiver falls behind) and the receiver's CPU
time (os.times, so in clock ticks of 10 ms).

    .venv/bin/python lab/investigations/broadcast_modes.py                    # 3 runs, 100 MB, 60 rounds
    .venv/bin/python lab/investigations/broadcast_modes.py --groups 3         # is the share per connection?
    .venv/bin/python lab/investigations/broadcast_modes.py --pin apart        # rank r on CPU r (or: same, CPU 0)
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from plain_ranks import run_ranks

SLOW_FACTOR = 1.5
WARMUP = 3


def _voluntary_switches() -> int:
    """This process's voluntary context switches, all threads (gloo's included)."""
    total = 0
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/status") as fh:
                for line in fh:
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            pass
    return total


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def rank_main(rank, world_size, store_path, results, args):
    if args.pin == "apart":
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    elif args.pin == "same":
        os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    groups = [dist.new_group([0, 1]) for _ in range(args.groups)]
    tensor = torch.ones(args.mb * 2**20 // 4)
    for group in groups:
        for _ in range(WARMUP):
            dist.broadcast(tensor, 0, group=group)
    rounds = [[] for _ in groups]
    for _ in range(args.rounds):
        for k, group in enumerate(groups):
            dist.barrier()
            switches, cpu, start = _voluntary_switches(), _cpu_seconds(), time.perf_counter()
            dist.broadcast(tensor, 0, group=group)
            seconds = time.perf_counter() - start
            rounds[k].append((seconds, _voluntary_switches() - switches, _cpu_seconds() - cpu))
    results.put((rank, rounds))
    dist.destroy_process_group()


def one_run(args):
    """Per group, per round: (round time, max over ranks; the root's switches; the receiver's CPU s)."""
    found = run_ranks(rank_main, 2, args)
    return [[(max(root[0], receiver[0]), root[1], receiver[2]) for root, receiver in zip(found[0][k], found[1][k])]
            for k in range(args.groups)]


def _median(values, scale=1.0):
    return f"{statistics.median(values) * scale:.1f}" if values else "-"


def describe(rounds) -> str:
    times = sorted(t for t, _, _ in rounds)
    cut = SLOW_FACTOR * times[len(times) // 10]
    fast = [r for r in rounds if r[0] <= cut]
    slow = [r for r in rounds if r[0] > cut]
    return (f"slow share {len(slow) / len(rounds):.2f}; round ms fast {_median([r[0] for r in fast], 1e3)} "
            f"slow {_median([r[0] for r in slow], 1e3)}; root switches fast {_median([r[1] for r in fast])} "
            f"slow {_median([r[1] for r in slow])}; receiver CPU ms fast {_median([r[2] for r in fast], 1e3)} "
            f"slow {_median([r[2] for r in slow], 1e3)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="MB broadcast per round")
    parser.add_argument("--rounds", type=int, default=60, help="timed rounds per group")
    parser.add_argument("--runs", type=int, default=3, help="fresh pairs of rank processes, one after another")
    parser.add_argument("--groups", type=int, default=1, help="process groups per run, their rounds interleaved")
    parser.add_argument("--pin", choices=("none", "apart", "same"), default="none",
                        help="none: the OS places the ranks; apart: rank r on CPU r; same: both on CPU 0")
    args = parser.parse_args(argv)
    print(f"broadcast {args.mb} MB, 2 ranks, {args.rounds} rounds per group, pin {args.pin}")
    for run in range(args.runs):
        for k, rounds in enumerate(one_run(args)):
            print(f"run {run} group {k}: {describe(rounds)}")


if __name__ == "__main__":
    main()
