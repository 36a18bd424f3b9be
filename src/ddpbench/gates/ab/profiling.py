"""Why an A/B case is slower: after its verdict, a few rounds of the case on one pool of each side
under torch.profiler (``--dist-ab-profile``), a Chrome trace per side and rank, and the ops whose
self time per round grew most.

It runs after the verdict, on rounds that are thrown away: the verdict and the case's recorded
rounds are final before the profiler starts. The ranks run :mod:`.forensics`'s task; a side that
cannot (an older ddpbench without it, a profiler error) is named instead of failing the case. When the
case asks for variant rounds (``--dist-exposed-comm``) and the side's workload has them, the side
also times them after the profiled rounds, outside the profiler, and the text shows each side's
exposed communication (a side whose ddpbench or workload has none shows none).
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..verdict_words import Verdict
from .forensics import profile_rounds

PROFILE_MODES = ("off", "regressions", "all")
DEFAULT_PROFILE = "regressions"
MIN_PROFILED_ROUNDS = 5  # at least this many rounds a side; else one block's worth
TOP_OPS = 8  # rows of the grown-ops table


def should_profile(mode: str, verdict: str) -> bool:
    """Whether ``mode`` (one of :data:`PROFILE_MODES`) profiles a case with ``verdict``."""
    if mode not in PROFILE_MODES:
        raise ValueError(f"profile mode {mode!r}: expected one of {', '.join(PROFILE_MODES)}")
    return mode == "all" or (mode == "regressions" and verdict == Verdict.REGRESSION)


@dataclass(frozen=True)
class GrownOp:
    """One op's self time per round on each side (the slowest rank's), CPU or device."""

    op: str
    where: str  # "cpu" or "device" (CUDA kernels)
    baseline_ms: float
    candidate_ms: float

    @property
    def ratio(self) -> float:
        return self.candidate_ms / self.baseline_ms if self.baseline_ms > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "where": self.where, "baseline_ms": round(self.baseline_ms, 6),
                "candidate_ms": round(self.candidate_ms, 6),
                "ratio": None if self.baseline_ms <= 0 else round(self.ratio, 4)}


@dataclass
class CaseProfile:
    """Both sides' profiles of one case: the grown ops, the traces, what it cost."""

    case_id: str
    verdict: str
    rounds: int
    folder: str
    traces: dict[str, list[str]] = field(default_factory=dict)  # side -> one trace per rank
    round_median_ms: dict[str, float] = field(default_factory=dict)  # side -> under the profiler
    grown: list[GrownOp] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # side -> why it was not profiled
    wall_s: float = 0.0
    # side -> its exposed communication (metrics.exposed_communication), where the side measured it
    exposed: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``extra_info["ab"]["profile"]``."""
        return {"rounds": self.rounds, "folder": self.folder, "traces": self.traces,
                "round_median_ms": self.round_median_ms, "top_ops": [g.to_dict() for g in self.grown],
                "errors": self.errors, "wall_s": round(self.wall_s, 3), "exposed_comm": self.exposed}

    @classmethod
    def from_summary(cls, case_id: str, ab: dict[str, Any]) -> "CaseProfile | None":
        """The profile a saved A/B run holds for a case (``extra_info["ab"]``), or None."""
        saved = ab.get("profile")
        if not isinstance(saved, dict):
            return None
        grown = [GrownOp(str(g.get("op")), str(g.get("where", "cpu")), float(g.get("baseline_ms") or 0.0),
                         float(g.get("candidate_ms") or 0.0)) for g in saved.get("top_ops") or []]
        exposed = {side: figures for side, figures in (saved.get("exposed_comm") or {}).items()
                   if isinstance(figures, dict)}
        return cls(case_id, str(ab.get("verdict")), int(saved.get("rounds") or 0), str(saved.get("folder", "")),
                   dict(saved.get("traces") or {}), dict(saved.get("round_median_ms") or {}), grown,
                   dict(saved.get("errors") or {}), float(saved.get("wall_s") or 0.0), exposed)

    def exposed_lines(self) -> list[str]:
        """Each side's exposed communication per step, where either side measured it."""
        if not self.exposed:
            return []
        out = ["exposed communication per step (step - compute-only; variant rounds after the profiled ones):"]
        for side in ("baseline", "candidate"):
            out.append(f"{side}: {_exposed_text(self.exposed.get(side))}")
        return out

    def markdown(self) -> str:
        """The grown ops as a markdown section (a PR comment)."""
        out = [f"**Why `{self.case_id}` is {'slower' if self.verdict == 'regression' else 'as it is'}** "
               f"(torch.profiler, {self.rounds} rounds a side after the verdict; self time per round of "
               f"the slowest rank)", ""]
        out += [f"- {side} not profiled: {error}" for side, error in self.errors.items()]
        if self.grown:
            out += ["| op | baseline (ms) | candidate (ms) | ratio |", "|---|---:|---:|---:|"]
            out += [f"| `{_label(g)}` | {g.baseline_ms:.3f} | {g.candidate_ms:.3f} | "
                    f"{'new' if g.baseline_ms <= 0 else f'{g.ratio:.2f}x'} |" for g in self.grown]
        elif not self.errors:
            out.append("No op's self time grew: the time went where torch.profiler sees no op; open the traces.")
        exposed = self.exposed_lines()
        if exposed:
            out += ["", exposed[0], ""] + [f"- {line}" for line in exposed[1:]]
        if self.traces:
            out += ["", f"Traces: `{_shown(self.folder)}` (the run's artifact)"]
        return "\n".join(out)

    def lines(self) -> list[str]:
        """The text beneath the verdict table."""
        head = (f"why {self.case_id} is {'slower' if self.verdict == 'regression' else 'as it is'} "
                f"({self.verdict}): torch.profiler, {self.rounds} rounds a side after the verdict, "
                f"self time per round of the slowest rank")
        out = [head]
        for side, error in self.errors.items():
            out.append(f"  {side} not profiled: {error}")
        if self.grown:
            width = max(24, *(len(_label(g)) for g in self.grown))
            out.append(f"  {'op':<{width}}  {'baseline ms':>11}  {'candidate ms':>12}  {'ratio':>7}")
            for g in self.grown:
                ratio = "new" if g.baseline_ms <= 0 else f"{g.ratio:.2f}x"
                out.append(f"  {_label(g):<{width}}  {g.baseline_ms:>11.3f}  {g.candidate_ms:>12.3f}  {ratio:>7}")
        elif not self.errors:
            out.append("  no op's self time grew: the time went where torch.profiler sees no op "
                       "(Python code, sleeps, waits): open the traces")
        if len(self.round_median_ms) == 2:
            out.append(f"  rounds under the profiler (median): baseline {self.round_median_ms['baseline']:.3f} ms, "
                       f"candidate {self.round_median_ms['candidate']:.3f} ms")
        exposed = self.exposed_lines()
        if exposed:
            out += [f"  {exposed[0]}"] + [f"    {line}" for line in exposed[1:]]
        if self.traces:
            names = [os.path.basename(p) for paths in self.traces.values() for p in paths]
            out.append(f"  traces (chrome://tracing, Perfetto) in {_shown(self.folder)}: {', '.join(names)}")
        out.append(f"  profiling took {self.wall_s:.1f} s")
        return out


