"""tests/conftest.py's `pool` marker keeps `make test-fast` fast: a test that starts rank processes or
a pytest run without it fails, naming the fix; with it, or through a pool fixture, it runs."""

from helpers.paths import TESTS_DIR

pytest_plugins = ["pytester"]

PROBES = '''
import subprocess
import sys

import pytest

from ddpbench.pool import PoolSpec, RankPool


def test_unmarked_pool():
    RankPool(PoolSpec("gloo", 2, "cpu")).close()


def test_unmarked_pytest_run():
    subprocess.run([sys.executable, "-m", "pytest", "--version"], capture_output=True)


def test_unmarked_ddpbench_command_that_starts_nothing():
    subprocess.run([sys.executable, "-m", "ddpbench.cli", "--version"], capture_output=True, check=True)


@pytest.mark.pool
def test_marked_pytest_run():
    subprocess.run([sys.executable, "-m", "pytest", "--version"], capture_output=True, check=True)


def test_pytester_is_a_pool_fixture(pytester):
    assert pytester.runpytest_subprocess("--version").ret == 0
'''


def test_starting_ranks_or_a_pytest_run_unmarked_fails_naming_the_fix(pytester):
    pytester.makeconftest((TESTS_DIR / "conftest.py").read_text())
    pytester.makepyfile(test_probes=PROBES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines([
        "*test_unmarked_pool starts rank processes but is not marked `pool`: mark it @pytest.mark.pool*",
        "*test_unmarked_pytest_run runs pytest in a subprocess but is not marked `pool`*"])
    deselected = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not pool")
    deselected.assert_outcomes(passed=1, failed=2, deselected=2)
