"""Collective workloads: all_reduce, all_gather, reduce_scatter and broadcast, one entry each in
:data:`COLLECTIVES` (docs/design/families.md#collectives)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .base import Workload
from .tensor_ops import all_gather_tensor, reduce_scatter_tensor

PATTERN_PERIODS = (65521, 65537)
PATTERN_VALUES = 64  # table entries in 0..63 at most: a rank's value is at most 126
PATTERN_SEED = 0x5EED

# Element size and the largest integer every smaller one of which the type holds exactly.
DTYPES: dict[str, tuple[int, int]] = {
    "float32": (4, 2**24), "float64": (8, 2**53), "float16": (2, 2**11), "bfloat16": (2, 2**8),
    "int32": (4, 2**31 - 1), "int64": (8, 2**63 - 1), "int8": (1, 127), "uint8": (1, 255),
}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
REDUCE_OPS = ("sum", "max", "min", "avg")
PLACEMENTS = ("out-of-place", "in-place")
DEFAULT_DTYPE, DEFAULT_REDUCE_OP = "float32", "sum"
# |result - expected| <= rtol * |expected| for avg (a division and, on NCCL, a pre-scaling).
AVG_RTOL = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}


# ----------------------------------------------------------------------------------------------
# The known data
# ----------------------------------------------------------------------------------------------


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def pattern_values(dtype: str, world_size: int, reduce_op: str = DEFAULT_REDUCE_OP) -> int:
    """How many table values (0..V-1) keep every result of this case exact: a sum over ranks of
    two entries each, 2 * world_size * (V - 1), must be an integer the float type holds exactly.
    Integer types wrap alike in the op and in the expected result; max and min never grow."""
    if dtype not in FLOAT_DTYPES or reduce_op in ("max", "min"):
        return PATTERN_VALUES
    exact = DTYPES[dtype][1]
    return max(2, min(PATTERN_VALUES, exact // (2 * max(1, world_size)) + 1))


def pattern_tables(rank: int, device, dtype: str = DEFAULT_DTYPE, values: int = PATTERN_VALUES) -> list:
    """Rank ``rank``'s pattern tables (small integers of ``dtype`` on ``device``), the same in
    every process."""
    import torch

    tables = []
    for k, period in enumerate(PATTERN_PERIODS):
        generator = torch.Generator().manual_seed(PATTERN_SEED + 1_000_003 * k + rank)
        entries = torch.randint(0, values, (period,), generator=generator, dtype=torch.int64)
        tables.append(entries.to(_torch_dtype(dtype)).to(device))
    return tables


def _write_tiled(out, table, offset: int, accumulate: bool) -> None:
    """``out[j] (+)= table[(offset + j) mod len(table)]``: broadcast copies, no index tensor."""
    period = table.numel()
    rolled = table.roll(-(offset % period))
    full = out.numel() // period
    body, tail = out[:full * period].view(full, period), out[full * period:]
    if accumulate:
        body.add_(rolled)
        tail.add_(rolled[:tail.numel()])
    else:
        body.copy_(rolled)
        tail.copy_(rolled[:tail.numel()])


def fill_pattern(out, tables, offset: int = 0) -> None:
    """``out[j]`` = the pattern of ``tables`` at global element index ``offset + j``."""
    first, *rest = tables
    _write_tiled(out, first, offset, accumulate=False)
    for table in rest:
        _write_tiled(out, table, offset, accumulate=True)


def summed_tables(world_size: int, device, dtype: str = DEFAULT_DTYPE, values: int = PATTERN_VALUES) -> list:
    """The tables of the sum over ranks (a sum of tilings is the tiling of the summed tables)."""
    per_rank = [pattern_tables(r, device, dtype, values) for r in range(world_size)]
    return [sum(tables[k] for tables in per_rank) for k in range(len(PATTERN_PERIODS))]


def reduced_pattern(out, world_size: int, offset: int, reduce_op: str, dtype: str, values: int) -> None:
    """``out`` = every rank's pattern at ``offset`` reduced over the ranks by ``reduce_op``."""
    import torch

    device = out.device
    if reduce_op in ("sum", "avg"):
        fill_pattern(out, summed_tables(world_size, device, dtype, values), offset)
        if reduce_op == "avg":
            out.div_(world_size)
        return
    combine = torch.maximum if reduce_op == "max" else torch.minimum
    fill_pattern(out, pattern_tables(0, device, dtype, values), offset)
    other = torch.empty_like(out)
    for rank in range(1, world_size):
        fill_pattern(other, pattern_tables(rank, device, dtype, values), offset)
        combine(out, other, out=out)


def poison_value(dtype: str):
    """What the check writes into a buffer the op must overwrite: NaN, or for an integer type a
    value no rank's data takes (data are 0..126)."""
    return float("nan") if dtype in FLOAT_DTYPES else (255 if dtype == "uint8" else -1)


