"""The metrics of a training step, in one place: tokens per second, model FLOPs per step, MFU with a
measured peak beside the datasheet's, peak memory per rank, parameter bytes, and exposed
communication (from the engine's variant rounds: the step, its compute-only variant and its
collectives replayed alone, interleaved).

Nothing here runs inside a timed round: FLOPs are counted once per case on a meta-device copy of
the model, memory is read after the rounds
(CUDA) or counted by the engine's memory census.
"""

from __future__ import annotations

import functools
import time
from typing import Any

# Dense bf16 tensor-core peaks from NVIDIA's datasheets (SXM parts, no sparsity), by a substring of
# torch.cuda.get_device_name(). Shown beside the measured peak, never used in place of it.
DATASHEET_BF16_FLOPS = {"H100": 989e12, "H200": 989e12}


def count_flops(fn, *args) -> int:
    """FLOPs that :class:`torch.utils.flop_counter.FlopCounterMode` counts while ``fn(*args)`` runs:
    matrix multiplications, convolutions and attention (forward and, if ``fn`` calls backward,
    backward), 2 per multiply-add; element-wise work, norms and softmax outside attention are not
    counted (the usual model-FLOPs convention of MFU)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return int(counter.get_total_flops())


@functools.lru_cache(maxsize=None)
def gpt_flops_per_sequence(size: str) -> int:
    """Model FLOPs of forward + backward of one sequence of the named GPT size (full context),
    counted on the meta device (no memory, no compute); activation recomputation is not counted
    (model FLOPs, not hardware FLOPs)."""
    import torch
    import torch.nn.functional as F

    from .gpt import build_gpt, gpt_config

    cfg = gpt_config(size)
    with torch.device("meta"):
        model = build_gpt(cfg)
        tokens = torch.zeros(1, cfg.seq_len, dtype=torch.int64)

    def step(x):
        logits = model(x)
        F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()

    return count_flops(step, tokens)


def tokens_per_second(tokens_per_step: int, median_s: float) -> float:
    """Global tokens (every rank's micro-batches of one optimizer step) per second of the median step."""
    return tokens_per_step / median_s


def mfu(model_flops_per_step: float, median_s: float, world_size: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s / (ranks x peak FLOP/s of one rank's device)."""
    return model_flops_per_step / median_s / (world_size * peak_flops)


def mfu_info(achieved_flops_per_second: float, world_size: int, rank_metrics: dict[str, Any]) -> dict[str, Any]:
    """``mfu`` against the peak the ranks measured (``peak_flops_measured``) and ``mfu_datasheet``
    where the ranks' device has a datasheet figure (``peak_flops_datasheet``), from the case's
    median step; ``rank_metrics``: the ranks' metrics combined, so a peak is the largest rank's
    probe. A peak the ranks did not report gives no key."""
    out: dict[str, Any] = {}
    if not (achieved_flops_per_second and world_size):
        return out
    for key, peak_key in (("mfu", "peak_flops_measured"), ("mfu_datasheet", "peak_flops_datasheet")):
        peak = rank_metrics.get(peak_key)
        if peak:
            out[key] = round(achieved_flops_per_second / (world_size * peak), 6)
    return out


def measure_peak_flops(device, dtype, size: int | None = None, repeats: int = 5) -> float:
    """This device's dense matmul FLOP/s in ``dtype``: the best of ``repeats`` square
    ``size`` x ``size`` products (after one warm-up), 2 size^3 FLOPs each."""
    import torch

    cuda = device.type == "cuda"
    n = size or (8192 if cuda else 1024)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for i in range(repeats + 1):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        if i:  # the first is the warm-up
            best = min(best, elapsed)
    return 2.0 * n**3 / best


def datasheet_peak_flops(device, dtype) -> float | None:
    """The datasheet's dense peak for this device and dtype, where this module knows it (bf16 on
    H100 / H200), else None."""
    import torch

    if device.type != "cuda" or dtype != torch.bfloat16:
        return None
    name = torch.cuda.get_device_name(device)
    for part, flops in DATASHEET_BF16_FLOPS.items():
        if part in name:
            return flops
    return None


def peak_memory(device) -> dict[str, int]:
    """CUDA: the caching allocator's peak allocated and reserved bytes on this rank's device. CPU:
    nothing; the engine's memory census (``extra_info["memory"]``) counts the step's tensors on every
    device (a process's resident-set high-water mark, reported here before, is inherited by every
    later case of the same rank process and says nothing about one case)."""
    if device.type == "cuda":
        import torch

        return {"peak_memory_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
                "peak_memory_reserved_bytes": int(torch.cuda.max_memory_reserved(device))}
    return {}


def _held_bytes(tensor) -> int:
    """Bytes this rank holds of a tensor: a DTensor's local shard, else the tensor."""
    held = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return held.numel() * held.element_size()


def parameter_bytes(model) -> dict[str, int]:
    """``param_bytes``: the whole model's parameters; ``sharded_param_bytes``: what this rank holds
    of them (differs from ``param_bytes`` for FSDP2's sharded DTensor parameters)."""
    total = local = 0
    for p in model.parameters():
        total += p.numel() * p.element_size()
        local += _held_bytes(p)
    return {"param_bytes": total, "sharded_param_bytes": local}


def exposed_communication(variant_times: dict[str, list[float]]) -> dict[str, Any]:
    """Exposed communication from the engine's interleaved variant rounds (max over ranks per
    round): ``step`` (the step itself), ``compute_only`` (the same step with every collective
    handing its data back unreduced) and, where the workload has it, ``communication_only`` (the
    step's collectives replayed alone). Round i of each ran in the same round group, so the step
    and its compute-only variant pair up.

    * ``compute_s``: the median compute-only round, ``compute_s_ci`` its 95% interval;
    * ``exposed_comm_s``: the median over the round groups of step - compute-only, the time the
      step spends waiting for communication, ``exposed_comm_s_ci`` its 95% interval (it holds 0
      where nothing is exposed, e.g. at world size 1; a noisy estimate may be below 0);
    * ``comm_isolated_s``: the median communication-only round, ``comm_isolated_s_ci`` its interval;
    * ``comm_overlap_pct``: the share of the isolated communication hidden behind compute,
      100 x (1 - exposed / isolated), held within [0, 100].

    The intervals are the distribution-free order-statistics intervals of the median
    (``engine.timing.median_interval``). Empty when the rounds hold no step and compute-only pair."""
    import statistics

    from ...engine.timing import median_interval
    from ...engine.variants import STEP
    from .. import COMMUNICATION_ONLY, COMPUTE_ONLY

    step, compute = variant_times.get(STEP) or [], variant_times.get(COMPUTE_ONLY) or []
    if not step or not compute:
        return {}
    if len(step) != len(compute):
        raise ValueError(f"exposed communication pairs the step's rounds with its compute-only rounds, "
                         f"and they differ in number ({len(step)} and {len(compute)})")
    gaps = [s - c for s, c in zip(step, compute)]
    info: dict[str, Any] = {"compute_s": statistics.median(compute), "compute_s_ci": list(median_interval(compute)),
                            "exposed_comm_s": statistics.median(gaps), "exposed_comm_s_ci": list(median_interval(gaps)),
                            "variant_rounds": len(step)}
    isolated = variant_times.get(COMMUNICATION_ONLY) or []
    if isolated:
        info["comm_isolated_s"] = statistics.median(isolated)
        info["comm_isolated_s_ci"] = list(median_interval(isolated))
        info["comm_overlap_pct"] = comm_overlap_pct(info["exposed_comm_s"], info["comm_isolated_s"])
    return info


def comm_overlap_pct(exposed_s: float, isolated_s: float) -> float | None:
    """The share (%) of the isolated communication time hidden behind compute: 100 x (1 - exposed /
    isolated), held within [0, 100] (noise can put exposed below 0 or above isolated); None when
    there is no communication time to share."""
    if not isolated_s > 0:
        return None
    return round(100.0 * min(1.0, max(0.0, 1.0 - exposed_s / isolated_s)), 2)


def add_exposed_communication(info: dict[str, Any]) -> dict[str, Any]:
    """:func:`exposed_communication` of a case's extra_info ``variant_round_times`` (what the
    ``dist_benchmark`` fixture recorded), or {} when the case ran no variant rounds."""
    times = info.get("variant_round_times")
    return exposed_communication(times) if isinstance(times, dict) else {}


def rank_state_bytes(model, optimizer) -> dict[str, int]:
    """The training state this rank holds, read after an optimizer step: its parameters
    (``param_bytes_per_rank``), the gradients they carry (``grad_bytes_per_rank``) and every tensor
    of the optimizer's state (``optimizer_state_bytes_per_rank``: AdamW's two moments and step
    counts). FSDP2's are DTensors, counted by their local shards; tied parameters count once."""
    import torch

    params = list(model.parameters())
    state = [value for p in params for value in optimizer.state.get(p, {}).values() if torch.is_tensor(value)]
    return {"param_bytes_per_rank": sum(_held_bytes(p) for p in params),
            "grad_bytes_per_rank": sum(_held_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer_state_bytes_per_rank": sum(_held_bytes(value) for value in state)}
