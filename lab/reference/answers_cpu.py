"""What the four exact answers cost in CPU seconds, which a loaded machine moves far less than wall
time (issue 62): one case's ``measure_workload`` in a fresh 1-rank gloo process (so the first case's
imports count), with the answers on (``RoundPlan``'s defaults) and off (``census=False,
memory_census=False, numerics_steps=0``), the median of ``--repeats`` processes each. One rank: a
collective moves no data, so read the answers' CPU (on minus off), not the ratio.

    .venv/bin/python lab/reference/answers_cpu.py
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python lab/reference/answers_cpu.py   # another tree
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = ("all_reduce", "syncbn", "mlp_ddp", "transformer")

ONE = r"""
import json, os, sys, tempfile, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
from ddpbench.engine.timing import RoundPlan, measure_workload
from ddpbench.pool.base import RankContext
case, answers = sys.argv[1], sys.argv[2] == "on"
if case == "all_reduce":
    from ddpbench.workloads.collectives import Collective
    workload = Collective("all_reduce", 10 << 20)
elif case == "syncbn":
    from ddpbench.workloads.syncbn import SyncBNCase
    workload = SyncBNCase("torch_bn", 32, 128)
elif case == "mlp_ddp":
    from ddpbench.workloads.training import Training
    workload = Training("mlp", "ddp")
else:
    from ddpbench.workloads.training import TransformerTraining
    workload = TransformerTraining(size="cpu-small")
ctx = RankContext(rank=0, world_size=1, backend="gloo", device_type="cpu")
plan = RoundPlan(warmup=2, rounds=20) if answers else RoundPlan(warmup=2, rounds=20, census=False,
                                                                memory_census=False, numerics_steps=0)
start = time.process_time()
measure_workload(ctx, workload, plan)
print(json.dumps({"cpu_s": time.process_time() - start}))
"""


def cpu_seconds(case: str, answers: bool) -> float:
    done = subprocess.run([sys.executable, "-c", ONE, case, "on" if answers else "off"], capture_output=True,
                          text=True, cwd="/" if os.name == "posix" else None)
    if done.returncode:
        raise SystemExit(f"{case} ({'on' if answers else 'off'}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["cpu_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    args = parser.parse_args()
    print(f"# load average {os.getloadavg()[0]:.2f} at the start; median of {args.repeats} processes")
    print("| case | CPU s answers on / off | answers' CPU s |")
    print("|---|---|---|")
    for case in args.cases.split(","):
        on = statistics.median(cpu_seconds(case, True) for _ in range(args.repeats))
        off = statistics.median(cpu_seconds(case, False) for _ in range(args.repeats))
        print(f"| {case} | {on:.2f} / {off:.2f} | {on - off:.2f} |", flush=True)


if __name__ == "__main__":
    main()
