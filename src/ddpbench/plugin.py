"""The pytest plugin: options, markers, the rank-pool fixtures and the ``dist_benchmark`` fixture.

Loaded through the ``pytest11`` entry point, so any pytest run in an environment with ddpbench
installed has it. ``dist_benchmark(workload)`` runs a workload on all ranks of the case's pool and
hands the per-round times (max over ranks) to pytest-benchmark as the case's rounds, so every
pytest-benchmark feature (--benchmark-json, --benchmark-autosave, --benchmark-compare[-fail],
--benchmark-histogram, --benchmark-save-data) works on them unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import pytest

from . import options as opts
from .pool import PoolRegistry, PoolSpec, cores_available
from .timing import RoundPlan, combine_rank_metrics, max_over_ranks, measure_workload

DEFAULT_SIZES = "1MB,10MB,100MB"
SLOW_SIZES = (1024**3,)  # 1 GB: collected with the `slow` marker when --dist-sizes is not given

_INTERRUPTED = int(pytest.ExitCode.INTERRUPTED)


# ----------------------------------------------------------------------------------------------
# Options and markers
# ----------------------------------------------------------------------------------------------


def pytest_addoption(parser):
    group = parser.getgroup("ddpbench", "ddpbench distributed benchmarks")
    group.addoption("--dist-backend", type=opts.parse_backend, default="gloo",
                    help="gloo (CPU tensors; the GPU cases of every family still use NCCL), nccl "
                         "(only the NCCL/CUDA cases), or auto (nccl when CUDA is present). Default: gloo")
    group.addoption("--dist-world-sizes", type=opts.parse_world_sizes, default=[2],
                    help="comma list of process counts, e.g. 2,4. Default: 2")
    group.addoption("--dist-sizes", type=opts.parse_sizes, default=None,
                    help=f"collective message sizes, KB/MB/GB suffixes (powers of 1024). "
                         f"Default: {DEFAULT_SIZES} (plus 1GB under -m slow)")
    group.addoption("--dist-timeout", type=opts.parse_timeout, default=120.0,
                    help="seconds a task may run on the ranks before the case fails. Default: 120")
    group.addoption("--dist-rounds", type=opts.parse_rounds, default=0,
                    help="recorded rounds per case; 0 picks enough rounds to fill --dist-min-time. Default: 0")
    group.addoption("--dist-warmup", type=opts.parse_warmup, default=2,
                    help="unrecorded warm-up rounds per case. Default: 2")
    group.addoption("--dist-pin-cores", choices=("auto", "off"), default="auto",
                    help="auto: pin each local rank to a core of its own when there are enough "
                         "cores (steadier medians); off: let the OS place them. Default: auto")
    group.addoption("--dist-controller", default=None, metavar="HOST:PORT",
                    help="multi-node: listen on HOST:PORT for ranks started by torchrun "
                         "(-m ddpbench.worker) instead of spawning local pools")
    group.addoption("--dist-secret-file", default=None, metavar="PATH",
                    help="with --dist-controller: 0600 file holding the shared secret "
                         "(default: $DDPBENCH_SECRET)")
    group.addoption("--dist-controller-wait", type=opts.parse_timeout, default=300.0,
                    help="with --dist-controller: seconds to wait for the workers. Default: 300")
    group.addoption("--dist-min-time", type=opts.parse_min_time, default=1.0,
                    help="with --dist-rounds=0: recorded seconds to aim for per case "
                         "(5 to 1000 rounds). Default: 1.0")


def pytest_configure(config):
    if config.getoption("dist_controller", None):
        from .controller import SecretError, load_secret, parse_address

        try:
            config._ddpbench_controller = (parse_address(config.getoption("dist_controller")),
                                           load_secret(config.getoption("dist_secret_file")))
        except (ValueError, SecretError) as exc:
            raise pytest.UsageError(f"--dist-controller: {exc}") from None
        if config.getoption("numprocesses", None):
            raise pytest.UsageError("--dist-controller serves one external pool: run without -n (xdist)")
    config.addinivalue_line("markers", "gpu: needs at least one CUDA device; skipped with a reason otherwise")
    config.addinivalue_line("markers", "multi_gpu: needs at least two CUDA devices; skipped with a reason otherwise")
    config.addinivalue_line("markers", "slow: large sizes and long loops, run with -m slow")
    config.addinivalue_line("markers", "dist_extra_world_sizes(*sizes): also run this test's dist_spec "
                            "cases at these world sizes (e.g. 1 as a scaling reference)")


@functools.lru_cache(maxsize=None)
def cuda_device_count() -> int:
    """CUDA devices visible to this process (asked once: every test function's parametrization
    and every item's GPU-skip check need it)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install counts as no CUDA
        return 0


def cpu_count() -> int:
    return len(cores_available()) or os.cpu_count() or 1


def pytest_report_header(config):
    world_sizes = config.getoption("dist_world_sizes")
    cores, gpus = cpu_count(), cuda_device_count()
    lines = [f"ddpbench: backend {config.getoption('dist_backend')}, world sizes "
             f"{','.join(map(str, world_sizes))}, {cores} CPU cores, {gpus} CUDA devices"]
    if config.getoption("dist_controller", None):
        lines.append(f"ddpbench: controller on {config.getoption('dist_controller')} (only that "
                     f"address) waits for torchrun workers; they join through the interface that "
                     f"reaches it unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME is set")
    if max(world_sizes) > cores:
        lines.append(f"ddpbench: WARNING: {max(world_sizes)} ranks outnumber the {cores} CPU cores; "
                     f"ranks time-slice and CPU timings of those cases are pessimistic")
    return lines


# ----------------------------------------------------------------------------------------------
# Case generation: which (backend, world size, device) a case runs on
# ----------------------------------------------------------------------------------------------


def dist_specs(backend_option: str, world_sizes: list[int], gpus: int) -> list[tuple[PoolSpec, list]]:
    """The pool specs to parametrize cases with, each with its marks.

    CPU cases use gloo. GPU cases use NCCL (one GPU per rank): world size 1 under ``gpu``, larger
    world sizes under ``gpu`` + ``multi_gpu``. ``gloo`` collects both sets (GPU cases skip without
    CUDA), ``nccl`` only the GPU set, ``auto`` resolves to nccl when CUDA is present.
    """
    backend = backend_option
    if backend == "auto":
        backend = "nccl" if gpus else "gloo"
    specs: list[tuple[PoolSpec, list]] = []
    if backend == "gloo":
        specs += [(PoolSpec("gloo", n, "cpu"), []) for n in world_sizes]
    gpu_sizes = [1] + [n for n in world_sizes if n > 1]
    for n in gpu_sizes:
        marks = [pytest.mark.gpu] + ([pytest.mark.multi_gpu] if n > 1 else [])
        specs.append((PoolSpec("nccl", n, "cuda"), marks))
    return specs


def spec_id(spec: PoolSpec) -> str:
    return f"{spec.backend}-{spec.world_size}p"


def pytest_generate_tests(metafunc):
    config = metafunc.config
    if "dist_spec" in metafunc.fixturenames:
        world_sizes = list(config.getoption("dist_world_sizes"))
        extra = metafunc.definition.get_closest_marker("dist_extra_world_sizes")
        if extra is not None:  # e.g. training's world-size-1 scaling reference
            world_sizes = sorted(set(world_sizes) | set(extra.args))
        specs = dist_specs(config.getoption("dist_backend"), world_sizes, cuda_device_count())
        metafunc.parametrize(
            "dist_spec",
            [pytest.param(spec, marks=marks, id=spec_id(spec)) for spec, marks in specs],
        )
    if "dist_message_size" in metafunc.fixturenames:
        sizes = config.getoption("dist_sizes")
        params = []
        if sizes is None:
            params += [pytest.param(s, id=opts.format_size(s)) for s in opts.parse_sizes(DEFAULT_SIZES)]
            params += [pytest.param(s, id=opts.format_size(s), marks=pytest.mark.slow) for s in SLOW_SIZES]
        else:
            params += [pytest.param(s, id=opts.format_size(s)) for s in sizes]
        metafunc.parametrize("dist_message_size", params)


def pytest_collection_modifyitems(config, items):
    gpus = cuda_device_count()
    for item in items:
        spec = getattr(item, "callspec", None) and item.callspec.params.get("dist_spec")
        needed = 0
        if item.get_closest_marker("gpu"):
            needed = 1
        if item.get_closest_marker("multi_gpu"):
            needed = 2
        if isinstance(spec, PoolSpec) and spec.device == "cuda":
            needed = max(needed, spec.world_size)
        if needed and gpus < needed:
            found = "no CUDA device" if gpus == 0 else f"only {gpus} CUDA device(s)"
            item.add_marker(pytest.mark.skip(
                reason=f"needs {needed} CUDA device(s) (NCCL runs one rank per GPU); {found} here"))


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dist_pools(request):
    """The session's rank pools, one per (backend, world size, device), reused across cases.

    With --dist-controller: the one pool of ranks that torchrun started on the nodes.
    """
    controller = getattr(request.config, "_ddpbench_controller", None)
    if controller is not None:
        from .controller import ExternalPoolRegistry

        address, secret = controller
        registry = ExternalPoolRegistry(address, secret, request.config.getoption("dist_controller_wait"),
                                        announce=functools.partial(_announce, request.config))
    else:
        registry = PoolRegistry(pin_cores=request.config.getoption("dist_pin_cores") == "auto")
    yield registry
    registry.close()


def _announce(config, lines: list[str]) -> None:
    """Write lines to the terminal in the middle of a test (past output capturing)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        for line in lines:
            reporter.write_line(line)


# `dist_spec` (a PoolSpec) and `dist_message_size` (bytes) are not fixtures: pytest_generate_tests
# parametrizes every test that names them.


@pytest.fixture
def dist_pool(dist_pools, dist_spec):
    """A live pool for this case's spec (tasks: ``dist_pool.run(fn, *args, timeout_s=...)``)."""
    from .controller import ExternalPoolRegistry, PoolUnavailable
    from .pool import PoolError

    try:
        return dist_pools.get(dist_spec)
    except PoolUnavailable as exc:
        pytest.skip(str(exc))
    except PoolError as exc:
        if not isinstance(dist_pools, ExternalPoolRegistry):
            raise
        message = str(exc)  # it says where each torchrun rank is: no traceback needed
    pytest.fail(message, pytrace=False)


@pytest.fixture
def dist_round_plan(request) -> RoundPlan:
    config = request.config
    return RoundPlan(
        warmup=config.getoption("dist_warmup"),
        rounds=config.getoption("dist_rounds"),
        min_time_s=config.getoption("dist_min_time"),
    )


@dataclass
class CaseResult:
    """What ``dist_benchmark(...)`` returns to the test."""

    round_times: list[float]  # max over ranks, one per recorded round
    rank_metrics: list[dict[str, Any]]  # per rank, in rank order
    extra_info: dict[str, Any]
    # each rank's own recorded round times, in rank order (round_times is their max per round)
    rank_round_times: list[list[float]] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.round_times)