def _exposed_text(figures: dict[str, Any] | None) -> str:
    """One side's exposed communication in words, or why there is none."""
    if not figures:
        return "not measured (its ddpbench or its workload has no compute-only variant)"
    low, high = figures.get("exposed_comm_s_ci") or (None, None)
    text = f"{figures['exposed_comm_s'] * 1e3:.3f} ms exposed"
    if low is not None:
        text += f" (95% interval {low * 1e3:.3f} to {high * 1e3:.3f})"
    text += f" of compute {figures['compute_s'] * 1e3:.3f} ms"
    if figures.get("comm_isolated_s") is not None:
        text += f"; communication alone {figures['comm_isolated_s'] * 1e3:.3f} ms"
        if figures.get("comm_overlap_pct") is not None:
            text += f", {figures['comm_overlap_pct']:.0f}% of it hidden"
    return text


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _label(g: GrownOp) -> str:
    return g.op if g.where == "cpu" else f"{g.op} [device]"


def case_folder(root: str | os.PathLike, case_id: str) -> Path:
    """The case's folder under the run's profile folder: its id with path characters replaced."""
    name = case_id.rsplit("::", 1)[-1]
    return Path(root) / re.sub(r"[^A-Za-z0-9._\[\]-]+", "_", name)


def per_round_ms(ranks: list[dict[str, Any]], rounds: int) -> dict[tuple[str, str], float]:
    """Per (op, cpu|device): the slowest rank's self time per round, in ms."""
    out: dict[tuple[str, str], float] = {}
    for rank in ranks:
        for op, t in rank["ops"].items():
            for where, key in (("cpu", "cpu_us"), ("device", "device_us")):
                ms = t[key] / rounds / 1000.0
                if ms > 0:
                    out[(op, where)] = max(out.get((op, where), 0.0), ms)
    return out


