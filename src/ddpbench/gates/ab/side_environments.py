"""A side of an A/B run: what its ranks run with (an interpreter, environment overrides, sys.path
entries), its engine and where it imports the code under test from, checked before rounds start
(docs/design/ab.md#what-a-side-is)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import types
from dataclasses import dataclass, field

from ...identity import DIGEST_SOURCE, identity, source_digest, torch_version_without_import
from ...pool import RankLaunch
from ...pool.rank_launch import read_import_guard_log

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PROBE_TIMEOUT_S = 120.0
# The engine's identity (ddpbench.identity): the probe runs the same digest text in the side's
# interpreter, whose ddpbench may be another version.
_DIGEST_SOURCE = DIGEST_SOURCE
# What an environment holds, as name -> version of every distribution its path shows: two sides
# that differ here differ in content even where the code under test is one file.
_DISTRIBUTIONS_SOURCE = r'''
def installed_distributions():
    from importlib import metadata
    found = {}
    for dist in metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            continue
        if name:
            found.setdefault(str(name).lower().replace("_", "-"), str(dist.version))
    return found
'''
_namespace: dict = {}
exec(_DISTRIBUTIONS_SOURCE, _namespace)  # noqa: S102 - our own constant text, shared with the probe
installed_distributions = _namespace["installed_distributions"]

# Run by the side's interpreter, environment and import path (after ddpbench.pool.RANK_BOOTSTRAP):
# what its ranks would import. Reads {"facts": bool, "modules": [names]} on stdin.
_PROBE = _DIGEST_SOURCE + _DISTRIBUTIONS_SOURCE + r'''
import importlib, importlib.util, json, os, sys
request = json.loads(sys.stdin.read())
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
if request["facts"]:
    try:
        import ddpbench
        from ddpbench import rank_process
    except Exception as exc:
        out["error"] = f"cannot import ddpbench: {type(exc).__name__}: {exc}"
    else:
        out["ddpbench_file"] = getattr(ddpbench, "__file__", None)
        version = getattr(ddpbench, "__version__", None)
        if version is None:
            try:
                from importlib.metadata import version as _v
                version = _v("ddpbench")
            except Exception:
                version = None
        out["ddpbench_version"] = version
        out["rank_protocol"] = getattr(rank_process, "RANK_PROTOCOL", 1)  # none: the first protocol
        out["ddpbench_source_sha256"] = source_digest(os.path.dirname(ddpbench.__file__))
        try:
            import torch
            out["torch_version"] = torch.__version__
        except Exception as exc:
            out["error"] = f"cannot import torch: {type(exc).__name__}: {exc}"
    out["distributions"] = installed_distributions()
plan = json.loads(os.environ.get("DDPBENCH_PROBE_APPEND", "[]"))
sys.path.extend(p for p in plan if p not in sys.path)  # what every task appends (ddpbench.pool.serve_tasks)
modules, errors = {}, {}
for name in request["modules"]:
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:
        spec, errors[name] = None, f"{type(exc).__name__}: {exc}"
    modules[name] = None if spec is None else (spec.origin or "(namespace package)")
out["modules"] = modules
out["module_errors"] = errors
try:
    from importlib import metadata as _metadata
    _providers = _metadata.packages_distributions()
except Exception:
    _providers = {}
packages = {}
for name, origin in modules.items():
    found = {}
    for dist in _providers.get(name.split(".", 1)[0], []) if origin else []:
        try:
            found[str(dist).lower().replace("_", "-")] = _metadata.version(dist)
        except Exception:
            pass
    packages[name] = found
out["module_packages"] = packages
print("DDPBENCH_PROBE " + json.dumps(out))
'''


class SideError(ValueError):
    """A side cannot be used: the message names the problem and the fix."""


class ImportIsolationError(SideError):
    """The baseline's ranks imported something from inside the candidate's environment although
    the user named another interpreter: the verdict would compare the candidate's code or packages
    with themselves. The run is refused (exit 2)."""

    EXIT_STATUS = 2


def parse_env_assignments(items: list[str] | None, option: str) -> dict[str, str]:
    """['KEY=VALUE', ...] -> {KEY: VALUE}; a malformed item is a SideError naming it."""
    env: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise SideError(f"{option} {item!r}: expected KEY=VALUE with KEY a variable name "
                            f"(letters, digits, _), e.g. {option} OMP_NUM_THREADS=2")
        env[key] = value
    return env


@dataclass(frozen=True)
class Side:
    """One side of an A/B comparison."""

    name: str  # "baseline" or "candidate"
    python: str | None = None  # None: the interpreter running pytest
    paths: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Set for both sides' ranks by A/B mode itself (ddpbench.gates.ab.heap); the side's own env wins.
    common_env: tuple[tuple[str, str], ...] = ()
    # Filled by probe(): what the side's ranks import.
    facts: dict = field(default_factory=dict, compare=False, hash=False)
    # Filled by resolve_modules(): module name -> the file the side's ranks import it from.
    modules: dict = field(default_factory=dict, compare=False, hash=False)
    # Where the ranks' import guard records imports from the candidate's environment (set by
    # with_import_guard for a side that names another interpreter; see ddpbench.pool.rank_launch).
    import_guard_log: str | None = None
    # Filled by resolve_modules(): module name -> {distribution: version} of the installed
    # distribution that provides it (empty for the project's own modules).
    module_packages: dict = field(default_factory=dict, compare=False, hash=False)
    # The side's own copy of the project (ddpbench.gates.ab.baseline_checkout), and the candidate's
    # project folder it stands for: the side's ranks import its folders instead of the candidate's.
    checkout: str | None = None
    project_root: str | None = None

    @property
    def launch(self) -> RankLaunch:
        return RankLaunch(python=self.python, paths=self.paths,
                          env=tuple({**dict(self.common_env), **dict(self.env)}.items()),
                          import_guard_log=self.import_guard_log,
                          project_map=((self.project_root, self.checkout) if self.checkout and self.project_root
                                       else None))

    @property
    def names_other_code(self) -> bool:
        """Whether the side asks for other code than the controller's: paths or another interpreter."""
        return bool(self.paths) or self.launch.foreign_interpreter

    def describe(self) -> dict:
        """The side as extra_info shows it."""
        return {
            "python": self.facts.get("python", self.python or sys.executable),
            "python_version": self.facts.get("python_version"),
            "torch_version": self.facts.get("torch_version"),
            "ddpbench_version": self.facts.get("ddpbench_version"),
            "ddpbench_file": self.facts.get("ddpbench_file"),
            "ddpbench_source_sha256": self.facts.get("ddpbench_source_sha256"),
            "rank_protocol": self.facts.get("rank_protocol"),
            "sys_path_prepended": list(self.paths),
            "env": dict(self.env),
            "common_env": dict(self.common_env),
            "modules": dict(self.modules),
            "checkout": self.checkout,
        }

    def short(self) -> str:
        parts = [f"python {self.facts.get('python', self.python or sys.executable)}",
                 f"torch {self.facts.get('torch_version', '?')}",
                 f"ddpbench {self.facts.get('ddpbench_version', '?')} "
                 f"#{(self.facts.get('ddpbench_source_sha256') or '?')[:12]}"]
        parts += [f"path {p}" for p in self.paths]
        if self.checkout:
            parts.append(f"checkout {self.checkout}")
        parts += [f"{k}={v}" for k, v in self.env]
        return ", ".join(parts)


