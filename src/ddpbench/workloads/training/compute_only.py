"""Compute-only training steps: the same step with every gradient or parameter exchange replaced by one
that hands the data back unreduced (docs/design/families.md#exposed-communication)."""

from __future__ import annotations

from typing import Any


class SkippedCollectives:
    """The collectives one step of a compute-only variant skipped, in call order (the latest step's
    only: :meth:`new_step` starts over)."""

    def __init__(self):
        self.calls: list[tuple[str, str, int, int]] = []  # (kind, dtype, group size, bytes)
        self.steps = 0

    def new_step(self) -> None:
        self.calls = []
        self.steps += 1

    def add(self, kind: str, tensor, group_size: int) -> None:
        """A ``kind`` collective of ``tensor`` (the input this rank would have sent) over
        ``group_size`` ranks."""
        self.calls.append((kind, str(tensor.dtype).removeprefix("torch."), int(group_size),
                           tensor.numel() * tensor.element_size()))

    def record(self) -> list[dict[str, Any]]:
        """Census-shaped: one entry per (kind, dtype, group size), first-seen order, with
        ``call_bytes``, the input bytes of each call in call order."""
        entries: dict[tuple[str, str, int], dict[str, Any]] = {}
        for kind, dtype, group_size, nbytes in self.calls:
            entry = entries.setdefault((kind, dtype, group_size), {"kind": kind, "dtype": dtype,
                                                                   "group_size": group_size, "call_bytes": []})
            entry["call_bytes"].append(nbytes)
        return list(entries.values())


def _completed(tensor):
    import torch

    future = torch.futures.Future()
    future.set_result(tensor)
    return future


def unreduced_hook(skipped: SkippedCollectives, bucket):
    """DDP communication hook: the bucket's buffer back as it is (no all-reduce, no division: DDP's
    built-in path folds its division into the copy into the bucket, so there is no pass to keep)."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    skipped.add("all_reduce", buffer, dist.get_world_size())
    return _completed(buffer)


def _compressed_unreduced(skipped: SkippedCollectives, bucket, dtype_name: str):
    """What ``default_hooks.fp16_compress_hook`` / ``bf16_compress_hook`` compute (cast, divide by
    the world size, copy back into the buffer), without the all-reduce."""
    import torch
    import torch.distributed as dist

    world_size = dist.get_world_size()
    buffer = bucket.buffer()
    compressed = buffer.to(getattr(torch, dtype_name)).div_(world_size)
    skipped.add("all_reduce", compressed, world_size)
    buffer.copy_(compressed)
    return _completed(buffer)


def fp16_unreduced_hook(skipped: SkippedCollectives, bucket):
    """DDP communication hook: fp16_compress_hook's compute without its all-reduce."""
    return _compressed_unreduced(skipped, bucket, "float16")


def bf16_unreduced_hook(skipped: SkippedCollectives, bucket):
    """DDP communication hook: bf16_compress_hook's compute without its all-reduce."""
    return _compressed_unreduced(skipped, bucket, "bfloat16")


# comm_hook name -> the compute-only hook (with the SkippedCollectives as its state).
COMPUTE_ONLY_HOOKS = {"none": unreduced_hook, "fp16": fp16_unreduced_hook, "bf16": bf16_unreduced_hook}


def register_compute_only_hook(ddp, comm_hook: str, skipped: SkippedCollectives) -> None:
    """Register the compute-only form of ``comm_hook`` on ``ddp``; a hook without one is named."""
    hook = COMPUTE_ONLY_HOOKS.get(comm_hook)
    if hook is None:
        raise ValueError(f"comm_hook {comm_hook!r} has no compute-only form (its exchanges are interleaved "
                         f"with its own compute); known: {', '.join(COMPUTE_ONLY_HOOKS)}")
    ddp.register_comm_hook(skipped, hook)


class UnexchangedAllGather:
    """FSDP2 custom all-gather (``FSDPModule.set_custom_all_gather``): FSDP2's copy-in has already
    put this rank's shard in its slot of the output; the other slots stay as allocated, zero."""

    def __init__(self, skipped: SkippedCollectives):
        self.skipped = skipped

    def allocate(self, size, *, dtype, device):
        import torch

        return torch.zeros(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        self.skipped.add("all_gather", input_tensor, group.size())
        numel = input_tensor.numel()
        own = output_tensor.narrow(0, numel * group.rank(), numel)
        if own.data_ptr() != input_tensor.data_ptr():
            own.copy_(input_tensor)
        return None


class UnexchangedReduceScatter:
    """FSDP2 custom reduce-scatter (``FSDPModule.set_custom_reduce_scatter``): this rank's chunk of
    its own gradient, unreduced."""

    def __init__(self, skipped: SkippedCollectives):
        self.skipped = skipped

    def allocate(self, size, *, dtype, device):
        import torch

        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op=None, async_op: bool = False):
        self.skipped.add("reduce_scatter", input_tensor, group.size())
        numel = output_tensor.numel()
        output_tensor.copy_(input_tensor.narrow(0, numel * group.rank(), numel))
        return None


def unexchange_fsdp2(modules, skipped: SkippedCollectives) -> None:
    """Give every ``fully_shard`` module in ``modules`` the unexchanged all-gather and reduce-scatter."""
    for module in modules:
        module.set_custom_all_gather(UnexchangedAllGather(skipped))
        module.set_custom_reduce_scatter(UnexchangedReduceScatter(skipped))