def grown_ops(baseline: dict[tuple[str, str], float], candidate: dict[tuple[str, str], float],
              top: int = TOP_OPS) -> list[GrownOp]:
    """The ops whose self time per round grew most from baseline to candidate, largest first."""
    grown = [GrownOp(op, where, baseline.get((op, where), 0.0), ms)
             for (op, where), ms in candidate.items() if ms > baseline.get((op, where), 0.0)]
    grown.sort(key=lambda g: g.candidate_ms - g.baseline_ms, reverse=True)
    return grown[:top]


def profile_case(pools: dict[str, Any], workloads: dict[str, Any], plan, rounds: int, folder: Path, case_id: str,
                 verdict: str, timeout_s: float) -> CaseProfile:
    """Profile ``rounds`` rounds of the case on each side's pool (``pools``: side -> pool), each
    side's own workload (``workloads``: side -> workload), one side after the other, and compare
    their ops. Never raises for a side's failure: it is named in :attr:`CaseProfile.errors`."""
    from ...pool import PoolError

    started = time.monotonic()
    profile = CaseProfile(case_id, verdict, rounds, str(folder))
    folder.mkdir(parents=True, exist_ok=True)
    per_side: dict[str, dict[tuple[str, str], float]] = {}
    for side in ("baseline", "candidate"):
        try:
            ranks = pools[side].run(profile_rounds, workloads[side], plan, rounds,
                                    str(folder / f"{side}-rank{{rank}}.json"), timeout_s=timeout_s)
        except PoolError as exc:
            profile.errors[side] = _first_line(str(exc))
            continue
        profile.traces[side] = [r["trace"] for r in ranks]
        per_side[side] = per_round_ms(ranks, rounds)
        slowest = [max(t) for t in zip(*(r["round_times"] for r in ranks))]
        profile.round_median_ms[side] = statistics.median(slowest) * 1e3
        exposed = side_exposed_communication(ranks)
        if exposed:
            profile.exposed[side] = exposed
    if len(per_side) == 2:
        profile.grown = grown_ops(per_side["baseline"], per_side["candidate"])
    profile.wall_s = time.monotonic() - started
    return profile


def side_exposed_communication(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """A side's exposed communication from its ranks' variant rounds (max over ranks per round),
    or {} when the side timed none (an older ddpbench's reply has no ``variant_times``)."""
    from ...engine.timing import max_over_ranks
    from ...workloads.training.metrics import exposed_communication

    per_rank = [r.get("variant_times") or {} for r in ranks]
    names = set(per_rank[0]) if per_rank else set()
    if not names or any(set(times) != names for times in per_rank):
        return {}
    return exposed_communication({name: max_over_ranks([times[name] for times in per_rank]) for name in names})


def profiled_plan(plan, candidate_metrics: list[dict[str, Any]]):
    """The case's plan with the ops per round the measured rounds used (so "auto" is not chosen
    anew, and both sides run alike), without a census, memory census or numerics replay (the case already
    has them)."""
    chosen = next((m.get("ops_per_round") for m in candidate_metrics if m.get("ops_per_round")), None)
    plan = dataclasses.replace(plan, census=False, memory_census=False, numerics_steps=0)
    return dataclasses.replace(plan, ops_per_round=chosen) if chosen else plan


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no reason given"
