"""What ddpbench keeps about one pytest session between the plugin's hooks: one
:class:`SessionState` in ``config.stash``, reached through :func:`session_state`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the plugin loads this module in every session: no A/B code at import
    from .gates.ab.session import ABSession


@dataclass
class SessionState:
    """Set by the plugin's hooks as the session goes; each field says which hook sets it."""

    #: pytest_configure: the A/B run, when an A/B option was given.
    ab: ABSession | None = None
    #: pytest_configure: ((host, port), secret) with --dist-controller (multi-node).
    controller: tuple[tuple[str, int], bytes] | None = None
    #: pytest_collection_finish: whether a collected test is a ddpbench case (False before).
    uses_ddpbench: bool = False
    #: pytest_collection_finish: the node ids of the collected ddpbench cases.
    case_ids: frozenset[str] = frozenset()
    #: pytest_sessionfinish, before pytest-benchmark saves: (pytest session, exit status).
    run_end: tuple[pytest.Session, int] | None = None
    #: machine_facts, once: ddpbench's additions to the run's machine_info.
    machine_facts: dict | None = None
    #: plugin.calibration, once: the machine-drift calibration's measurement.
    calibration: dict | None = None
    #: pytest_benchmark_compare_machine_info: this machine's machine_info as --benchmark-compare
    #: compared it.
    compared_machine_info: dict | None = None
    #: pytest_configure and each case's round plan: what the run says once about the options it
    #: was given (an old spelling, a pytest-benchmark option not read), in the order first said.
    notices: list[str] = field(default_factory=list)

    def notice(self, line: str) -> None:
        if line not in self.notices:
            self.notices.append(line)


_KEY = pytest.StashKey[SessionState]()


def session_state(config: pytest.Config) -> SessionState:
    """This session's state (made empty on first use)."""
    return config.stash.setdefault(_KEY, SessionState())
