"""What the workloads for a user's own model share (:class:`~.model_training.ModelTraining`,
:class:`~.lightning_training.LightningTraining`): their factories checked where they are made, each
rank's micro-batches drawn under a seed of its own, and the per-step figures (samples, tokens,
loss, MFU) from what the ranks measured."""

from __future__ import annotations

import hashlib
from typing import Any, Callable

#: Seeds of a rank's micro-batch: ``seed * SEED_STRIDE**2 + rank * SEED_STRIDE + index``.
SEED_STRIDE = 1_000_003


def check_factory(owner: str, role: str, fn: Any, optional: bool = False) -> None:
    """``fn`` is a callable the ranks can import (module level, or a ``functools.partial`` of one),
    else TypeError naming it and the fix; None passes when ``optional``."""
    from ...pool.picklecheck import unpicklable_message

    if fn is None and optional:
        return
    if not callable(fn):
        raise TypeError(f"ddpbench.{owner}: {role} must be a callable (a module-level function or class, or a "
                        f"functools.partial of one), got {fn!r}")
    problem = unpicklable_message(fn, f"{owner}'s {role}")
    if problem:
        raise TypeError(problem)


def check_positive(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ddpbench.{owner}: {name} must be a positive integer, got {value!r}")


def check_step_figures(owner: str, seq_len: Any, flops_per_sample: Any) -> None:
    if seq_len is not None:
        check_positive(owner, "seq_len", seq_len)
    if flops_per_sample is not None and (isinstance(flops_per_sample, bool)
                                         or not isinstance(flops_per_sample, (int, float)) or not flops_per_sample > 0):
        raise ValueError(f"ddpbench.{owner}: flops_per_sample must be a number above 0 (the model FLOPs of "
                         f"forward and backward of one sample), got {flops_per_sample!r}")


def callable_name(fn: Any) -> str:
    """``module.qualname`` of a function or class (of a partial's function)."""
    target = getattr(fn, "func", fn)
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(fn)


def json_value(value: Any) -> Any:
    """``value`` as saved JSON holds it: numbers, text, booleans, None and lists / dicts of them as
    they are, anything else by ``repr``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    return repr(value)


def to_device(batch: Any, device) -> Any:
    """``batch`` with every tensor in it (tuples, lists, dicts) moved to ``device``."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def tensors_of(batch: Any) -> list:
    """The tensors in ``batch`` (tuples, lists, dicts), in order."""
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, (list, tuple)):
        return [t for b in batch for t in tensors_of(b)]
    if isinstance(batch, dict):
        return [t for b in batch.values() for t in tensors_of(b)]
    return []


def batch_samples(batch: Any) -> int:
    """Samples in a micro-batch: the first dimension of its first tensor (0 without one)."""
    tensors = tensors_of(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 0


def seeded_batches(make_batch: Callable, ctx, count: int, seed: int) -> list:
    """This rank's ``count`` micro-batches, ``make_batch(ctx, i)`` on ``ctx.device``, each drawn
    under torch's generator seeded by (seed, rank, i), so that a factory of random tensors gives
    every rank samples of its own and every run the same ones; torch's generator is left as it was."""
    import torch

    batches = []
    for i in range(count):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * SEED_STRIDE * SEED_STRIDE + ctx.rank * SEED_STRIDE + i)
            batches.append(to_device(make_batch(ctx, i), ctx.device))
    return batches


def batches_digest(batches: list) -> str:
    """A digest of the tensors' bytes of ``batches`` (which samples a step trained on)."""
    digest = hashlib.sha256()
    for tensor in (t for batch in batches for t in tensors_of(batch)):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        if flat.numel():
            digest.update(flat.view(__import__("torch").uint8).numpy().tobytes())
    return digest.hexdigest()


