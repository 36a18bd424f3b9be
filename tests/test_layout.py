"""Repository layout rules that pytest itself would only report as a confusing collection error."""

import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique_across_tests_and_benchmarks():
    # Without __init__.py files pytest imports test modules by basename: two files of the same
    # name under tests/ and benchmarks/ break `pytest` run over both (an import-file mismatch).
    names = collections.Counter(p.name for d in ("tests", "benchmarks") for p in (ROOT / d).rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []
