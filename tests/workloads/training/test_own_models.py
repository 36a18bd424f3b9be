"""A user's own model as a case (ddpbench.ModelTraining, ddpbench.LightningTraining), on a 2-rank
gloo pool: each kind (a DDP MLP, an FSDP2 stack of transformer blocks, a LightningModule with a
datamodule) issues per step exactly the collectives of one optimizer step (the census), every rank
trains on samples of its own, and the per-step figures come out; a Lightning Trainer made inside a
rank the wrong way is refused as a usage error."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch

import ddpbench
from ddpbench.engine.timing import RoundPlan, combine_rank_metrics, measure_workload
from ddpbench.pool import PoolSpec, RankPool, TaskFailed
from ddpbench.workloads import case_extra_info
from ddpbench.workloads.training import lightning_unavailable_reason
from ddpbench.workloads.training.metrics import parameter_bytes

from helpers import own_models

lightning_missing = lightning_unavailable_reason()
needs_lightning = pytest.mark.skipif(lightning_missing is not None, reason=lightning_missing or "")

SGD = functools.partial(torch.optim.SGD, lr=0.05)
ADAMW = functools.partial(torch.optim.AdamW, lr=1e-3)
# Warm-up 2: DDP rebuilds its buckets as its second step starts (two int32 broadcasts), before the census.
PLAN = RoundPlan(warmup=2, rounds=2, memory_census=False, numerics_steps=0)


@pytest.fixture(scope="module")
def pool():
    p = RankPool(PoolSpec("gloo", 2, "cpu"))
    yield p
    p.close()


def _measure(pool, workload, plan=PLAN):
    """The case's combined rank metrics (census included) and its extra_info at a 10 ms median."""
    metrics = combine_rank_metrics([m.metrics for m in pool.run(measure_workload, workload, plan, timeout_s=300)])
    return metrics, case_extra_info(workload, 2, 0.01, metrics)


def _per_step(census) -> dict[tuple[str, str], tuple[int, int]]:
    """(kind, dtype) -> (calls, bytes) per step, on every rank alike."""
    assert census.get("incomplete") is None and census.get("varies_between_steps") is None, census
    assert not census.get("other_ranks"), "the ranks issued different collectives"
    return {(e["kind"], e["dtype"]): (e["count"], e["bytes"]) for e in census["collectives"]}


def _gradient_bytes(model) -> int:
    return parameter_bytes(model)["param_bytes"]


def _ranks_trained_on_other_samples(pool, workload) -> None:
    first, second = pool.run(own_models.trained_batches_digest, workload, timeout_s=300)
    assert first != second, "both ranks trained their step on the same samples"


# ----------------------------------------------------------------------------------------------
# Built where the test runs: what the ranks cannot rebuild is refused there
# ----------------------------------------------------------------------------------------------


def test_factories_must_be_module_level_and_options_must_fit_the_wrapper():
    with pytest.raises(TypeError, match="a lambda in module"):
        ddpbench.ModelTraining(lambda: torch.nn.Linear(2, 2), own_models.image_batch, SGD)
    with pytest.raises(ValueError, match="wrap='zero'; give one of ddp, fsdp2, none"):
        ddpbench.ModelTraining(own_models.mlp, own_models.image_batch, SGD, wrap="zero")
    with pytest.raises(ValueError, match="ddp_options apply to wrap='ddp', not 'fsdp2'"):
        ddpbench.ModelTraining(own_models.mlp, own_models.image_batch, SGD, wrap="fsdp2", ddp_options={"a": 1})
    with pytest.raises(ValueError, match="autocast='fp16'"):
        ddpbench.ModelTraining(own_models.mlp, own_models.image_batch, SGD, autocast="fp16")
    workload = ddpbench.ModelTraining(own_models.mlp, own_models.image_batch, SGD, ddp_options={"bucket_cap_mb": 1})
    assert pickle.dumps(pickle.loads(pickle.dumps(workload))) == pickle.dumps(workload)  # values, module-level callables
    assert {workload: "a case"}[workload] == "a case"  # hashable, options and all


