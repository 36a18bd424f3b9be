"""The pytest plugin: options, markers, the rank-pool fixtures and the ``dist_benchmark`` fixture.

Loaded through the ``pytest11`` entry point, so any pytest run in an environment with ddpbench
installed has it. ``dist_benchmark(workload)`` runs a workload on all ranks of the case's pool and
hands the per-round times (max over ranks) to pytest-benchmark as the case's rounds, so every
pytest-benchmark feature (--benchmark-json, --benchmark-autosave, --benchmark-compare[-fail],
--benchmark-histogram, --benchmark-save-data) works on them unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import os
import re
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest

from . import options as opts
from .gates.ab.heap import DEFAULT_HEAP, HEAP_MODES, heap_env
from .engine.modes import rank_aggregates, rounds_info
from .pool import PoolRegistry, PoolSpec, cores_available
from .engine.timing import RoundPlan, combine_rank_metrics, max_over_ranks, measure_workload

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
    group.addoption("--dist-pin-cores", choices=("auto", "off"), default=None,
                    help="off: the OS places the ranks, as in a plain torch.distributed script; "
                         "auto: pin each local rank to a core of its own while it measures, when "
                         "there are enough cores (steadier, but it measures that placement: 1 MB "
                         "gloo all_reduce ran 2-3x slower pinned on the 2-core dev machine). "
                         "Default: off, in A/B mode too")
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
                         "(5 to 1000 rounds), unless --dist-precision stops it earlier. Default: 1.0")
    ab = parser.getgroup("ddpbench-ab", "ddpbench A/B mode (baseline and candidate interleaved in one run)")
    ab.addoption("--dist-baseline-python", default=None, metavar="PATH",
                 help="interpreter for the baseline side's ranks (another environment with the same "
                      "ddpbench version installed, e.g. ../base/.venv/bin/python)")
    ab.addoption("--dist-baseline-path", action="append", default=None, metavar="DIR",
                 help="repeatable: prepended to the baseline ranks' sys.path (e.g. a checkout of the "
                      "code under test at the base revision)")
    ab.addoption("--dist-baseline-env", action="append", default=None, metavar="KEY=VALUE",
                 help="repeatable: set in the baseline ranks' environment")
    ab.addoption("--dist-candidate-env", action="append", default=None, metavar="KEY=VALUE",
                 help="repeatable: set in the candidate ranks' environment")
    ab.addoption("--dist-ab-threshold", type=opts.parse_percent, default=0.05, metavar="PCT",
                 help="smallest slowdown that counts as a regression (it must also be significant). "
                      "Default: 5%%")
    ab.addoption("--dist-ab-max-time", type=opts.parse_timeout, default=60.0, metavar="SECONDS",
                 help="per case: keep adding pairs of blocks while the verdict is inconclusive, up "
                      "to this many seconds. Default: 60")
    ab.addoption("--dist-ab-block-time", type=opts.parse_block_time, default=0.1, metavar="SECONDS",
                 help="recorded seconds aimed for per block (at least 3 rounds). Default: 0.1")
    ab.addoption("--dist-ab-pools-per-side", type=opts.parse_pools_per_side, default=2, metavar="N",
                 help="independent pools of ranks per side, taking turns pair by pair; a regression "
                      "must show on every pool pair, so one pool's own lasting offset is not a "
                      "verdict (1: the whole interval must clear the threshold instead). Default: 2")
    ab.addoption("--dist-ab-seed", type=opts.parse_seed, default=None, metavar="N",
                 help="seed of the blocks' random order; each run draws a new one and records it "
                      "(header, extra_info ab.seed): give it to repeat a run's order")
    ab.addoption("--dist-ab-allow-missing", action="store_true",
                 help="a case that the baseline ran but the candidate lost (crashed, hung) skips "
                      "instead of failing the run")
    ab.addoption("--dist-ab-fail-on-inconclusive", action="store_true",
                 help="exit 1 when any case is inconclusive (by default they are counted and exit 0)")
    ab.addoption("--dist-ab-heap", choices=HEAP_MODES, default=DEFAULT_HEAP,
                 help="steady: both sides' ranks run with glibc malloc's thresholds fixed, so every "
                      "pool allocates the same way every round (identical pools otherwise drifted "
                      "apart by whole cases on the dev machine); adaptive: glibc's defaults, as a "
                      "plain script. A side's own --dist-*-env setting wins. Default: steady")
    group.addoption("--dist-ops-per-round", type=opts.parse_ops_per_round, default=None, metavar="N|auto",
                    help="ops each round launches back to back, timed together and recorded per op; "
                         "auto: enough that the round's fixed cost (timer, launch, barrier exit) is "
                         "at most 1%% of it. Default: auto for CUDA cases, 1 on the CPU (gloo's ops "
                         "are synchronous: nothing to hide)")
    group.addoption("--dist-cuda-graphs", action="store_true",
                    help="capture each round's ops in a CUDA graph and replay it between the timing "
                         "events (nccl-tests -G); CUDA cases only")
    from .workloads.collectives import DTYPES, PLACEMENTS, REDUCE_OPS

    group.addoption("--dist-dtypes", type=opts.name_list(tuple(DTYPES), "data type", "float32,bfloat16"),
                    default=None, help=f"collective data types ({', '.join(DTYPES)}); cases gain a "
                                       f"dtype id part. Default: float32")
    group.addoption("--dist-reduce-ops", type=opts.name_list(REDUCE_OPS, "reduction", "sum,max"),
                    default=None, help="reductions of all_reduce and reduce_scatter (sum, max, min, avg); "
                                       "cases gain an id part. Default: sum")
    group.addoption("--dist-placements", type=opts.name_list(PLACEMENTS, "placement", "out-of-place,in-place"),
                    default=None, help="collective buffers out-of-place or in-place (as nccl-tests' two "
                                       "column groups); cases gain an id part. Default: each op's own "
                                       "(all_reduce and broadcast in place, the others out of place)")
    group.addoption("--dist-precision", type=opts.parse_precision, default=0.01,
                    help="with --dist-rounds=0: stop recording once the median's 95%% interval is "
                         "within +-this fraction of it (e.g. 1%%; checked after 20 rounds, then every "
                         "1.5x); 0 records until --dist-min-time is filled. Default: 1%%")


def pytest_configure(config):
    if config.getoption("dist_controller", None):
        from .pool.external import SecretError, load_secret, parse_address

        try:
            config._ddpbench_controller = (parse_address(config.getoption("dist_controller")),
                                           load_secret(config.getoption("dist_secret_file")))
        except (ValueError, SecretError) as exc:
            raise pytest.UsageError(f"--dist-controller: {exc}") from None
        if config.getoption("numprocesses", None):
            raise pytest.UsageError("--dist-controller serves one external pool: run without -n (xdist)")
    _configure_ab(config)
    _check_compare_target(config)
    if config.getoption("dist_cuda_graphs", False) and not cuda_device_count():
        broken = cuda_probe()[1]
        raise pytest.UsageError(
            "--dist-cuda-graphs: CUDA graphs capture and replay GPU work, and "
            + (f"CUDA is broken here: {broken}" if broken else
               "this machine has no CUDA device (the CPU cases' gloo ops run synchronously on the "
               "CPU: there is nothing to capture)"))
    config.addinivalue_line("markers", "gpu: needs at least one CUDA device; skipped with a reason otherwise")
    config.addinivalue_line("markers", "multi_gpu: needs at least two CUDA devices; skipped with a reason otherwise")
    config.addinivalue_line("markers", "slow: large sizes and long loops, run with -m slow")
    config.addinivalue_line("markers", "dist_extra_world_sizes(*sizes): also run this test's dist_spec "
                            "cases at these world sizes (e.g. 1 as a scaling reference)")


def _check_compare_target(config) -> None:
    """--benchmark-compare against a saved run that cannot be read is a usage error, not a
    warning and a silent comparison with an older run."""
    compare = config.getoption("benchmark_compare", None)
    if not compare:
        return
    from pytest_benchmark.utils import get_machine_id

    from .gates.compare import compare_target_problem

    problem = compare_target_problem(str(config.getoption("benchmark_storage", "file://./.benchmarks")),
                                     get_machine_id(), compare)
    if problem:
        raise pytest.UsageError(problem)


AB_OPTIONS = ("dist_baseline_python", "dist_baseline_path", "dist_baseline_env", "dist_candidate_env")


@dataclass
class ABConfig:
    """A/B mode's sides and settings (config._ddpbench_ab); verdicts collect in ``results`` as
    (case id, extra_info["ab"], candidate median or None)."""

    baseline: Any
    candidate: Any
    settings: Any
    heap: str = DEFAULT_HEAP  # --dist-ab-heap (ddpbench.gates.ab.heap)
    seed: int = 0  # --dist-ab-seed, or drawn for this run
    allow_missing: bool = False  # --dist-ab-allow-missing
    fail_on_inconclusive: bool = False  # --dist-ab-fail-on-inconclusive
    results: list = field(default_factory=list)

    def sides(self) -> dict:
        return {"baseline": self.baseline.describe(), "candidate": self.candidate.describe()}


def _ab_usage_error(config) -> None:
    """Option combinations A/B mode cannot measure, named with the fix."""
    if config.getoption("dist_controller", None):
        raise pytest.UsageError("A/B mode (--dist-baseline-* / --dist-candidate-env) runs local pools; "
                                "it cannot be combined with --dist-controller")
    if config.getoption("numprocesses", None):
        raise pytest.UsageError("A/B mode interleaves both sides on this machine's cores: run without -n (xdist)")
    if config.getoption("dist_warmup") == 0 and config.getoption("dist_rounds"):
        raise pytest.UsageError(
            "--dist-warmup=0 with --dist-rounds in A/B mode: A/B mode sizes its blocks of rounds "
            "(--dist-ab-block-time) from a timed warm-up round, and fixed rounds skip the one it would "
            "otherwise time. Use --dist-warmup=1 or more (--dist-rounds does not apply to A/B blocks)")


def _configure_ab(config) -> None:
    """A/B mode is on when any baseline / candidate option is given: check both sides now (the
    interpreter runs, imports a ddpbench of this run's rank protocol and torch), before any rank
    starts; where each side imports the code under test from is checked after collection."""
    if not any(config.getoption(name, None) for name in AB_OPTIONS):
        return
    from .gates.ab.engine import ABSettings
    from .gates.ab.schedule import new_seed
    from .gates.ab.sides import SideError, local_facts, make_side, parse_env_assignments, probe

    _ab_usage_error(config)
    heap = config.getoption("dist_ab_heap", DEFAULT_HEAP)
    common = heap_env(heap)
    try:
        baseline = make_side("baseline", config.getoption("dist_baseline_python"),
                             config.getoption("dist_baseline_path"),
                             parse_env_assignments(config.getoption("dist_baseline_env"), "--dist-baseline-env"),
                             common)
        candidate = make_side("candidate", None, None,
                              parse_env_assignments(config.getoption("dist_candidate_env"), "--dist-candidate-env"),
                              common)
        ours = local_facts()
        baseline = probe(baseline, ours["rank_protocol"])
        candidate = (probe(candidate, ours["rank_protocol"]) if candidate.env
                     else dataclasses.replace(candidate, facts=ours))
    except SideError as exc:
        raise pytest.UsageError(f"ddpbench A/B: {exc}") from None
    settings = ABSettings(threshold=config.getoption("dist_ab_threshold"),
                          max_time_s=config.getoption("dist_ab_max_time"),
                          block_time_s=config.getoption("dist_ab_block_time"),
                          pools_per_side=config.getoption("dist_ab_pools_per_side"))
    first_stage_s = 2 * settings.stage_sizes(settings.pools_per_side)[0] * settings.block_time_s
    if first_stage_s > settings.max_time_s:
        raise pytest.UsageError(
            f"--dist-ab-block-time {settings.block_time_s:g} s: a case's first stage alone (always "
            f"run, {2 * settings.stage_sizes(settings.pools_per_side)[0]} blocks) takes about "
            f"{first_stage_s:g} s, past --dist-ab-max-time {settings.max_time_s:g} s. Use a shorter "
            f"block time or a longer cap (defaults: 0.1 s and 60 s)")
    seed = config.getoption("dist_ab_seed")
    config._ddpbench_ab = ABConfig(baseline, candidate, settings, heap,
                                   seed=new_seed() if seed is None else seed,
                                   allow_missing=config.getoption("dist_ab_allow_missing"),
                                   fail_on_inconclusive=config.getoption("dist_ab_fail_on_inconclusive"))


def _resolve_ab_modules(session) -> None:
    """After collection: where each side's ranks import the modules under test from; stop when a
    baseline that names other code would import the candidate's (ddpbench.gates.ab.sides)."""
    ab = getattr(session.config, "_ddpbench_ab", None)
    if ab is None:
        return
    from .gates.ab.sides import SideError, check_modules_differ, module_lines, modules_under_test, resolve_modules

    test_modules = {item.module for item in session.items if getattr(item, "module", None) is not None}
    project = {str(session.config.rootpath)} | {os.path.dirname(m.__file__) for m in test_modules
                                                 if getattr(m, "__file__", None)}
    names = modules_under_test(test_modules, project)
    try:
        ab.baseline = resolve_modules(ab.baseline, names)
        ab.candidate = resolve_modules(ab.candidate, names)
        check_modules_differ(ab.baseline, ab.candidate)
    except SideError as exc:
        raise pytest.UsageError(f"ddpbench A/B: {exc}") from None
    lines = module_lines(ab.baseline, ab.candidate)
    if lines:
        _announce(session.config, ["ddpbench A/B: where each side's ranks import the code under test from:"]
                  + [f"ddpbench A/B: {line}" for line in lines])


def pin_cores(config) -> bool:
    """--dist-pin-cores as given; unset: off, A/B mode included. With the steady heap
    (--dist-ab-heap), pools of identical processes placed by the OS drifted apart by 0-1.7% for a
    case on the dev machine, pinned ones by 3.2-3.5% (docs/results.md)."""
    return config.getoption("dist_pin_cores", None) == "auto"


def _nvidia_gpus_present() -> list[str]:
    """The NVIDIA device files of this machine (no CUDA call): /dev/nvidia0, ..."""
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


@functools.lru_cache(maxsize=None)
def cuda_probe() -> tuple[int, str | None]:
    """(CUDA devices visible to this process, why CUDA is broken here or None), asked once.

    No GPU is not broken. Broken is a machine whose NVIDIA GPUs torch cannot use: a CPU-only
    torch build, or a CUDA build whose initialisation fails (a driver too old for it, a missing
    library). CUDA_VISIBLE_DEVICES set empty hides the GPUs on purpose: that is no GPU."""
    gpus = _nvidia_gpus_present()
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1")
    try:
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CUDA initialization: ..." says it again below
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # noqa: BLE001 - an install broken in any way
        return 0, f"torch's CUDA check raised {type(exc).__name__}: {exc}"
    if count or not gpus or hidden:
        return count, None
    if torch.version.cuda is None:
        return 0, (f"this machine has NVIDIA GPUs ({', '.join(gpus)}) but torch {torch.__version__} is a "
                   f"CPU-only build; install the CUDA build (on Linux, PyPI's torch wheel)")
    try:
        torch.cuda.init()
        reason = "torch sees no CUDA device"
    except Exception as exc:  # noqa: BLE001
        reason = f"{type(exc).__name__}: {exc}".strip()
    return 0, (f"this machine has NVIDIA GPUs ({', '.join(gpus)}) but torch {torch.__version__} (CUDA "
               f"{torch.version.cuda}) cannot use them: {reason}")


def cuda_device_count() -> int:
    """CUDA devices visible to this process (every test function's parametrization and every
    item's GPU-skip check need it)."""
    return cuda_probe()[0]


_GPU_MARK = re.compile(r"(\bnot\s+)?\b(multi_gpu|gpu)\b")


def gpu_cases_requested(config) -> bool:
    """Whether the run asks for GPU cases by name: -m selecting gpu / multi_gpu (not negated) or
    --dist-backend=nccl."""
    if config.getoption("dist_backend", None) == "nccl":
        return True
    expression = config.getoption("markexpr", "") or ""
    return any(not negated for negated, _ in _GPU_MARK.findall(expression))


GPU_INFO_KEY = "ddpbench_gpus"


@functools.lru_cache(maxsize=None)
def gpu_description() -> dict | None:
    """The visible GPUs and the CUDA / NCCL versions torch was built with (None without CUDA),
    stored in each saved run's machine_info under :data:`GPU_INFO_KEY`."""
    if not cuda_device_count():
        return None
    import torch

    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a build without NCCL
        nccl = None
    return {"devices": [torch.cuda.get_device_name(i) for i in range(cuda_device_count())],
            "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl}


def cpu_count() -> int:
    return len(cores_available()) or os.cpu_count() or 1


def pytest_report_header(config):
    world_sizes = config.getoption("dist_world_sizes")
    cores, gpus = cpu_count(), cuda_device_count()
    described = gpu_description()
    if described:
        from .report import gpus_label

        names = f": {gpus_label(described)}"
    else:
        names = ""
    lines = [f"ddpbench: backend {config.getoption('dist_backend')}, world sizes "
             f"{','.join(map(str, world_sizes))}, {cores} CPU cores, {gpus} CUDA devices{names}"]
    if config.getoption("dist_controller", None):
        lines.append(f"ddpbench: controller on {config.getoption('dist_controller')} (only that "
                     f"address) waits for torchrun workers; they join through the interface that "
                     f"reaches it unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME is set")
    if max(world_sizes) > cores:
        lines.append(f"ddpbench: WARNING: {max(world_sizes)} ranks outnumber the {cores} CPU cores; "
                     f"ranks time-slice and CPU timings of those cases are pessimistic")
    ab = getattr(config, "_ddpbench_ab", None)
    if ab is not None:
        s = ab.settings
        lines.append(f"ddpbench A/B: threshold {s.threshold * 100:g}%, blocks of ~{s.block_time_s:g} s, "
                     f"{s.first_pairs} pairs first, more up to {s.max_time_s:g} s per case, "
                     f"{s.pools_per_side} pool(s) per side, ranks "
                     f"{'pinned one core each' if pin_cores(config) else 'placed by the OS'} "
                     f"(--dist-pin-cores)")
        common = ", ".join(f"{k}={v}" for k, v in ab.baseline.common_env) or "glibc's defaults"
        lines.append(f"ddpbench A/B: heap {ab.heap}, both sides' ranks: {common} (--dist-ab-heap)")
        lines.append(f"ddpbench A/B: block order seed {ab.seed} (--dist-ab-seed {ab.seed} repeats it)")
        lines.append(f"ddpbench A/B: baseline  = {ab.baseline.short()}")
        lines.append(f"ddpbench A/B: candidate = {ab.candidate.short()}")
        from .gates.ab.sides import engine_lines

        lines += [f"ddpbench A/B: {line}" for line in engine_lines(ab.baseline, ab.candidate)]
        alive = 2 * s.pools_per_side * max(world_sizes)
        if alive > cores:
            lines.append(f"ddpbench A/B: both sides' pools are alive at once ({alive} rank "
                         f"processes on {cores} cores); only the pool measuring a block is busy")
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
    """``gloo-2p``, ``nccl-1p``; a backend off its usual device says so: ``gloo-cuda-2p`` (gloo
    with CUDA tensors, e.g. several ranks sharing one GPU)."""
    device = "" if spec.device == opts.usual_device(spec.backend) else f"{spec.device}-"
    return f"{spec.backend}-{device}{spec.world_size}p"


def _parametrizes_itself(metafunc, name: str) -> bool:
    """Whether the test has its own ``@pytest.mark.parametrize`` over ``name``."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc):
    config = metafunc.config
    # A test that parametrizes dist_spec itself (e.g. ranks sharing one GPU through gloo) keeps its own.
    if "dist_spec" in metafunc.fixturenames and not _parametrizes_itself(metafunc, "dist_spec"):
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
    # Collective variants: an id part each only when asked for, so default case ids never change.
    for name, option in (("dist_dtype", "dist_dtypes"), ("dist_reduce_op", "dist_reduce_ops"),
                         ("dist_placement", "dist_placements")):
        values = config.getoption(option, None)
        if name in metafunc.fixturenames and values and not _parametrizes_itself(metafunc, name):
            metafunc.parametrize(name, values, ids=values)


def pytest_collection_modifyitems(config, items):
    gpus, broken = cuda_probe()
    for item in items:
        spec = getattr(item, "callspec", None) and item.callspec.params.get("dist_spec")
        needed = 0
        if item.get_closest_marker("gpu"):
            needed = 1
        if item.get_closest_marker("multi_gpu"):
            needed = 2
        nccl = isinstance(spec, PoolSpec) and spec.backend == "nccl"
        if isinstance(spec, PoolSpec) and spec.device == "cuda":
            # NCCL runs one rank per GPU; gloo ranks with CUDA tensors may share one.
            needed = max(needed, spec.world_size if nccl else 1)
        if needed and gpus < needed:
            if broken and gpu_cases_requested(config):
                raise pytest.UsageError(
                    f"GPU cases were asked for (-m {config.getoption('markexpr')!r}"
                    f"{', --dist-backend=nccl' if config.getoption('dist_backend') == 'nccl' else ''}), "
                    f"but CUDA is broken here: {broken}. Fix the install (nvidia-smi shows the driver; "
                    f"python -c 'import torch; torch.cuda.init()' shows the error), or deselect the GPU "
                    f"cases")
            found = "no CUDA device" if gpus == 0 else f"only {gpus} CUDA device(s)"
            if broken:
                found = f"CUDA is broken here: {broken}"
            why = " (NCCL runs one rank per GPU)" if nccl else ""
            item.add_marker(pytest.mark.skip(reason=f"needs {needed} CUDA device(s){why}; {found}"
                                                    + ("" if broken else " here")))


# ----------------------------------------------------------------------------------------------
# Memory pre-flight: message sizes that cannot fit stop the run before any rank starts
# ----------------------------------------------------------------------------------------------

# Each rank process holds this much besides its buffers (the interpreter, torch, gloo).
RANK_BASE_MEMORY_BYTES = 384 * 1024**2
# Leave this share of the available memory free.
MEMORY_MARGIN = 0.9


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def memory_needs(items, pools_at_once: int = 1) -> list[tuple[int, PoolSpec, int]]:
    """(message size, spec, bytes needed) for the collected collective cases, largest need per
    (size, spec). CPU pools need world size x (base + buffers) of host memory (x pools_at_once:
    A/B mode keeps two pools alive); NCCL ranks need the buffers on their own GPU."""
    from .workloads.collectives import rank_memory_bytes

    needs = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        size, spec = params.get("dist_message_size"), params.get("dist_spec")
        if not isinstance(size, int) or not isinstance(spec, PoolSpec) or item.get_closest_marker("skip"):
            continue
        if spec.device == "cpu":
            need = pools_at_once * spec.world_size * (RANK_BASE_MEMORY_BYTES + rank_memory_bytes(size))
        else:
            need = rank_memory_bytes(size)
        needs[(size, spec)] = need
    return [(size, spec, need) for (size, spec), need in needs.items()]


def check_memory(items, pools_at_once: int, host_available: int, gpu_free) -> None:
    """Raise pytest.UsageError naming the largest case that cannot fit (host memory, or the free
    memory of the smallest GPU for NCCL cases)."""
    for size, spec, need in sorted(memory_needs(items, pools_at_once), key=lambda x: -x[2]):
        if spec.device == "cpu":
            available = int(host_available * MEMORY_MARGIN)
            where = f"{_gib(host_available)} of host memory is available"
            who = f"{spec.world_size} ranks" + (f" x {pools_at_once} pools (A/B mode: both sides' pools "
                                                f"alive at once)" if pools_at_once > 1 else "")
        else:
            free = gpu_free()
            if free is None:
                continue
            available = int(free * MEMORY_MARGIN)
            where = f"the smallest GPU has {_gib(free)} free"
            who = "each NCCL rank on its GPU"
        if need > available:
            raise pytest.UsageError(
                f"--dist-sizes: the {opts.format_size(size)} collective cases on {spec.label} need about "
                f"{_gib(need)} ({who}: the buffers, the backend's copy and the check's expected "
                f"result), but {where}. Use smaller --dist-sizes (e.g. --dist-sizes=1MB,10MB,100MB) "
                f"or fewer ranks (--dist-world-sizes)"
                + (", or fewer A/B pools (--dist-ab-pools-per-side=1)." if pools_at_once > 2 else "."))


def _smallest_gpu_free_bytes():
    if not cuda_device_count():
        return None
    import torch

    return min(torch.cuda.mem_get_info(i)[0] for i in range(cuda_device_count()))


def pytest_collection_finish(session):
    """Before any rank starts: every selected collective size must fit in memory, and in A/B mode
    each side must import its own code."""
    if getattr(session.config, "_ddpbench_controller", None):
        return  # multi-node: the nodes' memory is not this machine's
    import psutil

    ab = getattr(session.config, "_ddpbench_ab", None)
    pools_at_once = 2 * ab.settings.pools_per_side if ab is not None else 1
    check_memory(session.items, pools_at_once, psutil.virtual_memory().available, _smallest_gpu_free_bytes)
    _resolve_ab_modules(session)


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
        from .pool.external import ExternalPoolRegistry

        address, secret = controller
        registry = ExternalPoolRegistry(address, secret, request.config.getoption("dist_controller_wait"),
                                        announce=functools.partial(_announce, request.config))
    else:
        registry = PoolRegistry(pin_cores=pin_cores(request.config))
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
def dist_pool(dist_pools, dist_spec, request):
    """A live pool for this case's spec (tasks: ``dist_pool.run(fn, *args, timeout_s=...)``)."""
    from .pool.external import ExternalPoolRegistry, PoolUnavailable
    from .pool import PoolError

    ab = getattr(request.config, "_ddpbench_ab", None)
    try:
        if ab is not None:  # the case's own pool is the candidate's first
            return dist_pools.get(dist_spec, ab.candidate.launch, 0, owner="candidate")
        return dist_pools.get(dist_spec)
    except PoolUnavailable as exc:
        pytest.skip(str(exc))
    except PoolError as exc:
        if not isinstance(dist_pools, ExternalPoolRegistry):
            raise
        message = str(exc)  # it says where each torchrun rank is: no traceback needed
    pytest.fail(message, pytrace=False)


@pytest.fixture
def dist_dtype() -> str:
    """The case's collective data type: float32, or each of --dist-dtypes (an id part each)."""
    return "float32"


@pytest.fixture
def dist_reduce_op() -> str:
    """The case's reduction: sum, or each of --dist-reduce-ops (an id part each)."""
    return "sum"


@pytest.fixture
def dist_placement() -> str | None:
    """The case's buffer placement: None (the op's own), or each of --dist-placements."""
    return None


@pytest.fixture
def dist_round_plan(request) -> RoundPlan:
    """The options' round plan; ops_per_round None until a case resolves it for its device."""
    config = request.config
    return RoundPlan(
        warmup=config.getoption("dist_warmup"),
        rounds=config.getoption("dist_rounds"),
        min_time_s=config.getoption("dist_min_time"),
        precision=config.getoption("dist_precision"),
        ops_per_round=config.getoption("dist_ops_per_round", None),
        cuda_graphs=config.getoption("dist_cuda_graphs", False),
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

    def __init__(self, benchmark, pool, spec: PoolSpec, plan: RoundPlan, timeout_s: float,
                 ab: ABConfig | None = None, pools=None, case_id: str = ""):
        self.benchmark = benchmark
        self.pool = pool
        self.spec = spec
        self.plan = plan
        self.timeout_s = timeout_s
        self.ab = ab  # A/B mode: the case runs on both sides, interleaved
        self._pools = pools
        self.case_id = case_id
        self.extra_info = benchmark.extra_info  # tests may add their own keys

    def _measure(self, workload, plan: RoundPlan):
        """(round times, per-rank metrics, per-rank CPUs per round) of the case's own side."""
        if self.ab is None or self.benchmark.disabled:
            measurements = self.pool.run(measure_workload, workload, plan, timeout_s=self.timeout_s)
            return (max_over_ranks([m.round_times for m in measurements]), [m.metrics for m in measurements],
                    [m.round_cpus for m in measurements], [list(m.round_times) for m in measurements])
        from .gates.ab.engine import SideFailed, run_case

        # The candidate's pool 0 is the case's own (self.pool): the registry hands back the same
        # one. Each side owns its pools, even when both sides' launches are identical (A/A).
        pools = {name: [self._pools.get(self.spec, side.launch, j, owner=name)
                        for j in range(self.ab.settings.pools_per_side)]
                 for name, side in (("baseline", self.ab.baseline), ("candidate", self.ab.candidate))}
        try:
            outcome = run_case(pools, workload, plan, self.ab.settings, self.timeout_s, self.case_id,
                               self.ab.seed)
        except SideFailed as failure:
            if failure.side == "candidate":
                self._lost(failure)
            return self._new(workload, plan, failure)
        summary = outcome.summary(self.ab.sides())
        summary["heap"] = self.ab.heap
        summary["pool_pids"] = {name: [p.pids for p in side_pools] for name, side_pools in pools.items()}
        self.benchmark.extra_info["ab"] = summary
        self.ab.results.append((self.case_id, summary, statistics.median(outcome.candidate.round_times)))
        return (outcome.candidate.round_times, outcome.candidate_metrics, outcome.candidate.rank_cpus,
                outcome.candidate.rank_round_times)

    def _lost(self, failure) -> None:
        """The candidate lost a case the baseline ran (crashed, hung): a verdict of its own that
        fails the run, or skips the case with --dist-ab-allow-missing."""
        summary = {"verdict": "missing", "reason": f"candidate pool {failure.pool} failed",
                   "error": str(failure), "seed": self.ab.seed, "sides": self.ab.sides()}
        self.ab.results.append((self.case_id, summary, None))
        message = (f"ddpbench A/B: the candidate lost this case (the baseline ran it): "
                   f"{failure}")
        if self.ab.allow_missing:
            pytest.skip(f"{message.splitlines()[0]} (allowed by --dist-ab-allow-missing)")
        pytest.fail(message, pytrace=False)

    def _new(self, workload, plan, failure):
        """The baseline could not run this case (it fails or lacks it there): nothing to compare
        with, so the candidate is measured alone and the verdict is ``new``."""
        summary = {"verdict": "new", "reason": f"baseline pool {failure.pool} failed",
                   "error": str(failure), "seed": self.ab.seed, "sides": self.ab.sides()}
        self.benchmark.extra_info["ab"] = summary
        measurements = self.pool.run(measure_workload, workload, plan, timeout_s=self.timeout_s)
        times = max_over_ranks([m.round_times for m in measurements])
        self.ab.results.append((self.case_id, summary, statistics.median(times)))
        return (times, [m.metrics for m in measurements], [m.round_cpus for m in measurements],
                [list(m.round_times) for m in measurements])

    def _skip_reason(self, workload, plan: RoundPlan) -> str | None:
        reason = workload.skip_reason(self.spec)
        if reason is None and plan.cuda_graphs:
            if self.spec.device != "cuda":
                reason = ("--dist-cuda-graphs captures GPU work, and this case runs on the CPU (gloo's "
                          "ops are synchronous there)")
            elif not getattr(workload, "cuda_graph_safe", False):
                reason = (f"--dist-cuda-graphs: {type(workload).__name__}'s rounds do more than GPU work, "
                          f"which a CUDA graph cannot capture")
        return reason

    def __call__(self, workload, *, rounds: int | None = None, warmup: int | None = None) -> CaseResult:
        plan = self.plan
        if plan.ops_per_round is None:  # the default: auto for CUDA cases, 1 on the CPU
            plan = dataclasses.replace(plan, ops_per_round="auto" if self.spec.device == "cuda" else 1)
        if self.benchmark.disabled:
            plan = RoundPlan(warmup=0, rounds=1)
        elif rounds is not None or warmup is not None:
            plan = dataclasses.replace(plan, warmup=plan.warmup if warmup is None else warmup,
                                       rounds=plan.rounds if rounds is None else rounds)
        reason = self._skip_reason(workload, plan)
        if reason:
            pytest.skip(reason)
        if self.ab is not None and not self.benchmark.disabled and plan.warmup == 0 and plan.rounds:
            raise ValueError("dist_benchmark(..., warmup=0) with fixed rounds in A/B mode: A/B mode sizes "
                             "its blocks from a timed warm-up round; pass warmup=1 or more")
        if workload.group is not None and self.benchmark.group is None:
            self.benchmark.group = workload.group
        round_times, rank_metrics, cpus, rank_round_times = self._measure(workload, plan)
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
        info.update(rounds_info(round_times, cpus, self.pool.nodes))
        info.update(rank_aggregates(rank_round_times))
        info.update(workload.extra_info(self.spec.world_size, median_s))
        replay_into_pytest_benchmark(self.benchmark, round_times)
        return CaseResult(round_times, rank_metrics, dict(info), rank_round_times)


@pytest.fixture
def dist_benchmark(benchmark, dist_pool, dist_spec, dist_round_plan, dist_pools, request) -> DistBenchmark:
    """Benchmark a workload on all ranks of this case's pool; see :class:`DistBenchmark`."""
    return DistBenchmark(benchmark, dist_pool, dist_spec, dist_round_plan,
                         request.config.getoption("dist_timeout"),
                         ab=getattr(request.config, "_ddpbench_ab", None), pools=dist_pools,
                         case_id=request.node.nodeid)


# ----------------------------------------------------------------------------------------------
# Ctrl-C: never save a partial run over the user's baselines
# ----------------------------------------------------------------------------------------------


def _ab_cases(ab):
    from .gates.verdicts import CaseVerdict

    return [CaseVerdict(name, summary, median) for name, summary, median in ab.results]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    ab = getattr(session.config, "_ddpbench_ab", None)
    if ab is not None and exitstatus == pytest.ExitCode.OK:
        from .gates.verdicts import gate_outcome

        status, _ = gate_outcome(_ab_cases(ab), ab.allow_missing, ab.fail_on_inconclusive, "--dist-ab-")
        if status:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # 1, as --benchmark-compare-fail does
    bench_session = getattr(session.config, "_benchmarksession", None)
    if exitstatus == _INTERRUPTED and bench_session is not None:
        if bench_session.save or bench_session.autosave or bench_session.json:
            bench_session.save = bench_session.autosave = bench_session.json = None
            session.config.get_terminal_writer().line(
                "ddpbench: run interrupted; no benchmark results were saved and stored baselines "
                "are untouched.", yellow=True)
    yield


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    ab = getattr(config, "_ddpbench_ab", None)
    if ab is None:
        return
    from .gates.verdicts import describe, format_text, gate_outcome

    cases = _ab_cases(ab)
    terminalreporter.write_sep("-", "ddpbench A/B")
    sides = {name: describe(desc) for name, desc in ab.sides().items()}
    for line in format_text(cases, ab.settings.threshold, sides).splitlines():
        terminalreporter.write_line(line, red=" regression" in line or " missing" in line)
    status, lines = gate_outcome(cases, ab.allow_missing, ab.fail_on_inconclusive, "--dist-ab-")
    for line in lines:
        terminalreporter.write_line(f"ddpbench A/B: {line}", red="exit status 1" in line,
                                    bold="exit status 1" in line)
    terminalreporter.write_line(f"ddpbench A/B: block order seed {ab.seed} (--dist-ab-seed {ab.seed} repeats it)")


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    """A/B runs list the cases the candidate lost: they have no benchmark entry of their own, and
    ``ddpbench compare RUN.json`` must still see them."""
    ab = getattr(config, "_ddpbench_ab", None)
    if ab is None:
        return
    from .gates.verdicts import LOST_CASES_KEY

    output_json[LOST_CASES_KEY] = [{"name": name, "ab": summary} for name, summary, _ in ab.results
                                   if summary.get("verdict") == "missing"]


# ----------------------------------------------------------------------------------------------
# Machine-drift calibration: recorded with every saved / --benchmark-json run
# ----------------------------------------------------------------------------------------------


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    """Store a short local probe (:mod:`ddpbench.gates.calibration`) that ``ddpbench compare`` uses to
    normalise a uniformly slower or faster machine. Runs once per saved run, a few hundred ms."""
    from .gates.calibration import MACHINE_INFO_KEY, run_probe

    try:
        machine_info[MACHINE_INFO_KEY] = run_probe()
    except Exception as exc:  # never lose a run's results over the probe
        machine_info[MACHINE_INFO_KEY] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        gpus = gpu_description()
    except Exception as exc:  # never lose a run's results over the description either
        gpus = {"error": f"{type(exc).__name__}: {exc}"}
    if gpus is not None:
        machine_info[GPU_INFO_KEY] = gpus
