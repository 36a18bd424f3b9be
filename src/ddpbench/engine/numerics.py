"""The numerics fingerprint: a seeded, untimed replay of a few steps from a freshly set-up state, with
a bitwise digest and summary figures of the trainable state after set-up and after each step
(``extra_info["numerics"]``; docs/design/census-and-memory.md#numerics-fingerprint). It runs on a state of its own,
set up and torn down around it, never on the timed one."""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
from typing import Any, Callable

#: The case's record (combined over ranks, as saved): version 2 names each tensor once (``names``)
#: and gives each rank's step as a list of texts along them; version 1 repeated the names at every
#: step and gave each tensor's figures as a list (six lines each in a saved run's indented JSON).
NUMERICS_VERSION = 2
#: One rank's record (what a rank hands the controller): its steps as ``{name: figures}``. Version 1
#: is what every ddpbench with a numerics replay sends, so an A/B or bisect baseline running an
#: older ddpbench still combines.
RANK_RECORD_VERSION = 1
#: The seed every rank's torch, random and numpy get before each replay's set-up.
NUMERICS_SEED = 0
#: Replays per run: two, so that each run measures its own determinism (its replay-to-replay band).
REPLAYS = 2
#: Hex digits kept of each tensor's digest (the step's digest over all of them keeps all 64).
TENSOR_DIGEST_HEX = 16
# Elements per chunk when summing a tensor in float64 (no float64 copy of a large tensor at once).
_CHUNK = 1 << 20


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


def largest_difference(before: list[dict[str, list]], after: list[dict[str, list]],
                       from_step: int = 0) -> tuple[float, int | None, str | None]:
    """(largest relative difference, its step, its tensor) between two replays' steps (each a list
    of ``{name: figures}`` per step), over the tensors both hold, from ``from_step`` on."""
    worst, step, name = 0.0, None, None
    for s in range(from_step, min(len(before), len(after))):
        for key, figures in after[s].items():
            base = before[s].get(key)
            if base is None or base[0] == figures[0]:
                continue
            diff = relative_difference(base, figures)
            if step is None or diff > worst:
                worst, step, name = diff, s, key
    return worst, step, name


# ----------------------------------------------------------------------------------------------
# The rank side: what to fingerprint, and the replay
# ----------------------------------------------------------------------------------------------


def _named_tensors(targets: list, loss: Any) -> list[tuple[str, Any]]:
    """The trainable state in a fixed order, each tensor once: per module its parameters, their
    gradients and its buffers (DDP's ``module.`` prefix dropped); per optimizer each parameter's
    state (by the parameter's name where a module names it); other tensors; the loss the step
    returned."""
    import torch

    from .memory import _is_ddp

    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    param_names: dict[int, str] = {}

    def add(name: str, tensor) -> None:
        if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
            seen.add(id(tensor))
            out.append((name, tensor))

    modules = [t for t in targets if isinstance(t, torch.nn.Module)]
    for j, module in enumerate(modules):
        prefix = "" if j == 0 else f"{j}:"
        ddp = _is_ddp(module)

        def clean(name: str) -> str:
            return prefix + (name.removeprefix("module.") if ddp else name)

        for name, param in module.named_parameters():
            param_names.setdefault(id(param), clean(name))
            add(f"param {clean(name)}", param)
        for name, param in module.named_parameters():
            if param.grad is not None:
                add(f"grad {clean(name)}", param.grad)
        for name, buffer in module.named_buffers():
            add(f"buffer {clean(name)}", buffer)
    optimizers = [t for t in targets if isinstance(t, torch.optim.Optimizer)]
    for j, optimizer in enumerate(optimizers):
        prefix = "" if j == 0 else f"{j}:"
        index = 0
        for group in optimizer.param_groups:
            for param in group["params"]:
                pname = param_names.get(id(param), f"#{index}")
                index += 1
                for key in sorted(optimizer.state.get(param, {}), key=str):
                    add(f"opt {prefix}{pname}.{key}", optimizer.state[param][key])
    for i, tensor in enumerate(t for t in targets if isinstance(t, torch.Tensor)):
        add(f"tensor {i}", tensor)
    if isinstance(loss, torch.Tensor):
        add("loss", loss)
    elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
        add("loss", torch.tensor(float(loss), dtype=torch.float64))
    return out


def _local(tensor):
    """The tensor's own values on this rank: a DTensor's local shard, detached, on the CPU, dense."""
    if hasattr(tensor, "to_local"):
        tensor = tensor.to_local()
    tensor = tensor.detach()
    if tensor.is_sparse:
        tensor = tensor.to_dense()
    if tensor.is_complex():
        import torch

        tensor = torch.view_as_real(tensor)
    return tensor.cpu().contiguous().reshape(-1)


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
    flat = _local(tensor)
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


