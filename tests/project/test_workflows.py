"""The GitHub workflows lint clean with actionlint and call the commands that exist."""

import pathlib
import shutil
import subprocess
import sys

from helpers.paths import REPO_ROOT as ROOT
WORKFLOWS = ROOT / ".github" / "workflows"


def _actionlint() -> str:
    candidate = pathlib.Path(sys.executable).parent / "actionlint"
    found = str(candidate) if candidate.exists() else shutil.which("actionlint")
    assert found, "actionlint is missing: install the dev extra (pip install -e '.[dev]')"
    return found


def test_workflows_lint_clean():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"ci.yml", "gpu.yml", "ab.yml"}
    result = subprocess.run([_actionlint(), *map(str, files)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_runs_the_readme_test_command_and_gpu_runs_the_gpu_marker_on_tests_and_benchmarks():
    ci = (WORKFLOWS / "ci.yml").read_text()
    gpu = (WORKFLOWS / "gpu.yml").read_text()
    assert "make test" in ci and "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()
    assert "pytest -m gpu benchmarks/" in gpu and "[self-hosted, gpu]" in gpu
    assert "pytest -m gpu tests/" in gpu  # the CUDA tests in tests/ run nowhere else
    assert "workflow_dispatch" in gpu and "schedule" in gpu


def test_ab_workflow_gates_the_head_against_the_base_revision_in_one_run():
    ab = (WORKFLOWS / "ab.yml").read_text()
    assert "pull_request" in ab and "github.event.pull_request.base.sha" in ab
    assert "make -C base venv" in ab and "make -C head venv" in ab
    assert "--dist-baseline-python=../base/.venv/bin/python" in ab
    assert "--dist-ab-run-budget=\"$AB_RUN_BUDGET\"" in ab and 'AB_RUN_BUDGET: "' in ab  # one budget for the run
    assert "ddpbench compare ab.json --markdown" in ab and "GITHUB_STEP_SUMMARY" in ab


def test_ab_workflow_reads_each_revisions_rank_protocol_with_a_command_that_works():
    import re

    ab = (WORKFLOWS / "ab.yml").read_text()
    (snippet,) = re.findall(r"read_protocol='([^']+)'", ab)
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=ROOT)
    from ddpbench.rank_process import RANK_PROTOCOL

    assert out.returncode == 0 and out.stdout.strip() == str(RANK_PROTOCOL), out.stderr
    assert "steps.protocol.outputs.comparable == 'true'" in ab  # the gate runs only across one protocol
    assert "comm -23 base-cases.txt head-cases.txt" in ab  # cases the head removed fail the job


def test_ci_tests_what_pyproject_declares_and_the_readme_says_so():
    """The oldest Python and torch that pyproject declares, and the newest torch, are ci.yml rows
    beside the pinned build; README states the same floor."""
    import re

    import yaml

    pyproject = (ROOT / "pyproject.toml").read_text()
    oldest_python = re.search(r'requires-python = ">=([\d.]+)"', pyproject).group(1)
    oldest_torch = re.search(r'"torch>=([\d.]+)"', pyproject).group(1)
    rows = yaml.safe_load((WORKFLOWS / "ci.yml").read_text())["jobs"]["test"]["strategy"]["matrix"]["include"]
    assert {"python": oldest_python, "torch": f"torch=={oldest_torch}.*"}.items() <= next(
        (r for r in rows if r["python"] == oldest_python), {}).items(), rows
    assert any(r["torch"] == "torch" for r in rows), "no row with the newest torch release"
    assert any(r["torch"] == "" for r in rows), "no row with the pinned build (.ci/run's)"
    readme = (ROOT / "README.md").read_text()
    assert f"Python ≥ {oldest_python}" in readme and f"torch ≥ {oldest_torch}" in readme


def test_make_test_lints_with_a_pinned_ruff_before_the_suite():
    """make test (CI's command) runs ruff before pytest, with the version constraints.txt pins
    and the dev extra installs; a finding fails it before the suite spends its minutes."""
    import re

    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M).group(1).splitlines()
    assert "ruff check" in recipe[0] and "pytest tests/" in recipe[-1]
    assert re.search(r"^ruff==[\d.]+$", (ROOT / "constraints.txt").read_text(), re.M)
    assert '"ruff>=' in (ROOT / "pyproject.toml").read_text()
