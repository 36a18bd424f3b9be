"""The numerics fingerprint: a seeded, untimed replay of a few steps from a freshly set-up state, with
a bitwise digest and summary figures of the trainable state after set-up and after each step, the
figures rounding cannot move (learning rates, step counts, what the workload names), and the band
that rounding-level perturbations of the same replay grow into (``extra_info["numerics"]``;
docs/design/census-and-memory.md#numerics-fingerprint). It runs on a state of its own, set up and
torn down around it, never on the timed one."""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
import types
from dataclasses import dataclass, field
from typing import Any, Callable

#: The case's record (combined over ranks, as saved). Version 3 adds the exact figures
#: (``scalars``), the band and the replays' own spread per step and tensor group; version 2 named
#: each tensor once (``names``) and gave each rank's step as a list of texts along them; version 1
#: repeated the names at every step and gave each tensor's figures as a list.
NUMERICS_VERSION = 3
#: One rank's record (what a rank hands the controller): its steps as ``{name: figures}``. Version 1
#: is what every ddpbench with a numerics replay sends (later ones add keys beside it), so an A/B or
#: bisect baseline running an older ddpbench still combines.
RANK_RECORD_VERSION = 1
#: The seed every rank's torch, random and numpy get before each replay's set-up.
NUMERICS_SEED = 0
#: Plain replays per run: two, so that each run measures its own determinism.
REPLAYS = 2
#: Perturbed replays per run (the band): each moves every parameter and floating input after the
#: set-up's fingerprint, and every gradient as each optimizer step receives it, by one unit in the
#: last place of the step's compute dtype, in a seeded random direction (docs/results.md, "Numerics:
#: the band": the gradients' move stands for a reduction summed in another order).
BAND_REPLAYS = 2
#: Hex digits kept of each tensor's digest (the step's digest over all of them keeps all 64).
TENSOR_DIGEST_HEX = 16
# Elements per chunk when summing a tensor in float64 (no float64 copy of a large tensor at once).
_CHUNK = 1 << 20
# Significand bits (the implicit one included) of the floating dtypes a step may compute in.
_SIGNIFICAND_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}
# Optimizer settings that choose an implementation, not the arithmetic: never compared.
_IMPLEMENTATION_FLAGS = frozenset({"foreach", "fused", "capturable", "differentiable"})
# Path parts that wrappers insert into parameter names (torch.compile, FSDP1, activation checkpointing).
_WRAPPER_PARTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})


# ----------------------------------------------------------------------------------------------
# Relative differences (pure Python: the gate uses them too)
# ----------------------------------------------------------------------------------------------


def relative_difference(before: list, after: list) -> float:
    """How far one tensor's figures ``[digest, l2, l1, sum]`` moved, relative to ``before``'s:
    the largest of |Δl2| / l2, |Δl1| / l1 and |Δsum| / l1 (the sum against the L1 norm, so that a
    sum near zero does not blow up); 0 when the figures are equal, inf when a zero one moved."""
    worst = 0.0
    for a, b, scale in ((before[1], after[1], before[1]), (before[2], after[2], before[2]),
                        (before[3], after[3], before[2])):
        if a == b or (math.isnan(a) and math.isnan(b)):
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            return math.inf
        worst = max(worst, abs(b - a) / abs(scale) if scale else math.inf)
    return worst


#: The kind of a gradient as the last backward before the optimizer step left it, kept where it differs
#: from the gradient the step received (``grad``): a clip that fires, or a hand-written reduction
#: after the backward. Its digest is taken under the ``grad`` name, so equal values read equal.
BACKWARD_GRAD = "backward-grad"


def with_backward_grads(step: dict[str, list]) -> dict[str, list]:
    """A step's figures with each ``backward-grad`` a record left out (equal to its ``grad``) filled
    in: two sides compare the same tensors whichever of them kept it."""
    missing = {f"{BACKWARD_GRAD} {name[5:]}": figures for name, figures in step.items()
               if name.startswith("grad ") and f"{BACKWARD_GRAD} {name[5:]}" not in step}
    return {**step, **missing} if missing else step


def tensor_group(name: str) -> str:
    """The group a tensor's band is measured over: its kind (``param``, ``grad``, ``buffer``,
    ``tensor``, ``loss``), an optimizer state by its key (``opt exp_avg_sq``)."""
    kind, _, rest = name.partition(" ")
    return f"opt {rest.rsplit('.', 1)[-1]}" if kind == "opt" else kind


def group_differences(before: dict[str, list], after: dict[str, list]) -> dict[str, tuple[float, str]]:
    """Per tensor group, (the largest relative difference, its tensor) over the tensors both steps
    hold whose digest differs."""
    out: dict[str, tuple[float, str]] = {}
    before, after = with_backward_grads(before), with_backward_grads(after)
    for name, figures in after.items():
        base = before.get(name)
        if base is None or base[0] == figures[0]:
            continue
        diff, group = relative_difference(base, figures), tensor_group(name)
        if group not in out or diff > out[group][0]:
            out[group] = (diff, name)
    return out


