"""The pytest plugin: options, markers, parametrization and fixtures. It wires pytest to ddpbench
and decides nothing itself: the engine times (:mod:`ddpbench.engine`), the pools run
(:mod:`ddpbench.pool`), the gates judge (:mod:`ddpbench.gates`), each family says what its cases
need (e.g. :mod:`ddpbench.workloads.collective_cases`).

Loaded through the ``pytest11`` entry point, so any pytest run in an environment with ddpbench
installed has it; a session none of whose tests asks for a ddpbench fixture (and that gives no A/B
or controller option) imports no torch, probes no CUDA, starts nothing and prints no header line
(:func:`uses_ddpbench`). ``dist_benchmark(workload)`` (:class:`ddpbench.fixture.DistBenchmark`) runs a
workload on all ranks of the case's pool and hands the per-round times (max over ranks) to
pytest-benchmark as the case's rounds, so every pytest-benchmark feature (--benchmark-json,
--benchmark-autosave, --benchmark-compare[-fail], --benchmark-histogram, --benchmark-save-data)
works on them unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import TYPE_CHECKING

import pytest

from . import options as opts
from .benchmark_internals import benchmark_session
from .devices import GPU_INFO_KEY, cpu_count, cuda_device_count, cuda_probe, gpu_cases_requested, gpu_description
from .gates.ab.forensics import DEFAULT_PROFILE, PROFILE_MODES
from .gates.ab.heap import DEFAULT_HEAP, HEAP_MODES
from .workloads.collective_cases import DEFAULT_SIZES

if TYPE_CHECKING:  # imported where used: a session without a ddpbench case never loads the engine
    from .engine.timing import RoundPlan
    from .fixture import DistBenchmark
    from .pool import PoolSpec

_INTERRUPTED = int(pytest.ExitCode.INTERRUPTED)

#: The fixtures that make a test a ddpbench case (``dist_spec`` and ``dist_message_size`` are
#: parameters that pytest_generate_tests gives).
CASE_FIXTURES = frozenset({"dist_benchmark", "dist_pool", "dist_pools", "dist_spec", "dist_message_size",
                           "dist_dtype", "dist_reduce_op", "dist_placement", "dist_round_plan"})
#: Whether this session uses ddpbench: set once its tests are collected (unset before).
USES_DDPBENCH = pytest.StashKey[bool]()


def is_case(item) -> bool:
    """Whether a collected test asks for a ddpbench fixture."""
    return not CASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def _explicitly_asked(config) -> bool:
    """An A/B or multi-node option: the user asked for ddpbench whatever the tests are."""
    return (getattr(config, "_ddpbench_ab", None) is not None
            or getattr(config, "_ddpbench_controller", None) is not None)


def uses_ddpbench(config, items=None) -> bool:
    """Whether ddpbench has anything to do in this session: a test among ``items`` (the session's,
    once collected) is a ddpbench case, or an A/B / multi-node option was given. A session where
    it has not imports no torch, probes no CUDA and starts nothing (README, *Installing*)."""
    if _explicitly_asked(config):
        return True
    if items is not None:
        return any(is_case(item) for item in items)
    return bool(config.stash.get(USES_DDPBENCH, False))


# ----------------------------------------------------------------------------------------------
# Options and markers
# ----------------------------------------------------------------------------------------------


def pytest_addhooks(pluginmanager):
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    from .workloads.collectives import DTYPES, PLACEMENTS, REDUCE_OPS

    cases = parser.getgroup("ddpbench", "ddpbench distributed benchmarks")
    cases.addoption("--dist-backend", type=opts.parse_backend, default="gloo",
                    help="gloo (CPU tensors; the GPU cases of every family still use NCCL), nccl "
                         "(only the NCCL/CUDA cases), or auto (nccl when CUDA is present). Default: gloo")
    cases.addoption("--dist-world-sizes", type=opts.parse_world_sizes, default=[2],
                    help="comma list of process counts, e.g. 2,4. Default: 2")
    cases.addoption("--dist-sizes", type=opts.parse_sizes, default=None,
                    help=f"collective message sizes, KB/MB/GB suffixes (powers of 1024). "
                         f"Default: {DEFAULT_SIZES} (plus 1GB under -m slow)")
    cases.addoption("--dist-dtypes", type=opts.name_list(tuple(DTYPES), "data type", "float32,bfloat16"),
                    default=None, help=f"collective data types ({', '.join(DTYPES)}); cases gain a "
                                       f"dtype id part. Default: float32")
    cases.addoption("--dist-reduce-ops", type=opts.name_list(REDUCE_OPS, "reduction", "sum,max"),
                    default=None, help="reductions of all_reduce and reduce_scatter (sum, max, min, avg); "
                                       "cases gain an id part. Default: sum")
    cases.addoption("--dist-placements", type=opts.name_list(PLACEMENTS, "placement", "out-of-place,in-place"),
                    default=None, help="collective buffers out-of-place or in-place (as nccl-tests' two "
                                       "column groups); cases gain an id part. Default: each op's own "
                                       "(all_reduce and broadcast in place, the others out of place)")
    cases.addoption("--dist-timeout", type=opts.parse_timeout, default=120.0,
                    help="seconds a task may run on the ranks before the case fails. Default: 120")
    cases.addoption("--dist-rounds", type=opts.parse_rounds, default=0,
                    help="recorded rounds per case; 0 picks enough rounds to fill --dist-min-time. Default: 0")
    cases.addoption("--dist-warmup", type=opts.parse_warmup, default=2,
                    help="unrecorded warm-up rounds per case. Default: 2")
    cases.addoption("--dist-min-time", type=opts.parse_min_time, default=1.0,
                    help="with --dist-rounds=0: recorded seconds to aim for per case "
                         "(5 to 1000 rounds), unless --dist-precision stops it earlier. Default: 1.0")
    cases.addoption("--dist-ops-per-round", type=opts.parse_ops_per_round, default=None, metavar="N|auto",
                    help="ops each round launches back to back, timed together and recorded per op; "
                         "auto: enough that the round's fixed cost (timer, launch, barrier exit) is "
                         "at most 1%% of it. Default: auto for CUDA cases, 1 on the CPU (gloo's ops "
                         "are synchronous: nothing to hide)")
    cases.addoption("--dist-exposed-comm", type=opts.parse_exposed_comm, default="auto", metavar="auto|off|N",
                    help="after a case's rounds, time N rounds each of its workload's compute-only "
                         "step and its collectives replayed alone, interleaved with N more steps "
                         "(extra_info compute_s, exposed_comm_s, comm_isolated_s, comm_overlap_pct); "
                         "auto: as each case asks (the default transformer cases do); off: never. "
                         "Default: auto")
    cases.addoption("--dist-cuda-graphs", action="store_true",
                    help="capture each round's ops in a CUDA graph and replay it between the timing "
                         "events (nccl-tests -G); CUDA cases only")
    cases.addoption("--dist-census", choices=("on", "off"), default="on",
                    help="on: after warm-up, one more untimed round counts every collective a case "
                         "issues (kind, dtype, bytes, group size; DDP buckets; graph breaks; CUDA "
                         "kernel launches) into extra_info['census']; off: no extra round. Default: on")
    cases.addoption("--dist-memory-census", choices=("on", "off"), default="on",
                    help="on: after warm-up, one more untimed step under torch's memory tracker: the "
                         "peak of live tensor bytes per rank, what held them at the peak (parameters, "
                         "gradients, optimizer state, activations, temporaries, DDP buckets, FSDP2 "
                         "buffers), where it fell and what stays after the step, into "
                         "extra_info['memory']; off: no extra step. Default: on")

    nodes = parser.getgroup("ddpbench-nodes", "ddpbench across nodes (ranks started by torchrun)")
    nodes.addoption("--dist-controller", default=None, metavar="HOST:PORT",
                    help="multi-node: listen on HOST:PORT for ranks started by torchrun "
                         "(-m ddpbench.worker) instead of spawning local pools")
    nodes.addoption("--dist-secret-file", default=None, metavar="PATH",
                    help="with --dist-controller: 0600 file holding the shared secret "
                         "(default: $DDPBENCH_SECRET)")
    nodes.addoption("--dist-controller-wait", type=opts.parse_timeout, default=300.0,
                    help="with --dist-controller: seconds to wait for the workers. Default: 300")

    ab = parser.getgroup("ddpbench-ab", "ddpbench A/B mode (baseline and candidate interleaved in one run)")
    ab.addoption("--dist-baseline-python", default=None, metavar="PATH",
                 help="interpreter for the baseline side's ranks (another environment with ddpbench "
                      "installed, e.g. ../base/.venv/bin/python)")
    ab.addoption("--dist-baseline-path", action="append", default=None, metavar="DIR",
                 help="repeatable: first on the baseline ranks' sys.path (the base checkout's root for "
                      "a flat layout, its src/ for a src layout)")
    ab.addoption("--dist-baseline-env", action="append", default=None, metavar="KEY=VALUE",
                 help="repeatable: set in the baseline ranks' environment")
    ab.addoption("--dist-candidate-env", action="append", default=None, metavar="KEY=VALUE",
                 help="repeatable: set in the candidate ranks' environment")
    ab.addoption("--dist-ab-threshold", type=opts.parse_percent, default=0.05, metavar="PCT",
                 help="smallest slowdown that counts as a regression (it must also be significant). "
                      "Default: 5%%")
    ab.addoption("--dist-ab-max-time", type=opts.parse_timeout, default=None, metavar="SECONDS",
                 help="per case: keep adding pairs of blocks while the verdict is inconclusive, up "
                      "to this many seconds; with --dist-ab-run-budget, a cap on each case's share. "
                      "Default: 60 (none with a run budget)")
    ab.addoption("--dist-ab-run-budget", type=opts.parse_timeout, default=None, metavar="SECONDS",
                 help="for the whole run: each case may add pairs for its share of what is left (the "
                      "seconds left over the cases not yet finished), so time the cases that decide "
                      "early leave goes to the ones still undecided. Default: none (--dist-ab-max-time "
                      "per case)")
    ab.addoption("--dist-ab-seed", type=opts.parse_seed, default=None, metavar="N",
                 help="seed of the blocks' random order; each run draws a new one and records it "
                      "(header, extra_info ab.seed): give it to repeat a run's order")
    ab.addoption("--dist-ab-allow-missing", action="store_true",
                 help="a case that the baseline ran but the candidate lost (crashed, hung) skips "
                      "instead of failing the run")
    ab.addoption("--dist-ab-allow-baseline-failure", action="store_true",
                 help="a case whose baseline side failed (raised, died, hung) while the candidate ran "
                      "it does not fail the run (its verdict is baseline-failed either way)")
    ab.addoption("--dist-ab-accept-structure-change", action="store_true", help=opts.ACCEPT_STRUCTURE_HELP)
    ab.addoption("--dist-ab-accept-memory-change", action="store_true", help=opts.ACCEPT_MEMORY_HELP)
    ab.addoption("--dist-ab-memory-tolerance", type=opts.parse_memory_tolerance, default=None,
                 metavar="FRACTION", help=opts.MEMORY_TOLERANCE_HELP)
    ab.addoption("--dist-ab-fail-on-inconclusive", action="store_true",
                 help="exit 1 when any case is inconclusive (by default they are counted and exit 0)")
    ab.addoption("--dist-ab-profile", choices=PROFILE_MODES, default=DEFAULT_PROFILE,
                 help="after a case's verdict, profile a few rounds on each side with torch.profiler: "
                      "Chrome traces per side and rank under <benchmark storage>/ab-profiles/, and "
                      "the ops whose self time grew most beneath the verdict table; regressions: "
                      "the regressed cases, all: every case. Default: regressions")

    advanced = parser.getgroup("ddpbench-advanced", "ddpbench advanced settings (the defaults are measured "
                               "choices: docs/design.md)")
    advanced.addoption("--dist-precision", type=opts.parse_precision, default=0.01,
                       help="with --dist-rounds=0: stop recording once the median's 95%% interval is "
                            "within +-this fraction of it (e.g. 1%%; checked after 20 rounds, then every "
                            "1.5x); 0 records until --dist-min-time is filled. Default: 1%%")
    advanced.addoption("--dist-pin-cores", choices=("auto", "off"), default=None,
                       help="off: the OS places the ranks, as in a plain torch.distributed script; "
                            "auto: each local rank on a core of its own while it measures, when there "
                            "are enough cores (steadier, but it measures that placement). Default: off")
    advanced.addoption("--dist-ab-block-time", type=opts.parse_block_time, default=0.1, metavar="SECONDS",
                       help="A/B: recorded seconds aimed for per block (at least 3 rounds). Default: 0.1")
    advanced.addoption("--dist-ab-pools-per-side", type=opts.parse_pools_per_side, default=2, metavar="N",
                       help="A/B: independent pools of ranks per side, taking turns; a regression must show "
                            "on every pool pair (1: the whole interval must clear the threshold "
                            "instead). Default: 2")
    advanced.addoption("--dist-ab-stratify-placement", action="store_true",
                       help="A/B: compare both blocks of a pair at the pair's own mix of rounds where the "
                            "ranks shared a CPU and rounds where they did not (the two modes of 1 MB on a "
                            "small VM), instead of by their plain means; it cannot see a change in how "
                            "often the ranks share a CPU. Default: off")
    advanced.addoption("--dist-ab-heap", choices=HEAP_MODES, default=DEFAULT_HEAP,
                       help="A/B: steady: both sides' ranks run with glibc malloc's thresholds fixed, so "
                            "every pool allocates alike; adaptive: glibc's defaults, as a plain script. "
                            "A side's own --dist-*-env setting wins. Default: steady")


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
    _check_path_options_written_with_equals(config)
    config._ddpbench_ab = None
    if any(config.getoption(name, None) for name in opts.AB_OPTIONS):
        from .gates.ab.session import ABSession

        config._ddpbench_ab = ABSession.from_options(config)
    _check_compare_target(config)
    if config.getoption("benchmark_compare", None):
        config.pluginmanager.register(SessionCompare(), "ddpbench-session-compare")
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


#: Options whose value is a path: pytest decides its rootdir (and so which pytest.ini and conftest.py
#: apply) before it knows a plugin's options, taking every existing path among the words as a test path.
PATH_OPTIONS = ("--dist-baseline-path", "--dist-baseline-python")


def _check_path_options_written_with_equals(config) -> None:
    """``--dist-baseline-path ../base`` (two words) lets pytest read ``../base`` as a test path when it
    picks the rootdir, so the run may use the baseline's pytest.ini and conftest.py: a usage error
    that names the one-word form, which pytest cannot misread."""
    words = [str(word) for word in config.invocation_params.args]
    for option, value in zip(words, words[1:]):
        if option in PATH_OPTIONS and os.path.exists(os.path.join(str(config.invocation_params.dir), value)):
            raise pytest.UsageError(
                f"write {option}={value} (one word): given as two words, pytest takes {value!r} for a "
                f"test path when it chooses the rootdir (here {config.rootpath}), so the baseline's "
                f"pytest.ini and conftest.py could configure this run")


def _check_compare_target(config) -> None:
    """--benchmark-compare against a saved run that cannot be read is a usage error, not a
    warning and a silent comparison with an older run."""
    compare = config.getoption("benchmark_compare", None)
    if not compare:
        return
    from .benchmark_internals import get_machine_id

    from .gates.compare import compare_target_problem

    problem = compare_target_problem(str(config.getoption("benchmark_storage", "file://./.benchmarks")),
                                     get_machine_id(), compare)
    if problem:
        raise pytest.UsageError(problem)


def pin_cores(config) -> bool:
    """--dist-pin-cores as given; unset: off, A/B mode included (docs/design.md, *The rank pool*)."""
    return config.getoption("dist_pin_cores", None) == "auto"


def pytest_report_header(config):
    """In A/B and multi-node sessions (asked for by option): the header at once. Otherwise it waits
    for the collected tests (:func:`pytest_report_collectionfinish`): a session without a ddpbench
    case prints none and probes no CUDA."""
    return header_lines(config) if _explicitly_asked(config) else []


def pytest_report_collectionfinish(config, start_path, items):
    if _explicitly_asked(config) or not uses_ddpbench(config, items):
        return []  # said in the header already, or nothing to say
    if config.get_verbosity() < 0 or config.getoption("no_header", False):
        return []  # where pytest shows no header (-q, --no-header)
    return header_lines(config)


def header_lines(config) -> list[str]:
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
        lines += ab.header_lines(world_sizes, cores, pin_cores(config))
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
    from .pool import PoolSpec

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
    from .workloads.collective_cases import size_params

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
        metafunc.parametrize("dist_message_size", size_params(config.getoption("dist_sizes")))
    # Collective variants: an id part each only when asked for, so default case ids never change.
    for name, option in (("dist_dtype", "dist_dtypes"), ("dist_reduce_op", "dist_reduce_ops"),
                         ("dist_placement", "dist_placements")):
        values = config.getoption(option, None)
        if name in metafunc.fixturenames and values and not _parametrizes_itself(metafunc, name):
            metafunc.parametrize(name, values, ids=values)


def _cuda_needed(item) -> tuple[int, bool]:
    """(CUDA devices the test needs, whether it is an NCCL case) from its marks and pool spec."""
    needed = 2 if item.get_closest_marker("multi_gpu") else 1 if item.get_closest_marker("gpu") else 0
    spec = getattr(item, "callspec", None) and item.callspec.params.get("dist_spec")
    if spec is None:  # not a ddpbench case: its marks say it all
        return needed, False
    from .pool import PoolSpec

    nccl = isinstance(spec, PoolSpec) and spec.backend == "nccl"
    if isinstance(spec, PoolSpec) and spec.device == "cuda":
        # NCCL runs one rank per GPU; gloo ranks with CUDA tensors may share one.
        needed = max(needed, spec.world_size if nccl else 1)
    return needed, nccl


def pytest_collection_modifyitems(config, items):
    needs = [(item, *_cuda_needed(item)) for item in items]
    if not any(needed for _, needed, _ in needs):
        return  # no test needs a GPU: CUDA is not probed (nor torch imported)
    gpus, broken = cuda_probe()
    for item, needed, nccl in needs:
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


def pytest_collection_finish(session):
    """Before any rank starts: every selected collective size must fit in memory (unless the run
    only lists the cases: --collect-only), and in A/B mode each side must import its own code."""
    session.config.stash[USES_DDPBENCH] = uses_ddpbench(session.config, session.items)
    if getattr(session.config, "_ddpbench_controller", None):
        return  # multi-node: the nodes' memory is not this machine's
    if not session.config.stash[USES_DDPBENCH]:
        return  # no ddpbench case: nothing to check (and psutil stays unimported)
    import psutil

    from .workloads.collective_cases import check_memory, smallest_gpu_free_bytes

    ab = getattr(session.config, "_ddpbench_ab", None)
    pools_at_once = 2 * ab.settings.pools_per_side if ab is not None else 1
    if not session.config.getoption("collectonly", False):  # listing cases allocates nothing
        check_memory(session.items, pools_at_once, psutil.virtual_memory().available, smallest_gpu_free_bytes)
    if ab is not None:
        _announce(session.config, ab.resolve_modules(session))
        ab.plan_cases(session)


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
                                        announce=functools.partial(_announce, request.config),
                                        case_specs=_runnable_specs(request.session.items))
    else:
        from .pool import PoolRegistry

        registry = PoolRegistry(pin_cores=pin_cores(request.config))
    yield registry
    registry.close()


def _runnable_specs(items) -> list[PoolSpec]:
    """The pool specs of the selected cases that are not marked skipped."""
    from .pool import PoolSpec

    specs = []
    for item in items:
        spec = getattr(item, "callspec", None) and item.callspec.params.get("dist_spec")
        if isinstance(spec, PoolSpec) and not item.get_closest_marker("skip"):
            specs.append(spec)
    return specs


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
    from .pool import PoolError
    from .pool.external import ExternalPoolRegistry, PoolMatchesNoCase, PoolUnavailable

    ab = getattr(request.config, "_ddpbench_ab", None)
    try:
        if ab is not None:  # the case's own pool is the candidate's first
            return dist_pools.get(dist_spec, ab.candidate.launch, 0, owner="candidate")
        return dist_pools.get(dist_spec)
    except PoolUnavailable as exc:
        pytest.skip(str(exc))
    except PoolMatchesNoCase as exc:  # every case would skip: a usage error, not a green run
        pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
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
    from .engine.timing import RoundPlan

    config = request.config
    return RoundPlan(
        warmup=config.getoption("dist_warmup"),
        rounds=config.getoption("dist_rounds"),
        min_time_s=config.getoption("dist_min_time"),
        precision=config.getoption("dist_precision"),
        ops_per_round=config.getoption("dist_ops_per_round", None),
        cuda_graphs=config.getoption("dist_cuda_graphs", False),
        census=config.getoption("dist_census", "on") == "on",
        memory_census=config.getoption("dist_memory_census", "on") == "on",
    )


@pytest.fixture
def dist_benchmark(benchmark, dist_pool, dist_spec, dist_round_plan, dist_pools, request) -> DistBenchmark:
    """Benchmark a workload on all ranks of this case's pool; see :class:`DistBenchmark`."""
    from .fixture import DistBenchmark

    hook = request.config.hook.pytest_ddpbench_prepare_workload
    return DistBenchmark(benchmark, dist_pool, dist_spec, dist_round_plan,
                         request.config.getoption("dist_timeout"),
                         ab=getattr(request.config, "_ddpbench_ab", None), pools=dist_pools,
                         exposed_comm=request.config.getoption("dist_exposed_comm", "auto"),
                         case_id=request.node.nodeid,
                         prepare=lambda workload, spec: hook(workload=workload, spec=spec))


