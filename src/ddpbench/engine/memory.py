"""The memory census: the peak of live tensor bytes on one rank during one untimed step, what held them
and where it fell (``extra_info["memory"]``; docs/design/census-and-memory.md#memory-census)."""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
from typing import Any, Callable, Iterable

from .census import CENSUS_MIN_OPS, ddp_bucket_sizes, workload_census_details
from .torch_trackers import dynamo_stand_in, tracker_module

MEMORY_VERSION = 1

# torch's category names (the trackers' enum values) -> the record's.
_CATEGORY_NAMES = {
    "Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients", "Activation": "activations",
    "Temp": "temporaries", "Optstate": "optimizer_state", "OptState": "optimizer_state", "Other": "other",
    "Sharded Param": "sharded_parameters", "Unsharded Param": "unsharded_parameters",
    "Sharded Grad": "sharded_gradients", "Unsharded Grad": "unsharded_gradients",
    "All Gather": "all_gather_buffers", "Reduce Scatter": "reduce_scatter_buffers", "Inputs": "inputs",
    "Collective buffer": "collective_buffers", "DDP bucket": "ddp_buckets",
}
#: The categories a record may hold, in the order reports show them.
CATEGORIES = ("parameters", "sharded_parameters", "unsharded_parameters", "buffers", "gradients",
              "sharded_gradients", "unsharded_gradients", "optimizer_state", "activations", "temporaries",
              "ddp_buckets", "collective_buffers", "all_gather_buffers", "reduce_scatter_buffers", "inputs", "other")
# What a provisional label at the peak may turn into once a hook or a collective says more.
_FINAL_LABELS = ("Gradient", "Collective buffer", "DDP bucket", "Sharded Grad", "Unsharded Grad", "All Gather",
                 "Reduce Scatter")


def _collective_ref_type(base):
    """``base`` (torch's category enum) with two more categories: DDP's bucket buffers, and other
    buffers handed to a collective (a hand-written loop's, a loss all-reduced in a DDP model). The
    members keep torch's names and values, so torch's own members index the same snapshot keys."""
    _RefType = tracker_module("mem_tracker")._RefType

    members = {member.name: member.value for member in base}
    members["COLLECTIVE"] = "Collective buffer"
    members["DDP_BUCKET"] = "DDP bucket"
    return _RefType(f"_Census{base.__name__.lstrip('_')}", members, module=__name__)


