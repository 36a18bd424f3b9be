"""Checks each entry of ddpbench.benchmark_internals.USES against real pytest-benchmark objects
(tests/test_plugin_contract.py runs it inside a pytest run, where those objects exist)."""

from __future__ import annotations

import importlib
import inspect

from ddpbench.benchmark_internals import USES, Use


def broken_uses(benchmark, config, uses: tuple[Use, ...] = USES) -> list[str]:
    """One line per entry of ``uses`` that the installed pytest-benchmark breaks: the name, who in
    ddpbench relies on it, and what changed. ``benchmark``: a fixture that has run ``pedantic``."""
    session = config._benchmarksession
    owners = {"BenchmarkFixture": benchmark, "BenchmarkSession": session, "FileStorage": session.storage,
              "config": config}
    lines = []
    for use in uses:
        problem = _problem(use, owners, config)
        if problem:
            lines.append(f"{use.owner}.{use.name} ({use.how} by ddpbench {use.by}): {problem}")
    return lines


def _problem(use: Use, owners: dict, config) -> str | None:
    if use.owner == "option":
        try:
            config.getoption(use.name)
        except ValueError:
            return "no such option"
        return None
    if use.owner == "hook":
        caller = getattr(config.hook, use.name, None)
        if caller is None or caller.spec is None:
            return "no such hook"
        if set(caller.spec.argnames) != set(use.parameters):
            return f"its arguments are now {caller.spec.argnames}, ddpbench passes {use.parameters}"
        return None
    value = owners[use.owner] if use.owner in owners else importlib.import_module(use.owner)
    for part in use.name.split("."):
        if not hasattr(value, part):
            return f"missing ({part!r} not found)"
        value = getattr(value, part)
    if use.parameters is None:
        return None
    try:
        names = tuple(inspect.signature(value).parameters)
    except (TypeError, ValueError):
        return "not a function any more"
    if use.how == "replaced":
        if names != use.parameters:
            return f"takes {names}; ddpbench's replacement takes {use.parameters}"
        return None
    missing = [name for name in use.parameters if name not in names]
    return f"takes no {missing} any more (its parameters: {names})" if missing else None
