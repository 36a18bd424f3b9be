"""Collective workloads: all_reduce, all_gather, reduce_scatter and broadcast.

Sizes and bandwidths follow NVIDIA nccl-tests: ``size_bytes`` is the size of the full vector (the
all_gather output, the reduce_scatter input), algbw = size / time, and busbw = algbw times a factor
that makes the number comparable with the hardware's link bandwidth whatever the rank count:
all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1.

After the timed rounds (untimed, as nccl-tests' ``#wrong`` check) every rank re-fills its input with
its known data, poisons the buffer the op must write (NaN: the all_gather / reduce_scatter output,
a non-root rank's broadcast buffer), runs the op once more and compares with the exact expected
result. Rank r's data at global element index i is ``T1_r[i mod 65521] + T2_r[i mod 65537]``: two
tables of small random integers per rank (:func:`pattern_tables`), so the pattern repeats only
every 65521 * 65537 (about 4.3e9) elements, more than any buffer holds: a shard taken from the
wrong place, a rank's data missing or counted twice, or an op that wrote nothing all show. Values
are integers up to 126 per rank, so sums over ranks are exact in float32. Every fill is two
broadcast copies of the tables (copy speed, no index tensor), and the expected sum over ranks is
the tiling of the tables' sums, so the check costs a few passes over the buffer whatever the rank
count.

Test knob for measuring the regression gate's power (docs/results.md, gate reliability):
``DDPBENCH_INJECT_SLOWDOWN="all_reduce:10%"`` (comma list of ``op:percent``) makes every timed
round of those ops ``percent`` slower: after the op, the rank busy-waits for that fraction of the
op's own duration in this round. Read in the rank processes at set-up, so it must be in the
environment of the pytest process. Cases run with it record ``injected_slowdown_pct`` in extra_info.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from . import Workload

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
ELEMENT_BYTES = 4  # float32
# The check's data: per rank, one table of small random integers per period (coprime periods, so
# the sum of the two tilings repeats only every 65521 * 65537 elements).
PATTERN_PERIODS = (65521, 65537)
PATTERN_VALUES = 64  # table entries in 0..63: a rank's value is at most 126, exact in float32 sums
PATTERN_SEED = 0x5EED
INJECT_ENV = "DDPBENCH_INJECT_SLOWDOWN"


def parse_injected_slowdown(text: str | None) -> dict[str, float]:
    """``"all_reduce:10%,broadcast:5"`` -> ``{"all_reduce": 0.10, "broadcast": 0.05}``."""
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
        if not sep or op not in OPS or not value >= 0:
            raise ValueError(f"{INJECT_ENV}={text!r}: expected a comma list of op:percent with op in "
                             f"{', '.join(OPS)} and percent >= 0, e.g. all_reduce:10%")
        result[op] = value / 100.0
    return result


def _busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def bus_bandwidth_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


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


def element_count(op: str, size_bytes: int, world_size: int) -> int:
    """Elements in the full vector; all_gather / reduce_scatter need a multiple of world_size."""
    count = max(1, size_bytes // ELEMENT_BYTES)
    if op in ("all_gather", "reduce_scatter"):
        count = max(world_size, count - count % world_size)
    return count


def pattern_tables(rank: int, device) -> list:
    """Rank ``rank``'s pattern tables (float32 small integers on ``device``), the same in every process."""
    import torch

    tables = []
    for k, period in enumerate(PATTERN_PERIODS):
        generator = torch.Generator().manual_seed(PATTERN_SEED + 1_000_003 * k + rank)
        values = torch.randint(0, PATTERN_VALUES, (period,), generator=generator, dtype=torch.int64)
        tables.append(values.to(torch.float32).to(device))
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


def summed_tables(world_size: int, device) -> list:
    """The tables of the sum over ranks (a sum of tilings is the tiling of the summed tables)."""
    per_rank = [pattern_tables(r, device) for r in range(world_size)]
    return [sum(tables[k] for tables in per_rank) for k in range(len(PATTERN_PERIODS))]


