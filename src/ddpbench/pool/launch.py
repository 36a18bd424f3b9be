"""How a pool's rank processes start when not by plain multiprocessing spawn (A/B sides): the
interpreter, the import path and the environment of a rank (:class:`RankLaunch`)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass


# Run first by every process a RankLaunch starts (``python -c``), before anything is imported:
# ``-c`` (like ``-m``) puts the working directory first on sys.path, where it would shadow the
# side's own code with whatever the directory pytest was started from holds (a flat-layout
# checkout of the other side). The import path then becomes what the launch planned
# (RankLaunch.sys_path_plan), passed in DDPBENCH_RANK_SYS_PATH.
RANK_BOOTSTRAP = r"""
import json, os, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
_plan = json.loads(os.environ.pop("DDPBENCH_RANK_SYS_PATH", "null"))
if _plan is not None:
    if _plan["exact"] is not None:
        sys.path[:] = _plan["exact"]
    else:
        sys.path[:] = _plan["prepend"] + [p for p in sys.path if p not in _plan["prepend"]]
"""

RANK_MAIN = "from ddpbench.rank_process import main\nsys.exit(main(sys.argv[1:]))\n"
SYS_PATH_ENV = "DDPBENCH_RANK_SYS_PATH"


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

    def environment(self, controller_sys_path: list[str] | None = None) -> dict[str, str]:
        """The environment of a process this launch starts (``controller_sys_path``: the
        controller's sys.path to plan the import path from; default: the current one)."""
        env = dict(os.environ)
        env.update(dict(self.env))
        env[SYS_PATH_ENV] = json.dumps(self.sys_path_plan(controller_sys_path))
        return env

    def sys_path_plan(self, controller_sys_path: list[str] | None = None) -> dict:
        """What RANK_BOOTSTRAP makes of sys.path: ``exact`` (the whole list) with the controller's
        interpreter, else ``prepend`` before the interpreter's own entries; ``append`` is what each
        task adds after them (serve_tasks), listed for probes that must see what a task sees."""
        entries = [os.path.abspath(p) if p else os.getcwd()
                   for p in (sys.path if controller_sys_path is None else controller_sys_path)]
        paths = list(self.paths)
        if not self.foreign_interpreter:
            return {"exact": _unique(paths + entries), "prepend": [], "append": []}
        return {"exact": None, "prepend": paths, "append": [p for p in project_folders(entries) if p not in paths]}

    def command(self, code: str, *args: str) -> list[str]:
        """``python -c`` running RANK_BOOTSTRAP, then ``code`` (sys.argv[1:] == args)."""
        return [self.python or sys.executable, "-c", RANK_BOOTSTRAP + code, *args]

    @property
    def foreign_interpreter(self) -> bool:
        return self.python is not None and os.path.realpath(self.python) != os.path.realpath(sys.executable)


def _unique(entries: list[str]) -> list[str]:
    return list(dict.fromkeys(entries))


