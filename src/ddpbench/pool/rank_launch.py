"""How a local pool starts its ranks in another interpreter or environment (A/B sides), run by the
controller: :class:`RankLaunch` (the interpreter, import path and environment of a rank) and
:func:`start_rank_subprocess`. The rank runs :data:`RANK_BOOTSTRAP`, then
:mod:`ddpbench.rank_process` (of the ddpbench that interpreter has); why a foreign launch runs an
import guard: docs/design/ab.md#what-a-side-is."""

from __future__ import annotations

import functools
import json
import os
import site
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing import current_process
from multiprocessing.connection import Connection

from .base import PoolSpec, PoolStartError


# Run first by every process a RankLaunch starts (``python -c``), before anything is imported:
# ``-c`` (like ``-m``) puts the working directory first on sys.path, where it would shadow the
# side's own code with whatever the directory pytest was started from holds (a flat-layout
# checkout of the other side). The import path then becomes what the launch planned
# (RankLaunch.sys_path_plan), passed in DDPBENCH_RANK_SYS_PATH.
#
# With DDPBENCH_IMPORT_GUARD set (foreign launches, :meth:`RankLaunch.environment`), it then
# installs the import guard: a meta-path finder, first in line, that asks the other finders and,
# when the module they found lives inside the controller's environment (``roots``), in a source
# folder the controller's environment installs editable (``editable``) or, for a side with a copy
# of the project of its own, in the controller's project folder (``project``), and not in one of this
# interpreter's own folders, its own editable source folders or the project folders each task
# appends (the longest matching folder decides; on a tie, its own), appends a JSON line naming it
# to the ``log`` file. It only records: the controller reads the log (see
# :func:`read_import_guard_log`) and refuses the run. The bootstrap is the controller's code, so
# the guard runs whatever ddpbench the interpreter has.
#
# Editable installs (setuptools, PEP 660) put a project's source outside the environment: the
# folders an ``__editable__.*.pth`` file lists and the MAPPING of an ``__editable___*_finder.py``
# module in site-packages. Source text, as the bootstrap runs it for the rank's own environment.
EDITABLE_SOURCE = r"""
def _ddpbench_editable_sources(site_dirs):
    import ast, glob, os
    found = []
    for site_dir in site_dirs:
        for pth in sorted(glob.glob(os.path.join(glob.escape(site_dir), "__editable__*.pth"))):
            try:
                lines = open(pth, encoding="utf-8").read().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in (line.strip() for line in lines):
                if line and not line.startswith(("#", "import ", "import\t")):
                    path = os.path.join(site_dir, line)
                    if os.path.exists(path):
                        found.append(os.path.realpath(path))
        for finder in sorted(glob.glob(os.path.join(glob.escape(site_dir), "__editable___*_finder.py"))):
            try:
                tree = ast.parse(open(finder, encoding="utf-8").read())
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                continue
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                if not any(isinstance(t, ast.Name) and t.id == "MAPPING" for t in targets) or node.value is None:
                    continue
                try:
                    mapping = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(mapping, dict):
                    found += [os.path.realpath(p) for p in mapping.values() if isinstance(p, str) and os.path.exists(p)]
    return list(dict.fromkeys(found))
"""
RANK_BOOTSTRAP = EDITABLE_SOURCE + r"""
import json, os, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
_plan = json.loads(os.environ.pop("DDPBENCH_RANK_SYS_PATH", "null"))
if _plan is not None:
    if _plan["exact"] is not None:
        sys.path[:] = _plan["exact"]
    else:
        sys.path[:] = _plan["prepend"] + [p for p in sys.path if p not in _plan["prepend"]]
_guard = json.loads(os.environ.pop("DDPBENCH_IMPORT_GUARD", "null"))
if _guard is not None:
    def _ddpbench_import_guard(guard, plan):
        import site, sysconfig
        def folder(p):
            return os.path.realpath(p).rstrip(os.sep) + os.sep
        sites = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
        own = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
               *site.getsitepackages(), *sysconfig.get_paths().values(), *_ddpbench_editable_sources(sites),
               *((plan or {}).get("append") or [])]
        roots = ([(folder(p), False, "environment") for p in guard["roots"]]
                 + [(folder(p), False, "editable") for p in guard.get("editable", [])]
                 + [(folder(p), False, "project") for p in guard.get("project", [])]
                 + [(folder(p), True, "") for p in own if p])
        def foreign(file):
            if not isinstance(file, str) or not os.path.isabs(file):
                return ""
            real = os.path.realpath(file) + os.sep
            best = max((r for r in roots if real.startswith(r[0])), key=lambda r: (len(r[0]), r[1]), default=None)
            return "" if best is None or best[1] else best[2]
        def note(name, file, where):
            with open(guard["log"], "a") as handle:
                handle.write(json.dumps({"module": name, "file": file, "python": sys.executable,
                                         "prefix": sys.prefix, "pid": os.getpid(), "where": where}) + "\n")
        class ImportGuard:
            @classmethod
            def find_spec(cls, name, path=None, target=None):
                for finder in list(sys.meta_path):
                    find = getattr(finder, "find_spec", None)
                    if finder is cls or find is None:
                        continue
                    spec = find(name, path, target)
                    if spec is not None:
                        where = foreign(spec.origin)
                        if where:
                            note(name, spec.origin, where)
                        return spec
                return None
        for name, module in list(sys.modules.items()):
            where = foreign(getattr(module, "__file__", None))
            if where:
                note(name, module.__file__, where)
        sys.meta_path.insert(0, ImportGuard)
    _ddpbench_import_guard(_guard, _plan)
    del _ddpbench_import_guard
del _ddpbench_editable_sources
"""

