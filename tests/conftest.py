import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _no_xdist_marks_for_child_pytest_runs(monkeypatch):
    """`make test` runs under pytest-xdist, whose workers export PYTEST_XDIST_WORKER. A pytest run
    started from a test inherits it, and pytest-benchmark then believes it is an xdist worker and
    silently disables benchmarking. Child runs must look like the plain runs users make."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