@needs_lightning
def test_lightning_training_takes_its_data_one_way_and_leaves_the_attachment_to_itself():
    from helpers import own_lightning

    with pytest.raises(ValueError, match="give its data one way"):
        ddpbench.LightningTraining(own_lightning.LitClassifier)
    with pytest.raises(ValueError, match="give its data one way"):
        ddpbench.LightningTraining(own_lightning.LitClassifier, datamodule=own_lightning.ImagesData,
                                   batch=own_models.image_batch)
    with pytest.raises(ValueError, match="trainer_options devices, num_nodes: the workload sets these"):
        ddpbench.LightningTraining(own_lightning.LitClassifier, datamodule=own_lightning.ImagesData,
                                   trainer_options={"devices": 2, "num_nodes": 1})
    workload = ddpbench.LightningTraining(own_lightning.LitClassifier, datamodule=own_lightning.ImagesData,
                                          trainer_options={"precision": "bf16-mixed"})
    assert pickle.dumps(pickle.loads(pickle.dumps(workload))) == pickle.dumps(workload)


# ----------------------------------------------------------------------------------------------
# Each kind on two ranks: the census of one step, each rank's own samples, the figures
# ----------------------------------------------------------------------------------------------


def test_a_ddp_mlp_all_reduces_its_gradients_once_a_step_on_samples_of_each_ranks_own(pool):
    workload = ddpbench.ModelTraining(own_models.mlp, own_models.image_batch, SGD, grad_accum=2)
    metrics, info = _measure(pool, workload)
    # One bucket holds every gradient; the first micro-batch runs under no_sync(); no broadcast.
    assert _per_step(metrics["census"]) == {("all_reduce", "float32"): (1, _gradient_bytes(own_models.mlp()))}
    assert metrics["census"]["ddp_buckets"] == [_gradient_bytes(own_models.mlp())]
    assert metrics["samples_per_step"] == 2 * 2 * 16 and info["samples_per_second"] == 6400.0
    assert metrics["optimizer_steps"] >= 4 and metrics["final_loss"] > 0 and "same_samples_on_every_rank" not in metrics
    assert info["wrap"] == "ddp" and info["grad_accum"] == 2 and info["workload"] == "helpers.own_models.mlp"
    _ranks_trained_on_other_samples(pool, workload)


def test_an_fsdp2_transformer_gathers_and_scatters_each_block_and_reports_tokens_and_mfu(pool):
    workload = ddpbench.ModelTraining(own_models.TinyGPT, own_models.token_batch, ADAMW, wrap="fsdp2",
                                      seq_len=own_models.SEQ_LEN, flops_per_sample=1e6)
    metrics, info = _measure(pool, workload)
    steps = _per_step(metrics["census"])
    # Three units (two blocks, then the root): each gathers its parameters in forward, the blocks
    # again in backward (the root keeps its own after forward), and each reduce-scatters its gradients.
    assert sorted(steps) == [("all_gather", "float32"), ("reduce_scatter", "float32")]
    assert steps[("all_gather", "float32")][0] == 5 and steps[("reduce_scatter", "float32")][0] == 3
    model = own_models.TinyGPT()
    assert steps[("reduce_scatter", "float32")][1] == _gradient_bytes(model)
    assert metrics["sharded_param_bytes"] == _gradient_bytes(model) // 2  # each rank holds half
    assert info["tokens_per_second"] == 2 * 4 * own_models.SEQ_LEN / 0.01
    assert info["model_flops_per_step"] == 1e6 * 8 and 0 < info["mfu"] < 1
    _ranks_trained_on_other_samples(pool, workload)


def test_the_local_rank_is_the_rank_in_a_local_pool(pool):
    assert pool.run(own_models.context_ranks, timeout_s=60) == [(0, 0), (1, 1)]


@needs_lightning
def test_a_lightning_module_steps_once_a_round_without_fits_broadcasts_or_barriers(pool):
    from helpers import own_lightning

    workload = ddpbench.LightningTraining(own_lightning.LitClassifier, datamodule=own_lightning.ImagesData,
                                          grad_accum=2)
    metrics, info = _measure(pool, workload)
    # One all-reduce of every gradient per optimizer step, as under plain DDP; beside it only
    # Lightning's own per-batch broadcast of its SIGTERM flag (one int64), no parameter broadcast
    # or barrier: the fit is set up once, not once a round.
    assert _per_step(metrics["census"]) == {("all_reduce", "float32"): (1, _gradient_bytes(own_models.mlp())),
                                            ("broadcast", "int64"): (2, 16)}
    assert metrics["samples_per_step"] == 2 * 2 * 16 and info["samples_per_second"] == 6400.0
    assert info["wrap"] == "lightning-ddp" and info["data"] == "datamodule"
    # The datamodule's DistributedSampler deals each rank its own shard.
    _ranks_trained_on_other_samples(pool, workload)