# What a launched rank runs after the bootstrap: a module path that every ddpbench has (an A/B
# baseline may be an older one), with the arguments start_rank_subprocess gives.
RANK_MAIN = "from ddpbench.rank_process import main\nsys.exit(main(sys.argv[1:]))\n"
SYS_PATH_ENV = "DDPBENCH_RANK_SYS_PATH"
IMPORT_GUARD_ENV = "DDPBENCH_IMPORT_GUARD"
# The controller's import-path variables: a foreign launch's ranks get their side's own import path
# (--dist-baseline-path, --dist-baseline-env PYTHONPATH=... where the side wants one), never these.
CONTROLLER_PATH_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE")


@functools.cache
def interpreter_environment(python: str) -> tuple[str, str] | None:
    """(``sys.prefix``, the binary) of the environment ``python`` runs in, both resolved, or None
    when it cannot be run. Asked of the interpreter itself (``-I``: without PYTHONPATH or the
    user's site), since only its start-up knows which pyvenv.cfg applies, and a wrapper script
    reports the interpreter it starts."""
    code = "import os, sys; print(os.path.realpath(sys.prefix)); print(os.path.realpath(sys.executable))"
    try:
        out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return (lines[-2], lines[-1]) if out.returncode == 0 and len(lines) >= 2 else None


def this_environment() -> tuple[str, str]:
    """The controller's own (``sys.prefix``, binary), resolved as :func:`interpreter_environment` does."""
    return os.path.realpath(sys.prefix), os.path.realpath(sys.executable)


def environment_roots() -> list[str]:
    """The folders that are this interpreter's own environment: its installed packages and, for a
    venv, the whole venv (``sys.prefix``). An installation's prefix itself is left out: the
    interpreters made from it share its standard library."""
    roots = list(site.getsitepackages())
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site:
        roots.append(user_site)
    if os.path.realpath(sys.prefix) != os.path.realpath(sys.base_prefix):
        roots.append(sys.prefix)
    return list(dict.fromkeys(os.path.realpath(r) for r in roots))