@functools.cache
def _tracker_class(fsdp: bool, skip_dynamo: bool):
    """MemTracker (or FSDPMemTracker) that also labels collective buffers and notes where the peak
    falls. ``skip_dynamo``: as :func:`ddpbench.engine.census._census_mode_class`."""
    if fsdp:
        tools = tracker_module("fsdp2_mem_tracker")
        Base, base_refs = tools.FSDPMemTracker, tools._FSDPRefType
    else:
        tools = tracker_module("mem_tracker")
        Base, base_refs = tools.MemTracker, tools._MemRefType

    from .census import describe_call

    refs = _collective_ref_type(base_refs)
    # torch wraps the tracker's __torch_dispatch__ in torch._dynamo.disable, whose first call imports
    # torch._dynamo (about 1.2 s of CPU); until it is imported no compiled frame can run under the
    # tracker, so the census then calls torch's function itself, as the collective census's mode does.
    base_dispatch = Base.__torch_dispatch__
    if not skip_dynamo:
        base_dispatch = getattr(base_dispatch, "__wrapped__", base_dispatch)
    relabel = ("Activation", "Temp", "Other")  # what a tensor handed to a collective was labelled

    class _CensusTracker(Base):
        def __init__(self, *args):
            super().__init__(*args)
            self._ref_class = refs
            _name_modules_inside_compiled_ones(self._mod_tracker)
            # DDP's bucket buffers, alive all step but out of Python's reach until an op writes one:
            # (device, bytes) counted from the start; each leaves the list when the step first writes
            # a storage of its size that existed before the step (see count_ddp_buckets).
            self._bucket_placeholders: list[tuple[Any, int]] = []
            self._untracked_inputs: dict[int, Any] = {}
            self.peak_where: dict[Any, tuple[str | None, str]] = {}
            # Per device, the storages provisionally labelled at the peak (a temporary, an
            # activation, "other") with their label and bytes then: see relabeled_peak.
            self._peak_provisional: dict[Any, list] = {}
            self.collectives = HandedCollectives()  # what the step hands to collectives (settle)
            self._freed_here: set = set()  # the _WeakRefInfo whose free settle() counted (held: ids are reused)

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return skip_dynamo

        def _where_now(self) -> tuple[str | None, str]:
            names = sorted((n for n in self._mod_tracker.parents if n != "Global"),
                           key=lambda n: (n.count("."), n))
            module = names[-1] if names else None
            phase = ("optimizer" if self._in_opt else "backward" if self._mod_tracker.is_bw
                     else "forward" if module is not None else "outside the model")
            return module, phase

        def _pre_fw_hook(self, module, inputs) -> None:
            try:
                super()._pre_fw_hook(module, inputs)
            except NotImplementedError:
                # The step runs its root module twice (gradient accumulation): torch's tracker
                # refuses a second iteration; its per-module figures (which the record does not
                # use) start over, the running count and the peak go on.
                self.reset_mod_stats()
                super()._pre_fw_hook(module, inputs)

        def _fsdp_state_pre_forward(self, fsdp_mod, orig_pre_forward):
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig_pre_forward)

            def pre_forward(*args, **kwargs):
                # As _pre_fw_hook: FSDPMemTracker refuses the root's second forward in one step.
                if fsdp_mod in self.memory_tracking and not self._mod_tracker.is_bw:
                    name = self._mod_tracker.get_known_fqn(fsdp_mod)
                    if self._mod_tracker.parents - {name} == {"Global"}:
                        self.reset_mod_stats()
                return inner(*args, **kwargs)

            return pre_forward

        def _update_peak_stats(self, peak_state) -> None:
            if self.collectives and any(snap.get("Total", 0) > self._peak_mem.get(dev, 0)
                                    for dev, snap in self._curr_mem_snap.items()):
                self.settle()  # a new peak: first what the program let go of is gone
            # torch's own also keeps each tracked module's peak, walking every module's weak
            # reference at every op (about 60% of a transformer census's CPU); the record uses
            # the step's peak alone, kept as torch keeps it.
            before = dict(self._peak_mem)
            for dev, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snapshot["Total"]:
                    self._peak_mem[dev] = snapshot["Total"]
                    self._peak_mem_snap[dev] = copy.deepcopy(snapshot)
            for dev, peak in self._peak_mem.items():
                if before.get(dev) != peak:
                    self.peak_where[dev] = self._where_now()
                    self._peak_provisional[dev] = [
                        (winfo, winfo.reftype, winfo.mem_consumed) for winfo, _ in self._WINFO.values()
                        if winfo.device == dev and str(winfo.reftype.value) in relabel]

        def relabeled_peak(self) -> dict:
            """The peak snapshot with what the step learnt after the peak: a tensor an op had just
            made when the peak was taken is a temporary (or an activation) to torch's tracker until
            a hook says what it is: a gradient (the parameter's hook runs after the op), a buffer
            handed to a collective (DDP's bucket copy, a hand-written loop's flattened buffer),
            FSDP2's gradient or reduce-scatter buffers. Those move to their final category."""
            peak = self.get_tracker_snapshot("peak")
            for dev, provisional in self._peak_provisional.items():
                snapshot = peak.get(dev)
                if snapshot is None:
                    continue
                for winfo, label, nbytes in provisional:
                    final = winfo.reftype
                    if final != label and str(final.value) in _FINAL_LABELS:
                        snapshot[label] -= nbytes
                        snapshot[final] = snapshot.get(final, 0) + nbytes
            return peak

        def count_ddp_buckets(self, device, sizes: list[int]) -> None:
            """Count DDP's bucket buffers (``sizes`` bytes each, on ``device``) as live from now."""
            snapshot = self._curr_mem_snap.setdefault(device, dict.fromkeys(self._ref_class, 0))
            snapshot.setdefault("Total", 0)
            for nbytes in sizes:
                self._bucket_placeholders.append((device, int(nbytes)))
                snapshot[refs.DDP_BUCKET] += int(nbytes)
                snapshot["Total"] += int(nbytes)

        def _track(self, reftype, t) -> None:
            if self._bucket_placeholders:
                for storage in _storages(t):
                    self._maybe_bucket(storage, t)
            super()._track(reftype, t)

        def _maybe_bucket(self, storage, t) -> None:
            """A storage the step did not make, first written now, with a counted bucket's size:
            that bucket, from now on counted as the storage itself."""
            if storage in self._WINFO or id(storage) not in self._untracked_inputs:
                return
            key = (t.device, int(storage.nbytes()))
            if key not in self._bucket_placeholders:
                return
            self._bucket_placeholders.remove(key)
            snapshot = self._curr_mem_snap[t.device]
            snapshot[refs.DDP_BUCKET] -= key[1]
            snapshot["Total"] -= key[1]
            self._update_and_maybe_create_winfos(t, refs.DDP_BUCKET)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self._bucket_placeholders:  # the storages that existed before this op and are not counted yet
                self._untracked_inputs = _untracked_storages(self._WINFO, args, kwargs)
            namespace = getattr(func, "namespace", None)
            collective = namespace in ("c10d", "_c10d_functional") and describe_call(func, args, kwargs) is not None
            if collective and namespace == "c10d":
                res = self.collectives.run(lambda a, k: base_dispatch(self, func, types, a, k), args, kwargs)
            else:
                res = base_dispatch(self, func, types, args, kwargs)
            self._untracked_inputs = {}
            if collective and res is not NotImplemented:
                self._label_collective_buffers(args)
            return res

        def adopt(self, handed: "HandedCollectives") -> None:
            """Settle what an earlier census handed to collectives (the round just before this
            census): a storage its Works still hold is counted as the program holds it, the same."""
            self.collectives = handed

        def settle(self) -> None:
            """Count the free of every storage handed to a collective that the program no longer
            holds (:meth:`HandedCollectives.settle`). Called before a new peak is taken and after
            each step, so that the peak and what stays after the step count what the program
            holds, not what a backend's thread has yet to drop."""
            for storage in self.collectives.settle():
                winfo, _ = self._WINFO.get(storage, (None, None))
                if winfo is not None:
                    del self._WINFO[storage]
                    self._freed_here.add(winfo)
                    if winfo.mem_consumed > 0:
                        self._update_snap(_update_type().DEL, winfo)

        def _delete_callback(self, winfo, w_st) -> None:
            if winfo in self._freed_here:  # counted already, when the program let it go
                self._freed_here.discard(winfo)
                return
            super()._delete_callback(winfo, w_st)

        def _label_collective_buffers(self, args) -> None:
            import torch
            from torch.utils._pytree import tree_flatten

            for value in tree_flatten(list(args))[0]:
                if not isinstance(value, torch.Tensor):
                    continue
                for storage in _storages(value):
                    winfo, _ = self._WINFO.get(storage, (None, None))
                    if winfo is not None and str(winfo.reftype.value) in relabel:
                        self._update_and_maybe_create_winfos(value, refs.COLLECTIVE)
                        break

    return _CensusTracker


