"""The workflows' run steps, run as GitHub's runner runs them, with fake gate commands.

* Every step that pipes a ``ddpbench`` or ``pytest`` command (``... | tee compare.md``) fails when
  that command fails and passes when it passes, and still writes what it tees: found by reading the
  scripts, so a new piped step is covered without a change here.
* ab.yml: a pull request that changes the rank protocol fails the job unless it is labelled
  ``rank-protocol-changed``; one labelled ``structure-changed`` (``memory-changed``) runs the gate and
  its verdict table with the option that accepts a structural (memory) change, and only then; the
  labels reach the job
  (labelled / unlabelled runs) and the README documents them beside ``benchmarks-removed``.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess

import pytest
import yaml

from helpers.paths import REPO_ROOT as ROOT
WORKFLOWS = ROOT / ".github" / "workflows"

# How the runner starts a run step (docs: "Workflow syntax", jobs.<job_id>.steps[*].shell): with no
# `shell:` on Linux it is bash -e, without pipefail; `shell: bash` adds pipefail.
RUNNER_SHELLS = {
    None: "bash -e {0}",
    "bash": "bash --noprofile --norc -eo pipefail {0}",
    "sh": "sh -e {0}",
}
# A gate command: ddpbench or pytest (by path, or python -m pytest) as a word of the command line.
GATE_COMMAND = re.compile(r"(?:^|[\s;&|(/])(?:ddpbench|pytest)(?=\s|$|\))")
SINGLE_PIPE = re.compile(r"(?<!\|)\|(?!\|)")
LABEL_EXPRESSION = re.compile(
    r"^\$\{\{\s*contains\(github\.event\.pull_request\.labels\.\*\.name,\s*'([^']+)'\)\s*\}\}$"
)
# What the fake gate prints: a verdict table, whose one case id also serves a --collect-only run.
FAKE_OUTPUT = "| case | verdict |\n|---|---|\n| benchmarks/test_collectives.py::test_all_reduce[gloo-2p-1MB] | regression |"


def _workflows() -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(WORKFLOWS.glob("*.yml"))}


def _run_steps():
    """(workflow, job, step, shell, env) of every run step, with the shell the runner would use."""
    for name, workflow in _workflows().items():
        workflow_shell = ((workflow.get("defaults") or {}).get("run") or {}).get("shell")
        for job_id, job in workflow["jobs"].items():
            job_shell = ((job.get("defaults") or {}).get("run") or {}).get("shell")
            for step in job.get("steps", []):
                if "run" in step:
                    shell = step.get("shell") or job_shell or workflow_shell
                    env = {**(workflow.get("env") or {}), **(job.get("env") or {}), **(step.get("env") or {})}
                    yield name, job_id, step, shell, env


def _logical_lines(script: str) -> list[str]:
    """The script's lines with backslash continuations joined and quoted text blanked."""
    joined = re.sub(r"\\\n", " ", script)
    return [re.sub(r"'[^']*'|\"[^\"]*\"", "''", line) for line in joined.splitlines()]


def _piped_gates(script: str) -> list[str]:
    """Lines where a gate command's status goes into a pipe (any pipeline segment but the last)."""
    lines = []
    for line in _logical_lines(script):
        segments = SINGLE_PIPE.split(line)
        if any(GATE_COMMAND.search(segment) for segment in segments[:-1]):
            lines.append(line)
    return lines


PIPED_GATE_STEPS = [
    pytest.param(step, shell, env, id=f"{name}:{job}:{step.get('name', step['run'][:30])}")
    for name, job, step, shell, env in _run_steps()
    if _piped_gates(step["run"])
]


