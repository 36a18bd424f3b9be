"""What only tests and the lab use (slowdown injection, rank probes, training steps outside the
engine): nothing here is on a timed path of the product (docs/design/ab.md#test-knob)."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Any

from .workloads import Workload, case_extra_info

INJECT_ENV = "DDPBENCH_INJECT_SLOWDOWN"
#: The name that slows down every training step (the training and transformer families) in
#: :data:`INJECT_ENV`, beside the collectives' op names.
TRAINING = "training"


def parse_injected_slowdown(text: str | None) -> dict[str, float]:
    """``"all_reduce:10%,broadcast:5,training:20"`` -> ``{"all_reduce": 0.10, "broadcast": 0.05,
    "training": 0.20}``."""
    from .workloads.collectives import COLLECTIVES

    names = (*COLLECTIVES, TRAINING)
    result: dict[str, float] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        op, sep, pct = item.partition(":")
        op, pct = op.strip(), pct.strip().rstrip("%")
        try:
            value = float(pct)
        except ValueError:
            value = -1.0
        if not sep or op not in names or not value >= 0:
            raise ValueError(f"{INJECT_ENV}={text!r}: expected a comma list of op:percent with op in "
                             f"{', '.join(names)} and percent >= 0, e.g. all_reduce:10%")
        result[op] = value / 100.0
    return result


INJECTED_OP = "ddpbench.testing.injected_busy_wait"  # its name in a profile (--dist-ab-profile)


def _busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _injected_wait(seconds: float) -> None:
    """The injected work, named :data:`INJECTED_OP` in a profile; unprofiled, nothing but the wait."""
    import torch

    if not torch.autograd._profiler_enabled():
        _busy_wait(seconds)
        return
    with torch.profiler.record_function(INJECTED_OP):
        _busy_wait(seconds)


@dataclass(frozen=True)
class SlowedDown(Workload):
    """``inner`` (a collective, or a training step), whose rounds take ``1 + fraction`` times the
    op's own time where this rank's environment injects a slowdown for its op, or for
    :data:`TRAINING` (:data:`INJECT_ENV`, read at set-up). Every other hook is the inner one's, so a
    wrapped case counts, replays and reports what the plain one does."""

    inner: Any

    @property
    def injected_as(self) -> str | None:
        """The name :data:`INJECT_ENV` slows this workload down by."""
        from .workloads.training.base import TrainingWorkload

        return TRAINING if isinstance(self.inner, TrainingWorkload) else getattr(self.inner, "op", None)

    @property
    def numerics_replay(self):  # type: ignore[override]
        return self.inner.numerics_replay

    @property
    def single_process(self):
        return getattr(self.inner, "single_process", False)

    def memory_census_targets(self, state):
        return self.inner.memory_census_targets(state["inner"])

    def numerics_targets(self, state):
        return self.inner.numerics_targets(state["inner"])

    @property
    def group(self):  # type: ignore[override]
        return self.inner.group

    @property
    def pin_to_core(self):  # type: ignore[override]
        return self.inner.pin_to_core

    def skip_reason(self, spec):
        return self.inner.skip_reason(spec)

    def setup(self, ctx):
        fraction = parse_injected_slowdown(os.environ.get(INJECT_ENV)).get(self.injected_as, 0.0)
        state = {"inner": self.inner.setup(ctx), "fraction": fraction, "gpu_sleep_cycles": 0, "host_wait_s": 0.0}
        if fraction and ctx.device_type == "cuda":
            state["gpu_sleep_cycles"], state["host_wait_s"] = _cuda_injection(ctx, self.inner, state["inner"], fraction)
        return state

    @property
    def cuda_graph_safe(self):  # type: ignore[override]
        return getattr(self.inner, "cuda_graph_safe", False)

    def run_round(self, state) -> None:
        if not state["fraction"]:
            return self.inner.run_round(state["inner"])
        if state["gpu_sleep_cycles"]:
            import torch

            out = self.inner.run_round(state["inner"])
            torch.cuda._sleep(state["gpu_sleep_cycles"])
            return out
        if state["host_wait_s"]:
            out = self.inner.run_round(state["inner"])
            _injected_wait(state["host_wait_s"])
            return out
        start = time.perf_counter()
        out = self.inner.run_round(state["inner"])
        _injected_wait((time.perf_counter() - start) * state["fraction"])
        return out

    def rank_metrics(self, state) -> dict[str, Any]:
        metrics = dict(self.inner.rank_metrics(state["inner"]) or {})
        if state["fraction"]:
            metrics["injected_slowdown_pct"] = round(state["fraction"] * 100, 3)
        return metrics

    def check(self, state) -> None:
        self.inner.check(state["inner"])

    def census_details(self, state) -> dict[str, Any]:
        return self.inner.census_details(state["inner"])

    def teardown(self, state) -> None:
        self.inner.teardown(state["inner"])

    def extra_info(self, world_size: int, median_s: float,
                   rank_metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        return case_extra_info(self.inner, world_size, median_s, rank_metrics or {})


def _event_time(ctx, fn, ops: int, repeats: int) -> tuple[float, float]:
    """Medians over ``repeats`` of ``ops`` calls of ``fn`` back to back, per call: the CUDA-event
    time and the host time the calls took to return (their issue time)."""
    import statistics

    import torch

    event_times, host_times = [], []
    for _ in range(repeats):
        torch.cuda.synchronize(ctx.device)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        host_start = time.perf_counter()
        for _ in range(ops):
            fn()
        host_times.append((time.perf_counter() - host_start) / ops)
        stop.record()
        stop.synchronize()
        event_times.append(start.elapsed_time(stop) / 1000.0 / ops)
    return statistics.median(event_times), statistics.median(host_times)


# An op whose host issue time is at least this share of its event time is host-bound.
HOST_BOUND_SHARE = 0.8


def _cuda_injection(ctx, inner, inner_state, fraction: float) -> tuple[int, float]:
    """(GPU spin cycles, host wait s): one of them, ``fraction`` of what bounds the op, over 20
    ops back to back as the engine's rounds launch them; the spin kernel's cycles per second are
    measured the same way."""
    import torch

    for _ in range(3):
        inner.run_round(inner_state)
    op_s, host_s = _event_time(ctx, lambda: inner.run_round(inner_state), ops=20, repeats=5)
    if host_s >= HOST_BOUND_SHARE * op_s:
        return 0, host_s * fraction
    probe_cycles = 1_000_000
    torch.cuda._sleep(probe_cycles)
    sleep_s, _ = _event_time(ctx, lambda: torch.cuda._sleep(probe_cycles), ops=1, repeats=5)
    return max(1, int(op_s * fraction / sleep_s * probe_cycles)), 0.0


def pytest_ddpbench_prepare_workload(workload, spec):
    """With ``-p ddpbench.testing``: every collective and training case can be slowed down by the
    environment."""
    from .workloads.collectives import Collective
    from .workloads.training.base import TrainingWorkload

    return SlowedDown(workload) if isinstance(workload, (Collective, TrainingWorkload)) else None


def rank_state(ctx) -> dict[str, Any]:
    """Pool task: open descriptors, mapped shm segments and sharing strategy of a rank."""
    import torch.multiprocessing as tmp

    from .workloads.datasets.resources import mapped_shm_segments, open_fd_count

    return {"open_fds": open_fd_count(), "shm_segments": len(mapped_shm_segments()),
            "strategy": tmp.get_sharing_strategy(), "pid": os.getpid()}


def set_fd_limit(ctx, soft: int | None) -> int:
    """Pool task: set this rank's soft RLIMIT_NOFILE (None: back to the hard limit); returns the
    old soft limit."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if soft is None else soft, hard))
    return old_soft


