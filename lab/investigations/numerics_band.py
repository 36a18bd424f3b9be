"""The numerics band (issue 63): what rounding-level perturbations of a baseline grow into over the
replayed steps, and the verdict of harmless changes, planted bugs and lossy ones against it, over
the transformer family (cpu-small, 2 and 4 ranks) and karpathy/nanoGPT, each trained as nanoGPT's
train.py trains: 2 micro-batches per step (each loss divided by 2, DDP's sync on the last), the
gradient clipped at norm 1.0, a linear warm-up of the learning rate, AdamW with weight decay on the
2-D parameters only, ``zero_grad`` after the step.

    .venv/bin/python lab/investigations/numerics_band.py --parts table       # the results.md table
    .venv/bin/python lab/investigations/numerics_band.py --parts method      # the perturbations compared
    .venv/bin/python lab/investigations/numerics_band.py --parts table --families transformer-2

nanoGPT's ``model.py`` is read at run time (``--model-py``, or a git mirror of the repository,
``--nanogpt-git-dir``, as ``nanogpt_numerics.py``); without it the nanoGPT rows are skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nanogpt_numerics import model_py  # its neighbour: nanoGPT's model.py read the same way

from ddpbench.workloads import Workload
from ddpbench.workloads.training.transformer import COMM_HOOKS, TransformerTraining, _TransformerLoop

#: The planted bugs (each a mistake a training loop makes) and what each does.
BUGS = {
    "sum-grads": "gradients summed over the ranks, not averaged (a DDP comm hook that all-reduces without dividing)",
    "accum-not-divided": "each micro-batch's loss not divided by the accumulation steps",
    "no-clip": "gradient clipping dropped",
    "lr-off-by-one": "the learning-rate schedule one step ahead",
    "zero-grad-skipped": "zero_grad skipped after the first step (its gradients accumulate into the second)",
    "decay-norms": "weight decay applied to norms and biases too",
    "frozen-param": "one parameter (the first block's attention projection bias) left out of the optimizer",
    "dup-shard": "rank 1 trains on rank 0's data shard",
}
LEARNING_RATE, WARMUP, CLIP, WEIGHT_DECAY = 6e-4, 4, 1.0, 0.1


def get_lr(it: int) -> float:
    """nanoGPT's warm-up (train.py's get_lr, its first branch): linear over ``WARMUP`` steps."""
    return LEARNING_RATE * (it + 1) / (WARMUP + 1) if it < WARMUP else LEARNING_RATE


def _sum_hook(state, bucket):
    import torch.distributed as dist

    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


def _register_sum(ddp, ctx):
    ddp.register_comm_hook(None, _sum_hook)


def optimizer_for(named: list, bug: str, impl: str):
    """nanoGPT's configure_optimizers: AdamW, weight decay on the 2-D parameters only; ``impl``
    ``default`` (torch's choice: the for-loop on CPU), ``foreach`` or ``fused``."""
    import torch

    named = [(n, p) for n, p in named if p.requires_grad]
    if bug == "frozen-param":
        named = [(n, p) for n, p in named if n != FROZEN[0] and not n.endswith(FROZEN[1])]
    decay = [p for _, p in named if p.dim() >= 2]
    other = [p for _, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
              {"params": other, "weight_decay": WEIGHT_DECAY if bug == "decay-norms" else 0.0}]
    extra = {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(impl, {})
    return torch.optim.AdamW(groups, lr=LEARNING_RATE, betas=(0.9, 0.95), **extra)


FROZEN = ("blocks.0.attn.proj.bias", "h.0.attn.c_proj.bias")  # the transformer's name, nanoGPT's


class NanoGPTLikeStep:
    """One step of nanoGPT's train.py on any model: ``forward(x, y)`` gives the loss."""

    def __init__(self, ctx, model, trained, optimizer, batches, bug: str, bf16: bool, forward):
        self.ctx, self.model, self.trained, self.optimizer = ctx, model, trained, optimizer
        self.batches, self.bug, self.bf16, self.forward = batches, bug, bf16, forward
        self.it, self.cursor, self.clip_fired = 0, 0, None

    def step(self) -> float:
        import torch

        lr = get_lr(self.it + (1 if self.bug == "lr-off-by-one" else 0))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        accum, total = 2, 0.0
        for micro in range(accum):
            x, y = self.batches[self.cursor % len(self.batches)]
            self.cursor += 1
            if hasattr(self.trained, "require_backward_grad_sync"):
                self.trained.require_backward_grad_sync = micro == accum - 1
            autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext())
            with autocast:
                loss = self.forward(x, y)
            total += float(loss.detach())
            (loss if self.bug == "accum-not-divided" else loss / accum).backward()
        self.clip_fired = None
        if self.bug != "no-clip":
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
            self.clip_fired = bool(norm > CLIP)
        self.optimizer.step()
        if not (self.bug == "zero-grad-skipped" and self.it == 0):
            self.optimizer.zero_grad(set_to_none=True)
        self.it += 1
        return total / accum


class _Loop(_TransformerLoop):
    """The transformer family's loop, stepped as nanoGPT's train.py steps."""

    def __init__(self, ctx, w, inputs, targets):
        import torch.nn.functional as F

        super().__init__(ctx, w, inputs, targets)
        self.optimizer = optimizer_for(list(self.model.named_parameters()), w.bug, w.optimizer_impl)
        batches = [(self.inputs[i], self.targets[i]) for i in range(self.inputs.shape[0])]

        def forward(x, y):
            return F.cross_entropy(self.forward(x).flatten(0, 1).float(), y.flatten())

        self.train = NanoGPTLikeStep(ctx, self.model, self.wrapped, self.optimizer, batches, w.bug,
                                     w.precision == "bf16", forward)

    def step(self) -> float:
        loss = self.train.step()
        self.losses.append(loss)
        return loss


@dataclass(frozen=True)
class TransformerLikeNanoGPT(TransformerTraining):
    """The transformer family's case (its DDP knobs, precision, checkpointing) trained as nanoGPT's
    train.py trains; ``bug``: one of :data:`BUGS`; ``optimizer_impl``: default, foreach, fused."""

    bug: str = ""
    optimizer_impl: str = "default"
    measure_peak: bool = False
    loop_class: ClassVar[Any] = _Loop
    comm_hooks: ClassVar[dict] = {**COMM_HOOKS, "sum": _register_sum}

    def training_data(self, ctx):
        from ddpbench.workloads.training.gpt import make_tokens

        rank = 0 if self.bug == "dup-shard" else ctx.rank
        return make_tokens(self.config, self.micro_batch, self.data_batches, self.seed, rank)

    def run_round(self, state):
        return state["loop"].step()

    def numerics_scalars(self, state) -> dict:
        return {"clip fired": state["loop"].train.clip_fired}

    def check(self, state) -> None:  # the replay is all this script runs
        pass


def _load_model_module(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NanoGPTTrain(Workload):
    """karpathy/nanoGPT's GPT (a tiny config: 2 layers, 2 heads, n_embd 64, block 32, vocab 256,
    4 sequences per micro-batch and rank), under DDP as train.py wraps it, stepped as train.py
    steps; ``flash``: its scaled_dot_product_attention path (else the explicit softmax under the
    causal-mask buffer); ``comm_hook``: ``fp16`` (DDP's fp16_compress_hook) or ``sum`` (the bug)."""

    def __init__(self, model_py: str, flash: bool = False, bug: str = "", optimizer_impl: str = "default",
                 comm_hook: str = "none", bf16: bool = False):
        self.model_py, self.flash, self.bug, self.optimizer_impl = model_py, flash, bug, optimizer_impl
        self.comm_hook = "sum" if bug == "sum-grads" else comm_hook
        self.bf16 = bf16

    def setup(self, ctx):
        import io

        import torch
        from torch.nn.parallel import DistributedDataParallel

        nanogpt = _load_model_module(self.model_py)
        config = nanogpt.GPTConfig(block_size=32, vocab_size=256, n_layer=2, n_head=2, n_embd=64, dropout=0.0,
                                   bias=True)
        with contextlib.redirect_stdout(io.StringIO()):
            model = nanogpt.GPT(config)
        for module in model.modules():
            if isinstance(module, nanogpt.CausalSelfAttention):
                module.flash = self.flash
                if not hasattr(module, "bias"):
                    module.register_buffer("bias", torch.tril(torch.ones(32, 32)).view(1, 1, 32, 32))
        named = [(n.removeprefix("transformer."), p) for n, p in model.named_parameters()]
        optimizer = optimizer_for(named, self.bug, self.optimizer_impl)
        generator = torch.Generator().manual_seed(1000 + (0 if self.bug == "dup-shard" else ctx.rank))
        tokens = torch.randint(256, (4, 4, 33), generator=generator)
        batches = [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]
        trained = DistributedDataParallel(model)
        if self.comm_hook == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            trained.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.comm_hook == "sum":
            trained.register_comm_hook(None, _sum_hook)
        step = NanoGPTLikeStep(ctx, model, trained, optimizer, batches, self.bug, self.bf16,
                               lambda x, y: trained(x, y)[1])
        return {"model": trained, "optimizer": optimizer, "step": step}

    def run_round(self, state):
        return state["step"].step()

    def numerics_scalars(self, state) -> dict:
        return {"clip fired": state["step"].clip_fired}


# ----------------------------------------------------------------------------------------------
# On the ranks
# ----------------------------------------------------------------------------------------------


def rank_replays(ctx, workload, steps: int, seeds: int, modes: tuple[str, ...]) -> dict:
    """This rank's plain replays (two) and ``seeds`` perturbed replays per mode (``init``: the
    parameters and inputs after the set-up; ``grads``: also each step's gradients), each as the
    figures per step; and the seconds each kind took."""
    from ddpbench.engine.numerics import Perturbation, compute_bits, replay_once

    started = time.perf_counter()
    plain = [replay_once(workload, ctx, steps, watch_dtypes=(i == 0)) for i in range(2)]
    out: dict[str, Any] = {"plain": [p.figures for p in plain], "scalars": [p.scalars for p in plain],
                           "dtypes": plain[0].dtypes, "plain_s": (time.perf_counter() - started) / 2}
    bits = compute_bits(plain[0].dtypes)
    for mode in modes:
        started = time.perf_counter()
        runs = [replay_once(workload, ctx, steps, perturbation=Perturbation(k + 1, bits, gradients=mode == "grads"))
                for k in range(seeds)]
        out[mode] = [r.figures for r in runs]
        out[f"{mode}_s"] = (time.perf_counter() - started) / max(1, seeds)
    return out


def rank_record(ctx, workload, steps: int, band: bool = True):
    from ddpbench.engine.numerics import BAND_REPLAYS, take_numerics

    started = time.perf_counter()
    record = take_numerics(workload, ctx, steps, band_replays=BAND_REPLAYS if band else 0)
    record["seconds"] = time.perf_counter() - started
    return record


# ----------------------------------------------------------------------------------------------
# In the controller
# ----------------------------------------------------------------------------------------------


def group_diffs(before: list, after: list) -> list[dict[str, float]]:
    from ddpbench.engine.numerics import group_differences

    return [{g: d for g, (d, _) in group_differences(b, a).items()} for b, a in zip(before, after)]


def record_of(pool, workload, steps: int = 3, band: bool = True) -> dict:
    """The case's numerics record as the engine takes it (a candidate's without the band, as A/B takes it)."""
    from ddpbench.engine.numerics import combine_numerics

    records = pool.run(rank_record, workload, steps, band, timeout_s=1800)
    seconds = max(r.pop("seconds") for r in records)
    combined = combine_numerics(records)
    combined["seconds"] = seconds
    return combined


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "inf"
    return f"{value:.2g}" if value < 1000 else f"{value:.3g}"


def method_part(pools: dict, families: dict, seeds: int, steps: int) -> None:
    """The perturbations compared: per family, per step and group, one seed's difference against
    the largest of the other seeds' (its distribution says what margin a band of K replays needs)
    and the harmless changes' differences against the init-only and init+grads bands."""
    import numpy

    for label, (pool, base, harmless) in families.items():
        data = [pool.run(rank_replays, base, steps, seeds, ("init", "grads"), timeout_s=3600)[r]
                for r in range(pool.spec.world_size)]
        print(f"\n### {label}: seconds per replay (rank max, under load): plain "
              f"{max(d['plain_s'] for d in data):.2f}, perturbed {max(d['init_s'] for d in data):.2f}; compute "
              f"dtypes {data[0]['dtypes']}")
        plain = data[0]["plain"][0]
        for mode in ("init", "grads"):
            draws = [group_diffs(plain, run) for run in data[0][mode]]  # per seed, per step, per group
            ratios = []
            for s in range(1, steps + 1):
                for g in draws[0][s]:
                    values = [d[s].get(g, 0.0) for d in draws]
                    for k, v in enumerate(values):
                        for pair in ((k + 1) % seeds, (k + 2) % seeds):
                            band = max(values[pair], values[(pair + 1) % seeds]) if seeds > 2 else values[pair]
                            if band > 0 and v > 0:
                                ratios.append(v / band)
            qs = numpy.quantile(ratios, [0.5, 0.9, 0.99, 1.0]) if ratios else [math.nan] * 4
            print(f"- {mode}: one draw / the largest of 2 others, over steps, groups and seeds ({len(ratios)}): "
                  f"median {qs[0]:.2f}, 90% {qs[1]:.2f}, 99% {qs[2]:.2f}, max {qs[3]:.2f}")
        print("\n| change | step | group | difference | init band (max of seeds) | ratio | init+grads band | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        init = [group_diffs(plain, run) for run in data[0]["init"]]
        grads = [group_diffs(plain, run) for run in data[0]["grads"]]
        for name, workload in harmless.items():
            cand = pool.run(rank_replays, workload, steps, 0, (), timeout_s=3600)[0]["plain"][0]
            diffs = group_diffs(plain, cand)
            worst = {}
            for s in range(steps + 1):
                for g, d in diffs[s].items():
                    b1 = max(x[s].get(g, 0.0) for x in init)
                    b2 = max(x[s].get(g, 0.0) for x in grads)
                    r1 = d / b1 if b1 else math.inf
                    if g not in worst or r1 > worst[g][4]:
                        worst[g] = (s, g, d, b1, r1, b2, d / b2 if b2 else math.inf)
            for s, g, d, b1, r1, b2, r2 in sorted(worst.values(), key=lambda w: -w[4])[:4]:
                print(f"| {name} | {s} | {g} | {_fmt(d)} | {_fmt(b1)} | {_fmt(r1)} | {_fmt(b2)} | {_fmt(r2)} |")


def table_part(pools: dict, rows: dict) -> None:
    """Per family and row, the product's verdict (take_numerics on both sides, compare_numerics)."""
    from ddpbench.gates.numerics import compare_numerics

    print("\n| family | row | kind | verdict | largest difference | band | ratio | first resolving step | line |")
    print("|---|---|---|---|---|---|---|---|---|")
    for family, (pool, base, changes) in rows.items():
        baseline = record_of(pool, base)
        print(f"<!-- {family}: baseline record {baseline['seconds']:.1f} s (rank max, under load), "
              f"{len(baseline['names'])} tensors -->", flush=True)
        for kind, name, workload, against in changes:
            reference = baseline if against is None else record_of(pool, against)
            verdict = compare_numerics(reference, record_of(pool, workload, band=False), "candidate")
            word = verdict.line.split(":")[0].split(" from ")[0]
            print(f"| {family} | {name} | {kind} | {word} | {_fmt(verdict.difference)} | {_fmt(verdict.band)} | "
                  f"{_fmt(verdict.ratio)} | {verdict.resolving_step if verdict.resolving_step is not None else '-'} | "
                  f"{verdict.line} |", flush=True)


def transformer_rows(four: bool) -> list:
    t = TransformerLikeNanoGPT(grad_accum=2)
    rows = [("harmless", "gradient_as_bucket_view", dataclasses.replace(t, gradient_as_bucket_view=True), None),
            ("harmless", "activation checkpointing on", dataclasses.replace(t, activation_checkpointing=True), None),
            ("harmless", "foreach -> fused AdamW", dataclasses.replace(t, optimizer_impl="fused"),
             dataclasses.replace(t, optimizer_impl="foreach"))]
    if four:
        rows.insert(0, ("harmless", "bucket_cap_mb 25 -> 1", dataclasses.replace(t, bucket_cap_mb=1.0), None))
    for bug in BUGS:
        changed = dataclasses.replace(t, comm_hook="sum") if bug == "sum-grads" else dataclasses.replace(t, bug=bug)
        rows.append(("bug", bug, changed, None))
    bf16 = dataclasses.replace(t, precision="bf16")
    rows += [("lossy", "fp16_compress_hook", dataclasses.replace(t, comm_hook="fp16"), None),
             ("lossy", "bf16 autocast", bf16, None),
             ("lossy", "fp16_compress_hook, baseline under bf16", dataclasses.replace(bf16, comm_hook="fp16"), bf16)]
    return rows


def nanogpt_rows(path: str) -> list:
    rows = [("harmless", "flash attention off -> on", NanoGPTTrain(path, flash=True), None),
            ("harmless", "foreach -> fused AdamW", NanoGPTTrain(path, optimizer_impl="fused"),
             NanoGPTTrain(path, optimizer_impl="foreach"))]
    rows += [("bug", bug, NanoGPTTrain(path, bug=bug), None) for bug in BUGS]
    rows += [("lossy", "fp16_compress_hook", NanoGPTTrain(path, comm_hook="fp16"), None),
             ("lossy", "bf16 autocast", NanoGPTTrain(path, bf16=True), None),
             ("lossy", "fp16_compress_hook, baseline under bf16", NanoGPTTrain(path, comm_hook="fp16", bf16=True),
              NanoGPTTrain(path, bf16=True))]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="table", help="table, method (comma list)")
    parser.add_argument("--families", default="transformer-2,transformer-4,nanogpt-2")
    parser.add_argument("--seeds", type=int, default=8, help="perturbed replays per mode (method part)")
    parser.add_argument("--rows", default="", help="only the rows whose name holds one of these (comma list)")
    parser.add_argument("--model-py")
    parser.add_argument("--nanogpt-git-dir", default="/work/.mirror/karpathy+nanoGPT/repo")
    args = parser.parse_args()

    from ddpbench.pool import PoolSpec, RankPool

    import numerics_band as me  # the ranks import the workloads by this module's name

    wanted = set(args.families.split(","))
    parts = set(args.parts.split(","))
    pools: dict = {}

    def pool(n: int):
        if n not in pools:
            pools[n] = RankPool(PoolSpec("gloo", n, "cpu"))
        return pools[n]

    with tempfile.TemporaryDirectory() as scratch:
        path = model_py(args, Path(scratch))
        families: dict = {}
        t = me.TransformerLikeNanoGPT(grad_accum=2)
        for n in (2, 4):
            if f"transformer-{n}" in wanted:
                harmless = {"gradient_as_bucket_view": dataclasses.replace(t, gradient_as_bucket_view=True),
                            "activation checkpointing": dataclasses.replace(t, activation_checkpointing=True)}
                if n == 4:
                    harmless["bucket_cap_mb 1"] = dataclasses.replace(t, bucket_cap_mb=1.0)
                families[f"transformer cpu-small, {n} ranks"] = (n, t, harmless, me.transformer_rows(n == 4))
        if "nanogpt-2" in wanted:
            if path is None:
                print(f"nanoGPT rows skipped: no model.py ({args.nanogpt_git_dir} is not a git dir of it)")
            else:
                families["nanoGPT, 2 ranks"] = (2, me.NanoGPTTrain(path),
                                                {"flash on": me.NanoGPTTrain(path, flash=True)}, me.nanogpt_rows(path))
        try:
            if "method" in parts:
                method_part(pools, {k: (pool(n), base, harmless) for k, (n, base, harmless, _) in families.items()},
                            args.seeds, 3)
            if "table" in parts:
                only = [w for w in args.rows.split(",") if w]
                table_part(pools, {k: (pool(n), base, [r for r in rows if not only or any(w in r[1] for w in only)])
                                   for k, (n, base, _, rows) in families.items()})
        finally:
            for p in pools.values():
                p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
