"""The pytest hooks ddpbench adds, for plugins of its users (registered by :mod:`ddpbench.plugin`)."""

import pytest


@pytest.hookspec(firstresult=True)
def pytest_ddpbench_prepare_workload(workload, spec):
    """Called with each workload a case hands to ``dist_benchmark`` (and the case's pool spec)
    before anything runs; a plugin may return another workload to run instead (e.g. the workload
    wrapped with instrumentation of its own). The first non-None result is used.
    :mod:`ddpbench.testing` uses it to slow a case down on purpose for the gates' power tests."""