def fingerprint(targets: list, loss: Any = None) -> tuple[str, dict[str, list]]:
    """(the step's digest over every tensor in order, ``{name: figures}``) of the state now."""
    step = hashlib.sha256()
    figures: dict[str, list] = {}
    for name, tensor in _named_tensors(targets, loss):
        full, figures[name] = tensor_figures(name, tensor)
        step.update(full)
    return step.hexdigest(), figures


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


def _targets_of(workload, state) -> list:
    """What to fingerprint: the workload's ``numerics_targets``, else its ``memory_census_targets``,
    else what :func:`~.memory.discover_targets` finds (duck-typed workloads lack both hooks)."""
    for hook in ("numerics_targets", "memory_census_targets"):
        method = getattr(workload, hook, None)
        if method is not None:
            return list(method(state))
    from .memory import discover_targets

    return discover_targets(state)


def replay_once(workload, ctx, steps: int, seed: int = NUMERICS_SEED) -> tuple[list[str], list[dict[str, list]]]:
    """One replay: seeds fixed, ``setup``, the state's fingerprint, then ``steps`` rounds (one
    ``run_round`` each) with the fingerprint after each, ``teardown``. Returns the per-step
    digests and figures, step 0 being the freshly set-up state."""
    digests: list[str] = []
    figures: list[dict[str, list]] = []
    with seeded(seed):
        state = workload.setup(ctx)
        try:
            targets = _targets_of(workload, state)
            for step in range(steps + 1):
                loss = None if step == 0 else workload.run_round(state)
                digest, named = fingerprint(targets, loss)
                digests.append(digest)
                figures.append(named)
            del targets
        finally:
            workload.teardown(state)
    return digests, figures


def take_numerics(workload, ctx, steps: int, replays: int = REPLAYS,
                  replay: Callable[..., tuple[list[str], list[dict[str, list]]]] = replay_once) -> dict[str, Any]:
    """This rank's numerics record: ``replays`` replays of ``steps`` steps (:func:`replay_once`),
    the first's digests and figures, and how far the others moved from it (``replay_spread``, the
    largest relative difference; ``first_nondeterministic_step``; ``not_reproducible`` when even
    the freshly set-up state differs between replays)."""
    global _known_figures
    _known_figures = {}
    try:
        runs = [replay(workload, ctx, steps) for _ in range(max(1, replays))]
    except Exception as exc:
        raise RuntimeError(f"the numerics replay of {type(workload).__name__} failed on rank {ctx.rank}: "
                           f"{type(exc).__name__}: {exc} (--dist-numerics-steps 0 runs the case without it)") from exc
    finally:
        _known_figures = None
    digests, figures = runs[0]
    record: dict[str, Any] = {"version": RANK_RECORD_VERSION, "seed": NUMERICS_SEED, "steps": steps,
                              "replays": len(runs), "digests": digests, "tensors": figures}
    spread, first = 0.0, None
    for other_digests, other_figures in runs[1:]:
        differing = [s for s, (a, b) in enumerate(zip(digests, other_digests)) if a != b]
        if len(other_digests) != len(digests) or [sorted(f) for f in other_figures] != [sorted(f) for f in figures]:
            record["not_reproducible"] = "its replays fingerprinted other tensors"
        if not differing:
            continue
        first = differing[0] if first is None else min(first, differing[0])
        if differing[0] == 0:
            _, _, name = largest_difference(figures, other_figures)
            record["not_reproducible"] = (f"the freshly set-up state differs between two replays with the same "
                                          f"seeds ({name or 'the tensors moved'})")
        spread = max(spread, largest_difference(figures, other_figures)[0])
    record["replay_spread"] = spread if math.isfinite(spread) else None
    record["first_nondeterministic_step"] = first
    if first is not None and not math.isfinite(spread):
        record["not_reproducible"] = "a tensor moved from zero between two replays with the same seeds"
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


def combine_numerics(records: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The case's record from every rank's: per step, one digest over every rank's
    (``digests``) and each rank's own (``rank_digests``); every tensor's name once (``names``, in
    the order the ranks first hold them) and per step rank 0's figures as a list of texts along
    them (:func:`figures_text`, null where absent), a later rank's as ``{name: text}`` of the
    tensors whose digest differs from rank 0's (null: rank 0 holds it, this rank does not), so that
    a replicated parameter's figures are kept once (``tensors``); the widest ``replay_spread``, the first nondeterministic
    step, and ``not_reproducible`` / ``incomplete`` where any rank says so."""
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
    spreads = [r.get("replay_spread") for r in present]
    out["replay_spread"] = None if None in spreads else max(spreads)
    firsts = [r["first_nondeterministic_step"] for r in present if r.get("first_nondeterministic_step") is not None]
    out["first_nondeterministic_step"] = min(firsts) if firsts else None
    why = next((f"rank {i}: {r['not_reproducible']}" for i, r in enumerate(present) if r.get("not_reproducible")),
               None)
    if why:
        out["not_reproducible"] = why
    return out
