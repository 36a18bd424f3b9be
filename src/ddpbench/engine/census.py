"""The collective census: every collective one rank issues while a callable runs, counted by kind,
dtype, process group and peer, with each call's payload bytes (``extra_info["census"]``;
docs/design/census-and-memory.md#collective-census)."""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, NamedTuple

# Version 2: each entry also names its group (``group``) and, for send/recv, its ``peer``, and says
# when its bytes depend on the data (``data_dependent_bytes``); a record may say its collectives
# vary between steps (``varies_between_steps``, with each op's entries in ``steps``) and how many ops
# it counted (``ops_counted``); a case's record keeps every rank's (``ranks_counted``, ``other_ranks``).
CENSUS_VERSION = 2
CENSUS_METHOD = "dispatch:c10d"

#: torch.distributed's names for the kinds a record may hold.
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "gather",
         "scatter", "barrier", "send", "recv")

# The engine's census round counts at least this many ops, each apart: a step whose collectives
# differ between steps (one every other step) shows as such instead of as whichever phase one op
# happened to be.
CENSUS_MIN_OPS = 2

# The fields of an entry that tell one family of calls from another (its key).
ENTRY_KEY = ("kind", "dtype", "group_size", "group", "peer")


def _nbytes(value) -> int:
    """Payload bytes of a tensor, or of the tensors in (nested) lists of them."""
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    nbytes = getattr(value, "nbytes", None)
    return int(nbytes) if nbytes is not None else 0


