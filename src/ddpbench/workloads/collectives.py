"""Collective workloads: all_reduce, all_gather, reduce_scatter and broadcast.

Sizes and bandwidths follow NVIDIA nccl-tests: ``size_bytes`` is the size of the full vector (the
all_gather output, the reduce_scatter input), algbw = size / time, and busbw = algbw times a factor
that makes the number comparable with the hardware's link bandwidth whatever the rank count:
all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1.

After the timed rounds every rank re-fills its buffers with a known pattern, runs the op once more
and compares with the exact expected result (small integers, exact in float32).

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
PATTERN_PERIOD = 13  # values stay small integers, so sums are exact in float32
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


def _pattern(count: int, rank: int, device, offset: int = 0):
    """Rank r's known data: (index + offset) mod 13 + r, as float32."""
    import torch

    # One period, rotated to the offset and tiled: a copy-speed fill (an int64 arange over the
    # whole buffer costs 2x its size in memory and most of a 100 MB case's set-up time).
    period = torch.arange(PATTERN_PERIOD, dtype=torch.float32, device=device) + rank
    period = period.roll(-(offset % PATTERN_PERIOD))
    return period.repeat(count // PATTERN_PERIOD + 1)[:count]


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
        ctx, count = state["ctx"], state["count"]
        if self.op == "all_gather":
            chunk = count // ctx.world_size
            state["input"].copy_(_pattern(chunk, ctx.rank, ctx.device, offset=ctx.rank * chunk))
        else:
            state["input"].copy_(_pattern(count, ctx.rank, ctx.device))

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
        rank_sum = n * (n - 1) // 2  # sum of the per-rank offsets 0..n-1
        if self.op == "all_reduce":
            return _pattern(count, 0, device) * n + rank_sum
        if self.op == "all_gather":
            chunk = count // n
            return torch.cat([_pattern(chunk, r, device, offset=r * chunk) for r in range(n)])
        if self.op == "reduce_scatter":
            chunk = count // n
            return _pattern(chunk, 0, device, offset=ctx.rank * chunk) * n + rank_sum
        return _pattern(count, 0, device)

    def check(self, state) -> None:
        import torch

        self._fill(state)
        self._run_op(state)
        result = state["output"] if self.op in ("all_gather", "reduce_scatter") else state["input"]
        expected = self.expected(state)
        if not torch.equal(result, expected):
            wrong = (result != expected).nonzero()
            first = int(wrong[0, 0])
            raise AssertionError(
                f"{self.op} on rank {state['ctx'].rank} returned a wrong result: {wrong.shape[0]} of "
                f"{result.numel()} elements differ; first at index {first}: got "
                f"{float(result[first])}, expected {float(expected[first])}"
            )

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
