"""Seed 004's memory finding on the CPU: a hand-written all-reduce loop, DDP, and DDP with
``gradient_as_bucket_view=True``, the same model (the training family's mlp), on one 2-rank gloo
pool, each case's memory census (ddpbench.engine.memory) side by side. The seed measured
``torch.cuda.max_memory_allocated`` on its GPUs: 170.1 MB hand-written, 173.9 MB DDP.

    .venv/bin/python lab/investigations/seed004_memory.py            # the markdown table
    .venv/bin/python lab/investigations/seed004_memory.py --json     # the records, one JSON document

The census counts tensor storages, so the figures are the same to the byte in every run
(tests/engine/test_memory_census.py runs this script twice in fresh processes and compares the JSON).
"""

from __future__ import annotations

import argparse
import json

# (label, Training keyword arguments)
VARIANTS = (("hand-written all_reduce", {"impl": "manual"}),
            ("DDP", {"impl": "ddp"}),
            ("DDP, gradient_as_bucket_view", {"impl": "ddp", "gradient_as_bucket_view": True}))
SEED_MB = {"hand-written all_reduce": 170.1, "DDP": 173.9}  # seed 004's GPUs, max memory allocated
MODEL, BATCH = "mlp", 32


def measure(world_size: int = 2) -> dict[str, dict]:
    """Each variant's memory census (every rank's record combined), one pool for all."""
    from ddpbench.engine.timing import RoundPlan, combine_rank_metrics, measure_workload
    from ddpbench.pool import PoolSpec, RankPool
    from ddpbench.workloads.training import Training

    plan = RoundPlan(warmup=2, rounds=1, census=False)  # the memory census's step comes after warm-up
    pool = RankPool(PoolSpec("gloo", world_size, "cpu"))
    try:
        return {label: combine_rank_metrics([m.metrics for m in pool.run(
                    measure_workload, Training(MODEL, batch_size=BATCH, **kwargs), plan, timeout_s=300)])["memory"]
                for label, kwargs in VARIANTS}
    finally:
        pool.close()


def table(records: dict[str, dict]) -> str:
    """The census side by side: peak, the categories at the peak, what stays after the step."""
    def mb(nbytes) -> str:
        return "-" if not nbytes else f"{nbytes / 2**20:.2f}"

    keys = [k for k in ("parameters", "gradients", "optimizer_state", "activations", "temporaries",
                        "ddp_buckets", "collective_buffers", "other")
            if any(r["at_peak"].get(k) for r in records.values())]
    lines = ["| variant | peak (MiB) | " + " | ".join(f"{k} at peak" for k in keys)
             + " | peak at | kept after the step (MiB) | seed 004 (GPU, MB) |",
             "|---" * (len(keys) + 5) + "|"]
    for label, r in records.items():
        where = " ".join(str(v) for v in (r["peak_at"].get("module"), r["peak_at"].get("phase")) if v)
        lines.append(f"| {label} | {mb(r['max_peak_bytes'])} | "
                     + " | ".join(mb(r["at_peak"].get(k)) for k in keys)
                     + f" | {where} | {mb(r['after_step_bytes'])} | {SEED_MB.get(label, '-')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the records as one JSON document")
    args = parser.parse_args()
    records = measure()
    print(json.dumps(records, sort_keys=True) if args.json else table(records))


if __name__ == "__main__":
    main()
