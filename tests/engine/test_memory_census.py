"""The memory census (ddpbench.engine.memory) and the memory verdict (ddpbench.gates.memory), with the
planted checks: one extra activation kept alive per block moves the peak by exactly its bytes and is
a memory regression naming it while the timing reads same; activation checkpointing is an
improvement; an A/A is same 10 times of 10; the same cases give the same bytes in two fresh
processes, where DDP's bucket copy shows and gradient_as_bucket_view removes it (seed 004); an A/B run
of a user workload whose candidate keeps a 64 MB tensor alive across steps fails with exit 1 naming
it. Most of it runs in this process on a small model (the census needs no process group)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from ddpbench.engine.memory import combine_memory, discover_targets, take_memory_census
from ddpbench.gates import verdicts
from ddpbench.gates.exit_decision import decide_exit, exit_lines
from ddpbench.gates.memory import compare_memory
from ddpbench.storage.records import RecordError

BATCH, WIDTH, HIDDEN, BLOCKS = 512, 64, 256, 4
PLANTED_BYTES = BLOCKS * BATCH * HIDDEN * 4  # one (BATCH, HIDDEN) float32 tensor per block


class Block(torch.nn.Module):
    def __init__(self, keep: bool):
        super().__init__()
        self.up, self.down, self.keep, self.kept = torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Linear(HIDDEN, WIDTH), keep, None

    def forward(self, x):
        h = torch.relu(self.up(x))
        if self.keep:  # the planted bug: a copy of the activation kept alive (for "logging")
            self.kept = h * 1.0
        return self.down(h)


class Net(torch.nn.Module):
    def __init__(self, keep=False, checkpoint=False):
        super().__init__()
        self.blocks, self.checkpoint = torch.nn.ModuleList(Block(keep) for _ in range(BLOCKS)), checkpoint

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpoint else block(x)
        return x


def _census(batch=BATCH, **kwargs) -> dict:
    """The memory census of one step of ``Net(**kwargs)`` with AdamW, after two warm-up steps."""
    torch.manual_seed(0)
    model = Net(**kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
    x = torch.randn(batch, WIDTH)

    def step():
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    step(), step()
    return take_memory_census(step, discover_targets({"model": model, "optimizer": optimizer, "x": x}))


@pytest.fixture(scope="module")
def baseline():
    return _census()


def test_the_record_says_what_held_the_peak_and_where(baseline):
    params = sum(p.numel() * 4 for p in Net().parameters())
    assert baseline["at_peak"]["parameters"] == params
    assert baseline["peak_bytes"] == sum(baseline["at_peak"].values())
    assert baseline["peak_at"] == {"module": "blocks.3", "phase": "backward"}  # backward starts at the last block
    tensors = len(list(Net().parameters()))
    assert baseline["after_step"]["optimizer_state"] == 2 * params + 4 * tensors  # AdamW's moments, a step count each
    assert baseline["optimizers"] == [{"name": "AdamW", "foreach": False}]
    assert baseline["before_step_bytes"] == baseline["after_step_bytes"]  # nothing grows step to step


def test_an_extra_activation_per_block_moves_the_peak_by_exactly_its_bytes_and_regresses(baseline):
    planted = _census(keep=True)
    assert planted["peak_bytes"] - baseline["peak_bytes"] == PLANTED_BYTES
    assert planted["at_peak"]["activations"] - baseline["at_peak"]["activations"] == PLANTED_BYTES
    verdict = compare_memory(baseline, planted)
    assert verdict.verdict == "regression"
    assert verdict.line.startswith("peak +2.0 MiB: activations +2.0 MiB, at blocks.3 backward")
    assert "kept after the step +2.0 MiB (activations +2.0 MiB)" in verdict.line
    # Whatever the timing says (here: same), the case is a regression, and the report says why.
    case = verdicts.CaseVerdict("test_step", "same", ratio=1.0, ci_low=0.99, ci_high=1.01)
    case.judge_memory(verdict)
    assert (case.verdict, case.timing_verdict) == ("regression", "same")
    report = verdicts.GateReport("gate", [case], 0.05, columns=[verdicts.MEMORY_COLUMN])
    text = verdicts.format_text(report)
    assert "regression (memory; timing same)" in text and "peak +2.0 MiB: activations +2.0 MiB" in text
    decision = decide_exit(report)
    assert decision.status == 1 and decision.memory == ("test_step",)
    assert any("1 memory regression(s) (test_step)" in line for line in exit_lines(decision))
    # Accepted as made on purpose: shown, the timing verdict stands.
    accepted = verdicts.CaseVerdict("test_step", "same")
    accepted.judge_memory(verdict, accepted=True)
    assert accepted.verdict == "same" and accepted.memory.cell().startswith("regression, accepted: peak +2.0 MiB")
    decision = decide_exit(verdicts.GateReport("gate", [accepted]))
    assert decision.status == 0 and decision.memory_accepted == ("test_step",)


def test_activation_checkpointing_is_an_improvement(baseline):
    checkpointed = _census(checkpoint=True)
    assert checkpointed["at_peak"]["activations"] < baseline["at_peak"]["activations"] / 2
    verdict = compare_memory(baseline, checkpointed)
    # The peak moved (to the first block's backward, where more gradients exist): its total decides,
    # and the categories compare what held each peak, said as such (not a change in the step).
    assert verdict.verdict == "improvement", verdict.line
    assert verdict.line.startswith("peak -1.5 MiB, now at blocks.0 backward (was at blocks.3 backward); "
                                   "held at this peak against the baseline's: activations -1.9 MiB"), verdict.line


def test_the_model_ddp_wraps_is_named_by_its_class_not_by_ddps_attribute():
    # DDP holds the model as its attribute `module`: a peak inside the model's own code (not one of
    # its children) read "at module backward", a name the user never wrote.
    from ddpbench.engine.memory import _module_name

    wrapped = {"DistributedDataParallel": "Linear"}
    assert _module_name("DistributedDataParallel.module", wrapped) == "Linear"
    assert _module_name("DistributedDataParallel.module.blocks.0", wrapped) == "blocks.0"
    assert _module_name("DistributedDataParallel", wrapped) == "DistributedDataParallel"
    assert _module_name("Net.blocks.0", {}) == "blocks.0" and _module_name("Net", {}) == "Net"
    assert _module_name(None, wrapped) is None


def test_an_a_a_is_same_ten_times_of_ten():
    first, *again = [_census(batch=16) for _ in range(11)]  # a small batch: the verdict is exact at any size
    assert [compare_memory(first, record).verdict for record in again] == ["same"] * 10
    assert all(json.dumps(record, sort_keys=True) == json.dumps(first, sort_keys=True) for record in again)


def test_ranks_that_disagree_are_said_and_are_a_regression(baseline):
    grown = dict(baseline, peak_bytes=baseline["peak_bytes"] + 4096)
    combined = combine_memory([baseline, grown])
    assert combined["ranks_disagree"] is True
    assert combined["peak_bytes_per_rank"] == [baseline["peak_bytes"], baseline["peak_bytes"] + 4096]
    assert combined["max_peak_bytes"] == baseline["peak_bytes"] + 4096  # the gate judges the largest rank
    agreed = combine_memory([baseline, dict(baseline)])
    assert "ranks_disagree" not in agreed
    verdict = compare_memory(agreed, combined)  # rank by rank: rank 1's peak grew
    assert verdict.verdict == "regression" and verdict.line.startswith("rank 1: peak +4.0 KiB")


def test_measured_cuda_figures_are_shown_and_judged_only_with_a_tolerance(baseline):
    def measured(allocated):
        return dict(baseline, measured={"max_allocated_bytes": allocated, "max_reserved_bytes": 2 * allocated,
                                        "census_over_allocated": 0.9})

    before, after = measured(100 << 20), measured(108 << 20)
    shown = compare_memory(before, after)
    assert shown.verdict == "same" and "measured max allocated +8.0 MiB (1.080x) (shown, not judged)" in shown.line
    assert compare_memory(before, after, tolerance=0.10).verdict == "same"
    judged = compare_memory(before, after, tolerance=0.05)
    assert judged.verdict == "regression" and "past the 5% tolerance" in judged.line


def test_on_cuda_the_allocator_s_figures_sit_beside_the_census(baseline):
    from ddpbench.engine.memory import measured_cuda

    ranks = [measured_cuda(baseline, allocated, 2 * allocated) for allocated in (20 << 20, 25 << 20)]
    assert ranks[0]["measured"]["census_over_allocated"] == round(baseline["peak_bytes"] / (20 << 20), 4)
    combined = combine_memory(ranks)
    assert "ranks_disagree" not in combined  # the measured figures differ by nature, the census does not
    assert combined["measured"]["max_allocated_bytes"] == 25 << 20  # the largest rank's
    assert combined["measured"]["census_over_allocated"] == round(baseline["peak_bytes"] / (25 << 20), 4)


def test_what_cannot_be_compared_is_not_counted_and_a_damaged_record_is_named(baseline):
    assert compare_memory(None, baseline).verdict == "not counted"
    assert compare_memory(baseline, dict(baseline, version=99)).verdict == "not counted"
    assert compare_memory(baseline, dict(baseline, method="FSDPMemTracker")).verdict == "not counted"
    partial = dict(baseline, incomplete="a thread the census does not see")
    incomplete = compare_memory(partial, partial)
    assert incomplete.verdict == "not counted" and "incomplete" in incomplete.line
    one_side = compare_memory(baseline, partial)  # counted in part on one side only: never `same`
    assert one_side.verdict == "regression" and one_side.line.startswith("counted in full on the baseline only")
    with pytest.raises(RecordError, match=r"memory.at_peak.activations is -1, expected a whole number"):
        compare_memory(baseline, dict(baseline, at_peak={"activations": -1}))


# A fresh process: one 1-rank gloo group, the training family's mlp as hand-written all_reduce, DDP and
# DDP with gradient_as_bucket_view, each measured by the engine; prints their memory censuses.
FRESH = textwrap.dedent("""
    import json, os, sys, tempfile
    import torch.distributed as dist
    from ddpbench.engine.timing import RoundPlan, measure_workload
    from ddpbench.pool.base import RankContext
    from ddpbench.workloads.training import Training

    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ctx = RankContext(rank=0, world_size=1, backend="gloo", device_type="cpu")
    plan = RoundPlan(warmup=2, rounds=1, census=False)
    # --dist-census without memory: no record, and torch's trackers are not even imported
    off = measure_workload(ctx, Training("mlp", "manual", batch_size=8), RoundPlan(warmup=1, rounds=1, census=False,
                                                                                 memory_census=False))
    out = {"off": ["memory" in off.metrics, "torch.distributed._tools" in sys.modules]}
    for name, kwargs in (("manual", {"impl": "manual"}), ("ddp", {"impl": "ddp"}),
                         ("ddp_view", {"impl": "ddp", "gradient_as_bucket_view": True})):
        out[name] = measure_workload(ctx, Training("mlp", batch_size=8, **kwargs), plan).metrics["memory"]
    print(json.dumps(out, sort_keys=True))
