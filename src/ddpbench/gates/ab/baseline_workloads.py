"""Each side its own program: before any rank starts, the baseline's own pytest, in its environment
and checkout, builds each case's workload by running the baseline's test function with a stand-in
``dist_benchmark`` and pickles it there; the controller forwards the bytes unopened to the
baseline's ranks (:class:`BuiltByBaseline`). Why and what each outcome means:
docs/design/ab.md#each-side-its-own-program."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from .side_environments import Side, SideError

BUILD_ENV = "DDPBENCH_BASELINE_BUILD"
BUILD_TIMEOUT_S = 600.0

# Run by the baseline's interpreter after ddpbench.pool.RANK_BOOTSTRAP: the baseline's own pytest
# collects the requested files, keeps the requested node ids and calls each test with stand-ins
# for the fixtures that would start ranks. Only pytest and the standard library are used here, so
# any ddpbench version on the baseline side works.
BUILD_SOURCE = r'''
import base64, json, os, pickle, sys
_request = json.loads(os.environ.pop("DDPBENCH_BASELINE_BUILD"))
sys.path.extend(p for p in _request["append"] if p not in sys.path)
import pytest


class _Handed(Exception):
    """The test handed its workload to the stand-in dist_benchmark: nothing more of it runs."""


class _StandInBenchmark:
    def __init__(self, config, spec):
        self.config, self.spec, self.extra_info = config, spec, {}

    def __call__(self, workload, **options):
        hook = getattr(self.config.hook, "pytest_ddpbench_prepare_workload", None)
        if hook is not None:
            workload = hook(workload=workload, spec=self.spec) or workload
        raise _Handed(workload)


class _Build:
    STAND_INS = ("dist_pools", "dist_pool", "dist_benchmark")

    def __init__(self, wanted):
        self.wanted = set(wanted)
        self.cases = {}
        self.collect_errors = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        dropped = [item for item in items if item.nodeid not in self.wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid in self.wanted]

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.argname not in self.STAND_INS:
            return None
        value = None
        if fixturedef.argname == "dist_benchmark":
            callspec = getattr(request.node, "callspec", None)
            value = _StandInBenchmark(request.config, callspec.params.get("dist_spec") if callspec else None)
        fixturedef.cached_result = (value, fixturedef.cache_key(request), None)
        return value

    @pytest.hookimpl(hookwrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        outcome = yield
        excinfo = outcome.excinfo
        if excinfo is None or not isinstance(excinfo[1], _Handed):
            return
        try:
            data = pickle.dumps(excinfo[1].args[0])
        except Exception as exc:
            self.cases[pyfuncitem.nodeid] = {"status": "unpicklable", "error": f"{type(exc).__name__}: {exc}"}
        else:
            self.cases[pyfuncitem.nodeid] = {"status": "built", "workload": base64.b64encode(data).decode()}
        outcome.force_result(True)

    def pytest_runtest_logreport(self, report):
        if report.nodeid in self.cases:
            return
        if report.skipped:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
            self.cases[report.nodeid] = {"status": "skipped", "reason": str(reason)}
        elif report.failed:
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
            self.cases[report.nodeid] = {"status": "failed", "error": crash or report.longreprtext[-3000:],
                                         "traceback": report.longreprtext[-3000:]}
        elif report.when == "call":
            self.cases[report.nodeid] = {"status": "no-workload"}

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(f"{report.nodeid or '(session)'}: {report.longreprtext[-3000:]}")


_build = _Build(_request["nodeids"])
_status = pytest.main(_request["args"], plugins=[_build])
with open(_request["out"], "w") as _handle:
    json.dump({"cases": _build.cases, "collect_errors": _build.collect_errors, "exit": int(_status)}, _handle)
'''


class BuiltByBaseline:
    """A case's workload as the baseline's own code built and pickled it: the controller cannot
    open it (its classes are the baseline's), so it forwards the bytes, and unpickling on a
    baseline rank (``pickle.loads``, which every Python has) builds the baseline's object."""

    def __init__(self, data: bytes, case_id: str):
        self.data, self.case_id = data, case_id
        self.group = None  # the candidate's workload names the case's group

    def __reduce__(self):
        return pickle.loads, (self.data,)

    def __repr__(self) -> str:
        return f"<the baseline's own workload for {self.case_id}, {len(self.data)} bytes>"


@dataclass(frozen=True)
class BaselineCase:
    """What the baseline's build found for one case: ``status`` "built" (``workload`` set),
    "absent" (the baseline has no such case), "skipped", "failed", "no-workload" (its test ran
    without calling dist_benchmark) or "unpicklable"; ``detail`` says why in words."""

    status: str
    workload: BuiltByBaseline | None = None
    detail: str = ""


@dataclass
class BaselineBuilds:
    """The baseline's build of the run's cases: where it ran and what it found per case."""

    folder: str  # the project folder whose test files the baseline ran (its checkout, or the candidate's)
    own_checkout: bool  # whether ``folder`` is the baseline's own copy of the project
    cases: dict[str, BaselineCase] = field(default_factory=dict)

    def case(self, case_id: str) -> BaselineCase:
        return self.cases.get(case_id) or BaselineCase("absent", detail="the baseline's build did not collect it")

    def unbuildable(self) -> list[tuple[str, BaselineCase]]:
        return [(case_id, c) for case_id, c in self.cases.items() if c.status == "unpicklable"]


class BaselineBuildError(SideError):
    """The baseline's cases could not be built at all (its pytest failed to start or to collect,
    a workload cannot be pickled there): exit 2, before any rank starts."""

    EXIT_STATUS = 2


# Options of the candidate's command line that the baseline's build does not take: they select,
# spread, stop or write the run (the build selects its cases by id), or they time and compare it.
_NOT_FORWARDED = frozenset({
    "-k", "-m", "-n", "--numprocesses", "--maxprocesses", "--dist", "--tx", "--rsyncdir", "-x", "--exitfirst",
    "--maxfail", "--lf", "--last-failed", "--ff", "--failed-first", "--nf", "--new-first", "--sw", "--stepwise",
    "--sw-skip", "--stepwise-skip", "--lfnf", "--last-failed-no-failures", "--cache-clear", "--cache-show",
    "--junitxml", "--junit-xml", "--junitprefix", "--junit-prefix", "--basetemp", "--rootdir", "-c",
    "--config-file", "--confcutdir", "--co", "--collect-only", "--collectonly", "--pdb", "--pdbcls", "--trace",
    "--durations", "--durations-min", "--deselect", "--ignore", "--ignore-glob", "--setup-only", "--setup-show",
    "--setup-plan", "--report-log", "--resultlog", "--result-log", "--html", "--looponfail", "-f",
    "--runxfail", "--pastebin", "--timeout", "--session-timeout", "-q", "--quiet", "-v", "--verbose",
    "-r", "--tb", "-l", "--showlocals", "-s", "--capture", "--color", "--code-highlight",
})
# ddpbench's options that decide a case's id (its parametrization): the baseline's build takes
# them so that its cases carry the candidate's ids. Every other --dist-* option is the controller's.
ID_OPTIONS = ("--dist-backend", "--dist-world-sizes", "--dist-sizes", "--dist-dtypes", "--dist-reduce-ops",
              "--dist-placements")


def _takes_value(config) -> dict[str, bool]:
    """Option string -> whether it takes a value, from the run's own parser."""
    parser = getattr(config, "_parser", None)
    argparser = getattr(parser, "optparser", None) or (parser._getparser() if parser is not None else None)
    actions = getattr(argparser, "_option_string_actions", {}) if argparser is not None else {}
    return {name: action.nargs != 0 for name, action in actions.items()}


def forwarded_args(config) -> list[str]:
    """The candidate's command-line options that the baseline's build takes: the ids' options,
    plugins (-p), ini overrides (-o), warnings filters and the user's own options (a conftest's
    ``--model-dim``); never file or node-id arguments, selection, xdist, output or timing options."""
    args = [str(arg) for arg in config.invocation_params.args]
    takes = _takes_value(config)
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-":
            continue  # a file, folder or node id: the build names its own
        name, eq, _ = arg.partition("=")
        takes_value = takes.get(name)
        attached = False
        if takes_value is None and not name.startswith("--") and len(name) > 2 and takes.get(name[:2]):
            name, takes_value, attached = name[:2], True, True  # -kEXPR, -n2: the value attached
        words = [arg]
        if takes_value and not eq and not attached and i < len(args):
            words.append(args[i])
            i += 1
        if _forwarded(name):
            out += words
    return out


def _forwarded(name: str) -> bool:
    if name in ID_OPTIONS:
        return True
    return not (name.startswith(("--dist-", "--benchmark")) or name in _NOT_FORWARDED)


def build_on_baseline(side: Side, items, candidate_root: str, invocation_dir: str, forwarded: list[str],
                      controller_sys_path: list[str] | None = None) -> BaselineBuilds:
    """Build every case of ``items`` (pytest items asking for dist_benchmark) with the baseline's
    own code; see the module docstring. Raises BaselineBuildError when the build cannot run."""
    root = os.path.realpath(candidate_root)
    folder = side.checkout or root
    nodeids = [item.nodeid for item in items]
    files = sorted({nodeid.split("::", 1)[0] for nodeid in nodeids})
    present = [f for f in files if os.path.exists(os.path.join(folder, f))]
    builds = BaselineBuilds(folder, side.checkout is not None)
    if not present:
        builds.cases = {n: BaselineCase("absent", detail=f"the baseline has no {n.split('::', 1)[0]}")
                        for n in nodeids}
        return builds
    launch = side.launch
    relative_cwd = os.path.relpath(os.path.realpath(invocation_dir), root)
    cwd = os.path.join(folder, relative_cwd) if not relative_cwd.startswith("..") else folder
    cwd = cwd if os.path.isdir(cwd) else folder
    with tempfile.TemporaryDirectory(prefix="ddpbench-baseline-build-") as scratch:
        out_file = os.path.join(scratch, "build.json")
        args = [os.path.join(folder, f) for f in present]
        args += [f"--rootdir={folder}", "-p", "no:cacheprovider", "-o", "addopts=", "-q", "--color=no", *forwarded]
        request = {"args": args, "nodeids": nodeids, "out": out_file,
                   "append": launch.sys_path_plan(controller_sys_path)["append"]}
        env = launch.environment(controller_sys_path)
        env[BUILD_ENV] = json.dumps(request)
        for name in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST"):
            env.pop(name, None)
        try:
            run = subprocess.run(launch.command(BUILD_SOURCE), env=env, cwd=cwd, capture_output=True, text=True,
                                 timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise BaselineBuildError(f"the baseline's build of its cases (its own pytest in {folder}) did not "
                                     f"finish in {BUILD_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise BaselineBuildError(f"the baseline's build of its cases could not start "
                                     f"{side.python or sys.executable}: {exc}") from None
        try:
            with open(out_file, encoding="utf-8") as handle:
                found = json.load(handle)
        except (OSError, ValueError):
            tail = " | ".join((run.stderr or run.stdout).strip().splitlines()[-6:])
            raise BaselineBuildError(f"the baseline's build of its cases (its own pytest in {folder}, "
                                     f"{side.python or sys.executable}) ended with exit {run.returncode} "
                                     f"and wrote nothing: {tail}") from None
    return _read(builds, nodeids, found, present)


def _read(builds: BaselineBuilds, nodeids: list[str], found: dict, present: list[str]) -> BaselineBuilds:
    cases = found.get("cases") or {}
    errors = found.get("collect_errors") or []
    if found.get("exit") in (3, 4) and not cases:  # internal error / usage error: nothing was run
        raise BaselineBuildError(f"the baseline's own pytest in {builds.folder} refused the run (exit "
                                 f"{found.get('exit')}): {' | '.join(errors)[-1500:] or 'see its options'}")
    for nodeid in nodeids:
        record = cases.get(nodeid)
        file = nodeid.split("::", 1)[0]
        if record is None:
            failed = [e for e in errors if e.startswith(file)]
            if failed:
                builds.cases[nodeid] = BaselineCase("failed", detail=f"the baseline's {file} fails to collect: "
                                                                     f"{failed[0][-800:]}")
            elif file not in present:
                builds.cases[nodeid] = BaselineCase("absent", detail=f"the baseline has no {file}")
            else:
                builds.cases[nodeid] = BaselineCase("absent", detail="the baseline has no case of this id")
            continue
        status = record.get("status")
        if status == "built":
            data = base64.b64decode(record["workload"])
            builds.cases[nodeid] = BaselineCase("built", BuiltByBaseline(data, nodeid))
        elif status == "skipped":
            builds.cases[nodeid] = BaselineCase("skipped", detail=f"the baseline skips it: {record.get('reason')}")
        elif status == "failed":
            builds.cases[nodeid] = BaselineCase("failed", detail=f"the baseline's test fails before it hands "
                                                                 f"over its workload: {record.get('error', '')[-800:]}")
        elif status == "no-workload":
            builds.cases[nodeid] = BaselineCase("no-workload", detail="the baseline's test passes without "
                                                                      "calling dist_benchmark")
        else:
            builds.cases[nodeid] = BaselineCase("unpicklable", detail=f"the baseline's workload cannot be "
                                                                      f"pickled: {record.get('error')}")
    return builds