def _fake(path: pathlib.Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _workspace(tmp_path: pathlib.Path, protocols: tuple[int, int] = (1, 1)) -> pathlib.Path:
    """A checkout as the workflows see it: the repository's .venv (ci, gpu), base/ and head/ (ab),
    with a fake ddpbench / pytest that prints a verdict table and exits $FAKE_STATUS, a fake python
    that prints its side's rank protocol, and two saved runs so that compare steps compare."""
    workspace = tmp_path / "workspace"
    gate = f"cat <<'EOF'\n{FAKE_OUTPUT}\nEOF\nexit \"${{FAKE_STATUS:?}}\""
    for venv, protocol in ((".venv", protocols[1]), ("base/.venv", protocols[0]), ("head/.venv", protocols[1])):
        for command in ("ddpbench", "pytest"):
            _fake(workspace / venv / "bin" / command, gate)
        _fake(workspace / venv / "bin" / "python", f"echo {protocol}")
    for checkout in (workspace, workspace / "head"):
        for run in ("0001_base.json", "0002_head.json"):
            saved = checkout / ".benchmarks" / "Linux-CPython-3.11-64bit" / run
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text("{}")
    for command in ("ddpbench", "pytest"):  # called by bare name, from PATH
        _fake(tmp_path / "path" / command, gate)
    return workspace


def _run_step(step: dict, shell: str | None, env: dict, workspace: pathlib.Path,
              labels: tuple[str, ...] = (), **extra_env: str) -> subprocess.CompletedProcess:
    """The step's script run in its working directory under the runner's shell for it, with the
    workflow's env (label expressions evaluated for ``labels``, other expressions empty)."""
    script = workspace.parent / "step.sh"
    script.write_text(step["run"])
    summary, output = workspace.parent / "summary.md", workspace.parent / "output.txt"
    summary.touch()
    output.touch()
    resolved = {}
    for key, value in env.items():
        value = str(value)
        label = LABEL_EXPRESSION.match(value)
        resolved[key] = str(label.group(1) in labels).lower() if label else ("" if "${{" in value else value)
    run_env = {
        "PATH": f"{workspace.parent / 'path'}:/usr/bin:/bin",
        "HOME": str(workspace.parent),
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_OUTPUT": str(output),
        **resolved,
        **extra_env,
    }
    command = shlex.split(RUNNER_SHELLS.get(shell, shell).format(script))
    cwd = workspace / step.get("working-directory", ".")
    return subprocess.run(command, cwd=cwd, env=run_env, capture_output=True, text=True, timeout=60)


def test_the_piped_gate_steps_are_found():
    ids = {p.id for p in PIPED_GATE_STEPS}
    for expected in ("ci.yml:bench:Compare with the baseline", "gpu.yml:gpu-bench:Compare with the previous run",
                     "ab.yml:ab-gate:Cases the head removed"):
        assert expected in ids, sorted(ids)


@pytest.mark.parametrize("step, shell, env", PIPED_GATE_STEPS)
@pytest.mark.parametrize("status", [1, 0])
@pytest.mark.parametrize("under", ["the runner's shell", "plain bash -e"])
def test_a_piped_gate_step_fails_exactly_when_its_gate_fails_and_still_writes_its_output(
        tmp_path, step, shell, env, status, under):
    # Plain bash -e too: the step's own lines must carry the gate's status, so a step copied into
    # a workflow without the `shell: bash` default (or run by hand) still fails on a regression.
    if under == "plain bash -e":
        shell = None
    workspace = _workspace(tmp_path)
    result = _run_step(step, shell, env, workspace, FAKE_STATUS=str(status))
    log = f"shell {RUNNER_SHELLS.get(shell, shell)!r}\n{step['run']}\n{result.stdout}{result.stderr}"
    if status:
        assert result.returncode != 0, "the gate failed and the step passed:\n" + log
    else:
        assert result.returncode == 0, "the gate passed and the step failed:\n" + log
    cwd = workspace / step.get("working-directory", ".")
    for line in _piped_gates(step["run"]):
        for target in re.findall(r"\btee\s+(?:-a\s+)?([\w./-]+)", line):
            assert FAKE_OUTPUT in (cwd / target).read_text(), f"{target} lacks the gate's output:\n{log}"


def _protocol_step():
    (found,) = [(step, shell, env) for name, _, step, shell, env in _run_steps()
                if name == "ab.yml" and step.get("id") == "protocol"]
    return found


@pytest.mark.parametrize("protocols, labels, passes, comparable", [
    ((3, 3), (), True, "true"),
    ((3, 4), (), False, "false"),
    ((3, 4), ("benchmarks-removed",), False, "false"),  # the other label does not cover it
    ((3, 4), ("rank-protocol-changed",), True, "false"),
])
def test_ab_job_fails_on_a_rank_protocol_change_unless_labelled(tmp_path, protocols, labels, passes, comparable):
    step, shell, env = _protocol_step()
    workspace = _workspace(tmp_path, protocols)
    result = _run_step(step, shell, env, workspace, labels=labels)
    log = result.stdout + result.stderr
    assert (result.returncode == 0) is passes, log
    assert f"comparable={comparable}" in (tmp_path / "output.txt").read_text()
    summary = (tmp_path / "summary.md").read_text()
    if protocols[0] != protocols[1]:
        assert f"({protocols[0]} -> {protocols[1]})" in summary
        assert ("Label the pull request rank-protocol-changed" in summary) is not passes, summary


def test_ab_labels_reach_the_job_and_are_documented():
    ab = _workflows()["ab.yml"]
    trigger = (ab.get("on") or ab[True])["pull_request"]  # YAML 1.1 reads the key `on` as true
    # A re-run reads the event it started with: a label added later needs a run of its own.
    assert {"labeled", "unlabeled", "synchronize"} <= set(trigger["types"])
    readme = (ROOT / "README.md").read_text()
    for label in ("benchmarks-removed", "rank-protocol-changed", "structure-changed", "memory-changed",
                  "numerics-changed"):
        assert f"`{label}`" in readme
        assert f"'{label}'" in str(ab["env"])  # read from the pull request's labels


def _ab_step(name: str):
    (found,) = [(step, shell, env) for workflow, _, step, shell, env in _run_steps()
                if workflow == "ab.yml" and step.get("name") == name]
    return found


@pytest.mark.parametrize("labels, accepted", [
    ((), set()),
    (("benchmarks-removed",), set()),  # another label accepts no change
    (("structure-changed",), {"structure"}),  # one label accepts its own change only
    (("memory-changed",), {"memory"}),
    (("memory-changed", "structure-changed"), {"structure", "memory"}),
    (("numerics-changed",), {"numerics"}),
    (("numerics-changed", "memory-changed", "structure-changed"), {"structure", "memory", "numerics"}),
])
@pytest.mark.parametrize("name, command, prefix", [
    ("A/B gate (collectives and one training case)", "pytest", "--dist-"),
    ("Verdict table", "ddpbench", "--"),
])
def test_ab_change_labels_pass_their_accepting_options(tmp_path, labels, accepted, name, command, prefix):
    step, shell, env = _ab_step(name)
    workspace = _workspace(tmp_path)
    (workspace / "head" / "ab.json").write_text("{}")  # the verdict table step reads the gate's run
    args = tmp_path / "args.txt"
    _fake(workspace / "head" / ".venv" / "bin" / command, f'printf "%s\\n" "$@" > {args}')
    result = _run_step(step, shell, env, workspace, labels=labels)
    assert result.returncode == 0, result.stdout + result.stderr
    given = args.read_text().splitlines()
    assert {kind for kind in ("structure", "memory", "numerics")
            if f"{prefix}accept-{kind}-change" in given} == accepted, given
    if command == "pytest":  # the rest of the gate's command line is as before
        assert "--benchmark-json=ab.json" in given and "--dist-baseline-python=../base/.venv/bin/python" in given
    else:
        assert given[:3] == ["compare", "ab.json", "--markdown"]
