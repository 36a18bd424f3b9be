"""``ddpbench census``: the census of a transformer step simulated as rank 0 of N on torch's fake
process group equals, exactly, the census real gloo ranks take of the same step at 2 and 4 ranks
(the family's own batch there, the simulation's one short sequence here); FSDP2's per-rank state
shrinks as 1/N while DDP's stays whole; the command's table, JSON, chart and its usage errors."""

from __future__ import annotations

import json

import pytest

from ddpbench import cli
from ddpbench.pool import PoolSpec, RankPool
from ddpbench.scale import census_at_scale, memory_needed_bytes
from ddpbench.scale.memory import memory_census, simulate_memory
from ddpbench.scale.output import human_bytes
from ddpbench.scale.step import simulate, step_census
from ddpbench.workloads.training.transformer import TransformerTraining

# The real side trains on the family's data, 2 sequences of the full context per micro-batch.
REAL_BATCH = 2
CASES = {
    "ddp-cap1": dict(bucket_cap_mb=1),  # several buckets, DDP's built-in (C++) all-reduce
    "ddp-fp16-unused-accum2": dict(comm_hook="fp16", find_unused_parameters=True, grad_accum=2),
    "fsdp2": dict(impl="fsdp2"),
    "fsdp2-bf16-noreshard-accum2": dict(impl="fsdp2", precision="bf16", reshard_after_forward=False, grad_accum=2),
}


# The memory census's cases (one short batch: the check is of bookkeeping, not of size), fp32: bf16
# under FakeTensorMode is not byte-exact (docs/design/census-and-memory.md#what-is-checked).
MEMORY_CASES = {
    "ddp-cap1": dict(bucket_cap_mb=1),  # DDP's built-in all-reduce on gloo, torch's Python twin simulated
    "fsdp2": dict(impl="fsdp2"),
    "fsdp2-noreshard-accum2": dict(impl="fsdp2", reshard_after_forward=False, grad_accum=2),
}


def memory_workload(case):
    return TransformerTraining(batch_size=1, data_batches=2, measure_peak=False, **MEMORY_CASES[case])


@pytest.fixture(scope="module", params=[2, 4], ids=["2p", "4p"])
def real_censuses(request):
    """Every case's census, and every memory case's memory census, on each rank of a real gloo pool
    (one pool per world size)."""
    pool = RankPool(PoolSpec("gloo", request.param, "cpu"))
    try:
        results = {}
        for name, knobs in CASES.items():
            per_rank = pool.run(step_census, TransformerTraining(batch_size=REAL_BATCH, measure_peak=False, **knobs),
                                timeout_s=300)
            results[name] = per_rank
        for name in MEMORY_CASES:
            results[f"memory:{name}"] = pool.run(memory_census, memory_workload(name), timeout_s=300)
        results["pool"] = pool
        yield request.param, results
    finally:
        pool.close()


@pytest.mark.parametrize("case", list(MEMORY_CASES))
def test_the_simulated_peak_memory_equals_the_real_gloo_ranks_to_the_byte(real_censuses, case):
    """FSDP2 on fake tensors under FSDPMemTracker, DDP on real tensors under MemTracker, both as rank
    0 of N on the fake process group: the same peak, breakdown, place and after-step bytes as real
    gloo ranks; rank 0 holds the most."""
    world_size, results = real_censuses
    real = results[f"memory:{case}"]
    simulated = simulate_memory(memory_workload(case), world_size)
    for _ in range(2):
        if len({r["peak_bytes"] for r in real}) == 1 and real[0]["peak_bytes"] <= simulated["peak_bytes"]:
            break
        # A real rank's peak can hold a buffer that gloo's own thread releases late (+494,592 B at
        # 2p and 4p FSDP2: the root all-gather output and reduce-scatter input; +595,840 B once, a
        # gradient shard, under make test's load), on one rank or on all of them, moving the peak
        # to the next block; the fake group has no such thread, and FSDP2's collectives are still
        # in flight when the census could settle them. Only a real peak above the simulation's is
        # measured again, at most twice.
        real = results["pool"].run(memory_census, memory_workload(case), timeout_s=300)
    # Rank 0 holds the most: its state after the step (every shard padded to rank 0's rows).
    assert real[0]["after_step_bytes"] == max(r["after_step_bytes"] for r in real)
    assert simulated == real[0]
    assert simulated["peak_bytes"] == sum(simulated["peak_breakdown"].values()) > 0
    if MEMORY_CASES[case].get("impl") == "fsdp2":
        assert simulated["peak_breakdown"]["sharded_parameters"] == _shard_bytes(memory_workload(case), world_size)
    else:
        assert simulated["ddp_bucket_bytes"] == memory_workload(case).config.parameter_count * 4