class HandedCollectives:
    """The storages a census hands to collectives, and the collectives' Work. A backend that
    completes a collective on its own thread (gloo's worker, NCCL's watchdog) drops its reference
    to the collective's tensors there, after the program's wait returned: holding the program's
    tensor, it made a storage the program had let go of outlive it for as long as that thread
    waited for a CPU (a census's peak then held the previous step's gradient in some runs). Under
    a census the collective runs on aliases instead (:func:`_aliased`: new tensors on the same
    storages, so it computes the same, in the same memory); the backend holds those, this object
    holds them too, and :meth:`settle` names each storage the program holds nothing on any more,
    whatever the backend's thread does."""

    def __init__(self) -> None:
        # id of the storage -> (the aliases handed for it, ids of the collectives' Work in _works)
        self._handed: dict[int, tuple[list, set]] = {}
        self._works: dict[int, Any] = {}
        # Measured here, out of the tracker's sight: under it their probe tensors would be counted.
        _storage_refs_baseline(), _held_once_refcounts()

    def __bool__(self) -> bool:
        return bool(self._handed)

    def run(self, call: Callable[[tuple, dict], Any], args, kwargs):
        """``call(args, kwargs)`` (a c10d collective) on aliases of its tensors; returns its result
        with the program's own tensors where the op returns its inputs."""
        from torch.utils._pytree import tree_flatten, tree_map

        args, kwargs, aliases = _aliased(args, kwargs)
        res = call(args, kwargs)
        if not aliases or res is NotImplemented:
            return res
        works = [w for w in map(_work, tree_flatten(res)[0]) if w is not None]
        self._works.update((id(w), w) for w in works)
        for _, alias in aliases.values():
            held, work_ids = self._handed.setdefault(id(alias.untyped_storage()), ([], set()))
            held.append(alias)
            work_ids.update(id(w) for w in works)
        originals = {id(alias): tensor for tensor, alias in aliases.values()}
        return tree_map(lambda value: originals.get(id(value), value), res)

    def settle(self) -> list:
        """The storages (torch's storage objects) the program no longer holds, once their
        collectives completed: no tensor of its own on them, only the aliases, and no Work or
        alias (a future's value) referenced from Python but here. They are no longer followed."""
        base = _storage_refs_baseline()
        if base is None or not self._handed:  # a torch that keeps its references otherwise: none settled early
            return []
        freed = []
        for key, (aliases, work_ids) in list(self._handed.items()):
            if _storage_refs(aliases[0]) != len(aliases) + base:
                continue  # the program still holds a tensor on it
            if not all(self._works[i].is_completed() for i in work_ids):
                continue
            held = aliases + [self._works[i] for i in work_ids]
            if _refcounts(held) != [_unshared_refcount(value) for value in held]:
                continue  # ...or a Work, or an alias, from Python
            del self._handed[key]
            kept = set().union(*(ids for _, ids in self._handed.values()))
            for i in work_ids - kept:  # a Work no other storage waits on
                del self._works[i]
            freed.append(aliases[0].untyped_storage())
        return freed

    def release(self) -> None:
        """Drop the aliases and Work objects kept (after the census)."""
        self._handed.clear()
        self._works.clear()