def is_poison(tensor, dtype: str):
    import torch

    return torch.isnan(tensor) if dtype in FLOAT_DTYPES else tensor == poison_value(dtype)


# ----------------------------------------------------------------------------------------------
# The table of collectives
# ----------------------------------------------------------------------------------------------


def _reduce_op(name: str):
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
            "avg": dist.ReduceOp.AVG}[name]


def _chunk(state) -> tuple[int, int]:
    """(start, length) of this rank's chunk of the full vector."""
    ctx = state["ctx"]
    length = state["count"] // ctx.world_size
    return ctx.rank * length, length


def _all_reduce_buffers(state, empty) -> None:
    state["input"] = empty(state["count"])
    state["output"] = state["input"]


def _all_gather_buffers(state, empty) -> None:
    start, length = _chunk(state)
    state["output"] = empty(state["count"])
    in_place = state["placement"] == "in-place"
    state["input"] = state["output"][start:start + length] if in_place else empty(length)


def _reduce_scatter_buffers(state, empty) -> None:
    start, length = _chunk(state)
    state["input"] = empty(state["count"])
    in_place = state["placement"] == "in-place"
    state["output"] = state["input"][start:start + length] if in_place else empty(length)


def _fill_rank_data(state, offset: int = 0) -> None:
    ctx = state["ctx"]
    fill_pattern(state["input"], pattern_tables(ctx.rank, ctx.device, state["dtype"], state["values"]), offset)


def _all_gather_fill(state) -> None:
    _fill_rank_data(state, _chunk(state)[0])


def _poison_output(state) -> None:
    """The whole output; in place, the rank's own chunk of it is filled again right after (the
    check poisons, then fills, then runs the op)."""
    state["output"].fill_(poison_value(state["dtype"]))


def _broadcast_fill(state) -> None:
    """The root's data on the root; every other rank's buffer is what the op must overwrite."""
    if state["ctx"].rank == 0:
        _fill_rank_data(state)
    else:
        state["input"].fill_(poison_value(state["dtype"]))


def _no_poison(state) -> None:
    return None


def _run_all_reduce(state) -> None:
    import torch.distributed as dist

    dist.all_reduce(state["input"], op=_reduce_op(state["reduce_op"]))


def _run_all_gather(state) -> None:
    all_gather_tensor()(state["output"], state["input"])


def _run_reduce_scatter(state) -> None:
    reduce_scatter_tensor()(state["output"], state["input"], op=_reduce_op(state["reduce_op"]))


def _run_broadcast(state) -> None:
    import torch.distributed as dist

    dist.broadcast(state["input"], src=0)


def _expect_all_reduce(state, out) -> None:
    reduced_pattern(out, state["ctx"].world_size, 0, state["reduce_op"], state["dtype"], state["values"])


def _expect_all_gather(state, out) -> None:
    ctx = state["ctx"]
    length = state["count"] // ctx.world_size
    for r in range(ctx.world_size):
        fill_pattern(out[r * length:(r + 1) * length], pattern_tables(r, ctx.device, state["dtype"], state["values"]),
                     r * length)


def _expect_reduce_scatter(state, out) -> None:
    reduced_pattern(out, state["ctx"].world_size, _chunk(state)[0], state["reduce_op"], state["dtype"],
                    state["values"])


