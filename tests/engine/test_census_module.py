"""The census module alone (ddpbench.engine.census), in this process on torch's fake process group:
every kind's count and payload bytes, a planted extra all_reduce, the order of the calls, ops per
round, DDP's C++ reducer at world size 8, ranks that disagree. Through the engine on real gloo
ranks: tests/engine/test_census.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddpbench.engine.census import (CENSUS_VERSION, KINDS, CollectiveCensus, combine_census, ddp_bucket_sizes,
                                    dynamo_snapshot, take_census)

MB = 1 << 20


@pytest.fixture
def fake_group(request):
    """A fake process group of ``request.param`` ranks (8 unless parametrized), this process rank 0."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world_size = getattr(request, "param", 8)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield world_size
    finally:
        dist.destroy_process_group()


def by_kind(record):
    return {(c["kind"], c["dtype"], c["group_size"]): c for c in record["collectives"]}


def test_each_kind_counts_its_calls_and_payload(fake_group):
    n = fake_group
    t = torch.ones(MB // 4)  # 1 MB of float32

    def round_():
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(n * t.numel()), t)  # output: n MB
        dist.all_gather([torch.empty(10) for _ in range(n)], torch.empty(10))  # output: n x 40 bytes
        dist.reduce_scatter_tensor(torch.empty(100), torch.empty(100 * n))  # input: n x 400 bytes
        dist.broadcast(t, 0)
        dist.all_to_all_single(torch.empty(8 * n), torch.empty(8 * n))
        dist.reduce(torch.ones(3, dtype=torch.float64), 0)
        dist.barrier()

    record = take_census(round_)
    assert record["version"] == CENSUS_VERSION and record["rounds_counted"] == 1 and record["ops_per_round"] == 1
    kinds = by_kind(record)
    assert kinds[("all_reduce", "float32", n)] == {"kind": "all_reduce", "dtype": "float32", "group_size": n,
                                                   "group": "world", "peer": None, "count": 1, "bytes": MB,
                                                   "call_bytes": [MB], "data_dependent_bytes": None}
    assert kinds[("all_gather", "float32", n)]["call_bytes"] == [n * 40, n * MB]
    assert kinds[("reduce_scatter", "float32", n)]["call_bytes"] == [400 * n]
    assert kinds[("broadcast", "float32", n)]["call_bytes"] == [MB]
    assert kinds[("all_to_all", "float32", n)]["call_bytes"] == [32 * n]
    assert kinds[("reduce", "float64", n)]["call_bytes"] == [24]
    assert kinds[("barrier", "none", n)]["call_bytes"] == [0]
    assert [(c["kind"], c["dtype"], c["group_size"]) for c in record["collectives"]] == sorted(kinds)
    for entry in record["collectives"]:
        assert entry["kind"] in KINDS and entry["bytes"] == sum(entry["call_bytes"]) and entry["count"] == len(
            entry["call_bytes"]) and entry["call_bytes"] == sorted(entry["call_bytes"])
    assert record["ddp_buckets"] is None and record["cuda_kernel_launches"] is None


def test_functional_collectives_are_counted_once(fake_group):
    """What compiled graphs and DTensor issue (_c10d_functional) is counted as its kind, and the c10d
    op it runs underneath is not counted a second time."""
    import torch.distributed._functional_collectives as fc

    t = torch.ones(256)

    def round_():
        fc.all_reduce(t, "sum", dist.group.WORLD).wait()
        fc.all_gather_tensor(t, 0, dist.group.WORLD).wait()

    kinds = by_kind(take_census(round_))
    assert kinds[("all_reduce", "float32", fake_group)]["call_bytes"] == [1024]
    assert kinds[("all_gather", "float32", fake_group)]["call_bytes"] == [1024 * fake_group]
    assert len(kinds) == 2