def _aliased(args, kwargs):
    """``args`` and ``kwargs`` with each plain tensor replaced by an alias (a new tensor on the same
    storage, ``detach()``), and {id: (tensor, alias)}: a collective run on the aliases computes the
    same, in the same memory."""
    import torch
    from torch.utils._pytree import tree_map

    aliases: dict[int, Any] = {}

    def alias(value):
        if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided \
                or value.device.type == "meta":
            return value
        if id(value) not in aliases:
            aliases[id(value)] = (value, value.detach())
        return aliases[id(value)][1]

    return tree_map(alias, tuple(args)), tree_map(alias, dict(kwargs or {})), aliases


def _work(value):
    """The c10d Work ``value`` is (as a collective op returns it), or None."""
    import torch

    if not isinstance(value, torch.ScriptObject):
        return None
    try:
        from torch._C._distributed_c10d import Work

        return Work.unbox(value)
    except (ImportError, RuntimeError, TypeError):
        return None


def _refcounts(objects: list) -> list[int]:
    """Each of ``objects``' Python reference count, read as :func:`_unshared_refcount` reads it."""
    return [sys.getrefcount(value) for value in objects]


def _unshared_refcount(value) -> int:
    """What :func:`_refcounts` reads for ``value`` held by one container besides its argument (the
    census's own hold on an alias or a Work, no one else's): a tensor that C++ shares (a Work
    holds it) keeps one more, from torch's hold on its Python object."""
    import torch

    return _held_once_refcounts()[isinstance(value, torch.Tensor) and value._use_count() > 1]


