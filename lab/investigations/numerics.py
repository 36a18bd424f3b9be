"""The numerics verdict measured on CPU gloo: A/A runs of a few family cases (each against its
first run), the planted bugs of ddpbench.testing.SelfmadeTraining, and changes that only reorder
floating-point sums (DDP's bucket_cap_mb at 4 ranks, fp16_compress_hook against DDP's all-reduce),
each with the verdict line and the relative difference it shows. Every case runs through the engine
(measure_workload: its rounds, then the numerics replay), census and memory census off.

    .venv/bin/python lab/investigations/numerics.py                 # the markdown tables
    .venv/bin/python lab/investigations/numerics.py --repeats 3     # fewer A/A runs per case
    .venv/bin/python lab/investigations/numerics.py --parts planted # one table (aa, planted, reorder)
    .venv/bin/python lab/investigations/numerics.py --parts sizes   # each family's record, in bytes
"""

from __future__ import annotations

import argparse
import json
import re


def _numerics(pool, workload) -> dict:
    from ddpbench.engine.timing import RoundPlan, combine_rank_metrics, measure_workload

    plan = RoundPlan(warmup=1, rounds=2, census=False, memory_census=False)
    metrics = combine_rank_metrics([m.metrics for m in pool.run(measure_workload, workload, plan, timeout_s=600)])
    return metrics["numerics"]


def _magnitude(line: str) -> str:
    found = re.search(r"largest relative difference ([^ ]+)", line)
    return found.group(1) if found else "0"


def _tensor_count(record: dict) -> int:
    """Tensors rank 0 fingerprinted at the last step (a record of either version)."""
    last = record["tensors"][0][-1]
    return len(last) if isinstance(last, dict) else sum(figures is not None for figures in last)


def _size_cases() -> dict:
    from ddpbench.testing import SelfmadeTraining
    from ddpbench.workloads.collectives import Collective
    from ddpbench.workloads.syncbn import SyncBNCase
    from ddpbench.workloads.training import Training
    from ddpbench.workloads.training.transformer import TransformerTraining

    return {"all_reduce 1 MiB float32": Collective("all_reduce", 1 << 20),
            "syncbn fused bs32 h256": SyncBNCase("fused", 32, 256),
            "training mlp, hand-written all_reduce": Training("mlp", "manual"),
            "training mlp, DDP": Training("mlp", "ddp"),
            "selfmade loop (SelfmadeTraining)": SelfmadeTraining(),
            "transformer cpu-small, DDP": TransformerTraining(size="cpu-small", impl="ddp", measure_peak=False),
            "transformer cpu-small, FSDP2": TransformerTraining(size="cpu-small", impl="fsdp2", measure_peak=False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="A/A runs per case (default 10)")
    parser.add_argument("--parts", default="aa,planted,reorder",
                        help="which tables (default: the first three; also sizes: each record's bytes)")
    args = parser.parse_args()

    from ddpbench.gates.numerics import compare_numerics
    from ddpbench.pool import PoolRegistry, PoolSpec
    from ddpbench.testing import SelfmadeTraining
    from ddpbench.workloads.collectives import Collective
    from ddpbench.workloads.syncbn import SyncBNCase
    from ddpbench.workloads.training import Training
    from ddpbench.workloads.training.transformer import TransformerTraining

    registry = PoolRegistry()
    parts = set(args.parts.split(","))
    two = registry.get(PoolSpec("gloo", 2, "cpu"))
    four = registry.get(PoolSpec("gloo", 4, "cpu")) if "reorder" in parts else None
    try:
        cases = {} if "aa" not in parts else {"selfmade loop (SelfmadeTraining)": SelfmadeTraining(),
                 "all_reduce 1 MiB float32": Collective("all_reduce", 1 << 20),
                 "syncbn fused bs32 h256": SyncBNCase("fused", 32, 256),
                 "training mlp, hand-written all_reduce": Training("mlp", "manual"),
                 "training mlp, DDP": Training("mlp", "ddp"),
                 "transformer cpu-small, DDP": TransformerTraining(size="cpu-small", impl="ddp", measure_peak=False)}
        if cases:
            print("| A/A case (2 ranks) | runs | same (bitwise) | tensors per rank and step | replay spread |")
            print("|---|---|---|---|---|")
        for label, workload in cases.items():
            first = _numerics(two, workload)
            same = sum(compare_numerics(first, _numerics(two, workload)).line.startswith("same (bitwise)")
                       for _ in range(args.repeats))
            print(f"| {label} | {args.repeats} | {same} | {_tensor_count(first)} | {first['replay_spread']} |")

        sizes = _size_cases() if "sizes" in parts else {}
        if sizes:
            print("| case (2 ranks, 3 steps) | bytes, json.dumps(numerics) | bytes as a saved run holds it "
                  "(indent 4) | tensors per rank and step |")
            print("|---|---|---|---|")
        for label, workload in sizes.items():
            record = _numerics(two, workload)
            print(f"| {label} | {len(json.dumps(record))} | {len(json.dumps(record, indent=4))} | "
                  f"{_tensor_count(record)} |", flush=True)
        if not parts & {"planted", "reorder"}:
            return
        print("\n| change | ranks | verdict | relative difference | line |")
        print("|---|---|---|---|---|")
        base = _numerics(two, SelfmadeTraining()) if "planted" in parts else None
        for bug in ("sum-grads", "half-loss", "frozen-param") if base is not None else ():
            verdict = compare_numerics(base, _numerics(two, SelfmadeTraining(bug=bug)))
            print(f"| planted: {bug} | 2 | {verdict.verdict} | {_magnitude(verdict.line)} | {verdict.line} |")
        reorders = (
            ("training mlp DDP: bucket_cap_mb 25 → 1", four, Training("mlp", "ddp"),
             Training("mlp", "ddp", bucket_cap_mb=1.0)),
            ("transformer cpu-small DDP: bucket_cap_mb 25 → 1", four,
             TransformerTraining(size="cpu-small", impl="ddp", measure_peak=False),
             TransformerTraining(size="cpu-small", impl="ddp", measure_peak=False, bucket_cap_mb=1.0)),
            ("transformer cpu-small DDP: fp16_compress_hook", two,
             TransformerTraining(size="cpu-small", impl="ddp", measure_peak=False),
             TransformerTraining(size="cpu-small", impl="ddp", measure_peak=False, comm_hook="fp16")),
        )
        for label, pool, before, after in reorders if "reorder" in parts else ():
            verdict = compare_numerics(_numerics(pool, before), _numerics(pool, after))
            ranks = pool.spec.world_size
            print(f"| {label} | {ranks} | {verdict.verdict} | {_magnitude(verdict.line)} | {verdict.line} |")
    finally:
        registry.close()


if __name__ == "__main__":
    main()