def test_a_planted_all_reduce_moves_the_count_by_one_and_the_bytes_by_its_size(fake_group):
    grads = [torch.ones(1000), torch.ones(5000)]
    extra = torch.ones(777, dtype=torch.float32)

    def step():
        for g in grads:
            dist.all_reduce(g)

    def step_with_extra():
        step()
        dist.all_reduce(extra)

    plain, planted = by_kind(take_census(step)), by_kind(take_census(step_with_extra))
    key = ("all_reduce", "float32", fake_group)
    assert planted[key]["count"] == plain[key]["count"] + 1
    assert planted[key]["bytes"] == plain[key]["bytes"] + extra.nbytes
    # negative control: the same step twice gives the same record
    assert take_census(step) == take_census(step)


def test_the_order_of_the_calls_does_not_change_the_record(fake_group):
    a, b = torch.ones(10), torch.ones(1000, dtype=torch.float16)

    def one_order():
        dist.all_reduce(a)
        dist.broadcast(b, 0)
        dist.all_reduce(b)

    def other_order():
        dist.all_reduce(b)
        dist.broadcast(b, 0)
        dist.all_reduce(a)

    assert take_census(one_order) == take_census(other_order)


def test_figures_are_per_op(fake_group):
    t = torch.ones(100)

    def four_ops():
        for _ in range(4):
            dist.all_reduce(t)
            dist.all_reduce(torch.ones(10))

    record = take_census(four_ops, ops_per_round=4)
    assert record["ops_per_round"] == 4
    assert by_kind(record)[("all_reduce", "float32", fake_group)]["call_bytes"] == [40, 400]
    assert "varies_between_steps" not in record