@functools.cache
def _held_once_refcounts() -> tuple[int, int]:
    """:func:`_refcounts` of an object held once, and of a tensor held once in Python and once in C++."""
    import torch

    alone, shared = [object()], [torch.empty(1)]
    owner = torch.nn.Parameter(torch.empty(1))
    owner.grad = shared[0]
    return _refcounts(list(alone))[0], _refcounts(list(shared))[0]


def _update_type():
    return tracker_module("mem_tracker")._UpdateType


def _storage_refs(tensor) -> int:
    """The references to ``tensor``'s storage (one per tensor on it, and its Python object's)."""
    import torch

    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


@functools.cache
def _storage_refs_baseline() -> int | None:
    """What :func:`_storage_refs` reads beyond one reference per tensor on a storage (measured on a
    storage of our own), or None where it does not grow by one per tensor (this torch keeps its
    references otherwise: then no storage is settled early, as before)."""
    import torch

    owner = torch.empty(1)
    first, second = owner.detach(), owner.detach()
    _storage_refs(first)  # its Python object exists from here on, as a tracked storage's does
    three = _storage_refs(first) - 3
    del second
    two = _storage_refs(first) - 2
    del owner
    one = _storage_refs(first) - 1
    return one if one == two == three else None


def _storages(tensor) -> list:
    return list(tracker_module("common_utils").get_untyped_storages(tensor))


def _untracked_storages(tracked, args, kwargs) -> dict[int, Any]:
    """id -> storage of the tensors an op is handed that the tracker does not count yet."""
    import torch
    from torch.utils._pytree import tree_flatten

    found: dict[int, Any] = {}
    for value in tree_flatten((list(args), dict(kwargs or {})))[0]:
        if isinstance(value, torch.Tensor):
            for storage in _storages(value):
                if storage not in tracked:
                    found[id(storage)] = storage
    return found


def _name_modules_inside_compiled_ones(mod_tracker) -> None:
    """Let ``mod_tracker`` (torch's ModTracker) see the modules a compiled module runs. It ignores
    every module inside an ``OptimizedModule`` (so that dynamo traces no hook), which leaves them
    unnamed: FSDPMemTracker then fails (``assert mod_fqn is not None``). Under the census the step
    runs eager (:func:`_compiled_code_runs_eager`), so its hooks run as plain Python. While
    torch._dynamo is not imported no module runs inside a compiled one, and the hooks ask a stand-in
    (:func:`.torch_trackers.dynamo_stand_in`): asking torch._dynamo would import it."""
    for name in ("_fw_pre_hook", "_fw_post_hook"):
        hook = getattr(mod_tracker, name, None)
        if hook is None:
            continue

        def outside(*args, _hook=hook, **kwargs):
            if "torch._dynamo" not in sys.modules:
                with dynamo_stand_in():
                    return _hook(*args, **kwargs)
            from torch._dynamo import eval_frame

            was = getattr(eval_frame, "_in_optimized_module", False)
            eval_frame._in_optimized_module = False
            try:
                return _hook(*args, **kwargs)
            finally:
                eval_frame._in_optimized_module = was

        setattr(mod_tracker, name, outside)


@contextlib.contextmanager
def _compiled_code_runs_eager():
    """The census's steps run torch.compile'd code eager, leaving dynamo untouched. Under a
    (non-infra) dispatch mode dynamo would refuse each compiled frame and mark its code object
    skipped for good, so that every later round, timed ones included, ran eager; with the
    ``force_eager`` stance dynamo's frame hook is off and looks at nothing."""
    if "torch._dynamo" not in sys.modules:  # nothing compiled in this process
        yield
        return
    import warnings

    import torch

    with torch.compiler.set_stance("force_eager"), warnings.catch_warnings():
        # OptimizedModule's warning that the tracker's module hooks fire once more for it: they do
        # (the wrapper is named away, _module_name), and eager, they trace nothing.
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        yield


