"""A side of an A/B run: what its ranks run with (an interpreter, environment overrides, sys.path
entries), checked before any round starts.

The pool only learns "start ranks with this interpreter and this environment" from a side
(:class:`ddpbench.pool.RankLaunch`); what the two sides mean is decided here and in
:mod:`ddpbench.ab.engine`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

from ..pool import RankLaunch

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PROBE_TIMEOUT_S = 120.0

# Run by the side's interpreter with the side's environment: what it would import.
_PROBE = r"""
import json, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
try:
    import ddpbench
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
    try:
        import torch
        out["torch_version"] = torch.__version__
    except Exception as exc:
        out["error"] = f"cannot import torch: {type(exc).__name__}: {exc}"
print("DDPBENCH_PROBE " + json.dumps(out))
"""


class SideError(ValueError):
    """A side cannot be used: the message names the problem and the fix."""


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
    # Set for both sides' ranks by A/B mode itself (ddpbench.ab.heap); the side's own env wins.
    common_env: tuple[tuple[str, str], ...] = ()
    # Filled by probe(): what the side's ranks import.
    facts: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def launch(self) -> RankLaunch:
        return RankLaunch(python=self.python, paths=self.paths,
                          env=tuple({**dict(self.common_env), **dict(self.env)}.items()))

    def describe(self) -> dict:
        """The side as extra_info shows it."""
        return {
            "python": self.facts.get("python", self.python or sys.executable),
            "python_version": self.facts.get("python_version"),
            "torch_version": self.facts.get("torch_version"),
            "ddpbench_version": self.facts.get("ddpbench_version"),
            "sys_path_prepended": list(self.paths),
            "env": dict(self.env),
            "common_env": dict(self.common_env),
        }

    def short(self) -> str:
        parts = [f"python {self.facts.get('python', self.python or sys.executable)}",
                 f"torch {self.facts.get('torch_version', '?')}"]
        parts += [f"path {p}" for p in self.paths]
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


def probe(side: Side, expected_version: str | None) -> Side:
    """Start the side's interpreter with its environment once and check that it imports ddpbench
    (of ``expected_version``) and torch. Returns the side with its facts filled in."""
    launch = side.launch
    python = side.python or sys.executable
    try:
        out = subprocess.run([python, "-c", _PROBE], env=launch.environment(), capture_output=True,
                             text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SideError(f"the {side.name} side's interpreter {python} could not be run: {exc}") from None
    line = next((line for line in out.stdout.splitlines() if line.startswith("DDPBENCH_PROBE ")), None)
    if line is None:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise SideError(f"the {side.name} side's interpreter {python} failed to start "
                        f"(exit {out.returncode}): {' | '.join(tail)}")
    facts = json.loads(line.split(" ", 1)[1])
    if "error" in facts:
        raise SideError(f"the {side.name} side ({python}) {facts['error']}; install ddpbench and torch "
                        f"in that environment (pip install -e <ddpbench checkout>) or fix --dist-{side.name}-path")
    if expected_version is not None and facts.get("ddpbench_version") != expected_version:
        raise SideError(f"the {side.name} side ({python}) imports ddpbench {facts.get('ddpbench_version')} "
                        f"from {facts.get('ddpbench_file')}, but this run is ddpbench {expected_version}: both "
                        f"sides' ranks run this run's engine, so install the same ddpbench version in both "
                        f"environments (the code under test may differ; ddpbench may not)")
    return dataclasses.replace(side, facts=facts)


def local_facts() -> dict:
    """The controller's own interpreter, ddpbench and torch versions (without importing torch): a
    side that runs the controller's interpreter unchanged needs no probe."""
    from importlib.metadata import PackageNotFoundError, version

    import ddpbench

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = None
    return {"python": sys.executable, "python_version": sys.version.split()[0],
            "ddpbench_file": ddpbench.__file__, "ddpbench_version": ddpbench.__version__,
            "torch_version": torch_version}
