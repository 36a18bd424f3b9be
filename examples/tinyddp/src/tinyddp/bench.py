"""ddpbench workloads for tinyddp's training step, in the two forms ddpbench accepts.

They live in an importable module of the project, not inside a test function: the ranks are
separate processes that receive a workload pickled and import its functions and classes by name.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ddpbench
from tinyddp.model import TinyNet, make_batch, train_step

FEATURES, CLASSES = 64, 10


# 1. Two module-level functions, for ddpbench.FunctionWorkload.


def setup_ddp_step(ctx, batch_size=32):
    """Once per rank and case, not timed: the DDP model, its optimizer and this rank's batch."""
    model = DistributedDataParallel(TinyNet(FEATURES).to(ctx.device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = make_batch(batch_size, FEATURES, CLASSES, seed=ctx.rank, device=ctx.device)
    return model, optimizer, inputs, targets


def run_ddp_step(state):
    """One timed round on every rank."""
    train_step(*state)


# 2. A Workload subclass: parameters, a correctness check and numbers of its own.


class DDPStep(ddpbench.Workload):
    group = "tinyddp-width"  # the widths print side by side

    def __init__(self, hidden: int, batch_size: int = 32):
        self.hidden, self.batch_size = hidden, batch_size  # only picklable parameters here

    def setup(self, ctx):
        model = DistributedDataParallel(TinyNet(FEATURES, self.hidden).to(ctx.device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        inputs, targets = make_batch(self.batch_size, FEATURES, CLASSES, seed=ctx.rank, device=ctx.device)
        return {"ctx": ctx, "model": model, "optimizer": optimizer, "batch": (inputs, targets)}

    def run_round(self, state):
        state["loss"] = train_step(state["model"], state["optimizer"], *state["batch"])

    def rank_metrics(self, state):
        return {"final_loss": float(state["loss"])}  # numbers: the max over ranks

    def check(self, state):
        """After the rounds every rank must hold the same weights (DDP averaged the gradients)."""
        weights = torch.cat([p.detach().flatten() for p in state["model"].parameters()])
        gathered = [torch.empty_like(weights) for _ in range(state["ctx"].world_size)]
        dist.all_gather(gathered, weights)
        assert all(torch.equal(gathered[0], other) for other in gathered), "ranks' weights differ"

    def extra_info(self, world_size, median_s):
        return {"hidden": self.hidden, "samples_per_second": world_size * self.batch_size / median_s}