def largest_difference(before: list[dict[str, list]], after: list[dict[str, list]],
                       from_step: int = 0) -> tuple[float, int | None, str | None]:
    """(largest relative difference, its step, its tensor) between two replays' steps (each a list
    of ``{name: figures}`` per step), over the tensors both hold, from ``from_step`` on."""
    worst, step, name = 0.0, None, None
    for s in range(from_step, min(len(before), len(after))):
        for diff, key in group_differences(before[s], after[s]).values():
            if step is None or diff > worst:
                worst, step, name = diff, s, key
    return worst, step, name


# ----------------------------------------------------------------------------------------------
# The rank side: what to fingerprint, under which names
# ----------------------------------------------------------------------------------------------


def _walkable(value: Any) -> bool:
    """An object whose attributes may hold the training state: an instance (callable or not), not
    a function, method, class, module or partial."""
    import functools

    return (hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType,
                                                                  types.MethodType, types.BuiltinFunctionType,
                                                                  functools.partial)))


def discover(state: Any, depth: int = 3) -> list[tuple[str, Any]]:
    """The ``nn.Module`` objects, optimizers and tensors ``state`` holds, with the path they were
    found at (``loop.model``), in dicts, lists, tuples and instances' attributes (a callable state
    object too) ``depth`` levels deep, each once, in the order met."""
    import torch

    found: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def visit(value: Any, path: str, level: int) -> None:
        if value is None or isinstance(value, (str, bytes, int, float, bool, complex)) or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)):
            found.append((path or "state", value))
            return
        if level >= depth:
            return
        if isinstance(value, dict):
            children = [(str(key), child) for key, child in value.items()]
        elif isinstance(value, (list, tuple)):
            children = [(f"[{i}]", child) for i, child in enumerate(value)]
        elif _walkable(value):
            children = list(vars(value).items())
        else:
            return
        for key, child in children:
            visit(child, key if not path else (f"{path}{key}" if key.startswith("[") else f"{path}.{key}"), level + 1)

    visit(state, "", 0)
    return found


def _targets_of(workload, state) -> list[tuple[str | None, Any]]:
    """What to fingerprint, as (path or None, target): the workload's ``numerics_targets`` (a list,
    or a dict naming each), else its ``memory_census_targets`` where it overrides it, else what
    :func:`discover` finds (duck-typed workloads lack both hooks)."""
    from ..workloads.base import Workload

    for hook in ("numerics_targets", "memory_census_targets"):
        method = getattr(workload, hook, None)
        if method is None or getattr(method, "__func__", None) is getattr(Workload, hook):
            continue
        targets = method(state)
        if isinstance(targets, dict):
            return [(str(name), target) for name, target in targets.items()]
        return [(None, target) for target in targets]
    return discover(state)