def step_metrics(ctx, last_loss, steps: int, step_batches: list, replicated: bool = True) -> dict[str, Any]:
    """This rank's part of a case's figures, after its rounds: the last step's loss averaged over the
    ranks (``final_loss``), its optimizer steps, ``samples_per_step`` over every rank, and
    ``same_samples_on_every_rank: true`` when every rank trained its last step on the same
    samples (a sampler that did not shard the data). ``replicated``: whether the ranks hold one
    world (False: a wrapper of the user's own that trains each rank alone still sums samples)."""
    import torch
    import torch.distributed as dist

    loss = float("nan") if last_loss is None else float(last_loss)
    figures = torch.tensor([loss, float(sum(batch_samples(b) for b in step_batches))], dtype=torch.float64,
                           device=ctx.device)
    metrics: dict[str, Any] = {"optimizer_steps": steps}
    if dist.is_initialized() and ctx.world_size > 1:
        dist.all_reduce(figures)
        digests: list = [None] * ctx.world_size
        dist.all_gather_object(digests, batches_digest(step_batches))
        if len(set(digests)) == 1 and step_batches:
            metrics["same_samples_on_every_rank"] = True
        figures[0] /= ctx.world_size
    metrics["final_loss"] = float(figures[0])
    metrics["samples_per_step"] = int(figures[1])
    return metrics


def rate_info(median_s: float, world_size: int, rank_metrics: dict[str, Any], seq_len: int | None,
              flops_per_sample: float | None) -> dict[str, Any]:
    """The case's per-step figures from the median step and what the ranks measured:
    ``samples_per_second`` (every rank's samples), ``tokens_per_second`` given ``seq_len``, and
    given ``flops_per_sample``: ``model_flops_per_step``, ``achieved_flops_per_second`` and
    ``mfu`` against the peak the ranks probed (:func:`.metrics.mfu_info`)."""
    from .metrics import mfu_info

    samples = rank_metrics.get("samples_per_step")
    if not samples or not median_s > 0:
        return {}
    info: dict[str, Any] = {"samples_per_second": round(samples / median_s, 3)}
    if seq_len:
        info["tokens_per_step"] = samples * seq_len
        info["tokens_per_second"] = round(samples * seq_len / median_s, 3)
    if flops_per_sample:
        flops = flops_per_sample * samples
        info["model_flops_per_step"] = flops
        info["achieved_flops_per_second"] = flops / median_s
        info.update(mfu_info(flops / median_s, world_size, rank_metrics))
    return info


def probe_peak_flops(ctx, bf16: bool) -> dict[str, Any]:
    """This rank's measured matmul peak (and the datasheet's, where known) in the step's dtype: MFU's
    denominator (:func:`.metrics.measure_peak_flops`)."""
    import torch

    from .metrics import datasheet_peak_flops, measure_peak_flops

    dtype = torch.bfloat16 if bf16 else torch.float32
    out = {"peak_flops_measured": measure_peak_flops(ctx.device, dtype)}
    datasheet = datasheet_peak_flops(ctx.device, dtype)
    if datasheet:
        out["peak_flops_datasheet"] = datasheet
    return out


def check_ranks_agree(who: str, ctx, parameters) -> None:
    """Every rank holds rank 0's parameters (a replicated model after its steps); every rank raises
    alike when one differs."""
    import torch
    import torch.distributed as dist

    params = [p.detach().reshape(-1).to(torch.float64) for p in parameters]
    if not params or ctx.world_size < 2:
        return
    mine = torch.cat(params)
    reference = mine.clone()
    dist.broadcast(reference, src=0)
    worst = (mine - reference).abs().max().reshape(1)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if float(worst) > 1e-6:
        raise AssertionError(f"{who}: the ranks' parameters differ from rank 0's after training (max |diff| "
                             f"{float(worst):.3g}): the gradients were not reduced alike on every rank")


# What a set-up's peak-FLOPs probe found (probe_peak_flops), kept in the step's metrics where known.
PEAK_FLOPS_KEYS = ("peak_flops_measured", "peak_flops_datasheet")


def own_step_metrics(state: dict) -> dict[str, Any]:
    """The step figures of a user's own training loop (``state``: "ctx", "loop", "setup_seconds"
    and what probe_peak_flops found): step_metrics, the set-up's seconds and the peak FLOPs."""
    ctx, loop = state["ctx"], state["loop"]
    metrics = step_metrics(ctx, loop.last_loss, loop.steps, loop.last_step_batches)
    metrics["setup_seconds"] = round(state["setup_seconds"], 4)
    metrics.update({key: state[key] for key in PEAK_FLOPS_KEYS if state.get(key)})
    return metrics


def check_last_loss_finite(who: str, last_loss) -> None:
    """AssertionError naming ``who`` when the last step's loss is not a finite number."""
    import math

    if last_loss is not None and not math.isfinite(float(last_loss)):
        raise AssertionError(f"{who}: the last step's loss is {float(last_loss)}")