@pytest.mark.parametrize("case", list(CASES))
def test_the_simulated_census_equals_the_real_gloo_census(real_censuses, case):
    world_size, results = real_censuses
    real = results[case]
    # The ranks agree among themselves (the engine's own condition for keeping rank 0's record).
    assert all(r["census"]["collectives"] == real[0]["census"]["collectives"] for r in real)
    simulated = simulate(TransformerTraining(**CASES[case]), world_size)
    # gloo keeps sequence numbers, the fake group none: only the real census checked for unseen calls
    assert real[0]["census"].pop("sequence_checked") is True and "incomplete" not in real[0]["census"]
    assert simulated["census"].pop("sequence_checked") is False
    assert simulated == real[0]
    census = simulated["census"]
    assert census["collectives"] and {c["group_size"] for c in census["collectives"]} == {world_size}


def test_the_comparison_sees_a_changed_knob_and_a_changed_world_size(real_censuses):
    """Negative controls: the equality above is not one every census passes."""
    world_size, results = real_censuses
    real = results["ddp-cap1"][0]
    default_cap = simulate(TransformerTraining(), world_size)
    assert default_cap["census"]["collectives"] != real["census"]["collectives"]
    assert len(default_cap["census"]["ddp_buckets"]) < len(real["census"]["ddp_buckets"])
    other_size = simulate(TransformerTraining(bucket_cap_mb=1), 2 * world_size)
    assert other_size["census"] != real["census"]