_editable: dict = {}
exec(EDITABLE_SOURCE, _editable)  # noqa: S102 - our own constant text, shared with the rank bootstrap


def editable_sources() -> list[str]:
    """The source folders (and single-module files) this interpreter's environment installs
    editable: outside the environment, yet the candidate's code when this is the controller."""
    sites = list(site.getsitepackages()) + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return _editable["_ddpbench_editable_sources"](sites)


def read_import_guard_log(path: str) -> list[dict]:
    """What a foreign launch's import guard recorded in ``path``: one dict per module imported
    from inside the controller's environment or its editable source folders ({module, file,
    python, prefix, pid, where: "environment" or "editable"}); [] when none."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            found.append({"module": "?", "file": line, "python": "?", "prefix": "?", "pid": None})
    return found


def project_folders(entries: list[str]) -> list[str]:
    """The entries of the controller's sys.path that are the project's own folders (test folders,
    a checkout's src/), not this interpreter's standard library or installed packages: what another
    interpreter's ranks need from it so that workloads defined in test modules unpickle."""
    prefixes = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    return [p for p in entries if p and "-packages" not in p
            and not os.path.realpath(p).startswith(prefixes)]


@dataclass(frozen=True)
class RankLaunch:
    """How a pool's rank processes are started when not by plain multiprocessing spawn: with this
    interpreter (None: the controller's), these entries first on sys.path and these environment
    overrides. The pool knows nothing else about why (see ddpbench.gates.ab).

    A rank's import path, in order: ``paths``; then, with the controller's interpreter, the
    controller's own sys.path (as a spawned rank gets it); with another interpreter, that
    interpreter's own sys.path, to which each task appends the controller's project folders
    (``append``) once the rank's own ddpbench is loaded. Never the working directory implicitly:
    only where the controller itself imports from it, and after ``paths``.
    """

    python: str | None = None
    paths: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Where a foreign launch's import guard records imports from the controller's environment
    # (None: the guard is off). The A/B session reads it after each case.
    import_guard_log: str | None = None
    # (the controller's project folder, this side's own copy of it): each of the controller's
    # import folders inside the first becomes the same folder inside the second (dropped where the
    # copy lacks it), so that a side with a checkout of its own never imports the controller's
    # test modules or source (ddpbench.gates.ab.baseline_checkout).
    project_map: tuple[str, str] | None = None

    def environment(self, controller_sys_path: list[str] | None = None) -> dict[str, str]:
        """The environment of a process this launch starts (``controller_sys_path``: the
        controller's sys.path to plan the import path from; default: the current one). A foreign
        launch drops the controller's import-path variables (CONTROLLER_PATH_VARIABLES) unless its
        own ``env`` sets them, and turns its import guard on when it has a log."""
        env = dict(os.environ)
        if self.foreign_interpreter:
            for name in CONTROLLER_PATH_VARIABLES:
                env.pop(name, None)
            if self.import_guard_log is not None:
                env[IMPORT_GUARD_ENV] = json.dumps({
                    "roots": environment_roots(), "editable": editable_sources(), "log": self.import_guard_log,
                    # a side with a copy of the project of its own never imports the controller's
                    "project": [self.project_map[0]] if self.project_map is not None else []})
        env.update(dict(self.env))
        env[SYS_PATH_ENV] = json.dumps(self.sys_path_plan(controller_sys_path))
        return env

    def sys_path_plan(self, controller_sys_path: list[str] | None = None) -> dict:
        """What RANK_BOOTSTRAP makes of sys.path: ``exact`` (the whole list) with the controller's
        interpreter, else ``prepend`` before the interpreter's own entries; ``append`` is what each
        task adds after them (serve_tasks), listed for probes that must see what a task sees."""
        entries = [os.path.abspath(p) if p else os.getcwd()
                   for p in (sys.path if controller_sys_path is None else controller_sys_path)]
        if self.project_map is not None:
            entries = [mapped for mapped in map(self._own_copy, entries) if mapped is not None]
        paths = list(self.paths)
        if not self.foreign_interpreter:
            return {"exact": _unique(paths + entries), "prepend": [], "append": []}
        return {"exact": None, "prepend": paths, "append": [p for p in project_folders(entries) if p not in paths]}

    def _own_copy(self, entry: str) -> str | None:
        """``entry`` of the controller's import path as this launch's ranks get it: inside the
        controller's project folder, the same folder in the side's own copy (None where the copy
        has none); elsewhere unchanged."""
        theirs, ours = self.project_map
        real = os.path.realpath(entry)
        if real != theirs and not real.startswith(theirs.rstrip(os.sep) + os.sep):
            return entry
        mapped = os.path.join(ours, os.path.relpath(real, theirs)) if real != theirs else ours
        return os.path.normpath(mapped) if os.path.isdir(mapped) else None

    def command(self, code: str, *args: str) -> list[str]:
        """``python -c`` running RANK_BOOTSTRAP, then ``code`` (sys.argv[1:] == args)."""
        return [self.python or sys.executable, "-c", RANK_BOOTSTRAP + code, *args]

    @property
    def foreign_interpreter(self) -> bool:
        """Whether the launch names another interpreter or another environment than the
        controller's: another binary, or the same binary with another ``sys.prefix`` (a venv). A
        wrapper script that starts the controller's own interpreter in its environment is not."""
        if self.python is None:
            return False
        return interpreter_environment(self.python) != this_environment()


def _unique(entries: list[str]) -> list[str]:
    return list(dict.fromkeys(entries))


class SubprocessRank:
    """A rank started with ``python -c`` (RankLaunch), with the attributes of
    multiprocessing.Process that the pool uses: pid, sentinel, join, exitcode.

    Its sentinel is a pidfd where the OS has them; elsewhere the read end of a pipe whose write
    end only the rank holds, which reads end-of-file once the rank is gone."""

    def __init__(self, popen: "subprocess.Popen", exit_pipe: int):
        self._popen = popen
        self.pid = popen.pid
        self._exit_pipe: int | None = exit_pipe
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)  # readable once the process has exited
        except (AttributeError, OSError):
            self._pidfd = None

    @property
    def sentinel(self) -> int:
        return self._pidfd if self._pidfd is not None else self._exit_pipe

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def close_handles(self) -> None:
        for name in ("_pidfd", "_exit_pipe"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)