class _ReplayClock:
    """A timer for pytest-benchmark's fixture that replays round times measured in the ranks.

    pytest-benchmark times a round as ``end = timer(); ... ; start = timer()`` around the target;
    this clock answers 0.0 then the round's duration, so each recorded duration is exactly the
    rank-measured one.
    """

    __module__ = "ddpbench"
    __name__ = "rank_max_round_time"

    def __init__(self, durations: list[float]):
        self._ticks = iter([tick for d in durations for tick in (0.0, d)])

    def __call__(self) -> float:
        return next(self._ticks)

    def exhausted(self) -> bool:
        return next(self._ticks, None) is None


def _noop() -> None:
    return None


def replay_into_pytest_benchmark(benchmark, round_times: list[float]) -> None:
    """Record ``round_times`` as the rounds of a pytest-benchmark fixture.

    pytest-benchmark has no public API for outside timings, so this sets the fixture's timer
    (``_timer``, read by ``pedantic``'s runner) and verifies the result, failing loudly if a
    pytest-benchmark release changes how pedantic uses it.
    """
    if benchmark.disabled:  # --benchmark-disable: run the target once, record nothing
        benchmark.pedantic(_noop, rounds=1, iterations=1)
        return
    clock = _ReplayClock(round_times)
    benchmark._timer = clock
    benchmark.pedantic(_noop, rounds=len(round_times), iterations=1, warmup_rounds=0)
    recorded = list(benchmark.stats.stats.data) if benchmark.stats else None
    if recorded != list(round_times) or not clock.exhausted():
        import pytest_benchmark

        raise RuntimeError(
            f"ddpbench could not hand its round times to pytest-benchmark "
            f"{pytest_benchmark.__version__}: the fixture's internals (_timer / pedantic) changed. "
            f"Install the pytest-benchmark version pinned in ddpbench's pyproject.toml."
        )


