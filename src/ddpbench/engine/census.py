"""The collective census: every collective one rank issues while a callable runs, counted by kind,
dtype and process-group size, with each call's payload bytes (the record is ``extra_info["census"]``).

Mechanism (docs/design.md, "Collective census"): a TorchDispatchMode that sees the ``c10d`` ops
(what ``torch.distributed``'s calls, DDP's C++ reducer and FSDP2 dispatch to) and the
``_c10d_functional`` ops (what compiled graphs and DTensor issue). Every ProcessGroup call goes
through the dispatcher, so one mode sees the collectives of Python code, of C++ (the reducer), of
autograd threads (the mode is part of the thread-local state the autograd engine carries over), and
of every backend alike, the fake process group included. The mode declares itself an infra mode so
that torch.compile keeps running the compiled code under it (a user mode makes dynamo run the
frames eagerly, which would census another program).

Public names (stable: ``ddpbench census`` builds on them): :func:`take_census`,
:class:`CollectiveCensus`, :func:`combine_census`, :func:`dynamo_snapshot`, :func:`ddp_bucket_sizes`, :data:`CENSUS_VERSION`,
:data:`CENSUS_METHOD`, :data:`KINDS`.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable

CENSUS_VERSION = 1
CENSUS_METHOD = "dispatch:c10d"

#: torch.distributed's names for the kinds a record may hold.
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "gather",
         "scatter", "barrier", "send", "recv")

# The fields of a record whose equality means "the same collectives" (ranks agree, sides compare).
STRUCTURE_KEYS = ("collectives", "ddp_buckets", "ops_per_round")


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


def _pg_size(pg) -> int:
    """The size of a process group as the dispatcher hands it over (a boxed ScriptObject)."""
    from torch.distributed import ProcessGroup

    if not isinstance(pg, ProcessGroup):
        pg = ProcessGroup.unbox(pg)
    return int(pg.size())


def _group_size_of_name(group_name) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _pg_size(_resolve_process_group(group_name))


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


def _bound_arguments(func, args, kwargs) -> dict[str, Any]:
    named = {argument.name: value for argument, value in zip(func._schema.arguments, args)}
    named.update(kwargs or {})
    return named


def describe_call(func, args, kwargs) -> tuple[str, str, int, int] | None:
    """(kind, dtype, group size, payload bytes) of one dispatched op, or None when it is no
    collective (``_c10d_functional.wait_tensor``, ``c10d.check_for_nan``, every aten op)."""
    namespace = getattr(func, "namespace", None)
    if namespace == "c10d":
        entry = _C10D.get(func._schema.name.split("::", 1)[1])
        if entry is None:
            return None
        kind, payload, group = entry
        named = _bound_arguments(func, args, kwargs)
        tensors = named.get(payload) if payload else None
        size = _pg_size(named.get(group))
        if payload is None:  # a barrier: no payload (its placeholder tensor is not data)
            return kind, "none", size, 0
        return kind, _dtype_name(tensors), size, _nbytes(tensors)
    if namespace == "_c10d_functional":
        entry = _FUNCTIONAL.get(func._schema.name.split("::", 1)[1])
        if entry is None:
            return None
        kind, payload, gathered = entry
        named = _bound_arguments(func, args, kwargs)
        tensors = named.get(payload)
        size = int(named["group_size"]) if "group_size" in named else _group_size_of_name(named["group_name"])
        return kind, _dtype_name(tensors), size, _nbytes(tensors) * (size if gathered else 1)
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

        def __init__(self, calls: list, lock: threading.Lock):
            super().__init__()
            self.calls, self.lock = calls, lock

        @classmethod
        def is_infra_mode(cls) -> bool:
            # Dynamo runs compiled frames eagerly under a user dispatch mode; an infra mode leaves
            # the compiled code running, so the census counts the program that is measured.
            return True

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return skip_dynamo

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            call = describe_call(func, args, kwargs)
            if call is not None:
                with self.lock:
                    self.calls.append(call)
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


class CollectiveCensus:
    """Context manager: counts the collectives this rank issues inside it (any thread the
    autograd engine runs for it included); with ``count_kernel_launches`` (CUDA only) the CUDA
    kernel launches too, through torch.profiler.

        with CollectiveCensus() as census:
            run_round(state)
        record = census.record(ops_per_round=1)
    """

    def __init__(self, count_kernel_launches: bool = False):
        self.count_kernel_launches = count_kernel_launches
        self.calls: list[tuple[str, str, int, int]] = []
        self.kernel_launches: int | None = None
        self._lock = threading.Lock()
        self._mode = None
        self._profiler = None

    def __enter__(self) -> "CollectiveCensus":
        mode_class = _census_mode_class(skip_dynamo="torch._dynamo" in sys.modules)
        self.calls.clear()
        if self.count_kernel_launches:
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self._profiler.__enter__()
        self._mode = mode_class(self.calls, self._lock)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._mode = None
        if self._profiler is not None:
            import torch

            torch.cuda.synchronize()
            self._profiler.__exit__(*exc)
            if exc[0] is None:
                self.kernel_launches = sum(1 for event in self._profiler.events() if event.name in _KERNEL_LAUNCHES)
            self._profiler = None

    def collectives(self, ops_per_round: int = 1) -> list[dict[str, Any]]:
        """The record's ``collectives``: per (kind, dtype, group size), sorted by those keys, the
        calls per op (the counted calls divided by ``ops_per_round``) with each call's bytes."""
        if ops_per_round < 1:
            raise ValueError(f"ops_per_round={ops_per_round!r}: a round runs at least one op")
        groups: dict[tuple[str, str, int], list[int]] = {}
        for kind, dtype, size, nbytes in self.calls:
            groups.setdefault((kind, dtype, size), []).append(nbytes)
        out = []
        for (kind, dtype, size), sizes in sorted(groups.items()):
            sizes.sort()
            if len(sizes) % ops_per_round:
                raise ValueError(f"the counted round ran {len(sizes)} {kind} calls ({dtype}, group of {size}) "
                                 f"over {ops_per_round} ops: not the same collectives in every op")
            per_op = sizes[::ops_per_round]  # each op's calls, sorted: every ops_per_round-th
            out.append({"kind": kind, "dtype": dtype, "group_size": size, "count": len(per_op),
                        "bytes": sum(per_op), "call_bytes": per_op})
        return out

    def record(self, ops_per_round: int = 1, ddp_buckets: list[int] | None = None,
               dynamo_before: dict | None = None, dynamo_after: dict | None = None,
               dynamo_at_start: dict | None = None) -> dict[str, Any]:
        """The census record (``extra_info["census"]``; docs/design.md, "Collective census").
        ``dynamo_*``: :func:`dynamo_snapshot` when the case started, before and after the counted
        round; compile figures are null unless dynamo compiled a frame since the case started."""
        compiled = (dynamo_after is not None
                    and dynamo_after["frames"] > (dynamo_at_start or {"frames": 0})["frames"])
        before = dynamo_before or {"frames": 0, "graph_breaks": 0}
        start = dynamo_at_start or {"frames": 0, "graph_breaks": 0}
        return {
            "version": CENSUS_VERSION,
            "method": CENSUS_METHOD,  # how collectives were counted (kernel launches: a profiler)
            "rounds_counted": 1,
            "ops_per_round": ops_per_round,
            "collectives": self.collectives(ops_per_round),
            "ddp_buckets": None if ddp_buckets is None else [int(b) for b in ddp_buckets],
            "graph_breaks": dynamo_after["graph_breaks"] - start["graph_breaks"] if compiled else None,
            "recompiles": dynamo_after["frames"] - before["frames"] if compiled else None,
            "cuda_kernel_launches": (None if self.kernel_launches is None
                                     else self.kernel_launches // ops_per_round),
        }


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
                count_kernel_launches: bool = False, dynamo_at_start: dict | None = None) -> dict[str, Any]:
    """Run ``run()`` once under a :class:`CollectiveCensus` and return its record. ``run`` runs
    ``ops_per_round`` ops; the record's figures are per op. ``dynamo_at_start``: the
    :func:`dynamo_snapshot` taken when the case began (before its model was compiled); None counts
    from the process's start."""
    before = dynamo_snapshot()
    with CollectiveCensus(count_kernel_launches) as census:
        run()
    return census.record(ops_per_round, ddp_buckets, before, dynamo_snapshot(), dynamo_at_start)


def combine_census(records: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The case's census from every rank's record: rank 0's, with ``ranks_disagree: true`` when
    some rank counted other collectives (or DDP buckets); None when no rank took one."""
    present = [r for r in records if r is not None]
    if not present:
        return None
    first = dict(records[0] if records[0] is not None else present[0])
    if len(present) != len(records) or any(
            any(r.get(key) != first.get(key) for key in STRUCTURE_KEYS) for r in present[1:]):
        first["ranks_disagree"] = True
    return first