""")


@pytest.mark.pool
def test_two_fresh_processes_count_the_same_bytes_and_ddp_shows_its_bucket_copy():
    runs = [subprocess.Popen([sys.executable, "-c", FRESH], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=240) for run in runs]
    assert all(run.returncode == 0 for run in runs), outputs
    first, second = (out.strip().splitlines()[-1] for out, _ in outputs)
    assert first == second  # byte for byte
    records = json.loads(first)
    assert records.pop("off") == [False, False]
    from ddpbench.workloads.training import build_model

    params = sum(p.numel() * 4 for p in build_model("mlp").parameters())
    manual, ddp, view = records["manual"], records["ddp"], records["ddp_view"]
    # Seed 004: DDP holds one parameter-sized bucket copy beside the gradients, all step long...
    assert ddp["at_peak"]["ddp_buckets"] == params and ddp["after_step"]["ddp_buckets"] == params
    assert ddp["after_step_bytes"] - manual["after_step_bytes"] == params
    # ...which gradient_as_bucket_view removes (the gradients are views into the buckets).
    assert "ddp_buckets" not in view["at_peak"] and "ddp_buckets" not in view["after_step"]
    assert view["after_step_bytes"] == manual["after_step_bytes"]
    assert compare_memory(ddp, view).verdict == "improvement"
    assert compare_memory(manual, ddp).verdict == "regression"


KEEPER = '''
import os
import time

import torch

from ddpbench.workloads import Workload


class Step(Workload):
    """A 4 ms step that makes a 64 MB tensor; the candidate ($KEEP=1) keeps the last one alive."""

    def setup(self, ctx):
        return {"keep": os.environ.get("KEEP") == "1", "last": None}

    def run_round(self, state):
        out = torch.empty(16 << 20)  # 64 MB (float32), never filled: the step stays cheap
        if state["keep"]:
            state["last"] = out
        time.sleep(0.004)  # a few rounds fill a block (each round's barrier costs more than an empty step)


def test_step(dist_benchmark):
    dist_benchmark(Step())
'''


@pytest.mark.memory_census
def test_an_ab_run_whose_candidate_keeps_64_mb_alive_fails_naming_it(pytester):
    pytester.makepyfile(test_bench=KEEPER)
    result = pytester.runpytest_subprocess(
        "--dist-candidate-env", "KEEP=1", "--dist-ab-pools-per-side=1", "--dist-ab-block-time=0.02",
        "--dist-ab-max-time=8", "--dist-ab-profile=off", "--dist-census=memory", "--benchmark-json=ab.json",
        "-m", "not gpu", "-p", "no:cacheprovider", timeout=300)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_step*regression (memory; timing*",
                                 "    memory: regression: peak +64.0 MiB*kept after the step +64.0 MiB*",
                                 "*1 memory regression(s)*"])
    (case,) = json.loads((pytester.path / "ab.json").read_text())["benchmarks"]
    ab = case["extra_info"]["ab"]
    assert ab["memory_verdict"] == "regression" and ab["stages"] == 1  # decided at its first look
    assert ab["stopped_by_memory"].startswith("peak +64.0 MiB")
    assert case["extra_info"]["memory"]["after_step_bytes"] - ab["memory_baseline"]["after_step_bytes"] == 64 << 20


def test_the_stored_baseline_gate_judges_memory_and_accepts_a_change_made_on_purpose(tmp_path, capsys, baseline):
    from helpers.benchjson import bench, run_doc, write
    from ddpbench import cli

    grown = dict(baseline, peak_bytes=baseline["peak_bytes"] + (8 << 20), at_peak=dict(
        baseline["at_peak"], activations=baseline["at_peak"]["activations"] + (8 << 20)))
    rounds = [0.010, 0.0101, 0.0099, 0.0100, 0.0102, 0.0098] * 3  # the same rounds: the timing reads same
    base = write(tmp_path / "base.json", run_doc([bench("test_step", rounds, {"memory": baseline})]))
    cur = write(tmp_path / "cur.json", run_doc([bench("test_step", rounds, {"memory": grown})]))
    assert cli.main(["compare", str(base), str(cur)]) == 1
    out = capsys.readouterr().out
    assert "peak +8.0 MiB: activations +8.0 MiB, at blocks.3 backward" in out
    assert "regression (memory; timing same)" in out and "--accept-memory-change accepts" in out
    assert cli.main(["compare", str(base), str(cur), "--accept-memory-change"]) == 0
    assert "1 memory change(s) accepted by --accept-memory-change" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:  # a usage error, exit status 2
        cli.main(["compare", str(base), str(cur), "--memory-tolerance", "lots"])
    assert exited.value.code == 2
    assert "--memory-tolerance: 'lots' is not a percentage; write e.g. 5% or 5" in capsys.readouterr().err