def test_subgroups_are_counted_at_their_own_size(fake_group):
    half = dist.new_group(list(range(fake_group // 2)))
    t = torch.ones(4)
    kinds = by_kind(take_census(lambda: (dist.all_reduce(t), dist.all_reduce(t, group=half))))
    assert kinds[("all_reduce", "float32", fake_group)]["count"] == 1
    assert kinds[("all_reduce", "float32", fake_group // 2)]["count"] == 1


def _bucket_buffer_hook(state, bucket):
    """DDP's all_reduce of a bucket, its future resolving to the bucket's buffer (the fake process
    group's own futures resolve to None, which DDP's default path cannot use)."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda _: bucket.buffer())


@pytest.mark.parametrize("fake_group", [8, 1024], indirect=True)
def test_ddp_reducer_collectives_at_simulated_world_sizes(fake_group):
    """DDP's C++ reducer issues its bucket all_reduces from the autograd engine: the census sees
    each bucket once, and their bytes are DDP's own bucket sizes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    ddp.register_comm_hook(None, _bucket_buffer_hook)
    x = torch.randn(4, 512)
    for _ in range(2):  # DDP rebuilds its buckets after the first step (and broadcasts them once)
        ddp(x).sum().backward()
    buckets = ddp_bucket_sizes(ddp)
    record = take_census(lambda: ddp(x).sum().backward(), ddp_buckets=buckets)
    all_reduce = by_kind(record)[("all_reduce", "float32", fake_group)]
    assert len(buckets) > 1
    assert all_reduce["call_bytes"] == sorted(buckets)
    assert all_reduce["bytes"] == sum(p.numel() * 4 for p in model.parameters())
    assert record["ddp_buckets"] == buckets
    assert [c["kind"] for c in record["collectives"]] == ["all_reduce"]


def test_collectives_on_an_autograd_thread_are_counted(fake_group):
    """A collective issued from a backward hook (the autograd engine's thread where it runs one)."""
    t = torch.ones(16, requires_grad=True)

    def hook(grad):
        dist.all_reduce(grad)
        return grad

    t.register_hook(hook)
    kinds = by_kind(take_census(lambda: (t * 2).sum().backward()))
    assert kinds[("all_reduce", "float32", fake_group)]["call_bytes"] == [64]


def test_nothing_issued_gives_an_empty_census(fake_group):
    record = take_census(lambda: torch.ones(3) + 1)
    assert record["collectives"] == []
    with CollectiveCensus() as census:
        pass
    assert census.calls == []


def test_compile_figures_are_null_without_torch_compile(fake_group):
    record = take_census(lambda: dist.all_reduce(torch.ones(2)))
    if dynamo_snapshot() is None or dynamo_snapshot()["frames"] == 0:
        assert record["graph_breaks"] is None and record["recompiles"] is None


def test_a_compiled_step_runs_compiled_under_the_census_and_its_figures_are_dynamo_s(fake_group):
    """The census leaves compiled code running (an eager fallback would census another program):
    the compiled graphs run in the counted step, nothing recompiles, the graph break the function
    has is counted, and the collective after it is seen."""
    graph_runs = []

    def counting_backend(gm, example_inputs):
        def run(*args):
            graph_runs.append(1)
            return gm(*args)
        return run

    def step(x):
        y = torch.relu(x) * 2
        print("", end="")  # a graph break
        dist.all_reduce(y)
        return y + 1

    compiled = torch.compile(step, backend=counting_backend)
    x = torch.ones(8)
    start = dynamo_snapshot() or {"frames": 0, "graph_breaks": 0}
    for _ in range(2):
        compiled(x)
    runs_before = len(graph_runs)
    record = take_census(lambda: compiled(x), dynamo_at_start=start)
    assert len(graph_runs) > runs_before
    assert record["recompiles"] == 0
    assert record["graph_breaks"] >= 1
    assert by_kind(record)[("all_reduce", "float32", fake_group)]["count"] == 1


def test_combine_census_keeps_every_rank_s_record_as_rank_zero_s_and_the_differences():
    a = {"version": 1, "ops_per_round": 1, "ddp_buckets": None,
         "collectives": [{"kind": "all_reduce", "dtype": "float32", "group_size": 2, "count": 1, "bytes": 4,
                          "call_bytes": [4]}]}
    b = dict(a, collectives=[])
    assert combine_census([a, dict(a)]) == dict(a, ranks_counted=2)
    assert combine_census([a, b]) == dict(a, ranks_counted=2, ranks_disagree=True,
                                          other_ranks=[{"ranks": "1", "fields": {"collectives": []}}])
    assert combine_census([a, None]) == dict(a, ranks_counted=2, ranks_disagree=True,
                                             other_ranks=[{"ranks": "1", "fields": None}])
    assert combine_census([None, None]) is None


def test_an_uncompiled_census_leaves_torch_dynamo_unimported_and_a_compiled_one_skips_dynamo():
    # torch wraps a dispatch mode's __torch_dispatch__ in torch._dynamo.disable, which imports
    # torch._dynamo (about 1.4 s of CPU per rank process); the census needs that only once dynamo is
    # in use. A fresh interpreter, since this one may have imported it already.
    import subprocess
    import sys

    script = """
import sys, torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from ddpbench.engine.census import take_census
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
t = torch.ones(4)
plain = take_census(lambda: dist.all_reduce(t))
print("dynamo after the plain census:", "torch._dynamo" in sys.modules)
def step(x):
    dist.all_reduce(x)  # returns None eagerly; a Tensor under torch 2.11's compile
    return x * 2
fn = torch.compile(step, backend="eager")
fn(t)
from ddpbench.engine.census import CollectiveCensus
with CollectiveCensus() as census:
    fn(t)
    print("skips dynamo once imported:", type(census._mode)._should_skip_dynamo())
print("counts:", plain["collectives"][0]["count"], len(census.calls))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "dynamo after the plain census: False" in run.stdout
    assert "skips dynamo once imported: True" in run.stdout
    assert "counts: 1 1" in run.stdout


# ---- groups, peers, data-dependent bytes, unseen ops, steps that vary ---------------------------

def by_key(record):
    return {(c["kind"], c["dtype"], c["group_size"], c["group"], c["peer"]): c for c in record["collectives"]}


@pytest.mark.parametrize("fake_group", [4], indirect=True)
def test_equal_size_mesh_dimensions_and_peers_are_told_apart(fake_group):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    t = torch.ones(4)
    group = dist.group.WORLD.group_name
    batched = hasattr(torch.ops._c10d_functional, "batch_p2p_ops")  # from torch 2.13

    def step():
        dist.all_reduce(t, group=mesh.get_group("dp"))
        dist.all_reduce(torch.ones(64), group=mesh.get_group("tp"))
        dist.send(t, 1)  # to the next rank
        dist.recv(torch.ones(2), 3)  # from the previous one
        if batched:
            torch.ops._c10d_functional.batch_p2p_ops(["isend", "irecv"], [2, 1], [0, 0], [torch.ones(8), t], group)

    keys = by_key(take_census(step))
    assert keys[("all_reduce", "float32", 2, "mesh_dp", None)]["call_bytes"] == [16]
    assert keys[("all_reduce", "float32", 2, "mesh_tp", None)]["call_bytes"] == [256]
    assert keys[("send", "float32", 4, "world", 1)]["call_bytes"] == [16]
    assert keys[("recv", "float32", 4, "world", -1)]["call_bytes"] == [8]
    if batched:  # batch_p2p_ops, counted
        assert keys[("send", "float32", 4, "world", 2)]["call_bytes"] == [32]
        assert keys[("recv", "float32", 4, "world", 1)]["call_bytes"] == [16]


def test_object_collectives_and_caller_given_splits_are_counted_with_bytes_marked_as_data(fake_group):
    n = fake_group

    def step():
        dist.all_gather_object([None] * n, "a longer string")
        dist.all_to_all_single(torch.ones(2 * n), torch.ones(2 * n), [2] * n, [n + 1] + [1] * (n - 1))
        dist.all_reduce(torch.ones(4))

    record = take_census(step)
    marks = {(c["kind"], c["dtype"]): c["data_dependent_bytes"] for c in record["collectives"]}
    assert marks == {("all_gather", "int64"): "object", ("all_gather", "uint8"): "object",
                     ("all_to_all", "float32"): "splits", ("all_reduce", "float32"): None}
    assert record["version"] == CENSUS_VERSION == 2


def test_an_op_the_census_does_not_count_marks_it_incomplete(fake_group):
    import torch.distributed._symmetric_memory  # noqa: F401  (registers the symm_mem ops)

    record = take_census(lambda: torch.ops.symm_mem.one_shot_all_reduce(
        torch.ones(4, device="meta"), "sum", dist.group.WORLD.group_name))
    assert record["incomplete"] == "symm_mem::one_shot_all_reduce (symmetric-memory ops are not counted)"
    assert "incomplete" not in take_census(lambda: dist.all_reduce(torch.ones(2)))


def test_a_step_that_varies_is_marked_so_whatever_its_phase_and_ops_per_round(fake_group):
    t, steps = torch.ones(4), [0]

    def every_other_step():
        steps[0] += 1
        if steps[0] % 2:
            dist.all_reduce(t)

    for ops in (2, 3):
        record = take_census(every_other_step, ops_per_round=ops, ops_counted=ops)
        assert record["varies_between_steps"].startswith(f"op 1 of {ops}: ")
    # one round of 2 ops issuing 1 call (the ops not kept apart): told as well, not a ValueError
    record = take_census(lambda: dist.all_reduce(t), ops_per_round=2)
    assert "not the same in every op" in record["varies_between_steps"]
    assert record["collectives"][0]["count"] == 0.5 and record["collectives"][0]["call_bytes"] is None
    steady = take_census(lambda: dist.all_reduce(t), ops_per_round=1, ops_counted=2)
    assert "varies_between_steps" not in steady and steady["collectives"][0]["count"] == 1


def test_a_rank_whose_census_is_incomplete_keeps_its_own_reason():
    plain = {"version": 2, "collectives": [], "ddp_buckets": None, "ops_per_round": 1}
    combined = combine_census([plain, dict(plain, incomplete="process group world's sequence number moved 2")])
    assert "incomplete" not in combined  # rank 0's own record...
    assert combined["other_ranks"] == [{"ranks": "1", "fields": {  # ... and rank 1's, with its reason
        "incomplete": "process group world's sequence number moved 2"}}]
    assert "other_ranks" not in combine_census([plain, plain])


def test_a_step_that_varies_keeps_each_step_s_profile(fake_group):
    t, steps = torch.ones(256), [0]

    def sync_every_other_step():  # gradient accumulation over 2 steps: the second all_reduces
        steps[0] += 1
        if steps[0] % 2 == 0:
            dist.all_reduce(t)

    record = take_census(sync_every_other_step, ops_counted=2)
    assert record["varies_between_steps"] == "op 1 of 2: none; op 2 of 2: 1 all_reduce"
    assert record["steps"] == [[], [{"kind": "all_reduce", "dtype": "float32", "group_size": fake_group,
                                     "group": "world", "peer": None, "count": 1, "bytes": 1024,
                                     "call_bytes": [1024], "data_dependent_bytes": None}]]
    assert "steps" not in take_census(lambda: dist.all_reduce(t), ops_counted=2)


def test_an_all_to_all_whose_splits_do_not_follow_the_data_is_judged_on_bytes(fake_group):
    n, rounds = fake_group, [0]

    def marks(step, ops_counted=2):
        record = take_census(step, ops_counted=ops_counted)
        return {c["kind"]: c["data_dependent_bytes"] for c in record["collectives"]}

    def even():  # split sizes given, all equal: the bytes are the tensor's
        dist.all_to_all_single(torch.ones(2 * n), torch.ones(2 * n), [2] * n, [2] * n)
        dist.all_to_all([torch.ones(2) for _ in range(n)], [torch.ones(2) for _ in range(n)])

    def fixed():  # uneven, but the same in every step: a fixed partition, not a router's
        dist.all_to_all_single(torch.ones(2 * n), torch.ones(2 * n), [2] * n, [n + 1] + [1] * (n - 1))

    def routed():  # uneven, and other splits each step: set by the data
        rounds[0] += 1
        first = 1 + rounds[0] % 2
        dist.all_to_all_single(torch.ones(2 * n), torch.ones(2 * n), [2] * n, [first, 2 * n - first]
                               + [0] * (n - 2))

    assert marks(even) == {"all_to_all": None}
    assert marks(fixed) == {"all_to_all": None}
    assert marks(fixed, ops_counted=None) == {"all_to_all": "splits"}  # one op counted cannot tell
    assert marks(routed) == {"all_to_all": "splits"}


def test_a_thread_started_during_the_census_counts_and_stops_counting_when_it_ends(fake_group):
    import threading

    original_start = threading.Thread.start
    go_on, finished = threading.Event(), threading.Event()

    def worker():  # one all_reduce inside the census, one after it (in a thread that outlived it)
        dist.all_reduce(torch.ones(4))
        go_on.wait(timeout=30)
        dist.all_reduce(torch.ones(8))
        finished.set()

    with CollectiveCensus() as census:
        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        for _ in range(3000):  # until its first all_reduce is counted (30 s at most)
            if census.calls:
                break
            thread.join(timeout=0.01)
    assert threading.Thread.start is original_start  # the census put it back
    go_on.set()
    assert finished.wait(timeout=30)
    thread.join()
    assert [call.nbytes for call in census.calls] == [16]


def test_a_call_the_census_cannot_read_leaves_the_step_running_and_the_census_incomplete(fake_group, monkeypatch):
    from ddpbench.engine import census as census_module

    def unreadable(pg):
        raise RuntimeError("a group torch has not seen")

    monkeypatch.setattr(census_module, "group_identity", unreadable)
    t = torch.ones(4)
    record = take_census(lambda: dist.all_reduce(t))
    assert record["collectives"] == []
    assert "c10d.allreduce_.default could not be counted (RuntimeError: a group torch has not seen)" \
        in record["incomplete"]
