"""What every test under tests/ shares: child pytest runs that look like users' runs, and the
``pool`` marker: tests that start rank processes, or a command that does (pytest, a ddpbench
command, torchrun, make), take seconds each; `make test-fast` (-m "not pool") leaves them out.

tests/ is on sys.path because this file is imported from there, so tests import their shared code as
``helpers.NAME`` (tests/helpers/)."""
import functools
import os
import shlex
import subprocess

import pytest

from ddpbench.pool import RankPool

pytest_plugins = ["pytester"]

#: Fixtures that start rank processes (``pytester``: a pytest run, whose ddpbench cases start their
#: own). A test that uses one, itself or through another fixture, is marked ``pool``; a test that
#: starts ranks in its body carries ``@pytest.mark.pool`` (or its module ``pytestmark``).
POOL_FIXTURES = frozenset({"pytester", "pool", "registry", "real_censuses"})
#: Commands that start ranks (or may): a test that runs one in a subprocess needs the marker too.
POOL_COMMANDS = frozenset({"pytest", "torchrun", "make", "ddpbench.worker", "ddpbench bisect"})


@pytest.fixture(autouse=True)
def _no_xdist_marks_for_child_pytest_runs(monkeypatch):
    """`make test` runs under pytest-xdist, whose workers export PYTEST_XDIST_WORKER. A pytest run
    started from a test inherits it, and pytest-benchmark then believes it is an xdist worker and
    silently disables benchmarking. Child runs must look like the plain runs users make."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


#: What a pytest run that a test starts leaves out unless the test carries the marker: each costs
#: every case (or every A/B case) of such a run time that only the tests about it need.
CHILD_RUN_DEFAULTS = (
    # torch's memory tracker's steps, for a record only memory tests read
    ("memory_census", "--dist-census=collectives"),
    # the numerics replay's two more set-ups and six steps per case
    ("numerics", "--dist-numerics-steps=0"),
    # a second pool per A/B side: as many rank processes again to start, and its blocks
    ("ab_pools", "--dist-ab-pools-per-side=1"),
    # the training cases' variant rounds (compute only, collectives alone) after their own
    ("exposed_comm", "--dist-exposed-comm=off"),
    # a stored run's second pool per case (--dist-case-pools, 2 by default): a pool start and a set-up more
    ("case_pools", "--dist-case-pools=1"),
)


@pytest.fixture(autouse=True)
def _child_pytest_runs_without_the_memory_census(request, monkeypatch):
    """A pytest run (or a ddpbench command running pytest) that a test starts gets the options of
    CHILD_RUN_DEFAULTS in PYTEST_ADDOPTS, except those whose marker the test carries: a test about
    the memory census, the numerics, A/B's pools or exposed communication keeps it. An option the
    test's own command line gives wins (it comes after PYTEST_ADDOPTS)."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # first: pytester clears PYTEST_ADDOPTS when it starts
    for marker, option in CHILD_RUN_DEFAULTS:
        if request.node.get_closest_marker(marker) is None:
            addopts = os.environ.get("PYTEST_ADDOPTS", "")
            monkeypatch.setenv("PYTEST_ADDOPTS", f"{addopts} {option}".strip())


def pytest_collection_modifyitems(items):
    for item in items:
        if POOL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pool)


_running: list = [None]  # the test whose set-up, call or teardown runs now


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running[0] = item
    try:
        return (yield)
    finally:
        _running[0] = None


def _refuse_outside_pool_tests(what: str) -> None:
    item = _running[0]
    if item is not None and item.get_closest_marker("pool") is None:
        pytest.fail(f"{item.nodeid} {what} but is not marked `pool`: mark it @pytest.mark.pool (or name "
                    f"the fixture that does it in tests/conftest.py's POOL_FIXTURES)", pytrace=False)


def _pool_command(args) -> str | None:
    """The entry of POOL_COMMANDS that a subprocess's command line runs, if any."""
    words = [os.path.basename(w) for w in (shlex.split(args) if isinstance(args, str) else map(os.fspath, args))]
    for word, after in zip(words, words[1:] + [""]):
        command = f"ddpbench {after}" if word in ("ddpbench", "ddpbench.cli") else word
        if command in POOL_COMMANDS:
            return command
    return None


@pytest.fixture(autouse=True, scope="session")
def _ranks_start_only_in_pool_tests():
    """Keeps `-m "not pool"` fast: a test without the marker fails, naming the fix, when it starts a
    local rank pool (each starts in RankPool.__init__, in a fixture or in the test) or runs one of
    POOL_COMMANDS in a subprocess."""
    start_pool, start_process = RankPool.__init__, subprocess.Popen.__init__

    @functools.wraps(start_pool)
    def guarded_start_pool(self, *args, **kwargs):
        _refuse_outside_pool_tests("starts rank processes")
        start_pool(self, *args, **kwargs)

    @functools.wraps(start_process)
    def guarded_start_process(self, args, *rest, **kwargs):
        command = _pool_command(args)
        if command:
            _refuse_outside_pool_tests(f"runs {command} in a subprocess")
        start_process(self, args, *rest, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RankPool, "__init__", guarded_start_pool)
        patch.setattr(subprocess.Popen, "__init__", guarded_start_process)
        yield
