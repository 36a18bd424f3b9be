"""The pytest plugin: options, markers, parametrization and fixtures. It wires pytest to ddpbench and
decides nothing itself (docs/design/plugin-and-pool.md#options-and-the-plugin)."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import TYPE_CHECKING

import pytest

from . import option_table
from . import options as opts
from .benchmark_internals import benchmark_session
from .devices import GPU_INFO_KEY, cpu_count, cuda_device_count, cuda_probe, gpu_cases_requested, gpu_description
from .session_state import session_state

if TYPE_CHECKING:  # imported where used: a session without a ddpbench case never loads the engine
    from .engine.timing import RoundPlan
    from .fixture import DistBenchmark
    from .pool import PoolSpec

_INTERRUPTED = int(pytest.ExitCode.INTERRUPTED)

#: The fixtures that make a test a ddpbench case (``dist_spec`` and ``dist_message_size`` are
#: parameters that pytest_generate_tests gives).
CASE_FIXTURES = frozenset({"dist_benchmark", "dist_pool", "dist_pools", "dist_spec", "dist_message_size",
                           "dist_dtype", "dist_reduce_op", "dist_placement", "dist_round_plan"})


def is_case(item) -> bool:
    """Whether a collected test asks for a ddpbench fixture."""
    return not CASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def _explicitly_asked(config) -> bool:
    """An A/B or multi-node option: the user asked for ddpbench whatever the tests are."""
    state = session_state(config)
    return state.ab is not None or state.controller is not None


def uses_ddpbench(config, items=None) -> bool:
    """Whether ddpbench has anything to do in this session: a test among ``items`` (the session's,
    once collected) is a ddpbench case, or an A/B / multi-node option was given. A session where
    it has not imports no torch, probes no CUDA and starts nothing (README, *Installing*)."""
    if _explicitly_asked(config):
        return True
    if items is not None:
        return any(is_case(item) for item in items)
    return session_state(config).uses_ddpbench


# ----------------------------------------------------------------------------------------------
# Options and markers
# ----------------------------------------------------------------------------------------------


def pytest_addhooks(pluginmanager):
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    """ddpbench's options, each defined once in :mod:`ddpbench.option_table`."""
    option_table.add_pytest_options(parser)


def pytest_configure(config):
    state = session_state(config)
    for line in option_table.old_spelling_notices(config.option):
        state.notice(line)
    if config.getoption("dist_controller", None):
        from .pool.external import SecretError, load_secret, parse_address

        try:
            session_state(config).controller = (parse_address(config.getoption("dist_controller")),
                                                load_secret(config.getoption("dist_secret_file")))
        except (ValueError, SecretError) as exc:
            raise pytest.UsageError(f"--dist-controller: {exc}") from None
        if config.getoption("numprocesses", None):
            raise pytest.UsageError("--dist-controller serves one external pool: run without -n (xdist)")
    _check_path_options_written_with_equals(config)
    session_state(config).ab = None
    if any(config.getoption(name, None) for name in opts.AB_OPTIONS):
        from .gates.ab.session import ABSession

        session_state(config).ab = ABSession.from_options(config)
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

    from .storage.runs import compare_target_problem

    problem = compare_target_problem(str(config.getoption("benchmark_storage", "file://./.benchmarks")),
                                     get_machine_id(), compare)
    if problem:
        raise pytest.UsageError(problem)


def pin_cores(config) -> bool:
    """--dist-pin-cores as given; unset: off, A/B mode included (docs/design/plugin-and-pool.md#core-pinning)."""
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
    ab = session_state(config).ab
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
    state = session_state(session.config)
    state.uses_ddpbench = uses_ddpbench(session.config, session.items)
    state.case_ids = frozenset(item.nodeid for item in session.items if is_case(item))
    if state.controller:
        return  # multi-node: the nodes' memory is not this machine's
    if not state.uses_ddpbench:
        return  # no ddpbench case: nothing to check (and psutil stays unimported)
    import psutil

    from .workloads.collective_cases import check_memory, smallest_gpu_free_bytes

    ab = state.ab
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
    controller = session_state(request.config).controller
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

    ab = session_state(request.config).ab
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


#: The plan's fields set by a --dist- option that pytest-benchmark's own options may set too
#: (ddpbench.benchmark_options), with the field each sets.
_TIMING_OPTIONS = (("--dist-warmup", "warmup"), ("--dist-max-time", "min_time_s"), ("--dist-precision", "precision"))