def _first_tensor(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            found = _first_tensor(v)
            if found is not None:
                return found
        return None
    return value if hasattr(value, "dtype") and hasattr(value, "nbytes") else None


def _dtype_name(value) -> str:
    tensor = _first_tensor(value)
    return "none" if tensor is None else str(tensor.dtype).removeprefix("torch.")


def _process_group(pg):
    """The ProcessGroup the dispatcher hands over (a boxed ScriptObject), a group name, or a group."""
    from torch.distributed import ProcessGroup

    if isinstance(pg, ProcessGroup):
        return pg
    if isinstance(pg, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(pg)
    return ProcessGroup.unbox(pg)


def group_identity(pg) -> str:
    """Which group a collective ran on, as the record names it: ``world`` for the default group, the
    description torch gives a group (a DeviceMesh dimension's group is ``mesh_<its name>``, so two
    dimensions of one size stay apart), else ``ranks`` and the group's global ranks. The size is a
    field of its own."""
    import torch.distributed as dist

    desc = getattr(pg, "group_desc", "") or ""
    if desc == "default_pg" or pg is getattr(dist.group, "WORLD", None):
        return "world"
    if desc and desc != "undefined":
        return desc
    from ..storage.per_rank import ranks_text  # one spelling of rank runs: "0-3", "0,2"

    try:
        return "ranks " + ranks_text(dist.get_process_group_ranks(pg))
    except Exception:  # a group torch.distributed does not list (made by hand): its name
        return f"group {pg.group_name}"


def _peer_offset(pg, peer: int | None, is_global: bool) -> int | str:
    """A send's or recv's peer as an offset from this rank within the group (+1: the next rank,
    -1: the previous one), so that ranks exchanging in a ring record the same; "any" for a receive
    from any source."""
    if peer is None:
        return "any"
    if is_global:
        import torch.distributed as dist

        try:
            peer = dist.get_group_rank(pg, int(peer))
        except Exception:  # not a rank of a listed group: the peer as given
            pass
    size = int(pg.size())
    offset = (int(peer) - int(pg.rank())) % size
    return offset - size if offset > size // 2 else offset


@functools.cache
def _object_collective_code() -> frozenset:
    """The code of torch.distributed's object collectives: their payload is a pickle, whose length
    depends on the objects (a longer string is more bytes), so the census does not judge it."""
    import inspect

    import torch.distributed.distributed_c10d as c10d

    names = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
             "send_object_list", "recv_object_list")
    return frozenset(inspect.unwrap(getattr(c10d, name)).__code__ for name in names if hasattr(c10d, name))


def _inside_object_collective() -> bool:
    codes = _object_collective_code()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


class Call(NamedTuple):
    """One counted collective: its entry's key (kind, dtype, group size, group, peer), its payload
    bytes, why those bytes depend on the data (None: they do not), the group's name in this process,
    how far it moves that group's sequence number (the unseen check) and an all_to_all's uneven
    split sizes (how the census tells splits that stay from splits the data sets)."""

    kind: str
    dtype: str
    group_size: int
    group: str
    peer: int | str | None
    nbytes: int
    data_dependent: str | None
    group_name: str
    sequence_steps: int = 1
    splits: tuple | None = None


# c10d op name -> (kind, argument holding the payload, argument holding the process group). The
# payload is what each rank contributes or receives as the record defines it: all_gather its
# output, reduce_scatter its input, gather its input, scatter its output (what every rank holds;
# non-root ranks pass no scatter input), every other kind its tensor(s).
_C10D = {
    "allreduce_": ("all_reduce", "tensors", "process_group"),
    "allreduce_coalesced_": ("all_reduce", "tensors", "process_group"),
    "allgather_": ("all_gather", "output_tensors", "process_group"),
    "_allgather_base_": ("all_gather", "output_tensor", "process_group"),
    "allgather_coalesced_": ("all_gather", "output_lists", "process_group"),
    "allgather_into_tensor_coalesced_": ("all_gather", "outputs", "process_group"),
    "reduce_scatter_": ("reduce_scatter", "input_tensors", "process_group"),
    "_reduce_scatter_base_": ("reduce_scatter", "input_tensor", "process_group"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "inputs", "process_group"),
    "broadcast_": ("broadcast", "tensors", "process_group"),
    "alltoall_": ("all_to_all", "input_tensors", "process_group"),
    "alltoall_base_": ("all_to_all", "input", "process_group"),
    "reduce_": ("reduce", "tensors", "process_group"),
    "gather_": ("gather", "input_tensors", "process_group"),
    "scatter_": ("scatter", "output_tensors", "process_group"),
    "barrier": ("barrier", None, "process_group"),
    "monitored_barrier_": ("barrier", None, "process_group"),
    "send": ("send", "tensors", "process_group"),
    "recv_": ("recv", "tensors", "process_group"),
    "recv_any_source_": ("recv", "tensors", "process_group"),
}

# _c10d_functional op name -> (kind, payload argument, bytes multiplier from group_size?). The
# functional all_gather returns a new tensor group_size times its input: that is its payload.
_FUNCTIONAL = {
    "all_reduce": ("all_reduce", "input", False),
    "all_reduce_": ("all_reduce", "input", False),
    "all_reduce_coalesced": ("all_reduce", "inputs", False),
    "all_reduce_coalesced_": ("all_reduce", "inputs", False),
    "all_gather_into_tensor": ("all_gather", "input", True),
    "all_gather_into_tensor_out": ("all_gather", "input", True),
    "all_gather_into_tensor_coalesced": ("all_gather", "inputs", True),
    "reduce_scatter_tensor": ("reduce_scatter", "input", False),
    "reduce_scatter_tensor_out": ("reduce_scatter", "input", False),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "inputs", False),
    "all_to_all_single": ("all_to_all", "input", False),
    "broadcast": ("broadcast", "input", False),
    "broadcast_": ("broadcast", "input", False),
    "isend": ("send", "tensor", False),
    "irecv": ("recv", "tensor", False),
}

# Namespaces whose ops communicate but which the census does not count: a case issuing one is
# incomplete (symmetric-memory collectives move no process group's sequence number, and the legacy
# functional ops run their collective inside the op, where the mode is off).
_UNCOUNTED_NAMESPACES = {"symm_mem": "symmetric-memory ops are not counted",
                         "c10d_functional": "the legacy functional collectives are not counted"}