def _unwrap(module):
    """The module a wrapper trains: through ``torch.compile`` (``_orig_mod``), DDP and DataParallel
    (``module``)."""
    import torch

    while True:
        inner = getattr(module, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            module = inner
        elif isinstance(module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            module = module.module
        else:
            return module


def canonical_name(name: str) -> str:
    """A parameter's name without the parts wrappers insert (``_orig_mod``, FSDP1's and activation
    checkpointing's wrapped modules): the same parameter reads the same however it is wrapped."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def _own_values(tensor):
    """The tensor's values on this rank as it is shaped there (a DTensor's local shard), detached."""
    return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).detach()


def _same_values(copy, tensor) -> bool:
    """Whether ``copy`` (a CPU copy taken earlier) still holds ``tensor``'s values, bit for bit."""
    import torch

    own = _own_values(tensor)
    if own.shape != copy.shape or own.dtype != copy.dtype:
        return False
    if not own.numel():
        return True
    return bool(torch.equal(own.cpu().reshape(-1).contiguous().view(torch.uint8),
                            copy.reshape(-1).contiguous().view(torch.uint8)))


def _local(tensor):
    """The tensor's own values on this rank: a DTensor's local shard, detached, dense, flat."""
    if hasattr(tensor, "to_local"):
        tensor = tensor.to_local()
    tensor = tensor.detach()
    if tensor.is_sparse:
        tensor = tensor.to_dense()
    if tensor.is_complex():
        import torch

        tensor = torch.view_as_real(tensor)
    return tensor.reshape(-1)


# Within one take_numerics: a tensor's full digest -> its figures. The figures are a function of
# what the digest covers (name, dtype, shape, bytes), so a tensor a replay finds as an earlier one
# left it (every tensor of a second replay that reproduces the first) is hashed, not summed again.
_known_figures: dict[bytes, list] | None = None


def _sums(flat) -> tuple[float, float, float]:
    """L2 norm, L1 norm and sum of a flat tensor, in float64, chunk by chunk."""
    import torch

    squares = absolute = total = 0.0
    for start in range(0, flat.numel(), _CHUNK):
        chunk = flat[start:start + _CHUNK].to(torch.float64)
        squares += float(chunk.square().sum())
        absolute += float(chunk.abs().sum())
        total += float(chunk.sum())
    return math.sqrt(squares), absolute, total


def tensor_figures(name: str, tensor) -> tuple[bytes, list]:
    """(its full SHA-256, ``[short digest, l2, l1, sum]``): the digest over the name, dtype, shape
    and raw bytes; the figures summed in float64, chunk by chunk."""
    import torch

    digest = hashlib.sha256(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
    flat = _local(tensor).cpu().contiguous()
    if flat.device.type == "meta":
        return digest.digest(), [digest.hexdigest()[:TENSOR_DIGEST_HEX], 0.0, 0.0, 0.0]
    if flat.numel():
        digest.update(flat.view(torch.uint8).numpy())  # the buffer itself, not a copy of it
    full = digest.digest()
    known = _known_figures.get(full) if _known_figures is not None else None
    if known is not None:
        return full, list(known)
    figures = [digest.hexdigest()[:TENSOR_DIGEST_HEX], *_sums(flat)]
    if _known_figures is not None:
        _known_figures[full] = figures
    return full, list(figures)


def _loss_tensor(loss: Any):
    """The loss ``run_round`` returned as a tensor to fingerprint: a number, or a one-element
    tensor, as a float64 scalar (``loss.item()`` and ``loss`` read the same); a larger tensor as
    it is; None for anything else."""
    import torch

    if isinstance(loss, torch.Tensor):
        if loss.numel() == 1 and loss.is_floating_point() and not hasattr(loss, "to_local"):
            return torch.tensor(float(loss.detach().reshape(-1)[0]), dtype=torch.float64)
        return loss
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return torch.tensor(float(loss), dtype=torch.float64)
    return None


def _plain(value: Any) -> Any:
    """A hyperparameter as a JSON value: a number or bool, a list of them, a one-element tensor's
    value; None for anything else (not compared)."""
    import torch

    if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().reshape(-1)[0])
    if isinstance(value, (list, tuple)) and value and all(_plain(v) is not None for v in value):
        return [_plain(v) for v in value]
    return None


@dataclass(frozen=True)
class Perturbation:
    """A perturbed replay's rounding-level move: every floating parameter and input (and, with
    ``gradients``, every gradient at each optimizer step) moved by one unit in the last place of a
    dtype with ``bits`` significand bits, in a direction drawn from ``seed``, zeros left alone."""

    seed: int
    bits: int = 24
    gradients: bool = False


def _nudge(tensor, generator, bits: int) -> None:
    """``tensor`` (its local values) moved in place by one unit in the last place of a ``bits``-bit
    significand, each element up or down as ``generator`` draws; zeros stay zero (and an infinity
    or NaN what it is)."""
    import torch

    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    if not local.is_floating_point() or not local.numel():
        return
    with torch.no_grad():
        data = local.detach()
        signs = torch.randint(0, 2, data.shape, generator=generator, dtype=torch.int8).to(data.device)
        signs = signs.to(torch.float32).mul_(2).sub_(1).mul_(data != 0)  # +-1, 0 where the value is 0
        _, exponent = torch.frexp(data if data.dtype == torch.float32 else data.float())
        data.add_(torch.ldexp(signs, exponent - bits).to(data.dtype))  # +-2^(e - bits): one unit


class Fingerprint:
    """The trainable state of one replay, named once after set-up: per module (through its
    wrappers) its parameters, their gradients and its buffers; per optimizer each parameter's
    state; other tensors; the loss. Modules are named order-free: the one with the most
    parameters without a prefix, the others by their class. While alive, hooks take each step's
    gradients as the optimizer receives them (``grad``: after a hand-written reduction) and, where
    they differ, as the last backward before it left them (``backward-grad``: reduced by DDP or
    FSDP2, before a clip: a clip that fires hides a gradient summed instead of averaged, as Adam
    cancels a constant scale); and, at each optimizer step, the figures rounding cannot move: each
    parameter group's hyperparameters, its parameter count and how many have a gradient, the
    optimizer's steps."""

    def __init__(self, targets: list[tuple[str | None, Any]], perturbation: Perturbation | None = None):
        import torch

        self.perturbation = perturbation
        self.generator = None
        if perturbation is not None:
            self.generator = torch.Generator().manual_seed(1_000_003 * perturbation.seed + 17)
        self.modules: list[tuple[str, Any]] = []  # (prefix, unwrapped module)
        self.param_names: dict[int, str] = {}
        self.tensors: list[tuple[str, Any]] = []
        self.compiled = False
        modules, seen = [], set()
        for _, target in targets:
            if isinstance(target, torch.nn.Module):
                self.compiled |= hasattr(target, "_orig_mod")
                inner = _unwrap(target)
                if id(inner) not in seen:
                    seen.add(id(inner))
                    modules.append(inner)
        counts = {id(m): sum(p.numel() for p in m.parameters()) for m in modules}
        modules.sort(key=lambda m: (-counts[id(m)], type(m).__name__, _content_key(m)))
        classes: dict[str, int] = {}
        for j, module in enumerate(modules):
            cls = type(module).__name__
            k = classes.get(cls, 0)
            classes[cls] = k + 1
            prefix = "" if j == 0 else (f"{cls}:" if k == 0 else f"{cls}#{k}:")
            self.modules.append((prefix, module))
            for name, param in module.named_parameters():
                self.param_names.setdefault(id(param), prefix + canonical_name(name))
        optimizers = [t for _, t in targets if isinstance(t, torch.optim.Optimizer)]
        optimizers = list({id(o): o for o in optimizers}.values())
        optimizers.sort(key=lambda o: (type(o).__name__, self._first_param_name(o)))
        self.optimizers: list[tuple[str, Any]] = []
        classes = {}
        for optimizer in optimizers:
            cls = type(optimizer).__name__
            k = classes.get(cls, 0)
            classes[cls] = k + 1
            prefix = "" if len(optimizers) == 1 else (f"{cls}:" if k == 0 else f"{cls}#{k}:")
            self.optimizers.append((prefix, optimizer))
        for i, (path, target) in enumerate((p, t) for p, t in targets if isinstance(t, torch.Tensor)):
            self.tensors.append((f"tensor {path if path is not None else i}", target))
        self._hooks = [optimizer.register_step_pre_hook(self._pre_step) for _, optimizer in self.optimizers]
        self._round: dict[int, dict[str, Any]] = {}  # per optimizer: what its first step this round saw
        self._step_grads: dict[str, list] = {}
        self._step_full: dict[str, bytes] = {}
        # The gradients as the last backward left them (reduced, before a clip): see _after_backward.
        self._backward: dict[str, tuple[bytes, list]] | None = None
        self._queued = False
        self._params = [(name, p) for prefix, module in self.modules
                        for name, p in ((prefix + canonical_name(n), p) for n, p in module.named_parameters())]
        if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
            self._hooks += [p.register_post_accumulate_grad_hook(self._on_grad)
                            for _, p in self._params if p.requires_grad]

    def _first_param_name(self, optimizer) -> str:
        for group in optimizer.param_groups:
            for param in group["params"]:
                return self.param_names.get(id(param), "")
        return ""

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # -- what an optimizer step receives ---------------------------------------------------------

    def _group_figures(self, prefix: str, optimizer) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, group in enumerate(optimizer.param_groups):
            for key in sorted(group, key=str):
                if key == "params" or key in _IMPLEMENTATION_FLAGS:
                    continue
                value = _plain(group[key])
                if value is not None:
                    out[f"{prefix}group {i} {key}"] = value
            out[f"{prefix}group {i} params"] = len(group["params"])
            out[f"{prefix}group {i} with grad"] = sum(p.grad is not None for p in group["params"])
        return out

    def _on_grad(self, param) -> None:
        """A parameter's gradient was accumulated: once per backward, take the gradients when the
        backward has finished, after the callbacks queued in it (DDP's and FSDP2's reductions)."""
        if self._queued:
            return
        self._queued = True
        from torch.autograd import Variable

        Variable._execution_engine.queue_callback(
            lambda: Variable._execution_engine.queue_callback(self._after_backward))

    def _after_backward(self) -> None:
        """A copy of each gradient on the CPU (hashed only if the step receives another one: with no
        clip and no reduction of its own, the common case, it is never hashed)."""
        self._queued = False
        self._backward = {}
        seen: set[int] = set()
        for name, param in self._params:
            if param.grad is not None and id(param) not in seen:
                seen.add(id(param))
                self._backward[f"grad {name}"] = _own_values(param.grad).to("cpu", copy=True)

    def _pre_step(self, optimizer, args, kwargs) -> None:
        seen = self._round.get(id(optimizer))
        if seen is not None:
            seen["steps"] += 1
            return
        prefix = next(p for p, o in self.optimizers if o is optimizer)
        self._round[id(optimizer)] = {"steps": 1, "scalars": self._group_figures(prefix, optimizer)}
        taken = []  # (name, param, its gradient as the backward left it where that differs)
        for group in optimizer.param_groups:
            for param in group["params"]:
                name = self.param_names.get(id(param))
                if name is None or param.grad is None or f"grad {name}" in self._step_grads:
                    continue
                # as the backward left it, where that differs (a clip, a hand-written reduction after it)
                backward = (self._backward or {}).get(f"grad {name}")
                taken.append((name, param, None if backward is None or _same_values(backward, param.grad)
                              else backward))
        if self.perturbation is not None and self.perturbation.gradients:  # after that comparison
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        _nudge(param.grad, self.generator, self.perturbation.bits)
        for name, param, backward in taken:
            full, figures = tensor_figures(f"grad {name}", param.grad)  # as the step receives it
            self._step_full[f"grad {name}"], self._step_grads[f"grad {name}"] = full, figures
            if backward is not None:
                key = f"{BACKWARD_GRAD} {name}"
                self._step_full[key], self._step_grads[key] = tensor_figures(f"grad {name}", backward)

    # -- the perturbation ------------------------------------------------------------------------

    def perturb(self) -> None:
        """Move every floating parameter and input tensor by one unit in the last place (the
        perturbation's), in canonical order, so that every rank draws alike for a replicated one."""
        if self.perturbation is None:
            return
        for _, module in self.modules:
            for _, param in module.named_parameters():
                _nudge(param, self.generator, self.perturbation.bits)
        for _, tensor in self.tensors:
            _nudge(tensor, self.generator, self.perturbation.bits)

    # -- the fingerprint -------------------------------------------------------------------------

    def _named(self, loss: Any) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        seen: set[int] = set()

        def add(name: str, tensor) -> None:
            import torch

            if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
                seen.add(id(tensor))
                out.append((name, tensor))

        for prefix, module in self.modules:
            params = [(prefix + canonical_name(n), p) for n, p in module.named_parameters()]
            for name, param in params:
                add(f"param {name}", param)
            for name, param in params:
                if param.grad is not None and f"grad {name}" not in self._step_grads:
                    add(f"grad {name}", param.grad)
            for name, buffer in module.named_buffers():
                add(f"buffer {prefix + canonical_name(name)}", buffer)
        for prefix, optimizer in self.optimizers:
            index = 0
            for group in optimizer.param_groups:
                for param in group["params"]:
                    pname = self.param_names.get(id(param), f"#{index}")
                    index += 1
                    for key in sorted(optimizer.state.get(param, {}), key=str):
                        add(f"opt {prefix}{pname}.{key}", optimizer.state[param][key])
        for name, tensor in self.tensors:
            add(name, tensor)
        loss_tensor = _loss_tensor(loss)
        if loss_tensor is not None:
            add("loss", loss_tensor)
        return out

    def take(self, loss: Any = None, workload=None, state=None) -> tuple[str, dict[str, list], dict[str, Any]]:
        """(the step's digest, ``{name: figures}``, ``{name: exact figure}``) of the state now, the
        gradients as the step's optimizers received them; then a new round begins. The workload's
        ``numerics_scalars`` are asked after a step (``state`` given), not at the set-up."""
        figures: dict[str, list] = dict(self._step_grads)
        fulls: dict[str, bytes] = dict(self._step_full)
        for name, tensor in self._named(loss):
            fulls[name], figures[name] = tensor_figures(name, tensor)
        step = hashlib.sha256()
        for name in sorted(fulls):  # order-free: the same tensors in another order read the same
            step.update(fulls[name])
        scalars: dict[str, Any] = {}
        for prefix, optimizer in self.optimizers:
            seen = self._round.get(id(optimizer))
            scalars.update(seen["scalars"] if seen is not None else self._group_figures(prefix, optimizer))
            scalars[f"{prefix}optimizer steps"] = seen["steps"] if seen is not None else 0
        hook = getattr(workload, "numerics_scalars", None)
        if hook is not None and state is not None:
            for key, value in (hook(state) or {}).items():
                plain = _plain(value)
                if plain is not None:
                    scalars[f"workload {key}"] = plain
        for key in sorted(scalars):
            step.update(f"{key}={scalars[key]!r}".encode())
        self._round, self._step_grads, self._step_full, self._backward = {}, {}, {}, None
        return step.hexdigest(), figures, scalars


def _content_key(module) -> str:
    """A module's parameters' digest: two modules of one class and size are told apart by their
    values, not by the order they were listed in."""
    digest = hashlib.sha256()
    for name, param in module.named_parameters():
        digest.update(tensor_figures(canonical_name(name), param)[0])
    return digest.hexdigest()


def fingerprint(targets: list, loss: Any = None) -> tuple[str, dict[str, list]]:
    """(the step's digest, ``{name: figures}``) of ``targets`` (a list, as a workload's
    ``numerics_targets`` gives it) now."""
    taken = Fingerprint([(None, t) for t in targets])
    try:
        digest, figures, _ = taken.take(loss)
    finally:
        taken.close()
    return digest, figures


@contextlib.contextmanager
def seeded(seed: int):
    """Every generator a set-up may draw from, seeded with ``seed``; their states put back after, so
    that nothing run later in this process draws other numbers than it would have."""
    import torch

    saved: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        saved["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:  # numpy is optional to torch
        numpy = None
    if numpy is not None:
        saved["numpy"] = numpy.random.get_state()
    torch.manual_seed(seed)  # every device's generator
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(saved["torch"])
        random.setstate(saved["random"])
        if "cuda" in saved:
            torch.cuda.set_rng_state_all(saved["cuda"])
        if numpy is not None:
            numpy.random.set_state(saved["numpy"])


@contextlib.contextmanager
def _lowest_compute_dtype(modules: list, found: list):
    """While open, forward hooks on ``modules``' leaf modules note the floating dtypes their
    outputs have (autocast, a bf16 FSDP2 policy): ``found`` gets their names."""
    import torch

    def note(module, args, output):
        for value in (output if isinstance(output, (tuple, list)) else (output,)):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                found.append(str(value.dtype).removeprefix("torch."))

    handles = [m.register_forward_hook(note) for module in modules for m in module.modules()
               if not any(True for _ in m.children())]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class Replay:
    """One replay's fingerprints: per step (0: the freshly set-up state) the digest, each tensor's
    figures and the exact figures; the dtypes the step computed in (None: not looked at)."""

    digests: list[str] = field(default_factory=list)
    figures: list[dict[str, list]] = field(default_factory=list)
    scalars: list[dict[str, Any]] = field(default_factory=list)
    dtypes: list[str] | None = None

    def __iter__(self):  # (digests, figures), as replays were once returned
        return iter((self.digests, self.figures))


def replay_once(workload, ctx, steps: int, seed: int = NUMERICS_SEED, perturbation: Perturbation | None = None,
                watch_dtypes: bool = False) -> Replay:
    """One replay: seeds fixed, ``setup``, the state's fingerprint, the ``perturbation`` (if any),
    then ``steps`` rounds (one ``run_round`` each) with the fingerprint after each, ``teardown``.
    ``watch_dtypes``: note the floating dtypes the modules compute in (not through a compiled
    module, whose hooks would change what it compiles)."""
    out = Replay()
    with seeded(seed):
        state = workload.setup(ctx)
        taken = None
        try:
            taken = Fingerprint(_targets_of(workload, state), perturbation)
            watched: list[str] = []
            watch = watch_dtypes and not taken.compiled
            with (_lowest_compute_dtype([m for _, m in taken.modules], watched) if watch else contextlib.nullcontext()):
                for step in range(steps + 1):
                    loss = None if step == 0 else workload.run_round(state)
                    digest, named, scalars = taken.take(loss, workload, state if step else None)
                    out.digests.append(digest)
                    out.figures.append(named)
                    out.scalars.append(scalars)
                    if step == 0:
                        taken.perturb()
            if watch:
                out.dtypes = sorted(set(watched) | {str(p.dtype).removeprefix("torch.") for _, m in taken.modules
                                                    for p in m.parameters() if p.is_floating_point()})
        finally:
            if taken is not None:
                taken.close()
            del taken
            workload.teardown(state)
    return out


def compute_bits(dtypes: list[str] | None) -> int:
    """The significand bits of the least precise floating dtype the step computed in (float32's 24
    where nothing was seen)."""
    return min((_SIGNIFICAND_BITS[d] for d in dtypes or () if d in _SIGNIFICAND_BITS), default=24)


def _spread(first: Replay, others: list[Replay], steps: int) -> list[dict[str, float]]:
    """Per step, per tensor group, the largest relative difference of ``others`` from ``first``."""
    out: list[dict[str, float]] = [{} for _ in range(steps + 1)]
    for other in others:
        for s in range(min(len(first.figures), len(other.figures))):
            for group, (diff, _) in group_differences(first.figures[s], other.figures[s]).items():
                out[s][group] = max(out[s].get(group, 0.0), diff)
    return out


def _finite(groups: list[dict[str, float]]) -> list[dict[str, float | None]]:
    return [{g: (v if math.isfinite(v) else None) for g, v in step.items()} for step in groups]


def take_numerics(workload, ctx, steps: int, replays: int = REPLAYS, band_replays: int = BAND_REPLAYS,
                  replay: Callable[..., Replay] = replay_once) -> dict[str, Any]:
    """This rank's numerics record: ``replays`` plain replays of ``steps`` steps (:func:`replay_once`),
    the first's digests, figures and exact figures, how far the others moved from it
    (``replay_spread``, per step and group in ``spread``; ``first_nondeterministic_step``;
    ``not_reproducible`` when even the freshly set-up state differs between replays); then
    ``band_replays`` perturbed replays (:class:`Perturbation`) and how far each step and tensor
    group moved (``band``), and the exact figures they moved (``rounding_scalars``)."""
    global _known_figures
    _known_figures = {}
    try:
        return _take_numerics(workload, ctx, steps, replays, band_replays, replay)
    finally:
        _known_figures = None


def _take_numerics(workload, ctx, steps: int, replays: int, band_replays: int,
                   replay: Callable[..., Replay]) -> dict[str, Any]:
    try:
        runs = [replay(workload, ctx, steps, watch_dtypes=(i == 0)) for i in range(max(1, replays))]
    except Exception as exc:
        raise RuntimeError(f"the numerics replay of {type(workload).__name__} failed on rank {ctx.rank}: "
                           f"{type(exc).__name__}: {exc} (--dist-numerics-steps 0 runs the case without it)") from exc
    first = runs[0]
    record: dict[str, Any] = {"version": RANK_RECORD_VERSION, "seed": NUMERICS_SEED, "steps": steps,
                              "replays": len(runs), "digests": first.digests, "tensors": first.figures,
                              "scalars": first.scalars}
    spread, first_step = 0.0, None
    for other in runs[1:]:
        differing = [s for s, (a, b) in enumerate(zip(first.digests, other.digests)) if a != b]
        if len(other.digests) != len(first.digests) or [sorted(f) for f in other.figures] != [sorted(f) for f in first.figures]:
            record["not_reproducible"] = "its replays fingerprinted other tensors"
        if not differing:
            continue
        first_step = differing[0] if first_step is None else min(first_step, differing[0])
        if differing[0] == 0:
            _, _, name = largest_difference(first.figures[:1], other.figures[:1])
            moved = name or next((k for k in sorted(first.scalars[0]) if first.scalars[0][k] != other.scalars[0].get(k)),
                                 None)
            record["not_reproducible"] = (f"the freshly set-up state differs between two replays with the same "
                                          f"seeds ({moved or 'the tensors moved'})")
        spread = max(spread, largest_difference(first.figures, other.figures)[0])
    record["replay_spread"] = spread if math.isfinite(spread) else None
    record["first_nondeterministic_step"] = first_step
    record["spread"] = _finite(_spread(first, runs[1:], steps))
    if first_step is not None and not math.isfinite(spread):
        record["not_reproducible"] = "a tensor moved from zero between two replays with the same seeds"
    bits = compute_bits(first.dtypes)
    record["compute_dtypes"] = first.dtypes
    tensors = any(first.figures[s] for s in range(len(first.figures)))
    if band_replays and steps and tensors and "not_reproducible" not in record:  # nothing to move: no band
        try:
            perturbed = [replay(workload, ctx, steps, perturbation=Perturbation(k + 1, bits, gradients=True))
                         for k in range(band_replays)]
        except Exception as exc:
            raise RuntimeError(f"the numerics band's replay of {type(workload).__name__} failed on rank {ctx.rank}: "
                               f"{type(exc).__name__}: {exc} (--dist-numerics-steps 0 runs the case without it)") from exc
        if any(p.digests[0] != first.digests[0] for p in perturbed):
            record["not_reproducible"] = "the freshly set-up state differs between two replays with the same seeds"
        record["band"] = _finite(_spread(first, perturbed, steps))
        record["band_replays"] = len(perturbed)
        record["band_bits"] = bits
        record["rounding_scalars"] = sorted({key for p in perturbed for s in range(min(len(p.scalars), len(first.scalars)))
                                             for key, value in p.scalars[s].items() if first.scalars[s].get(key) != value})
    return record


# ----------------------------------------------------------------------------------------------
# The controller side: every rank's record into the case's
# ----------------------------------------------------------------------------------------------


def figures_text(figures: list) -> str:
    """A tensor's ``[digest, l2, l1, sum]`` as one text, ``"<digest> <l2> <l1> <sum>"`` (each float
    by ``repr``, which reads back exactly): one JSON value, so a saved run's indented JSON gives a
    tensor one line, not six."""
    return " ".join([str(figures[0]), *(repr(float(v)) for v in figures[1:])])


def _row(names: list[str], step: dict[str, list]) -> list:
    """Rank 0's step along ``names``: each tensor's figures as text, null where it lacks it."""
    return [None if step.get(name) is None else figures_text(step[name]) for name in names]


def _differences(step: dict[str, list], base: dict[str, list]) -> dict[str, str | None]:
    """A later rank's step against rank 0's (``base``): the tensors whose digest differs, as text,
    and null for those rank 0 holds and it lacks (a tensor not named is as rank 0's)."""
    out: dict[str, str | None] = {name: None for name in base if name not in step}
    out.update({name: figures_text(figures) for name, figures in step.items()
                if name not in base or base[name][0] != figures[0]})
    return out


def _scalar_differences(step: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A later rank's exact figures against rank 0's: those that differ, null for one it lacks."""
    out: dict[str, Any] = {name: None for name in base if name not in step}
    out.update({name: value for name, value in step.items() if base.get(name) != value or name not in base})
    return out


def _widest(per_rank: list[list[dict[str, float | None]] | None], steps: int) -> list[dict[str, float | None]] | None:
    """Per step and group, the largest over the ranks (null, a difference from zero, stays null)."""
    if not per_rank or any(r is None for r in per_rank):
        return None
    out: list[dict[str, float | None]] = []
    for s in range(steps):
        step: dict[str, float | None] = {}
        for rank in per_rank:
            for group, value in (rank[s] if s < len(rank) else {}).items():
                if group in step and (step[group] is None or value is None):
                    step[group] = None
                else:
                    step[group] = value if group not in step else max(step[group], value)
        out.append(step)
    return out


def combine_numerics(records: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The case's record from every rank's: per step, one digest over every rank's
    (``digests``) and each rank's own (``rank_digests``); every tensor's name once (``names``, in
    the order the ranks first hold them) and per step rank 0's figures as a list of texts along
    them (:func:`figures_text`, null where absent), a later rank's as ``{name: text}`` of the
    tensors whose digest differs from rank 0's (null: rank 0 holds it, this rank does not), so that
    a replicated parameter's figures are kept once (``tensors``); the exact figures likewise
    (``scalars``); the widest ``replay_spread``, per step and group the widest ``spread`` and
    ``band``, the first nondeterministic step, and ``not_reproducible`` / ``incomplete`` where any
    rank says so."""
    present = [r for r in records if r is not None]
    if not present:
        return None
    first = records[0] if records[0] is not None else present[0]
    out: dict[str, Any] = {"version": NUMERICS_VERSION}
    out.update({k: first[k] for k in ("seed", "steps", "replays") if k in first})
    out["ranks"] = len(records)
    if len(present) != len(records):
        out["incomplete"] = f"{len(records) - len(present)} of {len(records)} ranks recorded no numerics"
        return out
    if any(r.get("version") != first.get("version") for r in present):
        out["incomplete"] = "the ranks recorded numerics of different versions"
        return out
    steps = min(len(r.get("digests") or []) for r in present)
    out["digests"] = [hashlib.sha256("".join(r["digests"][s] for r in present).encode()).hexdigest()
                      for s in range(steps)]
    out["rank_digests"] = [list(r["digests"][:steps]) for r in present]
    names = list(dict.fromkeys(name for r in present for step in r["tensors"][:steps] for name in step))
    base = first["tensors"][:steps]
    out["names"] = names
    out["tensors"] = [[_row(names, step) for step in base]] + [
        [_differences(r["tensors"][s], base[s]) for s in range(steps)] for r in present[1:]]
    if all("scalars" in r for r in present):
        scalars = first["scalars"][:steps]
        out["scalars"] = [list(scalars)] + [[_scalar_differences(r["scalars"][s], scalars[s]) for s in range(steps)]
                                            for r in present[1:]]
    spreads = [r.get("replay_spread") for r in present]
    out["replay_spread"] = None if None in spreads else max(spreads)
    firsts = [r["first_nondeterministic_step"] for r in present if r.get("first_nondeterministic_step") is not None]
    out["first_nondeterministic_step"] = min(firsts) if firsts else None
    if all("spread" in r for r in present):
        out["spread"] = _widest([r["spread"] for r in present], steps)
    if all("band" in r for r in present):
        out["band"] = _widest([r["band"] for r in present], steps)
        out["band_replays"] = min(r.get("band_replays", 0) for r in present)
        out["band_bits"] = min(r.get("band_bits", 24) for r in present)
        out["rounding_scalars"] = sorted({k for r in present for k in r.get("rounding_scalars") or ()})
    dtypes = {d for r in present for d in r.get("compute_dtypes") or ()}
    if dtypes:
        out["compute_dtypes"] = sorted(dtypes)
    why = next((f"rank {i}: {r['not_reproducible']}" for i, r in enumerate(present) if r.get("not_reproducible")),
               None)
    if why:
        out["not_reproducible"] = why
    return out


def across_processes(records: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The first of several case records of one program replayed in other processes (A/B: a side's
    pools), marked ``not_reproducible`` where their set-up or steps differ although each process's
    own replays agree: what a per-process salt (``hash()`` of a text, the process id) does."""
    present = [r for r in records if r is not None]
    if not present:
        return None
    first = present[0]
    if len(present) < 2 or first.get("not_reproducible") or first.get("incomplete"):
        return first
    for other in present[1:]:
        if other.get("not_reproducible") or other.get("incomplete") or other.get("digests") == first.get("digests"):
            continue
        if other.get("first_nondeterministic_step") is not None or first.get("first_nondeterministic_step") is not None:
            continue  # replays that differ within one process: their band already speaks
        digests_a, digests_b = first.get("digests") or [], other.get("digests") or []
        step = next((s for s, (a, b) in enumerate(zip(digests_a, digests_b)) if a != b), None)
        where = "the freshly set-up state" if step == 0 else f"step {step}"
        return {**first, "not_reproducible": (f"its replays in two processes differ from {where}, while each "
                                              f"process's own replays agree: a per-process salt (hash() of a "
                                              f"text, the process id) or the OS's entropy")}
    return first


def numerics_band_plan(plan, side: str, pool: int):
    """The round plan a side's pool runs an A/B case with: the band's perturbed replays on the
    baseline's first pool only (the verdict judges against the baseline's band); a later pool one
    plain replay (its first pool's two tell the side's own determinism; a later one only whether
    two processes replay alike, :func:`across_processes`). A/B's numerics then cost what they did
    before the band: 2 + 2 + 1 + 1 plain replays and 2 perturbed on two pools a side, where each
    pool ran two."""
    import dataclasses

    if not hasattr(plan, "numerics_band_replays"):
        return plan
    if pool > 0:
        return dataclasses.replace(plan, numerics_band_replays=0, numerics_replays=1)
    return plan if side == "baseline" else dataclasses.replace(plan, numerics_band_replays=0)


def mark_not_reproducible(rank_metrics: list[dict[str, Any]], combined: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each rank's metrics, rank 0's numerics marked ``not_reproducible`` where the case's record
    (``combined``: :func:`across_processes`) found what one process cannot see and its ranks did not
    say: so the saved record says it too."""
    why = (combined or {}).get("not_reproducible")
    if not why or not rank_metrics or not isinstance(rank_metrics[0], dict):
        return rank_metrics
    numerics = rank_metrics[0].get("numerics")
    if not isinstance(numerics, dict) or numerics.get("not_reproducible"):
        return rank_metrics
    return [{**rank_metrics[0], "numerics": {**numerics, "not_reproducible": why}}, *rank_metrics[1:]]
