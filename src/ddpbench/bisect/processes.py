"""The subprocesses bisect starts: git, and each pytest or --setup run in a session of its own that
an interrupt or a time limit stops."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

INTERRUPT_GRACE_S = 60.0  # how long a stopped run has to end after its SIGINT before SIGKILL


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def child_env() -> dict:
    """The environment of the pytest runs: this one, less what an enclosing xdist run set."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("PYTEST_XDIST") and k != "PYTEST_CURRENT_TEST"}


def stop(child: subprocess.Popen) -> None:
    """Stops a run as Ctrl-C would (SIGINT to its session: pytest stops its ranks), killing it
    only when it has not ended after INTERRUPT_GRACE_S."""
    try:
        os.killpg(child.pid, signal.SIGINT)
        child.wait(INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    except ProcessLookupError:
        pass


def _interruptible() -> None:
    """In the child before it runs: SIGINT back to its default. A shell's background job (`cmd &`,
    nohup, a CI runner's script) starts with SIGINT ignored, Python then installs no
    KeyboardInterrupt handler, and :func:`stop`'s SIGINT would wait out INTERRUPT_GRACE_S."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Children:
    """The runs bisect started that are still under way (``running``), so an interrupt can stop
    them (:meth:`stop_all`)."""

    def __init__(self) -> None:
        self.running: list[subprocess.Popen] = []

    def run(self, command: list[str], cwd: Path, log: Path, env: dict | None = None,
            timeout: float | None = None) -> int | None:
        """Runs ``command`` in its own session (a Ctrl-C reaches bisect, which then stops it with
        SIGINT, so pytest stops its ranks), output to ``log``; its exit status, or None when it
        ran past ``timeout`` seconds (then stopped as an interrupt would)."""
        with open(log, "w") as handle:
            child = subprocess.Popen(command, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT,
                                     env=env or child_env(), start_new_session=True,
                                     preexec_fn=_interruptible)
            self.running.append(child)
            try:
                return child.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
            finally:
                self.running.remove(child)
                if child.poll() is None:
                    stop(child)

    def stop_all(self) -> None:
        for child in list(self.running):
            stop(child)