def _bound_arguments(func, args, kwargs) -> dict[str, Any]:
    named = {argument.name: value for argument, value in zip(func._schema.arguments, args)}
    named.update(kwargs or {})
    return named


def _call(kind, tensors, pg, nbytes=None, peer=None, splits=None, steps=1) -> Call:
    """``splits``: an all_to_all's uneven split sizes, its bytes marked ``splits`` (data-dependent)
    unless every op the census counts splits alike (:meth:`CollectiveCensus._settle_splits`)."""
    size = int(pg.size())
    data_dependent = "splits" if splits is not None else "object" if _inside_object_collective() else None
    return Call(kind, "none" if tensors is None else _dtype_name(tensors), size, group_identity(pg), peer,
                _nbytes(tensors) if nbytes is None else int(nbytes), data_dependent, pg.group_name, steps,
                splits)


def _uneven(sizes) -> bool:
    return bool(sizes) and len({int(s) for s in sizes}) > 1


def _uneven_splits(*sizes) -> tuple | None:
    """The split sizes as a call's mark when some are uneven (even or none: None; their bytes are the
    tensor's, whatever the data)."""
    return tuple(tuple(int(s) for s in each or ()) for each in sizes) if any(_uneven(s) for s in sizes) else None


def _c10d_call(name: str, named: dict) -> list[Call]:
    kind, payload, group = _C10D[name]
    pg = _process_group(named.get(group))
    if payload is None:  # a barrier: no payload (its placeholder tensor is not data)
        steps = 1
        if name == "monitored_barrier_":  # gloo's: rank 0 receives from and answers each other rank
            steps = 2 * (int(pg.size()) - 1) if int(pg.rank()) == 0 else 2
        return [_call(kind, None, pg, 0, steps=steps)]
    tensors = named.get(payload)
    peer = None
    if kind in ("send", "recv"):
        peer = _peer_offset(pg, named.get("dst", named.get("src")), is_global=False)
    splits = None  # the caller's uneven split sizes: in a mixture of experts, set by the data
    if name == "alltoall_base_":
        splits = _uneven_splits(named.get("input_split_sizes"), named.get("output_split_sizes"))
    elif name == "alltoall_":
        splits = _uneven_splits([t.numel() for t in (tensors or [])])
    return [_call(kind, tensors, pg, peer=peer, splits=splits)]


def _functional_call(name: str, named: dict) -> list[Call]:
    if name == "batch_p2p_ops":
        pg = _process_group(named["group_name"])
        return [_call("send" if op == "isend" else "recv", tensor, pg,
                      peer=_peer_offset(pg, peer, is_global=True))
                for op, peer, tensor in zip(named["op_list"], named["peer_list"], named["tensors"])]
    kind, payload, gathered = _FUNCTIONAL[name]
    pg = _process_group(named["group_name"])
    tensors = named.get(payload)
    size = int(pg.size())
    peer = None
    if kind in ("send", "recv"):
        peer = _peer_offset(pg, named.get("dst", named.get("src")), is_global=True)
    splits = None
    if name == "all_to_all_single":
        splits = _uneven_splits(named.get("input_split_sizes"), named.get("output_split_sizes"))
    return [_call(kind, tensors, pg, _nbytes(tensors) * (size if gathered else 1), peer, splits)]