# ----------------------------------------------------------------------------------------------
# A Lightning Trainer made inside a rank the wrong way
# ----------------------------------------------------------------------------------------------


@needs_lightning
@pytest.mark.parametrize("devices, why", [
    (2, "devices=2: Lightning would start 1 more process(es) inside this one"),
    (1, "it would train as rank 0 of 1 in rank 1 of the pool's 2"),
])
def test_a_trainer_that_would_launch_processes_or_play_rank_0_everywhere_is_refused(pool, devices, why):
    from helpers import own_lightning

    with pytest.raises(TaskFailed) as failed:
        pool.run(own_lightning.make_trainer_in_a_rank, devices, timeout_s=120)
    refusal = failed.value.refusal()
    assert refusal is not None and why in str(failed.value)
    assert refusal.startswith("ddpbench: a Lightning Trainer made inside a rank:")
    assert "Use ddpbench.LightningTraining(module=YourModule, datamodule=YourData)" in refusal


TRAINER_IN_SETUP = '''
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

import ddpbench


class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def setup(ctx):
    trainer = pl.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_steps=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    return {"trainer": trainer, "module": Lit(), "data": torch.utils.data.DataLoader(data, batch_size=8)}


def fit_one_more_step(state):
    state["trainer"].fit_loop.max_steps += 1
    state["trainer"].fit(state["module"], state["data"])


def test_lightning_step(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, fit_one_more_step))
'''


@needs_lightning
def test_the_obvious_trainer_in_a_function_workload_stops_the_run_as_a_usage_error(pytester):
    """The issue's trap: Trainer(strategy="ddp", devices=2) in set-up, one fit a round. Lightning's
    launcher would re-run pytest inside each rank while every rank trained as rank 0; the run stops
    with exit 2 instead, before any fit, naming the workload to use."""
    pytester.makepyfile(test_trap=TRAINER_IN_SETUP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not gpu", "--dist-warmup=1",
                                           "--dist-rounds=2", timeout=300)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stdout.fnmatch_lines(["*ddpbench: a Lightning Trainer made inside a rank: devices=2: Lightning would "
                                 "start 1 more process(es) inside this one*Use ddpbench.LightningTraining(module="
                                 "YourModule, datamodule=YourData)*"])
    assert "passed" not in result.stdout.str()


def test_a_compiled_step_is_the_same_step_through_dynamo(pool):
    """``compile`` takes torch.compile's arguments (here dynamo's eager backend, which compiles
    nothing and so costs no inductor build): the step runs through dynamo, its census is the eager
    step's, and the first step's loss is the uncompiled one's."""
    eager = ddpbench.ModelTraining(own_models.mlp, own_models.image_batch, SGD)
    compiled = ddpbench.ModelTraining(own_models.mlp, own_models.image_batch, SGD, compile={"backend": "eager"})
    assert compiled.skip_reason(PoolSpec("gloo", 2, "cpu")) is None  # only inductor may be missing
    eager_ranks, compiled_ranks = (pool.run(own_models.first_step_loss, w, timeout_s=300) for w in (eager, compiled))
    assert [loss for loss, _ in eager_ranks] == [loss for loss, _ in compiled_ranks]
    assert [dynamo_ran for _, dynamo_ran in compiled_ranks] == [True, True]
    metrics, info = _measure(pool, compiled)
    assert _per_step(metrics["census"]) == {("all_reduce", "float32"): (1, _gradient_bytes(own_models.mlp()))}
    assert info["compile"] == {"backend": "eager"}
    with pytest.raises(ValueError, match="compile='yes'"):
        ddpbench.ModelTraining(own_models.mlp, own_models.image_batch, SGD, compile="yes")
