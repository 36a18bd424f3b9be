"""Where the repository's files are, for tests that read them (README, lab/, docs/, workflows)."""

import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS_DIR = REPO_ROOT / "tests"