def describe_call(func, args, kwargs) -> list[Call] | str | None:
    """The collectives one dispatched op issues (a list of :class:`Call`; ``batch_p2p_ops`` is
    several), a str naming an op that communicates but is not counted (``symm_mem::*``), or None
    when it is no collective (``_c10d_functional.wait_tensor``, ``c10d.check_for_nan``, aten ops)."""
    namespace = getattr(func, "namespace", None)
    if namespace not in ("c10d", "_c10d_functional", "_dtensor") and namespace not in _UNCOUNTED_NAMESPACES:
        return None
    name = func._schema.name.split("::", 1)[1]
    if namespace in _UNCOUNTED_NAMESPACES:
        return f"{namespace}::{name} ({_UNCOUNTED_NAMESPACES[namespace]})"
    named = _bound_arguments(func, args, kwargs)
    if namespace == "c10d":
        return _c10d_call(name, named) if name in _C10D else None
    if namespace == "_dtensor":
        if name != "shard_dim_alltoall":
            return None
        pg = _process_group(named["group_name"])  # DTensor's all_to_all along a mesh dimension
        return [_call("all_to_all", named["input"], pg)]
    if name in _FUNCTIONAL or name == "batch_p2p_ops":
        return _functional_call(name, named)
    return None


@functools.cache
def _census_mode_class(skip_dynamo: bool):
    """The dispatch mode that counts collectives. ``skip_dynamo``: torch wraps its
    ``__torch_dispatch__`` in ``torch._dynamo.disable`` (TorchDispatchMode's default), which imports
    torch._dynamo, about 1.4 s of CPU in every rank process; without it the mode runs unwrapped, as
    every mode did before torch added the wrapper. :class:`CollectiveCensus` takes the unwrapped one
    only while torch._dynamo is not imported: then no compiled frame can run under the mode (a
    workload compiles in its warm-up, before the counted round)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _CollectiveCounter(TorchDispatchMode):
        """Notes every c10d / functional collective that passes, then runs it unchanged."""

        def __init__(self, calls: list, uncounted: list, lock: threading.Lock, active: list[bool], handed=None):
            super().__init__()
            self.calls, self.uncounted, self.lock, self.active = calls, uncounted, lock, active
            self.handed = handed  # HandedCollectives: c10d collectives run on aliases (engine.memory)

        @classmethod
        def is_infra_mode(cls) -> bool:
            # Dynamo runs compiled frames eagerly under a user dispatch mode; an infra mode leaves
            # the compiled code running, so the census counts the program that is measured.
            return True

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return skip_dynamo

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            try:
                calls = describe_call(func, args, kwargs) if self.active[0] else None
            except Exception as exc:  # the census never breaks a step: what it cannot read, it says
                calls = f"{func} could not be counted ({type(exc).__name__}: {exc})"
            if calls is not None:
                with self.lock:
                    if isinstance(calls, str):
                        self.uncounted.append(calls)
                    else:
                        self.calls.extend(calls)
                if self.handed is not None and not isinstance(calls, str) and func.namespace == "c10d":
                    return self.handed.run(lambda a, k: func(*a, **(k or {})), args, kwargs)
            return func(*args, **(kwargs or {}))

    return _CollectiveCounter


def dynamo_snapshot() -> dict[str, int] | None:
    """Dynamo's counters now: frames compiled and graph breaks met, or None when torch.compile was
    never used in this process (torch._dynamo not imported)."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    return {"frames": int(counters["frames"]["total"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


_KERNEL_LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                              "cudaLaunchCooperativeKernel", "cudaGraphLaunch"})


