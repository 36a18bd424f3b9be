"""ddpbench's wheel builds without a single warning.

A build warning is usually a deprecation with a date (setuptools' `project.license` as a table stops
building on 2027-02-18): failing on it here fixes it while it is a one-line change.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from helpers.paths import REPO_ROOT as ROOT


def test_the_wheel_builds_without_a_warning(tmp_path):
    setuptools = pytest.importorskip("setuptools", reason="the build backend (setuptools) is not installed")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX license strings (pyproject needs >=77)")
    # A copy of what the build reads, so that build/ and *.egg-info never land in the checkout.
    project = tmp_path / "project"
    shutil.copytree(ROOT / "src", project / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, project / name)
    # Offline and as the project's own: no index, this interpreter's setuptools, no pip config.
    # PYTHONDONTWRITEBYTECODE would add setuptools' "byte-compiling is disabled" warning: the
    # environment's, not the project's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "wheel", "-v", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(tmp_path / "wheels"), str(project)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    log = result.stdout + result.stderr
    if result.returncode != 0 and "No module named pip" in log:
        pytest.skip("pip is not installed in this interpreter: cannot build the wheel")
    assert result.returncode == 0, log
    warnings = [line.strip() for line in log.splitlines() if re.search(r"warn", line, re.I)]
    assert not warnings, "the build warns:\n" + "\n".join(warnings) + "\n\n" + log
    (wheel,) = (tmp_path / "wheels").glob("ddpbench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        assert "License-Expression: Apache-2.0" in archive.read(metadata).decode()
        # the license's text travels with the wheel, as the metadata names it
        assert "License-File: LICENSE" in archive.read(metadata).decode()
        (license_text,) = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert "Apache License" in archive.read(license_text).decode()