def start_rank_subprocess(spec: PoolSpec, rank: int, store_dir: str, pg_timeout_s: float,
                           pin: bool, launch: RankLaunch):
    """Start one rank with the launch's interpreter, import path and environment; returns (rank,
    connection)."""
    parent_sock, child_sock = socket.socketpair()
    exit_read, exit_write = os.pipe()  # the sentinel where there are no pidfds
    env = launch.environment()
    # The rank shares tensors with the controller through multiprocessing's resource sharer,
    # which authenticates with the process's authkey: hand ours over.
    env["DDPBENCH_RANK_AUTHKEY"] = bytes(current_process().authkey).hex()
    command = launch.command(
        RANK_MAIN, "--fd", str(child_sock.fileno()), "--rank", str(rank), "--world-size", str(spec.world_size),
        "--backend", spec.backend, "--device", spec.device, "--store-dir", store_dir,
        "--parent-pid", str(os.getpid()), "--pg-timeout", str(pg_timeout_s))
    if pin:
        command.append("--pin")
    try:
        popen = subprocess.Popen(command, env=env, pass_fds=(child_sock.fileno(), exit_write),
                                 stdin=subprocess.DEVNULL)
    except OSError as exc:
        parent_sock.close()
        os.close(exit_read)
        raise PoolStartError(f"ddpbench: cannot start rank {rank} with {command[0]}: {exc}") from exc
    finally:
        child_sock.close()
        os.close(exit_write)
    return SubprocessRank(popen, exit_read), Connection(parent_sock.detach())