@pytest.fixture
def dist_round_plan(request) -> RoundPlan:
    """The options' round plan; ops_per_round None until a case resolves it for its device.
    pytest-benchmark's timing options set what no --dist- option given sets; under
    --benchmark-disable the workload runs once, and nothing more (no census, no replay)."""
    import dataclasses

    from . import benchmark_options
    from .engine.timing import RoundPlan

    config = request.config
    censuses = tuple(config.getoption("dist_census", opts.CENSUSES) or ())
    plan = RoundPlan(
        rounds=config.getoption("dist_rounds"),
        ops_per_round=config.getoption("dist_ops_per_round", None),
        cuda_graphs=config.getoption("dist_cuda_graphs", False),
        census="collectives" in censuses,
        memory_census="memory" in censuses,
        numerics_steps=config.getoption("dist_numerics_steps", 3),
    )
    dist_given = {flag: config.getoption(flag[2:].replace("-", "_"), None) for flag, _ in _TIMING_OPTIONS}
    dist_given = {flag: value for flag, value in dist_given.items() if value is not None}
    mark = request.node.get_closest_marker("benchmark")
    choice = benchmark_options.choose(benchmark_options.given_values(config, mark.kwargs if mark else None),
                                      dist_given)
    state = session_state(config)
    for line in choice.notes:
        state.notice(line)
    chosen = {field: dist_given.get(flag, getattr(choice, field)) for flag, field in _TIMING_OPTIONS}
    plan = dataclasses.replace(plan, **{field: value for field, value in chosen.items() if value is not None})
    if choice.min_rounds is not None:
        plan = dataclasses.replace(plan, min_rounds=choice.min_rounds,
                                   max_rounds=max(plan.max_rounds, choice.min_rounds))
    bench_session = benchmark_session(config)
    if bench_session is not None and bench_session.disabled:
        plan = dataclasses.replace(plan, census=False, memory_census=False, numerics_steps=0)
    return plan