# ----------------------------------------------------------------------------------------------
# The run's end: the A/B gate's verdicts, never a partial run saved over the user's baselines, a
# partial run marked as such, and saves that are whole or nothing (ddpbench.storage)
# ----------------------------------------------------------------------------------------------


def _saving(config) -> bool:
    """Whether this process saves the run (xdist workers and --benchmark-disable record nothing)."""
    bench_session = benchmark_session(config)
    return bool(bench_session is not None and not bench_session.disabled
                and (bench_session.save or bench_session.autosave or bench_session.json))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A case whose extra_info JSON cannot hold fails here, named, rather than breaking the save
    of the whole run (only when the run is saved)."""
    result = yield
    fixture = getattr(item, "funcargs", {}).get("benchmark")
    if fixture is not None and _saving(item.config) and not getattr(fixture, "has_error", False):
        from .storage import unsaveable

        problem = unsaveable(fixture.extra_info, "extra_info")
        if problem:
            fixture.has_error = True  # pytest-benchmark leaves a case with an error out of the run
            pytest.fail(f"this case's results cannot be saved: {problem}", pytrace=False)
    return result


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    ab = getattr(session.config, "_ddpbench_ab", None)
    if ab is not None:
        ab.record_verdicts()  # each case's saved verdict is the one the run decides and exits on
    if ab is not None and exitstatus == pytest.ExitCode.OK and ab.exit_status():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # 1, as --benchmark-compare-fail does
    bench_session = benchmark_session(session.config)
    if exitstatus == _INTERRUPTED and bench_session is not None:
        if bench_session.save or bench_session.autosave or bench_session.json:
            bench_session.save = bench_session.autosave = bench_session.json = None
            session.config.get_terminal_writer().line(
                "ddpbench: run interrupted; no benchmark results were saved and stored baselines "
                "are untouched.", yellow=True)
    save_errors: list[str] = []
    if bench_session is not None:
        from . import storage

        storage.install(bench_session, save_errors.append)
        # pytest-benchmark saves in its own pytest_sessionfinish, inside this one: what the run
        # says about itself (pytest_benchmark_update_json) is known by then
        session.config._ddpbench_run_end = (session, exitstatus)
    yield
    for message in save_errors:
        session.config.get_terminal_writer().line(f"ddpbench: ERROR: {message}", red=True, bold=True)
    if save_errors and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR  # 3: the run's results were lost


def _failed_cases(config) -> list[str]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {}) or {}
    names = []
    for report in list(stats.get("failed", [])) + list(stats.get("error", [])):
        nodeid = getattr(report, "nodeid", None)
        if nodeid and nodeid not in names:
            names.append(nodeid)
    return names


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    ab = getattr(config, "_ddpbench_ab", None)
    if ab is None:
        return
    terminalreporter.write_sep("-", "ddpbench A/B")
    for line, failing in ab.summary_lines():
        terminalreporter.write_line(line, red=failing, bold=failing and "exit status 1" in line)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Every run says whether it is complete (:mod:`ddpbench.gates.completeness`); A/B runs list
    the cases the candidate lost: they have no benchmark entry of their own, and ``ddpbench compare
    RUN.json`` must still see them; a session that uses ddpbench stores its calibration probe."""
    ab = getattr(config, "_ddpbench_ab", None)
    if ab is not None:
        from .gates.verdicts import LOST_CASES_KEY

        output_json[LOST_CASES_KEY] = ab.lost_cases()
    end = getattr(config, "_ddpbench_run_end", None)
    if end is not None:
        from .gates.completeness import RUN_KEY, record

        session, exitstatus = end
        stopped = session.shouldfail or session.shouldstop
        output_json[RUN_KEY] = record(exitstatus, session.testsfailed, str(stopped) if stopped else None,
                                      _failed_cases(config))
    if uses_ddpbench(config):
        from .gates.calibration import CALIBRATION_KEY

        output_json[CALIBRATION_KEY] = calibration_probe(config)