class DistBenchmark:
    """The ``dist_benchmark`` fixture's value: call it with a workload once per case."""

    def __init__(self, benchmark, pool, spec: PoolSpec, plan: RoundPlan, timeout_s: float):
        self.benchmark = benchmark
        self.pool = pool
        self.spec = spec
        self.plan = plan
        self.timeout_s = timeout_s
        self.extra_info = benchmark.extra_info  # tests may add their own keys

    def __call__(self, workload, *, rounds: int | None = None, warmup: int | None = None) -> CaseResult:
        plan = self.plan
        if self.benchmark.disabled:
            plan = RoundPlan(warmup=0, rounds=1)
        elif rounds is not None or warmup is not None:
            plan = RoundPlan(
                warmup=plan.warmup if warmup is None else warmup,
                rounds=plan.rounds if rounds is None else rounds,
                min_time_s=plan.min_time_s, min_rounds=plan.min_rounds, max_rounds=plan.max_rounds,
            )
        if workload.group is not None and self.benchmark.group is None:
            self.benchmark.group = workload.group
        measurements = self.pool.run(measure_workload, workload, plan, timeout_s=self.timeout_s)
        round_times = max_over_ranks([m.round_times for m in measurements])
        rank_metrics = [m.metrics for m in measurements]
        median_s = statistics.median(round_times)
        info = self.benchmark.extra_info
        info.update({
            "backend": self.spec.backend,
            "world_size": self.spec.world_size,
            "device": self.spec.device,
            "nodes": self.pool.nodes,
        })
        info.update(getattr(self.pool, "extra_info", None) or {})  # torchrun pools: socket_ifname...
        if self.spec.world_size > cpu_count():
            info["ranks_outnumber_cores"] = True
        info.update(combine_rank_metrics(rank_metrics))
        info.update(workload.extra_info(self.spec.world_size, median_s))
        replay_into_pytest_benchmark(self.benchmark, round_times)
        return CaseResult(round_times, rank_metrics, dict(info), [list(m.round_times) for m in measurements])