def discover_targets(state: Any, depth: int = 3) -> list:
    """What a workload's state holds for the census to count from the step's start: its
    ``nn.Module`` objects, optimizers and tensors, found in dicts, lists, tuples and objects'
    attributes ``depth`` levels deep, each once, in the order met (the base
    :meth:`ddpbench.Workload.memory_census_targets`)."""
    import torch

    found: list = []
    seen: set[int] = set()

    def visit(value, level: int) -> None:
        if id(value) in seen or value is None or isinstance(value, (str, bytes, int, float, bool)):
            return
        seen.add(id(value))
        if isinstance(value, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)):
            found.append(value)
            return
        if level >= depth:
            return
        if isinstance(value, dict):
            children: Iterable = value.values()
        elif isinstance(value, (list, tuple, set, frozenset)):
            children = value
        elif hasattr(value, "__dict__") and not isinstance(value, type) and not callable(value):
            children = vars(value).values()
        else:
            return
        for child in children:
            visit(child, level + 1)

    visit(state, 0)
    return found


def _is_fsdp2(module) -> bool:
    if "torch.distributed.fsdp" not in sys.modules:  # nothing can be sharded by fully_shard yet
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _is_ddp(module) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(module, DistributedDataParallel)


def optimizer_facts(optimizer) -> dict[str, Any]:
    """The optimizer's class and, where it has the choice, whether it runs its foreach (multi-tensor)
    kernels: AdamW with ``foreach=True`` holds one more model-sized temporary in its step (the
    default on CUDA, not on the CPU), so a census says which it ran."""
    facts: dict[str, Any] = {"name": type(optimizer).__name__}
    defaults = getattr(optimizer, "defaults", {}) or {}
    if "foreach" in defaults:
        foreach, fused = defaults.get("foreach"), defaults.get("fused")
        if foreach is None and not fused:
            try:
                from torch.optim.optimizer import _default_to_fused_or_foreach

                params = [p for group in optimizer.param_groups for p in group["params"]]
                _, foreach = _default_to_fused_or_foreach(params, bool(defaults.get("differentiable")), False)
            except Exception:  # an optimizer torch cannot place: say it is not known
                foreach = None
        facts["foreach"] = None if foreach is None else bool(foreach)
        if fused is not None:
            facts["fused"] = bool(fused)
    return facts