# ----------------------------------------------------------------------------------------------
# What a saved run records about the machine: facts in machine_info (what pytest-benchmark compares
# to warn of another machine), the calibration probe's measurement beside it
# ----------------------------------------------------------------------------------------------

_MACHINE_FACTS = pytest.StashKey[dict]()
_CALIBRATION = pytest.StashKey[dict]()
_COMPARED_MACHINE_INFO = pytest.StashKey[dict]()  # this machine's, as --benchmark-compare compared it


def machine_facts(config, machine_info: dict) -> dict:
    """ddpbench's additions to a run's machine_info, worked out once per session: the GPUs and the
    facts that decide what the cases measure (:mod:`ddpbench.gates.fingerprint`). Facts only: two
    sessions on one machine with one install add the same, so pytest-benchmark's "machine_info is
    different" warning means what it says."""
    facts = config.stash.get(_MACHINE_FACTS, None)
    if facts is None:
        from .gates.fingerprint import FINGERPRINT_KEY, run_facts

        facts = {}
        try:
            gpus = gpu_description()
        except Exception as exc:  # never lose a run's results over the description
            gpus = {"error": f"{type(exc).__name__}: {exc}"}
        if gpus is not None:
            facts[GPU_INFO_KEY] = gpus
        try:
            facts[FINGERPRINT_KEY] = run_facts(machine_info)
        except Exception as exc:  # never lose a run's results over it: compare then says it is unknown
            facts[FINGERPRINT_KEY] = {"error": f"{type(exc).__name__}: {exc}"}
        config.stash[_MACHINE_FACTS] = facts
    return facts


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    """A session that uses ddpbench saves its facts (:func:`machine_facts`) in machine_info; the
    calibration probe, a measurement, goes beside it (:func:`pytest_benchmark_update_json`)."""
    if uses_ddpbench(config):
        machine_info.update(machine_facts(config, machine_info))