def make_side(name: str, python: str | None, paths: list[str] | None, env: dict[str, str],
              common_env: tuple[tuple[str, str], ...] = ()) -> Side:
    """Validate the interpreter and paths (existence); SideError names what is wrong.
    ``common_env``: what A/B mode sets for both sides' ranks (under ``env``)."""
    option = f"--dist-{name}"
    if python is not None:
        resolved = os.path.abspath(os.path.expanduser(python))
        if not os.path.isfile(resolved) or not os.access(resolved, os.X_OK):
            raise SideError(f"{option}-python {python}: no executable interpreter there; give the "
                            f"python of an environment with ddpbench installed (e.g. ../base/.venv/bin/python)")
        python = resolved
    checked = []
    for path in paths or []:
        resolved = os.path.abspath(os.path.expanduser(path))
        if not os.path.isdir(resolved):
            raise SideError(f"{option}-path {path}: not a directory; give a folder to prepend to the "
                            f"{name} ranks' sys.path (e.g. a checkout's src/)")
        checked.append(resolved)
    return Side(name, python, tuple(checked), tuple(sorted(env.items())), tuple(common_env))


def with_import_guard(side: Side, folder: str) -> Side:
    """The side with its ranks' import guard on (a log in ``folder``) when it names another
    interpreter or environment than the controller's; else unchanged (its ranks share the
    controller's environment by design)."""
    if not side.launch.foreign_interpreter:
        return side
    return dataclasses.replace(side, import_guard_log=os.path.join(folder, f"{side.name}-imports.jsonl"))