def _bytes_by_category(snapshot: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in snapshot.items():
        name = _CATEGORY_NAMES.get(str(getattr(key, "value", key)))
        if name is None or not value:
            continue
        out[name] = out.get(name, 0) + int(value)
    return {name: out[name] for name in CATEGORIES if name in out}


def _total(snapshot: dict) -> int:
    return int(snapshot.get("Total", 0))


def _module_name(fqn: str | None, wrapped: dict[str, str] | None = None) -> str | None:
    """A module's name as the model names it: the tracker's ``Root.blocks.0`` without the root's
    class name (and DDP's ``module.``); a root by its class name, and the model a DDP root wraps
    (``wrapped``: the DDP root's name to its model's class) by its class, not DDP's ``module``."""
    if fqn is None:
        return None
    head, _, rest = fqn.partition(".")
    if not rest:
        return head
    if head == "OptimizedModule" and rest.partition(".")[0] == "_orig_mod":  # torch.compile's wrapper
        rest = rest.partition(".")[2]
        if not rest:
            return head
        if rest == "module" or rest.startswith("module."):  # a compiled DDP model
            head = "DistributedDataParallel"
    if head in (wrapped or {}):
        return wrapped[head] if rest == "module" else rest.removeprefix("module.")
    return rest.removeprefix("module.") if head == "DistributedDataParallel" else rest


# What no memory census counts (the record's ``not_counted``; docs/design/census-and-memory.md#memory-census).
NOT_COUNTED = (
    "tensors other threads make",
    "tensors from before the step that memory_census_targets does not name, until an op writes them",
    "memory outside torch tensors (numpy)",
)


def take_memory_census(run: Callable[[], Any], targets: list, *, device=None,
                       incomplete: str | None = None, steps: int = 1,
                       handed: HandedCollectives | None = None) -> dict[str, Any]:
    """Run ``run()`` (one step) ``steps`` times under the memory tracker and return the record: the
    peak over them all (a step that allocates more every other step shows with ``steps=2``).
    ``targets``: the modules, optimizers and tensors alive before the step (:func:`discover_targets`);
    a DistributedDataParallel module's bucket buffers count from the start too. ``device``: the
    rank's device (its figures are the record's); ``incomplete``: why part of the step escapes the
    count (the gates then do not judge it). ``targets`` is emptied once they are registered: a
    reference held here would keep a tensor alive that the step itself lets go. Compiled code runs
    eager under the census, and dynamo's state is left as it was (:func:`_compiled_code_runs_eager`)."""
    import torch

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}: the memory census counts at least one step")
    modules = [t for t in targets if isinstance(t, torch.nn.Module)]
    optimizers = [t for t in targets if isinstance(t, torch.optim.Optimizer)]
    tensors = [t for t in targets if isinstance(t, torch.Tensor)]
    targets.clear()
    fsdp_roots = [m for m in modules if _is_fsdp2(m)]
    skip_dynamo = "torch._dynamo" in sys.modules  # as the collective census: see _tracker_class
    if fsdp_roots:
        tracker = _tracker_class(True, skip_dynamo)(fsdp_roots[0], optimizers[0] if optimizers else None)
        tracker.track_inputs(tuple(tensors))
        method = "FSDPMemTracker"
    else:
        tracker = _tracker_class(False, skip_dynamo)()
        tracker.track_external(*modules, *optimizers, *tensors)
        method = "MemTracker"
    del tensors
    ddps = [m for m in modules if _is_ddp(m)]
    not_counted = list(NOT_COUNTED)
    for ddp in ddps:
        missing = _count_ddp_buckets(tracker, ddp)
        if missing:
            not_counted.append(missing)
    if handed is not None:
        tracker.adopt(handed)
    before = tracker.get_tracker_snapshot("current")
    try:
        with _compiled_code_runs_eager(), tracker:
            for _ in range(steps):
                run()
                tracker.settle()
        after = tracker.get_tracker_snapshot("current")
        peak = tracker.relabeled_peak()
    finally:
        tracker.collectives.release()
    dev = torch.device(device) if device is not None else torch.device("cpu")
    chosen = next((d for d in sorted(peak, key=str) if d.type == dev.type), None)
    if chosen is None and peak:
        chosen = sorted(peak, key=str)[0]
    wrapped = {type(m).__name__: type(m.module).__name__ for m in modules if _is_ddp(m)}
    where = tracker.peak_where.get(chosen, (None, "outside the model"))
    record: dict[str, Any] = {
        "version": MEMORY_VERSION,
        "method": method,
        "device": dev.type,
        "steps_counted": steps,
        "peak_bytes": _total(peak.get(chosen, {})),
        "at_peak": _bytes_by_category(peak.get(chosen, {})),
        "peak_at": {"module": _module_name(where[0], wrapped), "phase": where[1]},
        "before_step_bytes": _total(before.get(chosen, {})),
        "after_step_bytes": _total(after.get(chosen, {})),
        "after_step": _bytes_by_category(after.get(chosen, {})),
        "optimizers": [optimizer_facts(o) for o in optimizers],
        "not_counted": not_counted,
    }
    others = {str(d): _total(s) for d, s in peak.items() if d != chosen and _total(s)}
    if others:
        record["other_devices_peak_bytes"] = others
    if incomplete:
        record["incomplete"] = str(incomplete)
    return record


def _count_ddp_buckets(tracker, ddp) -> str | None:
    """Count ``ddp``'s bucket buffers from the step's start (they are alive all step, but Python
    reaches them only when the reducer writes a gradient in, often after the peak); returns what
    is left uncounted, or None. With ``gradient_as_bucket_view`` a bucket that already backs the
    gradients is counted as them."""
    if not getattr(ddp, "_has_rebuilt_buckets", False):
        return "DDP's buckets before their rebuild in DDP's second step (the census ran before it)"
    try:
        sizes = ddp_bucket_sizes(ddp)
    except Exception as exc:  # a torch whose DDP keeps no logging data: say so, count the rest
        return f"DDP's bucket buffers (their sizes could not be read: {type(exc).__name__})"
    device = next((p.device for p in ddp.parameters()), None)
    if device is None or not sizes:
        return None
    held = [int(s.nbytes()) for p in ddp.parameters() if p.grad is not None for s in _storages(p.grad)
            if s in tracker._WINFO]
    for nbytes in set(held):  # a gradient's storage the size of a bucket: the bucket itself
        if nbytes in sizes:
            sizes.remove(nbytes)
    tracker.count_ddp_buckets(device, sizes)
    return None