def train_steps(ctx, workload, steps: int) -> dict[str, Any]:
    """Pool task: set up a training ``workload`` on this rank, run ``steps`` optimizer steps, return
    the per-step losses (after set-up) and the flattened final parameters."""
    from .workloads.training.models import flat_parameters

    state = workload.setup(ctx)
    try:
        losses = [state["loop"].step() for _ in range(steps)]
        return {"losses": losses, "params": flat_parameters(state["loop"].module())}
    finally:
        workload.teardown(state)


# ----------------------------------------------------------------------------------------------
# Planted numerics bugs: a hand-written data-parallel step with no check of its own, so that only
# the numerics fingerprint (ddpbench.engine.numerics) can tell a bug from the correct step
# ----------------------------------------------------------------------------------------------

PLANT_ENV = "DDPBENCH_PLANT_NUMERICS"
#: The bugs :class:`SelfmadeTraining` can plant: gradients summed over ranks instead of averaged,
#: the loss scaled by 0.5, the first parameter left out of the optimizer.
PLANTED_BUGS = ("sum-grads", "half-loss", "frozen-param")


def planted_bug(text: str | None) -> str:
    """The bug :data:`PLANT_ENV` names ('' for none); ValueError for another word."""
    text = (text or "").strip()
    if text and text not in PLANTED_BUGS:
        raise ValueError(f"{PLANT_ENV}={text!r}: expected one of {', '.join(PLANTED_BUGS)} (or unset)")
    return text


@dataclass(frozen=True)
class SelfmadeTraining(Workload):
    """A user's hand-written data-parallel step: a small MLP, SGD without momentum (so that leaving
    a parameter out of the optimizer changes no memory), gradients all-reduced one by one and
    divided by the world size. ``bug`` (or this rank's :data:`PLANT_ENV`, read at set-up) plants
    one of :data:`PLANTED_BUGS`; none changes the collectives or the memory a step holds."""

    bug: str = ""
    hidden: int = 64
    batch: int = 16
    lr: float = 0.1

    def setup(self, ctx):
        import torch

        bug = planted_bug(self.bug or os.environ.get(PLANT_ENV))
        model = torch.nn.Sequential(torch.nn.Linear(32, self.hidden), torch.nn.ReLU(), torch.nn.Linear(self.hidden, 4))
        params = list(model.parameters())
        optimizer = torch.optim.SGD(params[1:] if bug == "frozen-param" else params, lr=self.lr)
        generator = torch.Generator().manual_seed(1000 + ctx.rank)
        data = (torch.randn(self.batch, 32, generator=generator), torch.randint(0, 4, (self.batch,), generator=generator))
        return {"model": model, "optimizer": optimizer, "data": data, "bug": bug, "world": ctx.world_size}

    def run_round(self, state):
        import torch
        import torch.distributed as dist

        model, optimizer, (x, y) = state["model"], state["optimizer"], state["data"]
        model.zero_grad(set_to_none=True)  # every gradient, in the optimizer or not: the same memory either way
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if state["bug"] == "half-loss":
            loss = loss * 0.5
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            if state["bug"] != "sum-grads":
                p.grad /= state["world"]
        optimizer.step()
        return loss.detach()