def check_import_isolation(side: Side, candidate_prefix: str = sys.prefix) -> None:
    """ImportIsolationError when the side's ranks (or its probes) imported anything from inside
    the candidate's environment (``candidate_prefix``: the controller's); nothing when its guard is
    off or recorded nothing. The message names both environments and the first modules."""
    if side.import_guard_log is None:
        return
    found = read_import_guard_log(side.import_guard_log)
    if not found:
        return
    first = found[0]
    modules = list(dict.fromkeys(f"{f.get('module')} from {f.get('file')}" for f in found))
    shown = "; ".join(modules[:4]) + (f"; and {len(modules) - 4} more" if len(modules) > 4 else "")
    project = [f for f in found if f.get("where") == "project"]
    if project and side.checkout is not None:
        shown = "; ".join(list(dict.fromkeys(f"{f.get('module')} from {f.get('file')}" for f in project))[:4])
        raise ImportIsolationError(
            f"the {side.name} side has its own checkout of the project ({side.checkout}), but its ranks "
            f"imported {shown}: the candidate's project folder. The verdict would compare the candidate's "
            f"code with itself, so the run is refused. Look for a path into the candidate's checkout among "
            f"--dist-{side.name}-path, --dist-{side.name}-env PYTHONPATH=..., and the .pth files of "
            f"{first.get('prefix')}'s site-packages")
    editable = [f for f in found if f.get("where") == "editable"]
    if editable:
        shown = "; ".join(list(dict.fromkeys(f"{f.get('module')} from {f.get('file')}" for f in editable))[:4])
        raise ImportIsolationError(
            f"the {side.name} side names its own interpreter ({side.python}, environment "
            f"{first.get('prefix')}), but its ranks imported {shown}: the candidate's source, which the "
            f"candidate's environment {os.path.realpath(candidate_prefix)} installs editable, found through "
            f"the candidate's project folders on the {side.name} ranks' path before the {side.name} "
            f"environment's own install. The verdict would compare the candidate's code with itself, so the "
            f"run is refused. Give --dist-{side.name}-path the {side.name} checkout's root (a flat layout) or "
            f"its src/ (a src layout), so that its ranks import the {side.name}'s own code first")
    raise ImportIsolationError(
        f"the {side.name} side names its own interpreter ({side.python}, environment "
        f"{first.get('prefix')}), but its ranks imported {shown}: inside the candidate's environment "
        f"{os.path.realpath(candidate_prefix)} (the interpreter running pytest, {sys.executable}). "
        f"The verdict would compare the candidate's code or packages with themselves, so the run is "
        f"refused. Look for a path into {os.path.realpath(candidate_prefix)} among "
        f"--dist-{side.name}-path, --dist-{side.name}-env PYTHONPATH=..., and the .pth files of "
        f"{first.get('prefix')}'s site-packages")


