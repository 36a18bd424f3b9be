"""Repository layout rules that pytest itself would only report as a confusing collection error."""

import collections

from helpers.paths import REPO_ROOT as ROOT


def test_test_module_names_are_unique_across_tests_and_benchmarks():
    # Without __init__.py files pytest imports test modules by basename: two files of the same
    # name under tests/ and benchmarks/ break `pytest` run over both (an import-file mismatch).
    names = collections.Counter(p.name for d in ("tests", "benchmarks") for p in (ROOT / d).rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []


TESTS = ROOT / "tests"
PACKAGE = ROOT / "src" / "ddpbench"
# Folders of tests/ that mirror no module of ddpbench: tests of lab/'s scripts, tests of the project
# as a whole (README, workflows, build, this file), and the code the tests share.
OWN_FOLDERS = ("lab", "project", "helpers")


def test_a_module_s_tests_are_in_the_folder_of_its_name():
    # tests/gates/ab/ holds the tests of ddpbench.gates.ab, tests/bisect/ those of ddpbench/bisect.py
    # and tests/ itself those of ddpbench's top-level modules (plugin.py, report.py ...).
    misplaced = []
    for path in TESTS.rglob("test_*.py"):
        folder = path.parent.relative_to(TESTS)
        if not folder.parts or folder.parts[0] in OWN_FOLDERS:
            continue
        if not ((PACKAGE / folder).is_dir() or (PACKAGE / folder).with_suffix(".py").is_file()):
            misplaced.append(str(path.relative_to(ROOT)))
    assert misplaced == [], f"no module of ddpbench is named like these tests' folders: {misplaced}"


def test_code_the_tests_share_is_in_tests_helpers():
    stray = [str(p.relative_to(ROOT)) for p in TESTS.rglob("*.py")
             if not p.name.startswith("test_") and p.name != "conftest.py"
             and p.relative_to(TESTS).parts[0] != "helpers"]
    assert stray == [], f"move these into tests/helpers/ (and import them as helpers.NAME): {stray}"
    assert not list((TESTS / "helpers").rglob("test_*.py")), "tests/helpers/ holds no tests"
