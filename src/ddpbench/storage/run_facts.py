"""A run's facts: what decides what its cases measure (torch, CUDA, NCCL, the engine, Python, the
CPU and GPUs), recorded with every saved run under ``machine_info["ddpbench_fingerprint"]`` (the
key keeps its first name) and checked before two runs are compared
(docs/design/gates.md#comparable-runs). Storage reads them to pick a default baseline of the same
machine; the stored-run gate compares them."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any

from .records import FINGERPRINT_KEY, FINGERPRINT_VERSION, RUN_FACTS_KEY  # noqa: F401 - importable here

RUN_FACTS = ("torch", "cuda", "nccl", "engine", "python", "cpu_model", "cpu_cores", "gpus")
# The machine itself: which saved runs the default compare may take as the baseline.
MACHINE_FACTS = ("cpu_model", "cpu_cores", "gpus")
CASE_FACTS = ("backend", "world_size", "device", "nodes", "pinned_cores", "ops_per_round", "cuda_graphs")
ALL = "all"


# ----------------------------------------------------------------------------------------------
# Recording (at save time)
# ----------------------------------------------------------------------------------------------


def run_facts(machine_info: dict) -> dict[str, Any]:
    """This process's facts, for ``machine_info[RUN_FACTS_KEY]`` (``machine_info``: what
    pytest-benchmark already collected, whose CPU brand is reused); its torch and engine are
    :func:`ddpbench.identity.identity`'s."""
    import torch

    from ..devices import cpu_count, gpu_description
    from ..identity import identity

    nccl = None
    if torch.version.cuda:  # the NCCL torch was built with, GPU or not
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, (tuple, list)) else str(version)
        except Exception:  # noqa: BLE001 - a CUDA build without NCCL
            nccl = None
    gpus = gpu_description() or {}
    cpu = machine_info.get("cpu") if isinstance(machine_info.get("cpu"), dict) else {}
    ours = identity()
    return {
        "version": FINGERPRINT_VERSION,
        "torch": ours["torch_version"],
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "engine": ours["ddpbench_source_sha256"],
        "ddpbench_version": ours["ddpbench_version"],
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "cpu_model": cpu.get("brand_raw") or platform.processor() or platform.machine(),
        "cpu_cores": cpu_count(),
        "gpus": list(gpus.get("devices") or []),
        "kernel": platform.release(),
    }


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------


def _minor(python: Any) -> str | None:
    """'CPython 3.11.7' -> 'CPython 3.11' (a patch release does not decide a measurement)."""
    if not isinstance(python, str):
        return None
    name, _, version = python.rpartition(" ")
    return f"{name} {'.'.join(version.split('.')[:2])}".strip()


@dataclass(frozen=True)
class Facts:
    """A run's facts as compared (unknown ones absent), and whether it recorded them."""

    values: dict[str, Any]
    recorded: bool
    python_full: str | None = None
    kernel: str | None = None


def facts_of(machine_info: Any) -> Facts:
    """The run facts of a run's ``machine_info``: those it recorded, or what an older run holds."""
    info = machine_info if isinstance(machine_info, dict) else {}
    fp = info.get(FINGERPRINT_KEY)
    if isinstance(fp, dict) and fp.get("version") == FINGERPRINT_VERSION:
        values = {fact: fp.get(fact) for fact in RUN_FACTS if fact in fp}
        if "gpus" in values:
            values["gpus"] = list(values["gpus"] or [])
        values["python"] = _minor(fp.get("python"))
        return Facts(values, True, fp.get("python"), fp.get("kernel"))
    values: dict[str, Any] = {}
    python = None
    if isinstance(info.get("python_version"), str):
        python = f"{info.get('python_implementation') or 'Python'} {info['python_version']}"
        values["python"] = _minor(python)
    cpu = info.get("cpu") if isinstance(info.get("cpu"), dict) else {}
    if cpu.get("brand_raw"):
        values["cpu_model"] = cpu["brand_raw"]
    gpus = info.get("ddpbench_gpus")
    if isinstance(gpus, dict):  # ddpbench described the GPUs (and the versions torch was built with)
        values["gpus"] = list(gpus.get("devices") or [])
        for fact in ("torch", "cuda", "nccl"):
            if fact in gpus:
                values[fact] = gpus[fact]
    elif isinstance(info.get("ddpbench_calibration"), dict):  # saved by ddpbench, which saw no GPU
        values["gpus"] = []
    return Facts(values, False, python, info.get("release") if isinstance(info.get("release"), str) else None)


