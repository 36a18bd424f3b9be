"""Every part of pytest-benchmark that ddpbench reads, sets, calls or replaces beyond its hooks, in
one place: :data:`USES` lists them, checked against pytest-benchmark :data:`CHECKED_WITH`.
tests/test_plugin_contract.py fails, naming the entry, when one is missing or its parameters changed;
widen pyproject.toml's pytest-benchmark range only after it passes on the new release."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pytest_benchmark.storage.file import FileStorage
from pytest_benchmark.utils import get_machine_id, safe_dumps

__all__ = ["CHECKED_WITH", "USES", "FileStorage", "Use", "benchmark_session", "get_machine_id",
           "recorded_rounds", "safe_dumps", "set_round_timer"]

CHECKED_WITH = "5.3.1"


@dataclass(frozen=True)
class Use:
    """One name of pytest-benchmark that ddpbench relies on.

    ``owner``: where the name lives: a module (``pytest_benchmark.utils``), an object pytest-benchmark
    makes (``BenchmarkFixture``: the ``benchmark`` fixture; ``BenchmarkSession``: the run's session;
    ``FileStorage``: its storage), ``config`` (pytest's), ``option`` (a pytest-benchmark option by
    its ``getoption`` name) or ``hook`` (a hook ddpbench calls). ``how``: read, set, called, or
    replaced (ddpbench puts its own function there, which pytest-benchmark calls). ``parameters``:
    those ddpbench passes, or for a replaced method all that pytest-benchmark's own one has."""

    owner: str
    name: str
    how: str
    by: str  # the ddpbench function that uses it
    parameters: tuple[str, ...] | None = None


USES: tuple[Use, ...] = (
    # The fixture: round times measured on the ranks are replayed through its timer.
    Use("BenchmarkFixture", "_timer", "set", "set_round_timer"),
    Use("BenchmarkFixture", "pedantic", "called", "fixture.replay_into_pytest_benchmark",
        ("target", "rounds", "iterations", "warmup_rounds")),
    Use("BenchmarkFixture", "stats.stats.data", "read", "recorded_rounds"),
    Use("BenchmarkFixture", "disabled", "read", "fixture.DistBenchmark"),
    Use("BenchmarkFixture", "extra_info", "read", "fixture.DistBenchmark"),
    Use("BenchmarkFixture", "group", "set", "fixture.DistBenchmark"),
    Use("BenchmarkFixture", "has_error", "set", "plugin.pytest_runtest_call"),
    # The session: whether and where this run saves, what --benchmark-compare loaded.
    Use("config", "_benchmarksession", "read", "benchmark_session"),
    Use("BenchmarkSession", "disabled", "read", "plugin"),
    Use("BenchmarkSession", "save", "set", "plugin.pytest_sessionfinish"),
    Use("BenchmarkSession", "autosave", "set", "plugin.pytest_sessionfinish"),
    Use("BenchmarkSession", "json", "set", "plugin.pytest_sessionfinish"),
    Use("BenchmarkSession", "benchmarks", "read", "plugin.SessionCompare"),
    Use("BenchmarkSession", "compared_mapping", "read", "gates.benchmark_compare.compared_files"),
    Use("BenchmarkSession", "storage", "read", "storage.install"),
    Use("BenchmarkSession", "logger", "read", "storage.install"),
    Use("BenchmarkSession", "save_json", "replaced", "storage.install", ("output_json",)),
    # The file storage: saves go through ddpbench.storage.save_run instead.
    Use("FileStorage", "path", "read", "storage.install"),
    Use("FileStorage", "default_machine_id", "read", "storage.install"),
    Use("FileStorage", "logger", "read", "storage.install"),
    Use("FileStorage", "save", "replaced", "storage.install", ("output_json", "save")),
    Use("pytest_benchmark.storage.file", "FileStorage", "read", "storage.install"),
    Use("pytest_benchmark.utils", "safe_dumps", "called", "storage.serialise", ("obj",)),
    Use("pytest_benchmark.utils", "get_machine_id", "called", "plugin", ()),
    # Options ddpbench reads by their pytest-benchmark dest names, and a hook it calls itself.
    Use("option", "benchmark_compare", "read", "plugin"),
    Use("option", "benchmark_storage", "read", "plugin, gates.ab.run_plan"),
    # Its timing options, read for ddpbench's cases (each read with its default where a release lacks it).
    *(Use("option", dest, "read", "benchmark_options.given_values") for dest in (
        "benchmark_min_rounds", "benchmark_max_time", "benchmark_min_time", "benchmark_precision",
        "benchmark_confidence", "benchmark_timer", "benchmark_calibration_precision", "benchmark_warmup",
        "benchmark_warmup_iterations", "benchmark_disable_gc", "benchmark_cprofile")),
    Use("hook", "pytest_benchmark_generate_json", "called", "plugin.SessionCompare",
        ("config", "benchmarks", "include_data", "machine_info", "commit_info")),
)


def benchmark_session(config) -> Any:
    """The run's pytest-benchmark session (``BenchmarkSession``), or None before it is made."""
    return getattr(config, "_benchmarksession", None)


def set_round_timer(benchmark, clock: Callable[[], float]) -> None:
    """Make the fixture's next ``pedantic`` read its clock from ``clock``."""
    benchmark._timer = clock


def recorded_rounds(benchmark) -> list[float] | None:
    """The round times the fixture recorded, or None when it recorded none."""
    return list(benchmark.stats.stats.data) if benchmark.stats else None