@pytest.fixture
def dist_benchmark(benchmark, dist_pool, dist_spec, dist_round_plan, dist_pools, request) -> DistBenchmark:
    """Benchmark a workload on all ranks of this case's pool; see :class:`DistBenchmark`."""
    from .fixture import DistBenchmark

    hook = request.config.hook.pytest_ddpbench_prepare_workload
    return DistBenchmark(benchmark, dist_pool, dist_spec, dist_round_plan,
                         request.config.getoption("dist_timeout"),
                         ab=session_state(request.config).ab, pools=dist_pools,
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
    ab = session_state(session.config).ab
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
        session_state(session.config).run_end = (session, exitstatus)
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


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After pytest-benchmark's table: what the run says once about its options, each case's
    census, memory and numerics on one line, why cases were skipped, then the A/B verdicts, whose
    last line (beside pytest's counts) says the run's exit status and why."""
    state = session_state(config)
    if not state.uses_ddpbench:
        old = [line for line in state.notices if "the old spelling" in line]
        for line in old:  # an old spelling of a ddpbench option is worth a line in any session
            terminalreporter.write_line(line, yellow=True)
        return
    for line in state.notices:
        terminalreporter.write_line(line, yellow=True)
    from . import run_summary

    bench_session = benchmark_session(config)
    cases = run_summary.case_lines(getattr(bench_session, "benchmarks", None) or [])
    if cases:
        terminalreporter.write_sep("-", run_summary.CASES_HEADING)
        for line in cases:
            terminalreporter.write_line(line)
    for line in run_summary.skip_lines(terminalreporter.stats.get("skipped", []), state.case_ids,
                                       config.option.reportchars):
        terminalreporter.write_line(line, yellow=True)
    ab = state.ab
    if ab is None:
        return
    terminalreporter.write_sep("-", "ddpbench A/B")
    for line, failing in ab.summary_lines():
        terminalreporter.write_line(line, red=failing, bold=failing and "exit status 1" in line)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Every run says whether it is complete (:func:`ddpbench.storage.records.run_record`); A/B runs list
    the cases the candidate lost: they have no benchmark entry of their own, and ``ddpbench compare
    RUN.json`` must still see them; a session that uses ddpbench stores its calibration."""
    state = session_state(config)
    if state.ab is not None:
        from .gates.verdicts import LOST_CASES_KEY

        output_json[LOST_CASES_KEY] = state.ab.lost_cases()
    end = state.run_end
    if end is not None:
        from .storage.records import RUN_KEY, run_record

        session, exitstatus = end
        stopped = session.shouldfail or session.shouldstop
        output_json[RUN_KEY] = run_record(exitstatus, session.testsfailed, str(stopped) if stopped else None,
                                          _failed_cases(config))
    if uses_ddpbench(config):
        from .storage.records import CALIBRATION_KEY

        output_json[CALIBRATION_KEY] = calibration(config)


# ----------------------------------------------------------------------------------------------
# What a saved run records about the machine: facts in machine_info (what pytest-benchmark compares
# to warn of another machine), the calibration's measurement beside it
# ----------------------------------------------------------------------------------------------

def machine_facts(config, machine_info: dict) -> dict:
    """ddpbench's additions to a run's machine_info, worked out once per session: the GPUs and the
    facts that decide what the cases measure (:mod:`ddpbench.storage.run_facts`). Facts only: two
    sessions on one machine with one install add the same, so pytest-benchmark's "machine_info is
    different" warning means what it says."""
    state = session_state(config)
    if state.machine_facts is None:
        from .storage.run_facts import RUN_FACTS_KEY, run_facts

        facts = {}
        try:
            gpus = gpu_description()
        except Exception as exc:  # never lose a run's results over the description
            gpus = {"error": f"{type(exc).__name__}: {exc}"}
        if gpus is not None:
            facts[GPU_INFO_KEY] = gpus
        try:
            facts[RUN_FACTS_KEY] = run_facts(machine_info)
        except Exception as exc:  # never lose a run's results over it: compare then says it is unknown
            facts[RUN_FACTS_KEY] = {"error": f"{type(exc).__name__}: {exc}"}
        state.machine_facts = facts
    return state.machine_facts


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    """A session that uses ddpbench saves its facts (:func:`machine_facts`) in machine_info; the
    calibration, a measurement, goes beside it (:func:`pytest_benchmark_update_json`)."""
    if uses_ddpbench(config):
        machine_info.update(machine_facts(config, machine_info))


@pytest.hookimpl(optionalhook=True, hookwrapper=True)
def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    """--benchmark-compare: pytest-benchmark compares machine_info when the session is configured,
    before its tests are collected. Against a run that recorded ddpbench's facts, this session's
    machine_info gets them too (else the warning would fire on the same machine); a run saved when
    ddpbench kept its calibration in machine_info is compared without that measurement."""
    from .storage.records import MACHINE_INFO_KEY
    from .storage.run_facts import RUN_FACTS_KEY

    saved = compared_benchmark.get("machine_info") if isinstance(compared_benchmark, dict) else None
    if isinstance(saved, dict):
        saved.pop(MACHINE_INFO_KEY, None)  # the loaded copy only; the saved file is as it was
        if RUN_FACTS_KEY in saved or GPU_INFO_KEY in saved:
            machine_info.update(machine_facts(config, machine_info))
    session_state(config).compared_machine_info = machine_info
    yield


class SessionCompare:
    """Registered in sessions given --benchmark-compare: under pytest-benchmark's comparison table,
    ddpbench's noise-aware verdicts for the same pair (:mod:`ddpbench.gates.benchmark_compare`),
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
    from .gates.benchmark_compare import print_verdicts

    machine_info = dict(session_state(config).compared_machine_info or {})
    machine_info.update(machine_facts(config, machine_info))
    doc = config.hook.pytest_benchmark_generate_json(config=config, benchmarks=bench_session.benchmarks,
                                                     include_data=True, machine_info=machine_info,
                                                     commit_info={})
    print_verdicts(terminalreporter, bench_session, doc, probe=lambda: calibration(config))


def calibration(config) -> dict:
    """The machine-drift calibration (:mod:`ddpbench.gates.calibration`), run once per session (a
    few hundred ms), for ``ddpbench compare`` to normalise a uniformly slower or faster machine."""
    state = session_state(config)
    if state.calibration is None:
        from .gates.calibration import run_probe

        try:
            measured = run_probe()
        except Exception as exc:  # never lose a run's results over the calibration
            measured = {"error": f"{type(exc).__name__}: {exc}"}
        state.calibration = measured
    return state.calibration


calibration_probe = calibration  # its old name, kept importable