@pytest.hookimpl(optionalhook=True, hookwrapper=True)
def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    """--benchmark-compare: pytest-benchmark compares machine_info when the session is configured,
    before its tests are collected. Against a run that recorded ddpbench's facts, this session's
    machine_info gets them too (else the warning would fire on the same machine); a run saved when
    ddpbench kept its probe in machine_info is compared without that measurement."""
    from .gates.calibration import MACHINE_INFO_KEY
    from .gates.fingerprint import FINGERPRINT_KEY

    saved = compared_benchmark.get("machine_info") if isinstance(compared_benchmark, dict) else None
    if isinstance(saved, dict):
        saved.pop(MACHINE_INFO_KEY, None)  # the loaded copy only; the saved file is as it was
        if FINGERPRINT_KEY in saved or GPU_INFO_KEY in saved:
            machine_info.update(machine_facts(config, machine_info))
    config.stash[_COMPARED_MACHINE_INFO] = machine_info
    yield


class SessionCompare:
    """Registered in sessions given --benchmark-compare: under pytest-benchmark's comparison table,
    ddpbench's noise-aware verdicts for the same pair (:mod:`ddpbench.gates.session_compare`),
    when the session has ddpbench cases. Informational: the exit status stays pytest-benchmark's."""

    @pytest.hookimpl(wrapper=True)
    def pytest_terminal_summary(self, terminalreporter, config):
        try:
            return (yield)
        finally:  # also when --benchmark-compare-fail raised after printing its table
            bench_session = benchmark_session(config)
            if (bench_session is not None and not bench_session.disabled and bench_session.compared_mapping
                    and uses_ddpbench(config)):
                _print_session_verdicts(terminalreporter, config, bench_session)


def _print_session_verdicts(terminalreporter, config, bench_session) -> None:
    from .gates.session_compare import print_verdicts

    machine_info = dict(config.stash.get(_COMPARED_MACHINE_INFO, {}))
    machine_info.update(machine_facts(config, machine_info))
    doc = config.hook.pytest_benchmark_generate_json(config=config, benchmarks=bench_session.benchmarks,
                                                     include_data=True, machine_info=machine_info,
                                                     commit_info={})
    print_verdicts(terminalreporter, bench_session, doc, probe=lambda: calibration_probe(config))


def calibration_probe(config) -> dict:
    """The machine-drift calibration probe (:mod:`ddpbench.gates.calibration`), run once per
    session (a few hundred ms), for ``ddpbench compare`` to normalise a uniformly slower or faster
    machine."""
    probe = config.stash.get(_CALIBRATION, None)
    if probe is None:
        from .gates.calibration import run_probe

        try:
            probe = run_probe()
        except Exception as exc:  # never lose a run's results over the probe
            probe = {"error": f"{type(exc).__name__}: {exc}"}
        config.stash[_CALIBRATION] = probe
    return probe
