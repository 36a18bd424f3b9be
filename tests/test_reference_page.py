"""docs/reference.md is written from the option definitions (ddpbench.reference_page): it must be the
current text, and it must name every option the plugin registers and every command's arguments."""

import re
import subprocess
import sys

import pytest

from ddpbench.reference_page import reference_markdown
from helpers.paths import REPO_ROOT as ROOT

PAGE = ROOT / "docs" / "reference.md"


def test_the_reference_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/reference.md is out of date: run `.venv/bin/python -m ddpbench.reference_page > docs/reference.md`")


@pytest.mark.pool
def test_the_reference_names_every_registered_option_and_command():
    out = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    registered = set(re.findall(r"(--dist-[a-z-]+)", out.stdout))
    documented = set(re.findall(r"`(--dist-[a-z-]+)", reference_markdown()))
    assert registered and registered == documented
    for command in ("compare", "report", "history", "census", "bisect"):
        assert f"### ddpbench {command}" in reference_markdown()