def _shard_bytes(workload, world_size):
    """Rank 0's bytes of FSDP2's dim-0 shards: ceil(rows / N) rows of each parameter, fp32."""
    import torch

    from ddpbench.workloads.training.gpt import build_gpt

    with torch.device("meta"):
        model = build_gpt(workload.config)
    return sum(-(-p.shape[0] // world_size) * (p.numel() // p.shape[0]) * 4 for p in model.parameters())


def test_fsdp2_state_per_rank_shrinks_as_one_over_n_and_ddp_stays_whole():
    fsdp2, ddp = TransformerTraining(impl="fsdp2"), TransformerTraining()
    whole = fsdp2.config.parameter_count * 4
    sizes = [2, 5, 16]
    sharded = census_at_scale(fsdp2, sizes, warmup_steps=1, memory=False).rows
    for row in sharded:
        n = row["world_size"]
        assert row["param_bytes_per_rank"] == _shard_bytes(fsdp2, n)
        assert whole / n <= row["param_bytes_per_rank"] <= 1.05 * whole / n
        assert row["grad_bytes_per_rank"] == row["param_bytes_per_rank"]
        # AdamW: two moments per parameter, and a step count (one fp32 scalar) for each.
        assert row["optimizer_state_bytes_per_rank"] == 2 * row["param_bytes_per_rank"] + 4 * len(
            list(_parameter_names(fsdp2)))
    whole_rows = census_at_scale(ddp, sizes, warmup_steps=1, memory=False).rows
    assert {row["param_bytes_per_rank"] for row in whole_rows} == {whole}
    assert {row["grad_bytes_per_rank"] for row in whole_rows} == {whole}


def _parameter_names(workload):
    import torch

    from ddpbench.workloads.training.gpt import build_gpt

    with torch.device("meta"):
        return [name for name, _ in build_gpt(workload.config).named_parameters()]


def test_the_command_prints_the_table_and_writes_the_chart(tmp_path, capsys):
    chart = tmp_path / "census.png"
    assert cli.main(["census", "--impl", "fsdp2", "--world-sizes", "8,2", "--warmup-steps", "1",
                     "--chart", str(chart)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("cpu-small (1.84 M parameters), fsdp2, fp32, grad_accum 1, reshard_after_forward on")
    header = next(line for line in lines if line.startswith("ranks"))
    assert header.split() == ["ranks", "all_gather", "float32", "reduce_scatter", "float32", "params/rank",
                              "grads/rank", "optimizer/rank"]
    collective_table = lines[:lines.index("", lines.index(header))]
    rows = [line.split() for line in collective_table if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["2", "8"]  # ascending
    assert rows[0][1:3] == ["10", "x"] and rows[0][5:7] == ["5", "x"]  # 5 groups: gathered twice, reduced once
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"census chart: {chart}" in err


def test_json_holds_a_census_record_per_world_size(capsys):
    assert cli.main(["census", "--world-sizes", "1,4", "--bucket-cap-mb", "1", "--json", "--no-chart"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload"]["impl"] == "ddp" and doc["workload"]["bucket_cap_mb"] == 1
    assert [row["world_size"] for row in doc["world_sizes"]] == [1, 4]
    for row in doc["world_sizes"]:
        census = row["census"]
        assert census["version"] == 2 and census["ddp_buckets"] and len(census["ddp_buckets"]) > 1
        (entry,) = census["collectives"]
        assert (entry["kind"], entry["dtype"], entry["group_size"]) == ("all_reduce", "float32", row["world_size"])
        assert entry["call_bytes"] == sorted(census["ddp_buckets"]) and entry["bytes"] == row["param_bytes_per_rank"]


def test_a_step_right_after_the_first_carries_ddps_bucket_rebuild():
    """DDP rebuilds its buckets in gradient order as its second step starts, broadcasting rank 0's
    order: the default warm-up (2 steps) counts the steady step, 1 warm-up step counts the rebuild."""
    kinds = {(c["kind"], c["dtype"]): c["count"]
             for c in simulate(TransformerTraining(bucket_cap_mb=1), 8, warmup_steps=1)["census"]["collectives"]}
    assert kinds[("broadcast", "int32")] == 2 and kinds[("all_reduce", "float32")] > 1


@pytest.mark.parametrize("argv, message", [
    (["--size", "gpt-9b"], "argument --size: invalid choice: 'gpt-9b'"),
    (["--world-sizes", "2,0"], "'0' is not a world size: use whole numbers from 1"),
    (["--world-sizes", "2,eight"], "'eight' is not a world size"),
    (["--world-sizes", "2.5"], "'2.5' is not a world size"),
    (["--grad-accum", "0"], "argument --grad-accum: '0' is not a whole number of 1 or more"),
    (["--bucket-cap-mb", "0"], "a bucket holds more than 0 MB"),
    (["--impl", "fsdp2", "--bucket-cap-mb", "5", "--comm-hook", "fp16"],
     "--bucket-cap-mb, --comm-hook: DDP option(s), not FSDP2's; drop them or use --impl ddp"),
    (["--no-reshard"], "--no-reshard is an FSDP2 option (reshard_after_forward), not DDP's"),
    (["--comm-hook", "bf16"], "argument --comm-hook: invalid choice: 'bf16'"),
    (["--device-memory", "80XB"], "'80XB' is not a memory size: give a number and a unit, e.g. --device-memory 80GiB"),
    (["--batch-size", "0"], "'0' is not a number of sequences of 1 or more"),
    (["--no-memory", "--device-memory", "80GiB"], "--device-memory and --batch-size are the memory census's"),
    (["--chart", "no/such/folder/census.png"], "--chart no/such/folder/census.png: the folder no/such/folder does "
                                               "not exist"),
])
def test_bad_input_is_a_usage_error_naming_it(capsys, argv, message):
    try:
        status = cli.main(["census", *argv])
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert "ddpbench census: error:" in err and message in err
    assert "Traceback" not in err


def test_a_model_too_big_for_this_machine_is_refused_naming_what_it_needs(monkeypatch, capsys):
    import psutil

    class Memory:
        available = 2 * 2**30

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)
    needed = memory_needed_bytes(TransformerTraining(size="gpt2-124m"), 2, memory=False)
    assert needed > Memory.available
    assert cli.main(["census", "--size", "gpt2-124m", "--no-chart", "--no-memory"]) == 2
    err = capsys.readouterr().err
    assert ("ddpbench census: error: simulating gpt2-124m with ddp needs about 3.2 GiB of memory" in err and "this machine has 2.0 GiB available; use a smaller --size or --impl fsdp2" in err)
    # FSDP2 shards: at 1024 ranks, gpt2-124m fits where DDP did not.
    assert memory_needed_bytes(TransformerTraining(size="gpt2-124m", impl="fsdp2"), 1024) < needed


def test_device_memory_says_from_which_world_size_a_rank_fits_and_by_how_much_it_misses(capsys):
    """cpu-small FSDP2, 8 x 64-token micro-batch: 41.4 MiB a rank at 2 ranks, 31.2 MiB at 64
    (the 1/N shards shrink; one block's gathered parameters and the activations stay)."""
    argv = ["census", "--impl", "fsdp2", "--world-sizes", "2,64", "--device-memory", "32MiB", "--warmup-steps", "1",
            "--no-chart"]
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device_memory_bytes"] == 32 * 2**20 and doc["fits_from_world_size"] == 64
    small, large = (row["memory"] for row in doc["world_sizes"])
    for memory in (small, large):
        assert memory["device"]["headroom_bytes"] == 32 * 2**20 - memory["peak_bytes"]
        assert memory["peak_bytes"] == sum(memory["peak_breakdown"].values())
        assert memory["tracker"] == "FSDPMemTracker" and memory["adamw_foreach"] is False
    assert not small["device"]["fits"] and large["device"]["fits"]
    assert small["peak_breakdown"]["sharded_parameters"] == 32 * large["peak_breakdown"]["sharded_parameters"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    miss = human_bytes(-small["device"]["headroom_bytes"])
    assert f"per-rank peak fits 32.0 MiB from 64 ranks up; misses at 2 ranks by {miss}" in out
    assert f"MISSES by {miss}" in out and "sharded params" in out and "all-gather" in out


def test_powersgd_says_the_fake_group_returns_no_real_values():
    """PowerSGD computes its next matrices from all_reduced ones: the simulation says, in the table
    and the JSON, that those values are this rank's own."""
    from ddpbench.scale import ScaleCensus
    from ddpbench.scale.output import format_table, to_json

    plain = ScaleCensus(TransformerTraining(), 2)
    powersgd = ScaleCensus(TransformerTraining(comm_hook="powersgd"), 2)
    assert json.loads(to_json(plain))["caveats"] == [] and "note:" not in format_table(plain)
    (note,) = json.loads(to_json(powersgd))["caveats"]
    assert "fake process group returns no other rank's values" in note
    assert f"note: {note}" in format_table(powersgd)
