"""Per-rank peak memory of one training step of the transformer family, counted tensor by tensor, on a
real rank or simulated as rank 0 of N (docs/design/census-and-memory.md#per-rank-peak-memory)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from ..workloads.training.transformer import TransformerTraining
from .step import DEFAULT_WARMUP_STEPS, MESH_KEY, SimulatedTransformer

# The tracker's category names -> the record's keys, in the order the table shows them.
CATEGORIES = {
    "Parameter": "parameters", "Sharded Param": "sharded_parameters", "Unsharded Param": "unsharded_parameters",
    "Buffer": "buffers", "Gradient": "gradients", "Sharded Grad": "sharded_gradients",
    "Unsharded Grad": "unsharded_gradients", "Optstate": "optimizer_state", "OptState": "optimizer_state",
    "Activation": "activations", "Temp": "temporaries", "All Gather": "all_gather_buffers",
    "Reduce Scatter": "reduce_scatter_buffers", "Other": "inputs", "Inputs": "inputs",
}
# The key ctx.scratch holds the simulation's DeviceMesh under (built before FakeTensorMode).
# The record's adamw_foreach: the loop's torch.optim.AdamW default is the per-parameter loop on the
# CPU (the simulation's case) and foreach on CUDA, which adds one model-sized temporary to the peak.


def _breakdown(snapshot: dict) -> dict[str, int]:
    """One device's tracker snapshot -> {record key: bytes} (zero categories left out)."""
    out: dict[str, int] = {}
    for category, value in snapshot.items():
        name = getattr(category, "value", category)
        if name == "Total" or not value:
            continue
        key = CATEGORIES.get(name, str(name).lower().replace(" ", "_"))
        out[key] = out.get(key, 0) + int(value)
    return dict(sorted(out.items(), key=lambda item: list(CATEGORIES.values()).index(item[0])
                       if item[0] in CATEGORIES.values() else len(CATEGORIES)))


def _located(tracker_class):
    """``tracker_class`` that also remembers where the peak fell: the innermost module running and
    the phase (forward, backward, optimizer step)."""

    class Located(tracker_class):
        peak_at: dict[str, str] = {"module": "", "phase": "before the step"}

        def _pre_fw_hook(self, module, inputs) -> None:
            # MemTracker refuses a second forward of the top module in one tracked region (it
            # expects one per iteration); each micro-batch's forward is one: its per-module
            # statistics restart there (the peak and its place, kept here, do not).
            name = self._mod_tracker.get_known_fqn(module)
            if (module in self.memory_tracking and not self._mod_tracker.is_bw
                    and set(self._mod_tracker.parents) - {name} == {"Global"}):
                self.reset_mod_stats()
            super()._pre_fw_hook(module, inputs)

        def _update_peak_stats(self, peak_state) -> None:
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != before:
                modules = [m for m in self._mod_tracker.parents if m != "Global"]
                phase = ("optimizer step" if self._in_opt else "backward" if self._mod_tracker.is_bw
                         else "forward")
                self.peak_at = {"module": max(modules, key=lambda m: (m.count("."), m)) if modules else "",
                                "phase": phase}

    Located.__name__ = tracker_class.__name__
    return Located


def _per_micro_batch(fsdp_tracker_class):
    """``FSDPMemTracker`` for a step of several micro-batches: it refuses a second forward of the
    root in one tracked region (it expects one per iteration), so its per-module statistics restart
    at each micro-batch's forward (the peak and its place, kept by the tracker itself, do not)."""

    class PerMicroBatch(fsdp_tracker_class):
        def _fsdp_state_pre_forward(self, fsdp_mod, orig_fsdp_state_pre_fw):
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig_fsdp_state_pre_fw)

            def restarting(*args, **kwargs):
                if fsdp_mod is self._root_mod and fsdp_mod in self.memory_tracking and not self._mod_tracker.is_bw:
                    self.reset_mod_stats()
                return inner(*args, **kwargs)

            return restarting

    PerMicroBatch.__name__ = fsdp_tracker_class.__name__
    return PerMicroBatch


def _tracker(loop, workload: TransformerTraining):
    if workload.impl == "fsdp2":
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = _located(_per_micro_batch(FSDPMemTracker))(loop.model, loop.optimizer)
        tracker.track_inputs((loop.inputs, loop.targets))
        return tracker
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = _located(MemTracker)()
    tracker.track_external(loop.wrapped, loop.optimizer, loop.inputs, loop.targets)
    return tracker


