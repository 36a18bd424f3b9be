"""The rank-side task of ``--dist-ab-profile``: a few rounds of a case under torch.profiler on one
rank (:mod:`ddpbench.gates.ab.profiling` runs it on each side's pool and compares the ops).

This module's path and the task's name are a contract with other ddpbench versions, like
:mod:`ddpbench.rank_process`: the controller sends the task by reference, and an A/B side's ranks
import it from their own ddpbench, older or newer (docs/design/ab.md#why-a-regression-is-slower).
A side whose ddpbench lacks it is named as not profiled; never move or rename it.
"""

from __future__ import annotations

from typing import Any


def profile_rounds(ctx, workload, plan, rounds: int, trace_path: str) -> dict[str, Any]:
    """Pool task: set the workload up, warm it up, record ``rounds`` rounds under torch.profiler
    (CPU, and CUDA on a GPU), write the Chrome trace to ``trace_path`` with ``{rank}`` filled in,
    tear down without the check. Returns this rank's per-op self times (microseconds over all the
    rounds), its round times and the trace's path."""
    from torch.profiler import ProfilerActivity, profile

    from ...engine.timing import RankSession

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device_type == "cuda" else [])
    session = RankSession(ctx, workload, plan)
    try:
        session.start()
        with profile(activities=activities) as profiler:
            times, _ = session.record(rounds)
        path = trace_path.format(rank=ctx.rank)
        profiler.export_chrome_trace(path)
        ops = {event.key: {"cpu_us": float(event.self_cpu_time_total),
                           "device_us": float(getattr(event, "self_device_time_total", 0.0) or 0.0),
                           "calls": int(event.count)}
               for event in profiler.key_averages()}
        variant_times = session.time_variants(getattr(plan, "variant_rounds", 0))
    finally:
        session.close()
    return {"ops": ops, "round_times": list(times), "trace": path, "variant_times": variant_times}