@pytest.fixture
def dist_benchmark(benchmark, dist_pool, dist_spec, dist_round_plan, request) -> DistBenchmark:
    """Benchmark a workload on all ranks of this case's pool; see :class:`DistBenchmark`."""
    return DistBenchmark(benchmark, dist_pool, dist_spec, dist_round_plan,
                         request.config.getoption("dist_timeout"))


# ----------------------------------------------------------------------------------------------
# Ctrl-C: never save a partial run over the user's baselines
# ----------------------------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    bench_session = getattr(session.config, "_benchmarksession", None)
    if exitstatus == _INTERRUPTED and bench_session is not None:
        if bench_session.save or bench_session.autosave or bench_session.json:
            bench_session.save = bench_session.autosave = bench_session.json = None
            session.config.get_terminal_writer().line(
                "ddpbench: run interrupted; no benchmark results were saved and stored baselines "
                "are untouched.", yellow=True)
    yield


# ----------------------------------------------------------------------------------------------
# Machine-drift calibration: recorded with every saved / --benchmark-json run
# ----------------------------------------------------------------------------------------------


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    """Store a short local probe (:mod:`ddpbench.calibration`) that ``ddpbench compare`` uses to
    normalise a uniformly slower or faster machine. Runs once per saved run, a few hundred ms."""
    from .calibration import MACHINE_INFO_KEY, run_probe

    try:
        machine_info[MACHINE_INFO_KEY] = run_probe()
    except Exception as exc:  # never lose a run's results over the probe
        machine_info[MACHINE_INFO_KEY] = {"error": f"{type(exc).__name__}: {exc}"}
