"""The check's reference step: a single-process SGD step in float64 on every rank's micro-batches
of one step, gathered, and how an implementation's step is compared with it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from .models import build_model, loss_fn
from .settings import TrainingSettings


def check_rtol(device_type: str) -> float:
    """Training.check's tolerance, relative to each parameter's gradient / update norm. The loops
    run in float32 (CPU: ~1e-6 off the float64 reference); on CUDA the checked step runs with TF32
    off (:func:`_full_float32`), and cuDNN / cuBLAS may still sum in other orders and pick other
    algorithms, hence the looser bound there."""
    return 1e-2 if device_type == "cuda" else 1e-3


@contextlib.contextmanager
def _full_float32(device_type: str):
    """TF32 off for cuDNN convolutions and cuBLAS matmuls while the checked step runs on CUDA
    (cuDNN's default is on; its 10-bit mantissa would leave the check comparing TF32 rounding).
    The timed rounds keep the defaults a user's loop runs with."""
    if device_type != "cuda":
        yield
        return
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def max_pool_routing(model):
    """While active, records which element of each window every ``nn.MaxPool2d`` of ``model``
    picks, per forward call; yields one list of index tensors per pooling layer (in module order).

    The float64 reference must route the gradient through the same elements as the float32 step:
    where two values of a window are within float32 rounding of each other, float64 can pick the
    other one and send that window's gradient elsewhere (cnn, CPU: 0.6% off on the first
    convolution's weight after one particular number of training steps)."""
    import torch.nn as nn
    import torch.nn.functional as F

    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    routes: list[list] = [[] for _ in pools]

    def recorder(k, pool):
        def hook(module, args, output):
            _, indices = F.max_pool2d(args[0].detach(), pool.kernel_size, pool.stride, pool.padding,
                                      pool.dilation, pool.ceil_mode, return_indices=True)
            routes[k].append(indices)
        return hook

    handles = [pool.register_forward_hook(recorder(k, pool)) for k, pool in enumerate(pools)]
    try:
        yield routes
    finally:
        for handle in handles:
            handle.remove()


class _RoutedMaxPool:
    """A max-pooling layer that takes the elements ``indices`` name (from max_pool_routing)."""

    def __new__(cls, indices):
        import torch.nn as nn

        class RoutedMaxPool(nn.Module):
            def __init__(self):
                super().__init__()
                self.indices = indices

            def forward(self, x):
                picked = x.flatten(2).gather(2, self.indices.flatten(2).to(x.device))
                return picked.view(self.indices.shape)

        return RoutedMaxPool()


def reference_step(workload: TrainingSettings, state_dict, inputs, targets, momentum, pool_routes=None):
    """One single-process SGD step in float64 from ``state_dict`` on the global batch
    (``inputs``, ``targets``: every rank's micro-batches of the step, concatenated).

    Returns (gradient, parameter update) flattened in parameter order: the gradient of the mean
    loss over the global batch (what the average over ranks of the average over equal-sized
    micro-batches must equal) and ``-lr * (momentum * buffer + gradient)`` (torch's SGD with
    momentum; the buffers are the implementation's from before the step, None where it had none).
    ``pool_routes``: per max-pooling layer, the indices the implementation's step picked for the
    whole global batch; the reference pools the same elements.
    """
    import torch
    import torch.nn as nn

    model = build_model(workload.model).to(torch.float64)
    model.load_state_dict({k: v.to(torch.float64) if v.is_floating_point() else v
                           for k, v in state_dict.items()})
    if pool_routes:
        parents = [(parent, name) for parent in model.modules()
                   for name, child in parent.named_children() if isinstance(child, nn.MaxPool2d)]
        for (parent, name), indices in zip(parents, pool_routes):
            setattr(parent, name, _RoutedMaxPool(indices))
    model.to(inputs.device)
    x = inputs.to(torch.float64) if inputs.is_floating_point() else inputs
    loss_fn(model(x), targets).backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grad = torch.cat([p.grad.reshape(-1) for p in params]).cpu()
    steps = []
    for p, buf in zip(params, momentum):
        g = p.grad.reshape(-1).cpu()
        if buf is not None and workload.momentum:
            g = buf.reshape(-1).to("cpu", torch.float64) * workload.momentum + g
        steps.append(g * -workload.lr)
    return grad, torch.cat(steps)


def _gather_cat(tensor):
    """Every rank's ``tensor`` (same shape on each), concatenated along dim 0 in rank order."""
    import torch
    import torch.distributed as dist

    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts)


@dataclass
class StepComparison:
    """An implementation's step against the reference's, parameter by parameter: the gradient it
    left (``grads``) and how far the parameters moved (``moved``), each relative to the
    reference's norm (the update: plus ``rounding``, the parameter's own storage rounding, which a
    small update can be near)."""

    names: list[str]
    sizes: list[int]
    grads: Any
    grad_ref: Any
    moved: Any
    update_ref: Any
    rounding: list[float]
    rtol: float
    world_size: int

    def problems(self) -> list[str]:
        """What is wrong with the step (empty when nothing)."""
        return self._gradient_problems() + self._update_problems()

    def _gradient_problems(self) -> list[str]:
        gnorm = float(self.grad_ref.norm())
        if float(self.grads.norm()) == 0.0 and gnorm > 0:
            return [f"every gradient is zero after the step (the reference's norm is {gnorm:.3g})"]
        wrong = []
        for name, g, r in zip(self.names, self.grads.split(self.sizes), self.grad_ref.split(self.sizes)):
            err = float((g - r).norm()) / max(float(r.norm()), 1e-12 * gnorm, 1e-300)
            if not err <= self.rtol:
                wrong.append((err, name))
        if not wrong:
            return []
        scale = float((self.grads * self.grad_ref).sum()) / max(gnorm * gnorm, 1e-300)
        hint = ""
        if float((self.grads - self.grad_ref * scale).norm()) <= self.rtol * gnorm * max(abs(scale), 1.0):
            hint = f"; the gradient is {scale:.4g} x the reference's"
            if self.world_size > 1 and abs(scale - self.world_size) <= self.rtol * self.world_size:
                hint += (f" (= the world size: a reduction that sums over the {self.world_size} "
                         f"ranks without dividing by the world size)")
        worst = max(wrong)
        return [f"the reduced gradient differs in {len(wrong)} of {len(self.sizes)} parameters "
                f"(worst {worst[1]}: off by {worst[0]:.3g} of its norm, tolerance {self.rtol:g})" + hint]

    def _update_problems(self) -> list[str]:
        unorm = float(self.update_ref.norm())
        if float(self.moved.norm()) == 0.0 and unorm > 0:
            return [f"the parameters did not move in the optimizer step (the reference moves "
                    f"them by a norm of {unorm:.3g}): the step was skipped or had nothing to apply"]
        wrong = []
        for name, m, u, floor in zip(self.names, self.moved.split(self.sizes), self.update_ref.split(self.sizes),
                                     self.rounding):
            size = max(float(u.norm()), 1e-12 * unorm, 1e-300)
            err = float((m - u).norm()) / size
            if not err <= self.rtol + floor / size:
                wrong.append((err, name))
        if not wrong:
            return []
        worst = max(wrong)
        return [f"the parameters moved differently from the reference's SGD update in {len(wrong)} of "
                f"{len(self.sizes)} parameters (worst {worst[1]}: off by {worst[0]:.3g} of the update's "
                f"norm, tolerance {self.rtol:g})"]