def take_memory_census_round(workload, state, ctx, census: dict[str, Any] | None = None,
                             handed: HandedCollectives | None = None) -> dict[str, Any]:
    """The engine's memory census: untimed steps (each one ``run_round``) under the tracker, on every
    rank, as many as the collective census counted (``ops_counted``, at least
    :data:`~.census.CENSUS_MIN_OPS`), so that a step that allocates more every other step (the sync
    step of gradient accumulation) is in the peak: what the workload's ``memory_census_targets``
    names (its modules, optimizers, tensors) counts from the start, every tensor the steps make as
    it is made. ``census``: the case's collective census record, whose ``incomplete`` this record
    shares; without one, the workload's ``census_details`` says what escapes the count (a step on
    another thread). ``handed``: what the collective census's round handed to collectives, settled
    here as this census's own (:class:`HandedCollectives`), then released."""
    targets_of = getattr(workload, "memory_census_targets", None)  # duck-typed workloads lack it
    targets = list(targets_of(state) if targets_of is not None else discover_targets(state))
    steps = max(CENSUS_MIN_OPS, int((census or {}).get("ops_counted") or 1))
    try:
        record = take_memory_census(lambda: workload.run_round(state), targets, device=getattr(ctx, "device", None),
                                    incomplete=(census or {}).get("incomplete"), steps=steps, handed=handed)
    except Exception as exc:
        raise RuntimeError(f"the memory census of {type(workload).__name__}'s step failed on rank {ctx.rank}: "
                           f"{type(exc).__name__}: {exc} (--dist-census=collectives runs the case without it)") from exc
    if census is None:  # steps on threads the tracker cannot see
        incomplete = workload_census_details(workload, state).get("incomplete")
        if incomplete:
            record["incomplete"] = str(incomplete)
    return record


def measured_cuda(record: dict[str, Any], max_allocated: int, max_reserved: int) -> dict[str, Any]:
    """``record`` with the caching allocator's figures over the recorded rounds beside the census
    (``measured``): max allocated, max reserved and census peak / max allocated."""
    out = dict(record)
    out["measured"] = {"max_allocated_bytes": int(max_allocated), "max_reserved_bytes": int(max_reserved),
                       "census_over_allocated": (round(record["peak_bytes"] / max_allocated, 4)
                                                 if max_allocated else None)}
    return out


def combine_memory(records: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The case's memory census from every rank's record (:func:`ddpbench.storage.per_rank.combine`):
    rank 0's whole with ``ranks_counted`` and each rank that counted something else in
    ``other_ranks`` (``ranks_disagree: true``), every rank's peak (``peak_bytes_per_rank``), the
    largest (``max_peak_bytes``); measured CUDA figures: the largest over ranks."""
    from ..storage.per_rank import combine
    from ..storage.records import MEMORY_CASE_KEYS

    present = [r for r in records if r is not None]
    if not present:
        return None
    first = combine(records, MEMORY_CASE_KEYS)
    first["peak_bytes_per_rank"] = [None if r is None else r.get("peak_bytes") for r in records]
    first["max_peak_bytes"] = max(int(r.get("peak_bytes") or 0) for r in present)
    measured = [r["measured"] for r in present if isinstance(r.get("measured"), dict)]
    if measured:
        allocated = max(m["max_allocated_bytes"] for m in measured)
        first["measured"] = {"max_allocated_bytes": allocated,
                             "max_reserved_bytes": max(m["max_reserved_bytes"] for m in measured),
                             "census_over_allocated": (round(first["max_peak_bytes"] / allocated, 4)
                                                       if allocated else None)}
    return first