def _run_probe(side: Side, request: dict, controller_sys_path: list[str] | None = None) -> dict:
    """Start the side's interpreter exactly as its ranks start (RankLaunch) and run _PROBE."""
    launch = side.launch
    python = side.python or sys.executable
    env = launch.environment(controller_sys_path)
    env["DDPBENCH_PROBE_APPEND"] = json.dumps(launch.sys_path_plan(controller_sys_path)["append"])
    try:
        out = subprocess.run(launch.command(_PROBE), env=env, input=json.dumps(request),
                             capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SideError(f"the {side.name} side's interpreter {python} could not be run: {exc}") from None
    line = next((line for line in out.stdout.splitlines() if line.startswith("DDPBENCH_PROBE ")), None)
    if line is None:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise SideError(f"the {side.name} side's interpreter {python} failed to start "
                        f"(exit {out.returncode}): {' | '.join(tail)}")
    return json.loads(line.split(" ", 1)[1])


def probe(side: Side, expected_protocol: int | None) -> Side:
    """Start the side's interpreter with its environment once and check that it imports ddpbench
    (speaking ``expected_protocol``) and torch. Returns the side with its facts filled in."""
    facts = _run_probe(side, {"facts": True, "modules": []})
    check_import_isolation(side)
    facts.pop("modules", None)
    facts.pop("module_errors", None)
    python = side.python or sys.executable
    if "error" in facts:
        raise SideError(f"the {side.name} side ({python}) {facts['error']}; install ddpbench and torch "
                        f"in that environment (pip install -e <ddpbench checkout>) or fix --dist-{side.name}-path")
    if expected_protocol is not None and facts.get("rank_protocol") != expected_protocol:
        raise SideError(
            f"the {side.name} side ({python}) imports ddpbench {facts.get('ddpbench_version')} from "
            f"{facts.get('ddpbench_file')}, which speaks rank protocol {facts.get('rank_protocol')}, "
            f"but this run's ddpbench speaks protocol {expected_protocol}: the controller cannot drive "
            f"those ranks (their task messages or timing rule differ). Install a ddpbench of protocol "
            f"{expected_protocol} in that environment; the code under test may differ, the protocol "
            f"may not")
    return dataclasses.replace(side, facts=facts)


# The controller's torch version, read as the side's check reads it (ddpbench.identity: one torch
# must not read as two). The old name stays importable.
_torch_version_without_import = torch_version_without_import


def local_facts() -> dict:
    """The controller's own interpreter, ddpbench (engine identity) and torch versions, without
    importing torch: :func:`ddpbench.identity.identity`, with where they come from."""
    import ddpbench

    return {"python": sys.executable, "python_version": sys.version.split()[0],
            "ddpbench_file": ddpbench.__file__, **identity(import_torch=False),
            "distributions": installed_distributions()}


def engines_differ(baseline: Side, candidate: Side) -> bool:
    return (baseline.facts.get("ddpbench_source_sha256") != candidate.facts.get("ddpbench_source_sha256")
            or baseline.facts.get("ddpbench_version") != candidate.facts.get("ddpbench_version"))


def engine_lines(baseline: Side, candidate: Side) -> list[str]:
    """What the run header says about the sides' engines."""
    def one(side: Side) -> str:
        f = side.facts
        where = os.path.dirname(f.get("ddpbench_file") or "?")
        return f"ddpbench {f.get('ddpbench_version')} #{(f.get('ddpbench_source_sha256') or '?')[:12]} from {where}"

    if not engines_differ(baseline, candidate):
        return [f"both sides run the same engine: {one(candidate)}"]
    return [f"the sides run DIFFERENT ddpbench engines (both speak rank protocol "
            f"{candidate.facts.get('rank_protocol')}): each side's ranks time with their own, so the "
            f"ratios include any change to ddpbench itself",
            f"  baseline  engine: {one(baseline)}",
            f"  candidate engine: {one(candidate)}"]


# ----------------------------------------------------------------------------------------------
# Which modules carry the code under test, and where each side gets them
# ----------------------------------------------------------------------------------------------

# Top-level names that are the test machinery, never code under test.
_MACHINERY = {"builtins", "__main__", "pytest", "_pytest", "pluggy", "py", "pytest_benchmark",
              "xdist", "pytest_timeout", "conftest"}


def _installation_dirs() -> tuple[str, ...]:
    """This interpreter's own folders: the standard library and installed packages."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, site.getusersitepackages()}
    dirs.update(p for p in sysconfig.get_paths().values() if p)
    return tuple(os.path.realpath(d) for d in dirs)


def _under(path: str, dirs) -> bool:
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def _installed(path: str, installation: tuple[str, ...]) -> bool:
    return "-packages" in path or _under(path, installation)


def modules_under_test(test_modules, project_dirs) -> list[str]:
    """The module names whose files decide what the workloads run: the test modules, what their
    module-level names come from (modules, classes, functions), and every loaded module that lives
    in the project (under ``project_dirs``, outside this interpreter's installation). Installed
    packages count by their top-level name (torch: 'torch'); the standard library and the test
    machinery (pytest, conftest files) do not count."""
    installed = _installation_dirs()
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    project = tuple(os.path.realpath(d) for d in project_dirs)
    names: set[str] = set()

    def add(name: str | None) -> None:
        if not name:
            return
        top = name.split(".", 1)[0]
        if top in stdlib or top in _MACHINERY or name.rsplit(".", 1)[-1] == "conftest":
            return
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not os.path.isabs(file) or _installed(file, installed):
            names.add(top)  # an installed package (or a stand-in module): by its top-level name
        else:
            names.add(name)

    def add_references(module) -> None:
        for value in list(vars(module).values()):
            if isinstance(value, types.ModuleType):
                add(value.__name__)
            elif isinstance(value, (type, types.FunctionType)):
                add(getattr(value, "__module__", None))

    for module in test_modules:
        add(module.__name__)
        add_references(module)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        # Absolute files only: some packages register stand-in modules whose __file__ is a bare
        # name (torch.ops: "_ops.py"), which would otherwise resolve against the working directory.
        if isinstance(file, str) and os.path.isabs(file) and _under(file, project) and not _installed(file, installed):
            add(name)
            add_references(module)  # what the project's own code imports counts too (numpy, ...)
    return sorted(names)


def resolve_modules(side: Side, names: list[str]) -> Side:
    """The side with ``modules`` filled in: where its ranks import each of ``names`` from (None:
    they cannot import it)."""
    if not names:
        return side
    resolved = _run_probe(side, {"facts": False, "modules": list(names)})
    check_import_isolation(side)
    return dataclasses.replace(side, modules={**side.modules, **resolved["modules"]},
                               module_packages={**side.module_packages, **resolved.get("module_packages", {})})


class SameCodeError(SideError):
    """The baseline names other code but would run the candidate's: a module under test resolves
    to the very file the candidate's ranks import, and nothing else differs between the sides. The
    run is refused (exit 2), as an import across environments is."""

    EXIT_STATUS = 2


# Facts of a side whose difference makes the sides differ in content (the interpreter, torch, the engine).
_CONTENT_FACTS = {"python_version": "Python", "torch_version": "torch", "ddpbench_source_sha256": "ddpbench engine"}


# Distributions that install or drive the run, not code the ranks run: two venvs made at different
# times differ in them, and ddpbench itself is compared by its engine's hash.
_TOOLING = {"pip", "setuptools", "wheel", "uv", "ddpbench", "pytest", "pluggy", "iniconfig", "packaging",
            "pytest-benchmark", "py-cpuinfo", "pytest-xdist", "execnet", "pytest-timeout", "ruff"}


def _packages(side: Side, names: list[str]) -> dict:
    """The installed distributions (name -> version) that provide the modules ``names`` on this
    side: what the code under test imports, not whatever else its environment holds."""
    found: dict = {}
    for name in names:
        found.update(side.module_packages.get(name) or {})
    return {k: v for k, v in found.items() if k not in _TOOLING}


def _content_digest(path: str) -> str | None:
    """The bytes a module resolves to: a package's whole folder of .py files (its __init__.py
    alone may not change), else the file; None when it cannot be read."""
    import hashlib

    try:
        if os.path.basename(path) == "__init__.py":
            return source_digest(os.path.dirname(path))
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def what_differs(baseline: Side, candidate: Side, names: list[str]) -> str | None:
    """What differs in content between the sides beyond which files ``names`` resolve to, said in
    words (None: nothing): their interpreter, torch or engine, their environment variables, a
    module imported through the baseline's paths, the distributions their environments hold, or
    the bytes of a module the two sides get from different files. Cheapest first."""
    for key, words in _CONTENT_FACTS.items():
        if baseline.facts.get(key) != candidate.facts.get(key):
            return words
    if dict(baseline.env) != dict(candidate.env):
        return "environment variables"
    apart = [n for n in names if baseline.modules[n] != candidate.modules[n]]
    roots = [os.path.realpath(p) for p in baseline.paths]
    if any(_under(baseline.modules[n], roots) for n in apart if os.path.isabs(baseline.modules[n])):
        return "modules imported through --dist-baseline-path"
    if _packages(baseline, names) != _packages(candidate, names):
        return "the installed distributions the code under test imports"
    for name in apart:
        if name.split(".", 1)[0] == "torch":
            continue  # torch is compared by its version above: hashing it would cost seconds
        if not all(os.path.isabs(side.modules[name]) for side in (baseline, candidate)):
            continue  # a namespace package: no file of its own
        ours, theirs = _content_digest(baseline.modules[name]), _content_digest(candidate.modules[name])
        if ours is None or theirs is None or ours != theirs:
            return f"the bytes of {name}"
    return None


def _named(baseline: Side) -> str:
    named = [f"--dist-baseline-path={p}" for p in baseline.paths]
    if baseline.launch.foreign_interpreter:
        named.append(f"--dist-baseline-python={baseline.python}")
    return " and ".join(named)


def check_modules_differ(baseline: Side, candidate: Side) -> None:
    """SameCodeError when the baseline names other code (paths, another interpreter) but would time
    the candidate's code: it resolves every module under test to the very files the candidate's
    ranks import, or some of them, with nothing else different in content (:func:`what_differs`:
    copies of one revision in two venvs are one code, and the shared file would be timed twice).
    A module the sides import from one file is fine where something else differs: one test file
    timed against two torches."""
    names = sorted(set(baseline.modules) & set(candidate.modules))
    resolved = [n for n in names if baseline.modules[n] and candidate.modules[n]]
    if not baseline.names_other_code or not resolved:
        return
    same = [n for n in resolved if baseline.modules[n] == candidate.modules[n]]
    if not same:
        return
    shown = ", ".join(f"{n} -> {candidate.modules[n]}" for n in same[:4])
    more = f" and {len(same) - 4} more" if len(same) > 4 else ""
    fix = ("Point --dist-baseline-path at the folder that holds the baseline's own copy of them (the "
           "baseline checkout's root for a flat layout or a test file beside your code, e.g. "
           "--dist-baseline-path=../base; its src/ for a src layout), or give --dist-baseline-python an "
           "environment where the baseline's code is installed")
    if len(same) == len(resolved):
        raise SameCodeError(
            f"both sides import every module under test from the same files ({shown}{more}), although "
            f"{_named(baseline)} asks for other code: the baseline ranks would run the candidate's "
            f"code and the verdict would compare it with itself. {fix}")
    if what_differs(baseline, candidate, resolved) is None:
        raise SameCodeError(
            f"both sides import {shown}{more} from the same files, although {_named(baseline)} asks for "
            f"other code, and nothing else differs between the sides in content (Python, torch, the "
            f"ddpbench engine, installed distributions, environment variables, the bytes of the other "
            f"modules under test): the baseline ranks would run the candidate's code and the verdict "
            f"would compare it with itself. {fix}")


def module_lines(baseline: Side, candidate: Side) -> list[str]:
    """Per top-level package: where each side's ranks import it from."""
    groups: dict[str, list[str]] = {}
    for name in sorted(set(baseline.modules) | set(candidate.modules)):
        groups.setdefault(name.split(".", 1)[0], []).append(name)
    lines = []
    for top, names in groups.items():
        files = {side.name: [side.modules.get(n) for n in names] for side in (baseline, candidate)}
        label = names[0] if len(names) == 1 else f"{top} ({len(names)} modules)"

        def where(side_files):
            if any(f is None for f in side_files):
                missing = [n for n, f in zip(names, side_files) if f is None]
                return f"CANNOT IMPORT {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
            if len(side_files) == 1:
                return side_files[0]
            return os.path.commonpath(side_files) + os.sep

        same = [n for n, b, c in zip(names, files["baseline"], files["candidate"]) if b == c and b]
        if len(same) == len(names):
            lines.append(f"  {label}: same on both sides: {where(files['candidate'])}")
            continue
        lines.append(f"  {label}: baseline {where(files['baseline'])} | candidate {where(files['candidate'])}")
        if same:
            lines.append(f"    same file on both sides: {', '.join(same[:5])}{' ...' if len(same) > 5 else ''}")
    return lines