def case_facts(extra_info: Any) -> dict[str, Any]:
    """A case's facts from its ``extra_info`` (only those it records)."""
    info = extra_info if isinstance(extra_info, dict) else {}
    facts = {fact: info[fact] for fact in ("backend", "world_size", "device", "nodes", "pinned_cores")
             if fact in info}
    if "ops_per_round" in info:  # the engine sets round_fixed_cost_s only when it chose the count
        facts["ops_per_round"] = "auto" if "round_fixed_cost_s" in info else info["ops_per_round"]
    if "backend" in info:  # a ddpbench case: extra_info says cuda_graphs only when they were on
        facts["cuda_graphs"] = bool(info.get("cuda_graphs", False))
    return facts


# ----------------------------------------------------------------------------------------------
# Comparing
# ----------------------------------------------------------------------------------------------


def _show(fact: str, value: Any) -> str:
    if fact == "engine" and isinstance(value, str):
        return value[:12]
    if fact == "gpus":
        return ", ".join(value) if value else "none"
    return repr(value) if isinstance(value, str) or value is None else str(value)


@dataclass(frozen=True)
class Difference:
    fact: str
    baseline: Any
    current: Any

    def describe(self) -> str:
        return f"{self.fact} {_show(self.fact, self.baseline)} -> {_show(self.fact, self.current)}"


@dataclass
class RunDifferences:
    """What differs between two runs' facts, what cannot be told, and what is only said."""

    differ: list[Difference] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # facts one side does not record
    unrecorded: list[str] = field(default_factory=list)  # "baseline" / "candidate": no run facts recorded
    notes: list[str] = field(default_factory=list)


def run_differences(base_info: Any, cur_info: Any, facts: tuple[str, ...] = RUN_FACTS) -> RunDifferences:
    base, cur = facts_of(base_info), facts_of(cur_info)
    out = RunDifferences()
    out.unrecorded = [side for side, f in (("baseline", base), ("candidate", cur)) if not f.recorded]
    for fact in facts:
        if fact in base.values and fact in cur.values:
            if base.values[fact] != cur.values[fact]:
                out.differ.append(Difference(fact, base.values[fact], cur.values[fact]))
        else:
            out.unknown.append(fact)
    if facts is RUN_FACTS:
        if base.python_full and cur.python_full and base.python_full != cur.python_full \
                and not any(d.fact == "python" for d in out.differ):
            out.notes.append(f"Python {base.python_full} -> {cur.python_full} (a patch release: compared)")
        if base.kernel and cur.kernel and base.kernel != cur.kernel:
            out.notes.append(f"kernel {base.kernel} -> {cur.kernel} (compared)")
    return out


def case_differences(base_extra: Any, cur_extra: Any) -> list[Difference]:
    base, cur = case_facts(base_extra), case_facts(cur_extra)
    return [Difference(fact, base[fact], cur[fact]) for fact in CASE_FACTS
            if fact in base and fact in cur and base[fact] != cur[fact]]


def parse_allowed(text: str) -> set[str]:
    """``--allow-different torch,engine`` -> {"torch", "engine"}; ``all`` allows every fact.
    ValueError naming the unknown fact and the known ones."""
    names = {part.strip() for part in text.split(",") if part.strip()}
    known = set(RUN_FACTS) | set(CASE_FACTS) | {ALL}
    unknown = sorted(names - known)
    if not names or unknown:
        raise ValueError(f"unknown fact {', '.join(unknown) or repr(text)}; name some of "
                         f"{', '.join(RUN_FACTS + CASE_FACTS)} (comma-separated), or all")
    return set(RUN_FACTS) | set(CASE_FACTS) if ALL in names else names
