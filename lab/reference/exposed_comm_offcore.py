"""Exposed communication when compute leaves the cores free: one bucket holding every gradient
raises ``exposed_comm_s`` while ``compute_s`` stays (docs/results.md, *Why is it slower?*).

On the 2-core machine gloo's communication runs on the same cores as the backward pass, so default
DDP hides none of it and one bucket has no overlap to lose. A GPU's kernels leave the host cores
free; this script stands in for that: each transformer block's backward ends with ``--offcore-ms``
of waiting with its core idle (a full backward hook that sleeps), as a rank waits on its GPU, and
the compute-only variant waits alike. Buckets that are ready by then are all-reduced by gloo's
thread meanwhile, so the default's first bucket hides behind the remaining blocks' waits and one
bucket (``bucket_cap_mb`` 1000) can start only after the last gradient. ``--batch-size 1`` keeps the
on-core compute small beside the waits and the gradients' exchange (at the size's own batch its
noise is wider than the difference).

A temporary flat-layout folder holds the workload (a TransformerTraining whose loop adds the hooks)
and one test per bucket cap; each run is one pytest run of every case with ``--dist-exposed-comm``
round groups, ``--runs`` times, quiet.

    .venv/bin/python lab/reference/exposed_comm_offcore.py --runs 5 --size cpu-large --batch-size 1 \
        --offcore-ms 20 --caps 1 25 1000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD = '''
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from ddpbench.workloads.training import TransformerTraining
from ddpbench.workloads.training.transformer import _TransformerLoop

OFFCORE_S = {offcore_s!r}


def _wait_off_core(module, grad_input, grad_output):
    time.sleep(OFFCORE_S)  # the core is free, as while a GPU kernel runs


class OffCoreLoop(_TransformerLoop):
    """Each block's backward ends with OFFCORE_S of waiting with the core idle."""

    def __init__(self, ctx, workload, inputs, targets):
        super().__init__(ctx, workload, inputs, targets)
        for block in self.model.blocks:
            block.register_full_backward_hook(_wait_off_core)


@dataclass(frozen=True)
class OffCoreTransformer(TransformerTraining):
    loop_class: ClassVar[Any] = OffCoreLoop
'''

BENCH = '''
import pytest

from ddpbench.pool import PoolSpec
from ddpbench.workloads.training.metrics import add_exposed_communication

from offcore import OffCoreTransformer

CASES = [OffCoreTransformer(size={size!r}, batch_size={batch_size!r}, bucket_cap_mb=cap) for cap in {caps!r}]


@pytest.mark.parametrize("workload", [pytest.param(w, id=f"cap{{w.bucket_cap_mb:g}}") for w in CASES])
@pytest.mark.parametrize("dist_spec", [pytest.param(PoolSpec("gloo", {world_size}, "cpu"), id="gloo-{world_size}p")])
def test_offcore(dist_benchmark, workload):
    result = dist_benchmark(workload, variant_rounds={groups})
    dist_benchmark.extra_info.update(add_exposed_communication(result.extra_info))
'''

KEYS = ("compute_s", "exposed_comm_s", "comm_isolated_s")


def _ms(value) -> str:
    return f"{1e3 * value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--offcore-ms", type=float, default=20.0, help="each block's idle wait in backward")
    parser.add_argument("--size", default="cpu-large", help="the transformer size (cpu-small, cpu-large)")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="sequences per rank (0: the size's own); few make the on-core compute small "
                             "beside the idle waits and the gradients' communication")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks (1: nothing to exchange, so exposed communication should hold 0)")
    parser.add_argument("--groups", type=int, default=16, help="round groups of step, compute-only, replay")
    parser.add_argument("--caps", type=float, nargs="+", default=[25.0, 1000.0],
                        help="the bucket_cap_mb of each case (default: 25, DDP's own, and 1000, one bucket)")
    args, pytest_args = parser.parse_known_args()
    rows: dict[str, list[dict]] = {}
    walls = []
    with tempfile.TemporaryDirectory(prefix="offcore-") as tmp:
        root = Path(tmp)
        (root / "pytest.ini").write_text("[pytest]\n")
        (root / "offcore.py").write_text(WORKLOAD.format(offcore_s=args.offcore_ms / 1e3))
        (root / "test_offcore.py").write_text(BENCH.format(size=args.size, batch_size=args.batch_size, world_size=args.world_size, groups=args.groups, caps=tuple(args.caps)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        for index in range(1, args.runs + 1):
            out = root / f"run{index}.json"
            started = time.monotonic()
            run = subprocess.run([sys.executable, "-m", "pytest", "test_offcore.py", "-q", "-p", "no:cacheprovider",
                                  f"--benchmark-json={out}", *pytest_args], cwd=root, env=env,
                                 capture_output=True, text=True)
            walls.append(time.monotonic() - started)
            if run.returncode != 0 or not out.exists():
                print(run.stdout[-3000:], run.stderr[-2000:])
                raise SystemExit(f"run {index} failed (exit {run.returncode})")
            for case in json.loads(out.read_text())["benchmarks"]:
                info = case["extra_info"]
                name = case["name"].split("[")[1].rstrip("]")
                rows.setdefault(name, []).append(info)
                print(f"run {index} {name}: step median {_ms(case['stats']['median'])} ms, "
                      f"compute {_ms(info['compute_s'])} ms, exposed comm {_ms(info['exposed_comm_s'])} "
                      f"[{_ms(info['exposed_comm_s_ci'][0])}, {_ms(info['exposed_comm_s_ci'][1])}] ms, "
                      f"isolated comm {_ms(info['comm_isolated_s'])} ms, overlap {info['comm_overlap_pct']:.0f}%, "
                      f"buckets {(info.get('census') or {}).get('ddp_buckets')}", flush=True)
    print(f"\n{args.runs} runs, {args.world_size} rank(s), {args.size}, {args.offcore_ms:g} ms idle per block's backward, "
          f"{args.groups} round groups; wall per run {statistics.median(walls):.0f} s "
          f"(min {min(walls):.0f}, max {max(walls):.0f})")
    print("| case | " + " | ".join(f"{k} ms, median (min-max)" for k in KEYS) + " | overlap %, median (min-max) |")
    print("|---|" + "---|" * (len(KEYS) + 1))
    for name, infos in rows.items():
        cells = []
        for key in KEYS:
            values = [1e3 * info[key] for info in infos]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        overlap = [info["comm_overlap_pct"] for info in infos]
        cells.append(f"{statistics.median(overlap):.0f} ({min(overlap):.0f}-{max(overlap):.0f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