def _expect_broadcast(state, out) -> None:
    fill_pattern(out, pattern_tables(0, state["ctx"].device, state["dtype"], state["values"]))


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective: everything the engine-facing :class:`Collective` needs to know of it."""

    name: str
    bus_factor: Callable[[int], float]  # busbw / algbw for n ranks (nccl-tests)
    reduces: bool  # takes a reduction (reduce_op)
    placements: tuple[str, ...]  # those it has, its default first
    divides: bool  # the full vector is split among ranks: its length is a multiple of n
    buffers: Callable  # (state, empty) -> sets state["input"], state["output"]
    fill: Callable  # (state): this rank's known data into its input
    poison: Callable  # (state): before the check's fill and op, the buffer the op must write
    run: Callable  # (state): one op
    expected: Callable  # (state, out): the exact result this rank must hold, into out


COLLECTIVES: dict[str, CollectiveSpec] = {
    "all_reduce": CollectiveSpec("all_reduce", lambda n: 2 * (n - 1) / n, True, ("in-place",), False,
                                 _all_reduce_buffers, _fill_rank_data, _no_poison, _run_all_reduce,
                                 _expect_all_reduce),
    "all_gather": CollectiveSpec("all_gather", lambda n: (n - 1) / n, False, ("out-of-place", "in-place"), True,
                                 _all_gather_buffers, _all_gather_fill, _poison_output, _run_all_gather,
                                 _expect_all_gather),
    "reduce_scatter": CollectiveSpec("reduce_scatter", lambda n: (n - 1) / n, True, ("out-of-place", "in-place"),
                                     True, _reduce_scatter_buffers, _fill_rank_data, _poison_output,
                                     _run_reduce_scatter, _expect_reduce_scatter),
    "broadcast": CollectiveSpec("broadcast", lambda n: 1.0, False, ("in-place",), False,
                                _all_reduce_buffers, _broadcast_fill, _no_poison, _run_broadcast,
                                _expect_broadcast),
}
OPS = tuple(COLLECTIVES)  # the built-in ops; code that must see added entries reads COLLECTIVES


def collective_spec(op: str) -> CollectiveSpec:
    try:
        return COLLECTIVES[op]
    except KeyError:
        raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(COLLECTIVES)}") from None


def bus_bandwidth_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    return collective_spec(op).bus_factor(world_size)


def bandwidths_gbps(op: str, size_bytes: int, world_size: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes, as nccl-tests prints them)."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_bandwidth_factor(op, world_size)


# Peak memory of one rank of a collective case, in multiples of the message size: the op's own
# buffers, the backend's staging copy, and the check's freshly built expected result and pattern.
PEAK_MEMORY_MULTIPLE = 4


def rank_memory_bytes(size_bytes: int) -> int:
    """Bytes one rank of any collective case of this message size may hold at its peak."""
    return PEAK_MEMORY_MULTIPLE * size_bytes


def element_count(op: str, size_bytes: int, world_size: int, element_bytes: int = 4) -> int:
    """Elements in the full vector; all_gather / reduce_scatter need a multiple of world_size."""
    count = max(1, size_bytes // element_bytes)
    if collective_spec(op).divides:
        count = max(world_size, count - count % world_size)
    return count


# ----------------------------------------------------------------------------------------------
# The workload
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Collective(Workload):
    """One collective of ``size_bytes`` (the full vector), in ``dtype``, reduced by ``reduce_op``
    (ops that reduce), ``placement`` ``out-of-place`` / ``in-place`` (None: the op's own)."""

    op: str
    size_bytes: int
    dtype: str = DEFAULT_DTYPE
    reduce_op: str = DEFAULT_REDUCE_OP
    placement: str | None = None

    # Its rounds are GPU work only: a CUDA graph can capture them (--dist-cuda-graphs).
    cuda_graph_safe = True

    def __post_init__(self):
        collective_spec(self.op)  # validates early, in the controller
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown data type {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if self.reduce_op not in REDUCE_OPS:
            raise ValueError(f"unknown reduction {self.reduce_op!r}; expected one of {', '.join(REDUCE_OPS)}")
        if self.placement is not None and self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; expected one of {', '.join(PLACEMENTS)}")

    @property
    def spec(self) -> CollectiveSpec:
        return collective_spec(self.op)

    @property
    def group(self) -> str:  # type: ignore[override]
        return self.op

    @property
    def resolved_placement(self) -> str:
        return self.placement or self.spec.placements[0]

    def skip_reason(self, pool_spec) -> str | None:
        """Why this case cannot run on ``pool_spec`` (a backend or op that lacks it), or None."""
        spec = self.spec
        if self.resolved_placement not in spec.placements:
            return (f"torch.distributed's {self.op} exists only {spec.placements[0]} (it writes "
                    f"{'its input' if spec.placements[0] == 'in-place' else 'a buffer of its own'})")
        if not spec.reduces and self.reduce_op != DEFAULT_REDUCE_OP:
            return f"{self.op} does not reduce: a reduction ({self.reduce_op}) does not apply"
        if self.reduce_op == "avg" and self.dtype not in FLOAT_DTYPES and pool_spec.backend == "gloo":
            return f"gloo averages floating types only (ReduceOp.AVG on {self.dtype} is refused)"
        return None

    def element_bytes(self) -> int:
        return DTYPES[self.dtype][0]

    def setup(self, ctx) -> dict[str, Any]:
        import torch

        n = ctx.world_size
        dtype = _torch_dtype(self.dtype)
        state: dict[str, Any] = {
            "ctx": ctx, "count": element_count(self.op, self.size_bytes, n, self.element_bytes()),
            "dtype": self.dtype, "reduce_op": self.reduce_op, "placement": self.resolved_placement,
            "values": pattern_values(self.dtype, n, self.reduce_op),
        }
        # Zeroed, not torch.empty: a buffer the fill leaves alone (all_gather's or reduce_scatter's
        # output) would hold whatever the allocator last had there, and the numerics replay's two
        # set-ups would differ ("not reproducible under fixed seeds"). Set-up is untimed.
        self.spec.buffers(state, lambda count: torch.zeros(count, dtype=dtype, device=ctx.device))
        self.spec.fill(state)
        return state

    def run_round(self, state) -> None:
        self._run_op(state)

    def _run_op(self, state) -> None:
        self.spec.run(state)

    def expected(self, state):
        """The result this rank must hold after one op on freshly filled buffers."""
        import torch

        out = torch.empty_like(state["output"])
        self.spec.expected(state, out)
        return out

    def check(self, state) -> None:
        """Fill, poison what the op must write, run the op once (untimed) and compare: exactly, or
        within the type's rounding for avg."""
        import torch

        self.spec.poison(state)
        self.spec.fill(state)
        self._run_op(state)
        result = state["output"]
        expected = self.expected(state)
        if self.reduce_op == "avg":
            close = torch.isclose(result.double(), expected.double(), rtol=AVG_RTOL[self.dtype], atol=0.0)
            if bool(close.all()):
                return
            mismatch = ~close
        else:
            if torch.equal(result, expected):
                return
            mismatch = result != expected  # NaN compares unequal: unwritten elements count as wrong
        wrong = int(mismatch.sum())
        first = int(torch.argmax(mismatch.to(torch.uint8)))
        what = self.op if self._is_default_kind() else f"{self.op} ({self.describe()})"
        raise AssertionError(
            f"{what} on rank {state['ctx'].rank} returned a wrong result: {wrong} of "
            f"{result.numel()} elements differ; first at index {first}: got {result[first].item()}, "
            f"expected {expected[first].item()}; {self._diagnose(state, result, expected)}")

    def _is_default_kind(self) -> bool:
        return (self.dtype, self.reduce_op, self.placement) == (DEFAULT_DTYPE, DEFAULT_REDUCE_OP, None)

    def describe(self) -> str:
        parts = [self.dtype]
        if self.spec.reduces:
            parts.append(self.reduce_op)
        parts.append(self.resolved_placement)
        return ", ".join(parts)

    def _diagnose(self, state, result, expected) -> str:
        """What the wrong result looks like (runs only when the check failed)."""
        import torch

        ctx = state["ctx"]
        n = ctx.world_size
        length = state["count"] // n
        unwritten = int(is_poison(result, self.dtype).sum())
        poison = "NaN" if self.dtype in FLOAT_DTYPES else f"value {poison_value(self.dtype)}"
        if unwritten == result.numel():
            return (f"the op wrote nothing: the buffer still holds the {poison} the check put there "
                    f"before running it")
        notes = []
        if unwritten:
            notes.append(f"{unwritten} elements were never written (still the {poison})")
        if self.op == "reduce_scatter":
            shard = torch.empty_like(expected)
            for r in range(n):
                reduced_pattern(shard, n, r * length, self.reduce_op, self.dtype, state["values"])
                if r != ctx.rank and torch.equal(result, shard):
                    notes.append(f"it holds rank {r}'s shard of the {self.reduce_op} (shard {r}, elements "
                                 f"{r * length}..{(r + 1) * length - 1}) instead of its own, shard {ctx.rank}")
        elif self.op == "all_gather":
            bad = [r for r in range(n) if not torch.equal(result[r * length:(r + 1) * length],
                                                          expected[r * length:(r + 1) * length])]
            notes.append(f"wrong in the chunk(s) of rank(s) {', '.join(map(str, bad))}")
        elif self.op == "all_reduce":
            own = torch.empty_like(expected)
            fill_pattern(own, pattern_tables(ctx.rank, ctx.device, self.dtype, state["values"]))
            if torch.equal(result, own):
                notes.append("it is this rank's own input: nothing was reduced")
            else:
                for other in (r for r in REDUCE_OPS if r != self.reduce_op):
                    if other == "avg" and self.dtype not in FLOAT_DTYPES:
                        continue
                    reduced_pattern(own, n, 0, other, self.dtype, state["values"])
                    if torch.equal(result, own):
                        notes.append(f"it is the {other} over the ranks, not the {self.reduce_op}")
                        break
        return "; ".join(notes) or "the values are wrong"

    def teardown(self, state) -> None:
        state.clear()

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        count = element_count(self.op, self.size_bytes, world_size, self.element_bytes())
        size_bytes = count * self.element_bytes()
        algbw, busbw = bandwidths_gbps(self.op, size_bytes, world_size, median_s)
        info: dict[str, Any] = {
            "family": "collectives",  # its section of the report: ddpbench/report/collectives.py
            "op": self.op,
            "size_bytes": size_bytes,
            "algbw_GBps": round(algbw, 6),
            "busbw_GBps": round(busbw, 6),
            "dtype": self.dtype,
            "placement": self.resolved_placement,
        }
        if self.spec.reduces:
            info["reduce_op"] = self.reduce_op
        return info