def memory_census(ctx, workload: TransformerTraining, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> dict[str, Any]:
    """This rank's peak memory over one optimizer step after ``warmup_steps``:
    ``{"peak_bytes", "peak_breakdown": {category: bytes}, "peak_at": {"module", "phase"},
    "after_step_bytes", "after_step_breakdown", ...}``."""
    state = workload.setup(ctx)
    try:
        loop = state["loop"]
        foreach = loop.optimizer.defaults.get("foreach")
        if foreach is None:  # torch's default: the foreach implementation where every parameter is on a GPU
            foreach = all(p.device.type == "cuda" for p in loop.model.parameters())
        for _ in range(warmup_steps):
            workload.run_round(state)
        tracker = _tracker(loop, workload)
        with tracker:
            workload.run_round(state)
        (peak,) = tracker.get_tracker_snapshot("peak").values() or [{}]
        after = next(iter(tracker.get_tracker_snapshot("current").values()), {})
        record: dict[str, Any] = {
            "peak_bytes": int(peak.get("Total", 0)), "peak_breakdown": _breakdown(peak),
            "peak_at": dict(tracker.peak_at),
            "after_step_bytes": int(after.get("Total", 0)), "after_step_breakdown": _breakdown(after),
            "tracker": type(tracker).__name__, "adamw_foreach": bool(foreach),
            "micro_batch": [workload.micro_batch, workload.config.seq_len],
        }
        if workload.impl == "ddp":
            from ..engine.census import ddp_bucket_sizes

            record["ddp_bucket_bytes"] = sum(ddp_bucket_sizes(loop.wrapped))
        return record
    finally:
        workload.teardown(state)


def simulated_for_memory(workload: TransformerTraining) -> SimulatedTransformer:
    """``workload``'s knobs, its own batch (memory depends on it), no peak-FLOPs probe, on the
    fake process group's variant of the family."""
    from dataclasses import fields

    knobs = {f.name: getattr(workload, f.name) for f in fields(workload)}
    knobs.update(measure_peak=False)
    return SimulatedTransformer(**knobs)


def simulate_memory(workload: TransformerTraining, world_size: int,
                    warmup_steps: int = DEFAULT_WARMUP_STEPS) -> dict[str, Any]:
    """:func:`memory_census` of rank 0 of ``world_size`` ranks, in this process (fake process
    group; FSDP2 under FakeTensorMode, DDP on real tensors)."""
    from ..pool.base import RankContext
    from .fakepg import simulated_world

    with simulated_world(world_size):
        ctx = RankContext(rank=0, world_size=world_size, backend="fake", device_type="cpu")
        if workload.impl != "fsdp2":
            return memory_census(ctx, simulated_for_memory(workload), warmup_steps)
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed.device_mesh import init_device_mesh

        # Built on real tensors: under FakeTensorMode the mesh's set-up reads values it cannot have.
        ctx.scratch[MESH_KEY] = init_device_mesh("cpu", (world_size,))
        with FakeTensorMode(), _one_chunk_at_a_time():
            return memory_census(ctx, simulated_for_memory(workload), warmup_steps)


class _Chunks:
    """``torch.chunk(tensor, n, dim)`` padded with empty tensors to ``n`` (FSDP2's
    ``_chunk_with_empty``), each chunk made when indexed: FSDP2 reads one rank's chunk and chunk 0
    only, and making all N fake views costs seconds a parameter at N = 1024."""

    def __init__(self, tensor, num_chunks: int, dim: int):
        self.tensor, self.n, self.dim = tensor, num_chunks, dim
        rows = tensor.shape[dim]
        self.size = -(-rows // num_chunks) if rows else 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not -self.n <= i < self.n:
            raise IndexError(i)
        i %= self.n
        rows = self.tensor.shape[self.dim]
        start = i * self.size
        if start < rows:
            return self.tensor.narrow(self.dim, start, min(self.size, rows - start))
        return self[0].new_empty(0)

    def __iter__(self):
        return (self[i] for i in range(self.n))


@contextlib.contextmanager
def _one_chunk_at_a_time():
    """FSDP2's parameter set-up chunks lazily (:class:`_Chunks`) while open."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = _Chunks
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original


def fits(peak_bytes: int, device_bytes: int | None) -> dict[str, Any] | None:
    """Whether a rank's peak fits ``device_bytes``: ``{"fits": bool, "headroom_bytes": device - peak}``
    (negative: by how much it misses); None without a device size."""
    if device_bytes is None:
        return None
    return {"fits": peak_bytes <= device_bytes, "headroom_bytes": device_bytes - peak_bytes}


def fits_from(rows: list[dict[str, Any]]) -> int | None:
    """The smallest simulated world size from which every larger one fits the device (None: the
    largest does not fit, or no device was given)."""
    smallest = None
    for row in reversed(rows):
        verdict = row.get("memory", {}).get("device")
        if not verdict or not verdict["fits"]:
            break
        smallest = row["world_size"]
    return smallest


@functools.cache
def ddp_memory_census_needs(workload: TransformerTraining) -> int:
    """About how much memory DDP's memory census (real tensors, the workload's own batch) needs:
    the same step of the model without DDP counted on fake tensors (parameters, gradients, AdamW's
    moments, activations and temporaries, exactly), plus a bucket copy of every gradient and a
    compressing hook's copy, plus a quarter for the allocator."""
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from ..workloads.training.gpt import build_gpt

    cfg, whole = workload.config, workload.config.parameter_count * 4
    with FakeTensorMode():
        model = build_gpt(cfg, workload.activation_checkpointing)
        optimizer = torch.optim.AdamW(model.parameters(), foreach=False)  # as the simulated rank's, on the CPU
        tokens = torch.zeros(workload.micro_batch, cfg.seq_len, dtype=torch.int64)

        def step():
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten()).backward()
            optimizer.step()

        step()  # AdamW's state exists from here on
        tracker = MemTracker()
        tracker.track_external(model, optimizer, tokens)
        with tracker:
            step()
        (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int((int(peak["Total"]) + 2 * whole) * 1.25)


__all__ = ["CATEGORIES", "ddp_memory_census_needs", "fits", "fits_from", "memory_census", "simulate_memory"]
