"""The memory census imports torch's tracker and nothing else of ``torch.distributed._tools``
(ddpbench.engine.torch_trackers): no runtime estimator (torch._inductor), no FSDP tracker, no DTensor
in a process that has none, no torch._dynamo, and it counts the same bytes as with torch's whole
package imported; the package still works for whoever imports it afterwards. Each in a fresh
interpreter (what a rank process is at its first case)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

FRESH = textwrap.dedent("""
    import json, os, sys, tempfile
    if sys.argv[1] == "whole":
        import torch.distributed._tools  # torch's package, every tool in it, before any census
    import torch.distributed as dist
    from ddpbench.engine.timing import RoundPlan, measure_workload
    from ddpbench.pool.base import RankContext
    from ddpbench.workloads.collectives import Collective
    from ddpbench.workloads.syncbn import SyncBNCase

    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ctx = RankContext(rank=0, world_size=1, backend="gloo", device_type="cpu")
    plan = RoundPlan(warmup=2, rounds=1, numerics_steps=0)
    out = {"all_reduce": measure_workload(ctx, Collective("all_reduce", 1 << 20), plan).metrics["memory"],
           "syncbn": measure_workload(ctx, SyncBNCase("torch_bn", 32, 128), plan).metrics["memory"]}
    heavy = ("torch._dynamo", "torch._inductor", "torch.distributed.tensor", "torch.distributed.fsdp",
             "torch.distributed._tools.runtime_estimator")
    out["imported"] = [name for name in heavy if name in sys.modules]
    from torch.distributed._tools import FSDPMemTracker, MemTracker  # the package, whole, as torch has it
    import torch.distributed._tools.mem_tracker as mem_tracker
    from torch.distributed.tensor import DTensor
    out["package"] = [MemTracker is mem_tracker.MemTracker, FSDPMemTracker.__name__,
                      mem_tracker.DTensor == DTensor, DTensor == mem_tracker.DTensor,
                      issubclass(DTensor, mem_tracker.DTensor), mem_tracker.DTensor != DTensor]
    print(json.dumps(out, sort_keys=True))
""")


@pytest.mark.pool
def test_the_census_imports_only_the_tracker_and_counts_what_the_whole_package_counts():
    runs = {how: subprocess.Popen([sys.executable, "-c", FRESH, how], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for how in ("tracker", "whole")}
    outputs = {how: run.communicate(timeout=300) for how, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values()), outputs
    tracker, whole = (json.loads(outputs[how][0].strip().splitlines()[-1]) for how in ("tracker", "whole"))
    assert tracker.pop("imported") == []
    assert "torch._dynamo" in whole.pop("imported")  # negative control: what the package's import brings
    assert tracker == whole  # the same records to the byte, and the package as torch has it
    assert tracker["package"] == [True, "FSDPMemTracker", True, True, True, False]
    assert tracker["all_reduce"]["peak_bytes"] >= 1 << 20 and tracker["syncbn"]["peak_bytes"] > 0