@dataclass(frozen=True)
class Collective(Workload):
    op: str
    size_bytes: int

    def __post_init__(self):
        bus_bandwidth_factor(self.op, 2)  # validates the op name early, in the controller

    @property
    def group(self) -> str:  # type: ignore[override]
        return self.op

    def setup(self, ctx) -> dict[str, Any]:
        import torch

        n = ctx.world_size
        count = element_count(self.op, self.size_bytes, n)
        state: dict[str, Any] = {"ctx": ctx, "count": count}
        if self.op == "all_gather":
            state["input"] = torch.empty(count // n, dtype=torch.float32, device=ctx.device)
            state["output"] = torch.empty(count, dtype=torch.float32, device=ctx.device)
        elif self.op == "reduce_scatter":
            state["input"] = torch.empty(count, dtype=torch.float32, device=ctx.device)
            state["output"] = torch.empty(count // n, dtype=torch.float32, device=ctx.device)
        else:
            state["input"] = torch.empty(count, dtype=torch.float32, device=ctx.device)
        self._fill(state)
        state["inject"] = parse_injected_slowdown(os.environ.get(INJECT_ENV)).get(self.op, 0.0)
        return state

    def _fill(self, state) -> None:
        """This rank's known data into the input (all_gather: its chunk, at its global offset)."""
        ctx, count = state["ctx"], state["count"]
        tables = pattern_tables(ctx.rank, ctx.device)
        offset = ctx.rank * (count // ctx.world_size) if self.op == "all_gather" else 0
        fill_pattern(state["input"], tables, offset)

    def _poison(self, state) -> None:
        """NaN into the buffer the op must write, so a result can only come from this op."""
        if self.op in ("all_gather", "reduce_scatter"):
            state["output"].fill_(float("nan"))
        elif self.op == "broadcast" and state["ctx"].rank != 0:
            state["input"].fill_(float("nan"))

    def run_round(self, state) -> None:
        inject = state.get("inject", 0.0)
        if inject:  # test knob (module docstring): this round takes (1 + inject) x the op's time
            start = time.perf_counter()
            self._run_op(state)
            _busy_wait((time.perf_counter() - start) * inject)
        else:
            self._run_op(state)

    def _run_op(self, state) -> None:
        import torch.distributed as dist

        if self.op == "all_reduce":
            dist.all_reduce(state["input"], op=dist.ReduceOp.SUM)
        elif self.op == "all_gather":
            dist.all_gather_into_tensor(state["output"], state["input"])
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_tensor(state["output"], state["input"], op=dist.ReduceOp.SUM)
        else:
            dist.broadcast(state["input"], src=0)

    def expected(self, state):
        """The exact result this rank must hold after one op on freshly filled buffers."""
        import torch

        ctx, count = state["ctx"], state["count"]
        n, device = ctx.world_size, ctx.device
        chunk = count // n
        if self.op == "all_gather":
            expected = torch.empty(count, dtype=torch.float32, device=device)
            for r in range(n):
                fill_pattern(expected[r * chunk:(r + 1) * chunk], pattern_tables(r, device), r * chunk)
            return expected
        if self.op == "reduce_scatter":
            expected = torch.empty(chunk, dtype=torch.float32, device=device)
            fill_pattern(expected, summed_tables(n, device), ctx.rank * chunk)
            return expected
        expected = torch.empty(count, dtype=torch.float32, device=device)
        fill_pattern(expected, summed_tables(n, device) if self.op == "all_reduce"
                     else pattern_tables(0, device))
        return expected

    def check(self, state) -> None:
        """Fill, poison the output with NaN, run the op once (untimed) and compare exactly."""
        import torch

        self._fill(state)
        self._poison(state)
        self._run_op(state)
        result = state["output"] if self.op in ("all_gather", "reduce_scatter") else state["input"]
        expected = self.expected(state)
        if torch.equal(result, expected):
            return
        mismatch = result != expected  # NaN compares unequal: unwritten elements count as wrong
        wrong = int(mismatch.sum())
        first = int(torch.argmax(mismatch.to(torch.uint8)))
        raise AssertionError(
            f"{self.op} on rank {state['ctx'].rank} returned a wrong result: {wrong} of "
            f"{result.numel()} elements differ; first at index {first}: got {float(result[first])}, "
            f"expected {float(expected[first])}; {self._diagnose(state, result, expected)}")

    def _diagnose(self, state, result, expected) -> str:
        """What the wrong result looks like (runs only when the check failed)."""
        import torch

        ctx, count = state["ctx"], state["count"]
        n, device = ctx.world_size, ctx.device
        chunk = count // n
        unwritten = int(torch.isnan(result).sum())
        if unwritten == result.numel():
            return ("the op wrote nothing: the buffer still holds the NaN the check put there "
                    "before running it")
        notes = []
        if unwritten:
            notes.append(f"{unwritten} elements were never written (still the NaN poison)")
        if self.op == "reduce_scatter":
            summed = summed_tables(n, device)
            shard = torch.empty_like(expected)
            for r in range(n):
                fill_pattern(shard, summed, r * chunk)
                if r != ctx.rank and torch.equal(result, shard):
                    notes.append(f"it holds rank {r}'s shard of the sum (shard {r}, elements "
                                 f"{r * chunk}..{(r + 1) * chunk - 1}) instead of its own, shard {ctx.rank}")
        elif self.op == "all_gather":
            bad = [r for r in range(n) if not torch.equal(result[r * chunk:(r + 1) * chunk],
                                                          expected[r * chunk:(r + 1) * chunk])]
            notes.append(f"wrong in the chunk(s) of rank(s) {', '.join(map(str, bad))}")
        elif self.op == "all_reduce":
            own = torch.empty_like(expected)
            fill_pattern(own, pattern_tables(ctx.rank, device))
            if torch.equal(result, own):
                notes.append("it is this rank's own input: nothing was reduced")
        return "; ".join(notes) or "the values are wrong"

    def teardown(self, state) -> None:
        state.clear()

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        count = element_count(self.op, self.size_bytes, world_size)
        size_bytes = count * ELEMENT_BYTES
        algbw, busbw = bandwidths_gbps(self.op, size_bytes, world_size, median_s)
        info: dict[str, Any] = {
            "op": self.op,
            "size_bytes": size_bytes,
            "algbw_GBps": round(algbw, 6),
            "busbw_GBps": round(busbw, 6),
        }
        inject = parse_injected_slowdown(os.environ.get(INJECT_ENV)).get(self.op, 0.0)
        if inject:
            info["injected_slowdown_pct"] = round(inject * 100, 3)
        return info
