"""The transformer family's knobs, one section each (the step, compile, DDP, FSDP2), with what each
section checks, reports and builds; :class:`~.transformer.TransformerTraining` takes its fields from
all of them, so a case names every knob flat (``TransformerTraining(impl="fsdp2", ...)``)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, ClassVar

from .gpt import gpt_config

TRANSFORMER_IMPLS = ("ddp", "fsdp2")
PRECISIONS = ("fp32", "bf16")


def _positive_integer(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _changed(section, settings) -> list[str]:
    """The names of ``section``'s knobs whose value on ``settings`` differs from their default."""
    return [f.name for f in dataclasses.fields(section) if getattr(settings, f.name) != f.default]


@dataclass(frozen=True)
class StepSettings:
    """The model and one optimizer step: a round is ``grad_accum`` micro-batches of ``batch_size``
    sequences per rank, trained with ``impl`` at ``precision``."""

    size: str = "cpu-small"
    impl: str = "ddp"
    batch_size: int = 0  # sequences per rank and micro-batch; 0: the size's default
    grad_accum: int = 1
    precision: str = "fp32"

    def check_step_settings(self) -> None:
        gpt_config(self.size)
        if self.impl not in TRANSFORMER_IMPLS:
            raise ValueError(f"unknown transformer implementation {self.impl!r}; expected one of "
                             f"{', '.join(TRANSFORMER_IMPLS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; expected one of {', '.join(PRECISIONS)}")
        _positive_integer("grad_accum", self.grad_accum)
        if not isinstance(self.batch_size, int) or self.batch_size < 0:
            raise ValueError(f"batch_size must be a positive integer (0: the size's default), got {self.batch_size!r}")

    @property
    def config(self):
        return gpt_config(self.size)

    @property
    def micro_batch(self) -> int:
        return self.batch_size or self.config.batch_size


@functools.lru_cache(maxsize=None)
def compile_unavailable_reason() -> str | None:
    """Why ``torch.compile`` (inductor) cannot build here, found by compiling a tiny function once
    per process; None when it can."""
    try:
        import torch

        fn = torch.compile(lambda x: torch.sin(x) * 2 + 1)
        fn(torch.randn(8))
    except Exception as exc:  # noqa: BLE001 - any failure to build is the reason to skip
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"torch.compile cannot build on this machine: {type(exc).__name__}: {first[:300]}"
    return None


@dataclass(frozen=True)
class CompileSettings:
    """What torch does to the model's graph: ``compile`` wraps the trained module in
    ``torch.compile`` (the case is skipped, with inductor's reason, where it cannot build);
    ``activation_checkpointing`` recomputes each block in backward (non-reentrant)."""

    compile: bool = False
    activation_checkpointing: bool = False

    def compile_skip_reason(self) -> str | None:
        return compile_unavailable_reason() if self.compile else None


def _register_fp16(ddp, ctx) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)


def _register_bf16(ddp, ctx) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)


def _register_powersgd(ddp, ctx) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    # start_powerSGD_iter >= 2 is DDP's minimum with error feedback / warm start on.
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                        use_error_feedback=True, warm_start=True)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return state


# name -> register(ddp, ctx) (None: DDP's built-in all-reduce); DDPSettings.comm_hooks.
COMM_HOOKS: dict[str, Any] = {"none": None, "fp16": _register_fp16, "bf16": _register_bf16,
                              "powersgd": _register_powersgd}


@dataclass(frozen=True)
class DDPSettings:
    """DistributedDataParallel's knobs (``impl="ddp"``), and a communication hook: ``none``, ``fp16`` /
    ``bf16`` compression, ``powersgd`` (rank 1 with error feedback)."""

    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    comm_hook: str = "none"
    # name -> register(ddp, ctx); a subclass may swap one in (planted bugs, the simulation).
    comm_hooks: ClassVar[dict] = COMM_HOOKS

    def check_ddp_settings(self) -> None:
        if self.comm_hook not in self.comm_hooks:
            raise ValueError(f"unknown comm_hook {self.comm_hook!r}; expected one of {', '.join(self.comm_hooks)}")
        if not self.bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {self.bucket_cap_mb!r}")

    def ddp_knobs_set(self) -> list[str]:
        """The DDP knobs that differ from their defaults."""
        return _changed(DDPSettings, self)

    def ddp_skip_reason(self, spec, grad_accum: int) -> str | None:
        if self.comm_hook == "bf16" and spec.backend != "nccl":
            return ("DDP's bf16_compress_hook needs NCCL (torch refuses it on other backends: \"BF16 all "
                    "reduce communication hook required CUDA 11+ and NCCL 2.10+\")")
        if self.static_graph and grad_accum > 1:
            return ("DDP static_graph with no_sync() micro-batches fails in torch's reducer "
                    "(expect_autograd_hooks_ internal assert, torch 2.13)")
        return None

    def ddp_info(self) -> dict[str, Any]:
        """The case's extra_info of these knobs."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(DDPSettings)}

    def wrap_ddp(self, model, ctx, skipped=None) -> tuple[Any, Any]:
        """(``model`` in DistributedDataParallel with these knobs and the hook registered, the hook's
        state or None); with ``skipped`` (a compute-only step's record), a hook that hands each
        bucket back unreduced instead."""
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [ctx.device.index] if ctx.device_type == "cuda" else None
        ddp = DistributedDataParallel(
            model, device_ids=device_ids, bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view, static_graph=self.static_graph,
            find_unused_parameters=self.find_unused_parameters)
        register = self.comm_hooks[self.comm_hook]
        if skipped is not None:
            from .compute_only import register_compute_only_hook

            register_compute_only_hook(ddp, self.comm_hook, skipped)
            return ddp, None
        return ddp, (register(ddp, ctx) if register is not None else None)


@dataclass(frozen=True)
class FSDPSettings:
    """FSDP2's knobs (``impl="fsdp2"``): ``fully_shard`` on every block, then on the root."""

    reshard_after_forward: bool = True

    def fsdp_knobs_set(self) -> list[str]:
        """The FSDP2 knobs that differ from their defaults."""
        return _changed(FSDPSettings, self)

    def fsdp_info(self) -> dict[str, Any]:
        """The case's extra_info of these knobs."""
        return {"reshard_after_forward": self.reshard_after_forward}

    def shard_fsdp2(self, model, precision: str, mesh=None, skipped=None):
        """``model`` sharded in place (each block, then the root; ``precision="bf16"`` is
        ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``) over ``mesh`` (None: the whole
        world); with ``skipped`` (a compute-only step's record), exchanges that hand the data back
        unreduced. Returns the model."""
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16" else MixedPrecisionPolicy())
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=self.reshard_after_forward, mp_policy=mp, mesh=mesh)
        fully_shard(model, reshard_after_forward=self.reshard_after_forward, mp_policy=mp, mesh=mesh)
        if skipped is not None:
            from .compute_only import unexchange_fsdp2

            unexchange_fsdp2([*model.blocks, model], skipped)
        return model
