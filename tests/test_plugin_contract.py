"""The pytest-benchmark internals that ddpbench relies on (pyproject.toml cites this file).

ddpbench.benchmark_internals lists every one (USES): each must exist in the installed release, its
methods with the parameters ddpbench passes or replaces them with. pytest-benchmark has no public
API for timings measured elsewhere, so ``ddpbench.fixture.replay_into_pytest_benchmark`` sets the
fixture's ``_timer`` and runs ``pedantic`` once per recorded round. These tests fail loudly when a
pytest-benchmark release changes that: the recorded rounds must be exactly the given times, in the
JSON too, with ddpbench's timer named; ``--benchmark-disable`` must still run; and the installed
release must be inside the range pyproject.toml allows (widen it only after these tests pass on the
new release).
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import pytest_benchmark
from packaging.specifiers import SpecifierSet

from ddpbench.benchmark_internals import CHECKED_WITH, Use
from ddpbench.fixture import replay_into_pytest_benchmark
from helpers.benchmark_contract import broken_uses
from helpers.paths import REPO_ROOT as ROOT, TESTS_DIR

pytest_plugins = ["pytester"]

TIMES = [0.0031, 0.0012, 0.0027, 0.0019, 0.0022]

REPLAY = f'''
from ddpbench.fixture import replay_into_pytest_benchmark

TIMES = {TIMES!r}

def test_replay(benchmark):
    replay_into_pytest_benchmark(benchmark, TIMES)
    if not benchmark.disabled:
        assert list(benchmark.stats.stats.data) == TIMES
'''


def test_replayed_round_times_are_the_recorded_rounds(pytester):
    pytester.makepyfile(test_replay=REPLAY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    (case,) = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    assert case["stats"]["data"] == TIMES
    assert case["stats"]["rounds"] == len(TIMES) and case["stats"]["iterations"] == 1
    assert case["stats"]["median"] == pytest.approx(sorted(TIMES)[len(TIMES) // 2])
    assert case["options"]["timer"] == "rank_max_round_time"


def test_benchmark_disable_still_runs_the_case(pytester):
    pytester.makepyfile(test_replay=REPLAY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-disable")
    result.assert_outcomes(passed=1)


class _FixtureThatIgnoresItsTimer:
    """A pytest-benchmark fixture whose pedantic no longer reads ``_timer``."""

    disabled = False

    def __init__(self):
        self.stats = None

    def pedantic(self, target, rounds, iterations, warmup_rounds):
        class Stats:
            data = [1.0] * rounds

        self.stats = type("Metadata", (), {"stats": Stats})()


def test_a_changed_fixture_is_reported_not_silently_mismeasured():
    with pytest.raises(RuntimeError, match=r"fixture's internals \(_timer / pedantic\) changed"):
        replay_into_pytest_benchmark(_FixtureThatIgnoresItsTimer(), TIMES)


def test_the_installed_pytest_benchmark_is_inside_the_range_pyproject_allows():
    pyproject = (ROOT / "pyproject.toml").read_text()
    (spec,) = re.findall(r'"pytest-benchmark\s*([<>=!~][^"]*)"', pyproject)
    assert pytest_benchmark.__version__ in SpecifierSet(spec), (
        f"pytest-benchmark {pytest_benchmark.__version__} is outside {spec!r} (pyproject.toml)")
    assert "tests/test_plugin_contract.py" in pyproject
    assert "ddpbench.benchmark_internals" in pyproject


def test_the_internals_were_checked_against_the_pinned_release():
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    assert CHECKED_WITH == pins["pytest-benchmark"], (
        "make venv installs another pytest-benchmark than ddpbench.benchmark_internals.CHECKED_WITH: "
        "run these tests on it and update CHECKED_WITH")


CONTRACT = f'''
import sys

sys.path.insert(0, {str(TESTS_DIR)!r})
from helpers.benchmark_contract import broken_uses

def test_uses(benchmark, request):
    benchmark.pedantic(lambda: None, rounds=2, iterations=1, warmup_rounds=0)
    problems = broken_uses(benchmark, request.config)
    assert not problems, "pytest-benchmark changed what ddpbench relies on:\\n" + "\\n".join(problems)
'''


def test_every_internal_ddpbench_uses_is_there_with_its_parameters(pytester):
    pytester.makepyfile(test_contract=CONTRACT)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()  # the failed assertion names every broken entry


def test_a_missing_name_or_changed_parameters_are_named():
    class Fixture:
        def pedantic(self, target, rounds):
            pass

    class Storage:
        def save(self, output_json, save, metadata):
            pass

    def getoption(name):
        raise ValueError(name)

    config = SimpleNamespace(_benchmarksession=SimpleNamespace(storage=Storage()), getoption=getoption,
                             hook=SimpleNamespace())
    uses = (Use("BenchmarkFixture", "_timer", "set", "x"),
            Use("BenchmarkFixture", "pedantic", "called", "x", ("target", "rounds", "warmup_rounds")),
            Use("FileStorage", "save", "replaced", "x", ("output_json", "save")),
            Use("option", "benchmark_gone", "read", "x"),
            Use("hook", "pytest_benchmark_gone", "called", "x", ()))
    assert broken_uses(Fixture(), config, uses) == [
        "BenchmarkFixture._timer (set by ddpbench x): missing ('_timer' not found)",
        "BenchmarkFixture.pedantic (called by ddpbench x): takes no ['warmup_rounds'] any more "
        "(its parameters: ('target', 'rounds'))",
        "FileStorage.save (replaced by ddpbench x): takes ('output_json', 'save', 'metadata'); "
        "ddpbench's replacement takes ('output_json', 'save')",
        "option.benchmark_gone (read by ddpbench x): no such option",
        "hook.pytest_benchmark_gone (called by ddpbench x): no such hook",
    ]