def _sequence_numbers() -> tuple[dict[str, tuple[Any, int]], bool]:
    """Every process group's name -> (the group, its sequence number now), for the groups whose
    backend keeps one; and whether every group does (torch's fake group keeps none)."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return {}, True
        groups = list(dist.distributed_c10d._world.pg_map)
    except Exception:
        return {}, False
    numbers, every = {}, True
    for pg in groups:
        try:
            numbers[pg.group_name] = (pg, int(pg._get_sequence_number_for_group()))
        except Exception:  # "does not yet support sequence numbers"
            every = False
    return numbers, every


class CollectiveCensus:
    """Context manager: counts the collectives this rank issues inside it (any thread the
    autograd engine runs for it included), and checks through each process group's sequence number
    that none was issued out of its sight; with ``count_kernel_launches`` (CUDA only) the CUDA
    kernel launches too, through torch.profiler. :meth:`next_op` between two ops keeps each op's
    calls apart, so that the record can say when they differ.

        with CollectiveCensus() as census:
            run_round(state)
        record = census.record(ops_per_round=1)
    """

    def __init__(self, count_kernel_launches: bool = False, handed=None):
        self.count_kernel_launches = count_kernel_launches
        self.handed = handed  # see take_census
        self.calls: list[Call] = []
        self.uncounted: list[str] = []  # ops seen that communicate but are not counted
        self.op_starts: list[int] = [0]  # where each op's calls begin in ``calls``
        self.unseen: dict[str, tuple[int, int]] = {}  # group -> (sequence steps, counted steps)
        self.sequence_checked = False
        self.kernel_launches: int | None = None
        self._lock = threading.Lock()
        self._mode = None
        self._profiler = None
        self._sequence_before: tuple[dict[str, tuple[Any, int]], bool] = ({}, False)
        self._active = [False]
        self._restore_thread_start = threading.Thread.start

    def __enter__(self) -> "CollectiveCensus":
        mode_class = _census_mode_class(skip_dynamo="torch._dynamo" in sys.modules)
        self.calls.clear()
        self.uncounted.clear()
        self.op_starts = [0]
        self.unseen = {}
        if self.count_kernel_launches:
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self._profiler.__enter__()
        self._sequence_before = _sequence_numbers()
        self._active = [True]  # a thread's mode outliving the census counts no more once it is False
        self._mode = mode_class(self.calls, self.uncounted, self._lock, self._active, self.handed)
        self._count_in_new_threads(mode_class)
        self._mode.__enter__()
        return self

    def _count_in_new_threads(self, mode_class) -> None:
        """While the census runs, a thread started in this process (a workload's worker for the
        step) runs under a mode of its own that counts into the same record: ``Thread.start``
        wraps the thread's ``run`` in it, so the mode leaves the thread's dispatch stack when
        ``run`` returns. One that outlives the census counts no more (``active``)."""
        original_start = threading.Thread.start
        calls, uncounted, lock, active = self.calls, self.uncounted, self._lock, self._active

        def start(thread, *args, **kwargs):
            run = thread.run

            def counted_run(*run_args, **run_kwargs):
                with mode_class(calls, uncounted, lock, active):
                    return run(*run_args, **run_kwargs)

            thread.run = counted_run
            return original_start(thread, *args, **kwargs)

        threading.Thread.start = start
        self._restore_thread_start = original_start

    def next_op(self) -> None:
        """The calls from here on belong to the next op."""
        with self._lock:
            self.op_starts.append(len(self.calls))

    def __exit__(self, *exc) -> None:
        threading.Thread.start = self._restore_thread_start
        self._active[0] = False
        self._mode.__exit__(*exc)
        self._mode = None
        self._check_unseen(_sequence_numbers())
        self._settle_splits()
        if self._profiler is not None:
            import torch

            torch.cuda.synchronize()
            self._profiler.__exit__(*exc)
            if exc[0] is None:
                self.kernel_launches = sum(1 for event in self._profiler.events() if event.name in _KERNEL_LAUNCHES)
            self._profiler = None

    def _check_unseen(self, after: tuple[dict[str, tuple[Any, int]], bool]) -> None:
        """Each group whose sequence number moved more than the counted calls on it move it."""
        (before, every_before), (numbers, every_after) = self._sequence_before, after
        self._sequence_before = ({}, False)
        self.sequence_checked = every_before and every_after
        counted: dict[str, int] = {}
        for call in self.calls:
            counted[call.group_name] = counted.get(call.group_name, 0) + call.sequence_steps
        for name, (pg, number) in numbers.items():
            moved = number - before.get(name, (pg, 0))[1]  # a group made during the round started at 0
            if moved > counted.get(name, 0):
                self.unseen[group_identity(pg)] = (moved, counted.get(name, 0))

    def _settle_splits(self) -> None:
        """An all_to_all whose uneven splits were the same in every op counted (a fixed partition,
        not a router's) moves bytes the data does not set: its mark is cleared, so it is judged.
        One op counted cannot tell."""
        ops = self._ops()
        if len(ops) < 2:
            return

        def split_calls(op: list[Call], key: tuple) -> list:
            return sorted((c.nbytes, c.splits) for c in op if c.data_dependent == "splits" and c[:5] == key)

        keys = {call[:5] for call in self.calls if call.data_dependent == "splits"}
        steady = {key for key in keys if all(split_calls(op, key) == split_calls(ops[0], key) for op in ops[1:])}
        self.calls[:] = [call._replace(data_dependent=None) if call.data_dependent == "splits" and call[:5] in steady
                         else call for call in self.calls]

    def _ops(self) -> list[list[Call]]:
        bounds = self.op_starts + [len(self.calls)]
        return [self.calls[a:b] for a, b in zip(bounds, bounds[1:])]

    @staticmethod
    def _entries(calls: list[Call], divide_by: int, per_call: bool) -> list[dict[str, Any]]:
        groups: dict[tuple, list[Call]] = {}
        for call in calls:
            groups.setdefault((call.kind, call.dtype, call.group_size, call.group, call.peer), []).append(call)
        out = []
        for key in sorted(groups, key=entry_sort_key):
            members = groups[key]
            sizes = sorted(call.nbytes for call in members)
            why = sorted({call.data_dependent for call in members if call.data_dependent})
            count, total = len(sizes) / divide_by, sum(sizes) / divide_by
            out.append({**dict(zip(ENTRY_KEY, key)),
                        "count": int(count) if count.is_integer() else count,
                        "bytes": int(total) if total.is_integer() else total,
                        "call_bytes": sizes if per_call else None,
                        "data_dependent_bytes": ", ".join(why) or None})
        return out

    def collectives(self, ops_per_round: int = 1) -> list[dict[str, Any]]:
        """The record's ``collectives``: per (kind, dtype, group size, group, peer), sorted by
        those, the calls per op with each call's bytes. Counted with :meth:`next_op`, each op's
        calls; without, the round's calls divided by ``ops_per_round``. When the ops did not all
        issue the same calls, the average per op (``call_bytes`` null) and :meth:`variation` says
        how they differ."""
        if isinstance(ops_per_round, bool) or not isinstance(ops_per_round, int) or ops_per_round < 1:
            raise ValueError(f"ops_per_round={ops_per_round!r}: a round runs at least one op")
        if self.variation(ops_per_round) is not None:
            return self._entries(self.calls, len(self.op_starts) if len(self.op_starts) > 1 else ops_per_round,
                                 per_call=False)
        if len(self.op_starts) > 1:
            return self._entries(self._ops()[0], 1, per_call=True)
        entries = self._entries(self.calls, 1, per_call=True)
        for entry in entries:  # every op's calls, sorted: every ops_per_round-th is one op's
            entry["call_bytes"] = entry["call_bytes"][::ops_per_round]
            entry["count"], entry["bytes"] = len(entry["call_bytes"]), sum(entry["call_bytes"])
        return entries

    def variation(self, ops_per_round: int = 1) -> str | None:
        """How the counted ops' collectives differ (None: every op issued the same). Each op's
        calls, when :meth:`next_op` kept them apart; else only a count that ``ops_per_round`` does
        not divide shows."""
        def summary(calls: list[Call]) -> str:
            entries = self._entries(calls, 1, per_call=True)
            return ", ".join(f"{e['count']} {e['kind']}" for e in entries) or "none"

        ops = self._ops()
        if len(ops) > 1:
            shapes = [sorted((c.kind, c.dtype, c.group_size, c.group, str(c.peer), c.nbytes if not c.data_dependent
                              else -1) for c in op) for op in ops]
            if all(shape == shapes[0] for shape in shapes[1:]):
                return None
            return "; ".join(f"op {i + 1} of {len(ops)}: {summary(op)}" for i, op in enumerate(ops))
        if ops_per_round == 1:
            return None
        for entry in self._entries(self.calls, 1, per_call=True):
            if entry["count"] % ops_per_round:
                return (f"the round's {ops_per_round} ops issued {entry['count']} {entry['kind']} calls "
                        f"({entry['dtype']}, group {entry['group']}): not the same in every op")
        return None

    def incompleteness(self) -> str | None:
        """Why the count is partial (collectives issued out of the census's sight, or ops it does
        not count), or None."""
        reasons = []
        for group, (moved, counted) in sorted(self.unseen.items()):
            reasons.append(f"process group {group}'s sequence number moved {moved} in the counted ops where "
                           f"the census counted {counted}: collectives were issued out of its sight (a thread "
                           f"started before the census, a direct backend call, or an op it does not know)")
        reasons.extend(sorted(set(self.uncounted)))
        return "; ".join(reasons) or None

    def record(self, ops_per_round: int = 1, ddp_buckets: list[int] | None = None,
               dynamo_before: dict | None = None, dynamo_after: dict | None = None,
               dynamo_at_start: dict | None = None) -> dict[str, Any]:
        """The census record (``extra_info["census"]``; docs/design/census-and-memory.md#record-format).
        ``dynamo_*``: :func:`dynamo_snapshot` when the case started, before and after the counted
        round; compile figures are null unless dynamo compiled a frame since the case started."""
        compiled = (dynamo_after is not None
                    and dynamo_after["frames"] > (dynamo_at_start or {"frames": 0})["frames"])
        before = dynamo_before or {"frames": 0, "graph_breaks": 0}
        start = dynamo_at_start or {"frames": 0, "graph_breaks": 0}
        ops_counted = len(self.op_starts) if len(self.op_starts) > 1 else ops_per_round
        record = {
            "version": CENSUS_VERSION,
            "method": CENSUS_METHOD,  # how collectives were counted (kernel launches: a profiler)
            "rounds_counted": 1,
            "ops_per_round": ops_per_round,
            "ops_counted": ops_counted,
            "collectives": self.collectives(ops_per_round),
            "ddp_buckets": None if ddp_buckets is None else [int(b) for b in ddp_buckets],
            "graph_breaks": dynamo_after["graph_breaks"] - start["graph_breaks"] if compiled else None,
            "recompiles": dynamo_after["frames"] - before["frames"] if compiled else None,
            "cuda_kernel_launches": (None if self.kernel_launches is None
                                     else self.kernel_launches // ops_counted),
            "sequence_checked": self.sequence_checked,
        }
        variation = self.variation(ops_per_round)
        if variation is not None:
            record["varies_between_steps"] = variation
            if len(self.op_starts) > 1:  # each op's own profile: the gates compare them step by step
                record["steps"] = [self._entries(op, 1, per_call=True) for op in self._ops()]
        incomplete = self.incompleteness()
        if incomplete is not None:
            record["incomplete"] = incomplete
        return record


def entry_sort_key(key) -> tuple:
    """The order of a record's entries: by kind, dtype, group size, group, then peer."""
    kind, dtype, size, group, peer = key
    return kind, dtype, size, group or "", (0, peer) if isinstance(peer, int) else (1, str(peer))


def ddp_bucket_sizes(ddp) -> list[int]:
    """The bucket sizes in bytes a DistributedDataParallel module's reducer all_reduces now, in the
    reducer's order (DDP rebuilds its buckets in its second step). DDP's logging data has them
    without allocating anything, but it catches up with a rebuild only at the next sampled step;
    until then they come from the reducer's buckets themselves (one zero tensor per bucket)."""
    data = ddp._get_ddp_logging_data()
    rebuilt = bool(getattr(ddp, "_has_rebuilt_buckets", False))
    if rebuilt and not data.get("has_rebuilt_buckets"):
        return [int(bucket.buffer().nbytes) for bucket in ddp.reducer._get_zeros_like_grad_buckets()]
    sizes = data.get("rebuilt_bucket_sizes") if rebuilt else data.get("bucket_sizes")
    return [int(s) for s in str(sizes or "").split(",") if s.strip()]


def take_census(run: Callable[[], Any], *, ops_per_round: int = 1, ddp_buckets: list[int] | None = None,
                count_kernel_launches: bool = False, dynamo_at_start: dict | None = None,
                ops_counted: int | None = None, handed=None) -> dict[str, Any]:
    """Run ``run()`` under a :class:`CollectiveCensus` and return its record; the record's figures
    are per op. Without ``ops_counted``, ``run`` is a whole round of ``ops_per_round`` ops, run
    once; with it, ``run`` is one op, run ``ops_counted`` times, each op's calls kept apart, so that
    a step whose collectives vary between steps is told (``varies_between_steps``).
    ``dynamo_at_start``: the :func:`dynamo_snapshot` taken when the case began (before its model
    was compiled); None counts from the process's start. ``handed``: a
    :class:`ddpbench.engine.memory.HandedCollectives` the c10d collectives of the census's own
    thread run through, on aliases, so that the memory census after it tells what the program
    still holds of them from what a backend's thread has yet to drop."""
    before = dynamo_snapshot()
    with CollectiveCensus(count_kernel_launches, handed) as census:
        if ops_counted is None:
            run()
        else:
            for i in range(ops_counted):
                if i:
                    census.next_op()
                run()
    return census.record(ops_per_round, ddp_buckets, before, dynamo_snapshot(), dynamo_at_start)


def workload_census_details(workload, state) -> dict[str, Any]:
    """What only the workload knows about its census (its optional ``census_details``: DDP's
    buckets, why part of its step escapes the count); {} where it has no such method."""
    census_details = getattr(workload, "census_details", None)  # optional: duck-typed workloads lack it
    return (census_details(state) if census_details is not None else None) or {}


def take_census_round(workload, state, *, ops_per_round: int = 1, count_kernel_launches: bool = False,
                      dynamo_at_start: dict | None = None, handed=None) -> dict[str, Any]:
    """The engine's census round: one untimed round of ``ops_per_round`` ops, and at least
    :data:`CENSUS_MIN_OPS`, under the collective census, on every rank (each rank counts what it
    issues), each op's collectives kept apart: a step whose collectives differ from one step to the
    next (one every other step) is marked ``varies_between_steps`` and left unjudged, whatever phase
    the round began in. The workload's ``census_details`` adds what only it knows (DDP's buckets).
    ``handed``: as :func:`take_census`'s."""
    record = take_census(lambda: workload.run_round(state), ops_per_round=ops_per_round,
                         ops_counted=max(ops_per_round, CENSUS_MIN_OPS),
                         count_kernel_launches=count_kernel_launches, dynamo_at_start=dynamo_at_start,
                         handed=handed)
    details = workload_census_details(workload, state)
    if details.get("ddp_buckets") is not None:
        record["ddp_buckets"] = [int(b) for b in details["ddp_buckets"]]
    if details.get("incomplete"):  # why part of the step escapes the count: the gates do not judge it
        record["incomplete"] = "; ".join(filter(None, [str(details["incomplete"]), record.get("incomplete")]))
    return record


def combine_census(records: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The case's census from every rank's record (:func:`ddpbench.storage.per_rank.combine`): rank
    0's whole, with ``ranks_counted`` and, where some rank counted other collectives, DDP buckets
    or steps (or none), ``ranks_disagree: true`` and ``other_ranks``, each group of such ranks
    with the fields that differ, so that the gates compare rank by rank; None when no rank took one."""
    from ..storage.per_rank import combine

    return combine(records)
