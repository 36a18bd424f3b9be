"""pytest-benchmark's own timing options, read for a ddpbench case. Each means what it means for any
benchmark where a distributed round gives it a meaning, set on the command line or in a test's
``@pytest.mark.benchmark(...)``: it sets the round plan as the ``--dist-`` option that does the same
job would, and that option wins where both are given. Each of the others is named once in the
run's summary with the ``--dist-`` option that does its job instead
(docs/design/plugin-and-pool.md#pytest-benchmarks-own-options). Pure functions: no torch."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any

#: pytest-benchmark's default of its ``--benchmark-warmup-iterations``: not given.
WARMUP_ITERATIONS_DEFAULT = 100000
#: A default no value is compared with: the option counts as given only where it is written out.
WRITTEN_ONLY = object()


@dataclass(frozen=True)
class BenchmarkOption:
    """One of pytest-benchmark's timing options. ``mark``: its keyword in ``@pytest.mark.benchmark``;
    ``default``: pytest-benchmark's (a value that differs was given); ``dist_flag``: the ``--dist-``
    option that does its job for a ddpbench case; ``unused``: None where ddpbench reads it, else
    why a distributed round gives it no meaning."""

    flag: str
    mark: str
    default: Any
    dist_flag: str
    unused: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


MIN_ROUNDS = BenchmarkOption("--benchmark-min-rounds", "min_rounds", 5, "--dist-rounds")
MAX_TIME = BenchmarkOption("--benchmark-max-time", "max_time", 1.0, "--dist-max-time")
PRECISION = BenchmarkOption("--benchmark-precision", "precision", None, "--dist-precision")
WARMUP = BenchmarkOption("--benchmark-warmup", "warmup", False, "--dist-warmup")
WARMUP_ITERATIONS = BenchmarkOption("--benchmark-warmup-iterations", "warmup_iterations", WARMUP_ITERATIONS_DEFAULT,
                                    "--dist-warmup")
UNUSED = (
    BenchmarkOption("--benchmark-min-time", "min_time", 0.000005, "--dist-ops-per-round",
                    "a round is one step on every rank, as long as the step takes"),
    BenchmarkOption("--benchmark-confidence", "confidence", 0.99, "--dist-precision",
                    "the precision rule holds the median's 95% interval"),
    BenchmarkOption("--benchmark-timer", "timer", WRITTEN_ONLY, "--dist-ops-per-round",
                    "the ranks time each round themselves (CUDA events on a GPU)"),
    BenchmarkOption("--benchmark-calibration-precision", "calibration_precision", 10, "--dist-ops-per-round",
                    "a round is one step on every rank, not calibrated iterations"),
    BenchmarkOption("--benchmark-disable-gc", "disable_gc", False, "--dist-warmup",
                    "the rounds run in the rank processes, whose collector pytest-benchmark does not reach"),
    BenchmarkOption("--benchmark-cprofile", "cprofile", None, "--dist-ab-profile",
                    "the rounds run in the rank processes, out of this process's profiler"),
)
READ = (MIN_ROUNDS, MAX_TIME, PRECISION, WARMUP, WARMUP_ITERATIONS)


def words_given(config) -> set[str]:
    """The option names (``--benchmark-warmup``) written on this session's command line, in
    PYTEST_ADDOPTS or in the ini file's addopts: how ``--benchmark-warmup=off`` is told from
    pytest-benchmark's default, which is off on CPython too."""
    words = list(getattr(config.invocation_params, "args", ()) or ())
    words += shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    try:
        words += list(config.getini("addopts") or [])
    except (ValueError, KeyError):
        pass
    return {str(word).split("=", 1)[0] for word in words if str(word).startswith("--")}


def _same(value: Any, default: Any) -> bool:
    """Whether an option's value is its default (pytest-benchmark keeps seconds as Decimals)."""
    if isinstance(value, bool) or isinstance(default, bool) or value is None or default is None:
        return value == default
    try:
        return float(value) == float(default)
    except (TypeError, ValueError):
        return value == default


def given_values(config, mark_kwargs: dict | None = None) -> dict[str, Any]:
    """pytest-benchmark's timing options this case was given, by mark keyword: the command line's
    (where they differ from pytest-benchmark's default, or are written out), then the test's
    ``@pytest.mark.benchmark`` keywords over them, as pytest-benchmark takes them."""
    written = words_given(config)
    given = {}
    for option in READ + UNUSED:
        value = config.getoption(option.dest, option.default)
        if option.flag in written or (option.default is not WRITTEN_ONLY and not _same(value, option.default)):
            given[option.mark] = value
    given.update({key: value for key, value in (mark_kwargs or {}).items()
                  if key in {option.mark for option in READ + UNUSED}})
    return given


@dataclass(frozen=True)
class PlanChoice:
    """What pytest-benchmark's options set in a case's round plan (None: left to the plan's own
    default or its ``--dist-`` option) and the lines the run says once about them."""

    warmup: int | None = None
    min_time_s: float | None = None
    precision: float | None = None
    min_rounds: int | None = None
    notes: tuple[str, ...] = ()


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


def choose(given: dict[str, Any], dist_given: dict[str, Any]) -> PlanChoice:
    """How ``given`` (:func:`given_values`) sets a case's plan where ``dist_given`` (the ``--dist-``
    options given, by flag: ``{"--dist-warmup": 3}``) does not; notes for what is not read."""
    notes = []
    by_mark = {option.mark: option for option in READ + UNUSED}

    def unless_dist(option: BenchmarkOption, value: Any) -> Any:
        if value is None:
            return None
        if option.dist_flag in dist_given:
            notes.append(f"ddpbench: {option.flag} {_shown(given[option.mark])} is not read: "
                         f"{option.dist_flag} {_shown(dist_given[option.dist_flag])} is given, and it wins")
            return None
        return value

    warmup = None
    if "warmup_iterations" in given or "warmup" in given:
        on = given.get("warmup", True) is not False  # a bare --benchmark-warmup reads None: on
        iterations = given.get("warmup_iterations")
        warmup = 0 if not on else iterations  # on alone: ddpbench's own warm-up, as it always does
        mark = "warmup" if not on or iterations is None else "warmup_iterations"
        warmup = unless_dist(by_mark[mark], warmup)
    min_time_s = unless_dist(MAX_TIME, given.get("max_time"))
    precision = unless_dist(PRECISION, given.get("precision"))
    min_rounds = given.get("min_rounds")
    for option in UNUSED:
        if option.mark in given:
            notes.append(f"ddpbench: {option.flag} has no meaning for a ddpbench case ({option.unused}); "
                         f"see {option.dist_flag}")
    return PlanChoice(warmup=warmup, min_time_s=None if min_time_s is None else float(min_time_s),
                      precision=None if precision is None else float(precision),
                      min_rounds=None if min_rounds is None else int(min_rounds), notes=tuple(notes))
