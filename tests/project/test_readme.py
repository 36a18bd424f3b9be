"""The README is a manual whose every command works.

* The example under ``<!-- readme-example: FILE -->`` runs as it is from a fresh project.
* Every command in the README's ``bash`` blocks is exercised here or by CI, by kind:
  ``make TARGET`` (CI runs ``make test``; ``make bench`` runs below on one small case),
  ``.venv/bin/pytest ...`` (collected with ``--collect-only`` in a copy of the suite, which checks
  its options, markers and the cases it selects), ``.venv/bin/ddpbench ...`` (parsed by the CLI;
  tests/gates/test_compare.py, tests/test_report.py, tests/history/test_history.py, tests/bisect/test_bisect.py,
  tests/scale/test_census_scale.py and tests/test_benchmark_flow.py run the subcommands), the multi-node commands (the secret is generated and accepted here; the torchrun
  flags are the ones tests/pool/test_multinode.py launches two nodes with). A command of any other
  kind fails the test until it is covered.
* Every ``--dist-*`` option the README names exists (docs/reference.md documents them all), and the
  README stays a manual: its sections, ≤ 250 lines, prose lines ≤ 100 characters.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from ddpbench import cli
from ddpbench.pool.external import load_secret
from helpers.paths import REPO_ROOT as ROOT

pytest_plugins = ["pytester"]

README = (ROOT / "README.md").read_text(encoding="utf-8")
SECTIONS = ["Install", "A first benchmark", "Running the suite", "Gating a pull request", "Reading a verdict",
            "Why is it slower?", "CI", "Across nodes", "Reference"]
MAX_LINES = 250  # a manual, read top to bottom; every option is in docs/reference.md
MAX_PROSE_WIDTH = 100  # characters a line of prose (tables and code blocks aside): no hidden paragraphs
# What README's pytest commands must select (a substring of the collected ids), and must not.
EXPECTED_IDS = {
    "--dist-world-sizes=2,4 --dist-sizes=1MB,1GB": (["test_all_reduce[gloo-4p-1GB]"], []),
    "-m slow": (["test_all_reduce[gloo-2p-1GB]"], ["test_all_reduce[gloo-2p-1MB]"]),
    "-m gpu": (["test_all_reduce[nccl-1p-1MB]", "test_syncbn_shared_gpu[gloo-cuda-2p-"], ["[gloo-2p-"]),
    '-k "fused or naive"': (["-fused-", "-naive-"], ["-torch_bn-", "test_all_reduce"]),
    "--dist-controller=": (["test_all_reduce[gloo-8p-1MB]"], []),
}
SECRET_COMMAND = "export DDPBENCH_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')"


def code_blocks(lang: str) -> list[tuple[str | None, str]]:
    """(marker, body) of each fenced block in ``lang``; marker: the ``<!-- ... -->`` line above."""
    blocks = []
    for match in re.finditer(rf"(?:<!--\s*(.*?)\s*-->\n)?```{lang}\n(.*?)```", README, re.S):
        blocks.append((match.group(1), match.group(2)))
    return blocks


def _without_comment(line: str) -> str:
    """``line`` up to an unquoted ``#`` that starts a word."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def readme_commands() -> list[str]:
    """Each command line of the bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for _, body in code_blocks("bash"):
        for line in body.replace("\\\n", " ").splitlines():
            command = " ".join(_without_comment(line).split())
            if command:
                commands.append(command)
    return commands


COMMANDS = readme_commands()


def _kind(command: str) -> str:
    first = shlex.split(command)[0]
    if first.startswith("DDPBENCH_SECRET=") or command.startswith("export DDPBENCH_SECRET="):
        return "secret"
    if command == "python3 -m venv .venv":
        return "install"
    return {"make": "make", ".venv/bin/pytest": "pytest", ".venv/bin/ddpbench": "ddpbench",
            ".venv/bin/torchrun": "torchrun", ".venv/bin/pip": "install"}.get(first, "unknown")


def _ids(kind: str) -> list[str]:
    return [c for c in COMMANDS if _kind(c) == kind]


# ----------------------------------------------------------------------------------------------
# The manual's shape
# ----------------------------------------------------------------------------------------------


def _long_prose_lines(text: str) -> list[str]:
    """Lines of prose (outside code blocks and tables) longer than MAX_PROSE_WIDTH characters."""
    long, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("|") and len(line) > MAX_PROSE_WIDTH:
            long.append(line)
    return long


def test_readme_is_a_manual_of_short_lines_in_its_sections():
    lines = README.splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines"
    assert _long_prose_lines(README) == [], "wrap these lines"
    assert _long_prose_lines("x" * (MAX_PROSE_WIDTH + 1)) and not _long_prose_lines("```\n" + "x" * 200 + "\n```")
    headings = [line[3:].strip() for line in lines if line.startswith("## ")]
    assert headings == SECTIONS
    assert not re.search(r"\d\s*ms\b", README), "measured figures belong in docs/results.md"
    for doc in ("docs/results.md", "docs/design/", "examples/tinyddp"):
        assert doc in README and (ROOT / doc).exists()


def test_every_readme_command_is_of_a_kind_that_is_exercised():
    assert COMMANDS, "no commands found in README's bash blocks"
    unknown = [c for c in COMMANDS if _kind(c) == "unknown"]
    assert unknown == [], "README shows commands that no test or CI exercises"


@functools.lru_cache(maxsize=None)
def _registered_options() -> frozenset[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return frozenset(re.findall(r"(--dist-[a-z-]+)", out.stdout))


@pytest.mark.pool
def test_every_option_the_readme_names_exists_and_it_links_the_reference():
    # Every option is documented in docs/reference.md (tests/test_reference_page.py); the README names
    # the ones a user needs first, and only real ones.
    named = set(re.findall(r"`(--dist-[a-z-]+)", README))
    assert named and sorted(named - _registered_options()) == []
    assert "docs/reference.md" in README


# ----------------------------------------------------------------------------------------------
# The example
# ----------------------------------------------------------------------------------------------


@pytest.mark.memory_census  # its summary's memory line
def test_the_readme_example_runs_in_a_fresh_project(pytester):
    examples = [(marker, body) for marker, body in code_blocks("python")
                if marker and marker.startswith("readme-example:")]
    assert len(examples) == 1, "README needs one block under <!-- readme-example: FILE -->"
    marker, body = examples[0]
    filename = marker.split(":", 1)[1].strip()
    code_lines = [line for line in body.splitlines() if line.strip()]
    assert len(code_lines) <= 15, f"the example has {len(code_lines)} lines"
    (pytester.path / filename).write_text(body)
    # `pytest test_my_step.py`, as the README says (NCCL cases deselected, few rounds for speed)
    result = pytester.runpytest_subprocess(filename, "-p", "no:cacheprovider", "-m", "not gpu",
                                           "--dist-rounds=3", "--dist-warmup=1",
                                           "--benchmark-json=out.json", timeout=300)
    result.assert_outcomes(passed=1, deselected=2)
    # The run's own summary: per case what one step sends, holds (the peak, where it fell: the model
    # DDP wraps, by its class) and computes, on one line under a heading that says so.
    result.stdout.fnmatch_lines(["*ddpbench: what each case*s step sends (census), holds (memory*) and computes (numerics)*",
                                 "test_my_ddp_step[[]gloo-2p[]]  sends *all_reduce* per step; memory peak * at Linear *, "
                                 "* kept after the step; *numerics*"])
    (case,) = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    assert case["name"] == "test_my_ddp_step[gloo-2p]" and case["stats"]["rounds"] == 3
    assert case["extra_info"]["workload"] == f"{pathlib.Path(filename).stem}.train_step"


# ----------------------------------------------------------------------------------------------
# The commands
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def suite_copy(tmp_path_factory):
    """The benchmark suite as `make` and `.venv/bin/pytest` see it, in a scratch directory (so
    nothing a command writes lands in the checkout)."""
    where = tmp_path_factory.mktemp("suite")
    for name in ("Makefile", "pytest.ini", "conftest.py", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, where / name)
    shutil.copytree(ROOT / "benchmarks", where / "benchmarks",
                    ignore=shutil.ignore_patterns("raw", "__pycache__", ".benchmarks"))
    return where


def _short(command: str) -> str:
    return command.split("/bin/", 1)[-1]


@pytest.mark.pool
@pytest.mark.parametrize("command", _ids("pytest"), ids=_short)
def test_readme_pytest_command_collects_the_cases_it_promises(command, suite_copy, monkeypatch):
    args = shlex.split(command)[1:]
    # The README's baseline interpreter and checkout are examples: this interpreter, and a base
    # checkout beside the copy with the example and ddpbench's source (A/B refuses a base path
    # through which the baseline would import the candidate's files).
    example = next(body for marker, body in code_blocks("python") if marker and marker.startswith("readme-example:"))
    base = suite_copy.parent / "base"
    if not base.exists():
        shutil.copytree(ROOT / "src", base / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        (base / "test_my_step.py").write_text(example)
    (suite_copy / "test_my_step.py").write_text(example)  # the example the gating commands name
    args = [f"--dist-baseline-python={sys.executable}" if arg.startswith("--dist-baseline-python=")
            else arg.replace("=../base", f"={base}") if arg.startswith("--dist-baseline-path=") else arg
            for arg in args]
    monkeypatch.setenv("DDPBENCH_SECRET", "0123456789abcdef" * 4)  # for --dist-controller
    out = subprocess.run([sys.executable, "-m", "pytest", *args, "--collect-only", "-q",
                          "-p", "no:cacheprovider"],
                         cwd=suite_copy, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert ids, out.stdout[-3000:]
    for key, (wanted, unwanted) in EXPECTED_IDS.items():
        if key in command:
            for text in wanted:
                assert any(text in i for i in ids), f"{command!r} does not select {text}"
            for text in unwanted:
                assert not any(text in i for i in ids), f"{command!r} selects {text}"


@pytest.mark.parametrize("command", _ids("ddpbench"), ids=_short)
def test_readme_ddpbench_command_is_accepted_by_the_cli(command):
    args = cli.parse_args(shlex.split(command)[1:])
    assert args.command in ("compare", "report", "history", "bisect", "census")


def _checkout_pinning_torch(folder: pathlib.Path, pin: str, version: str) -> None:
    """``folder``: ROOT's entries as links, but constraints.txt pinning torch ``version`` for ``pin``."""
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name != "constraints.txt":
            (folder / entry.name).symlink_to(entry)
    text = (ROOT / "constraints.txt").read_text()
    (folder / "constraints.txt").write_text(re.sub(rf"^torch=={re.escape(pin)}$", f"torch=={version}", text,
                                                   flags=re.M))


def test_the_install_commands_work_as_written_and_keep_the_users_own_index(tmp_path):
    # In your own project: a venv it makes, torch from PyTorch's CPU index for that one command (the
    # --index-url option; PIP_EXTRA_INDEX_URL would replace the user's own extra index), then
    # ddpbench from a checkout beside the project.
    venv, torch_line, ddpbench_line = _ids("install")
    assert venv == "python3 -m venv .venv" and "PIP_EXTRA_INDEX_URL" not in README
    pin = re.search(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    assert shlex.split(torch_line) == [".venv/bin/pip", "install", f"torch=={pin}", "--index-url",
                                       "https://download.pytorch.org/whl/cpu"]
    import torch

    project = tmp_path / "my-project"
    project.mkdir()
    here = torch.__version__.split("+")[0]
    if here == pin:  # make venv installs that pin from that index too
        (tmp_path / "ddpbench").symlink_to(ROOT)
    else:
        # Another torch that pyproject declares (a CI matrix row, the GPU image's 2.11): the checkout
        # beside the project with the constraints' torch pin set to it, so that the line resolves here.
        _checkout_pinning_torch(tmp_path / "ddpbench", pin, here)
    made = subprocess.run(shlex.split(venv), cwd=project, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0 and (project / ".venv" / "bin" / "pip").exists(), made.stderr
    # The ddpbench line, as written, resolves offline against this environment (its CPU torch
    # satisfies the constraints' pin): pip would install ddpbench from the checkout and nothing else.
    args = shlex.split(ddpbench_line)
    assert args[:2] == [".venv/bin/pip", "install"]
    dry = subprocess.run([sys.executable, "-m", "pip", *args[1:], "--dry-run", "--no-index", "--no-build-isolation"],
                         cwd=project, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0 and "Would install ddpbench-" in dry.stdout, dry.stdout + dry.stderr
    would = dry.stdout.strip().splitlines()[-1].split()[2:]
    assert [name.rsplit("-", 1)[0] for name in would] == ["ddpbench"]  # ddpbench alone


def test_readme_make_targets_run_in_ci_or_here():
    targets = [shlex.split(c)[1] for c in _ids("make")]
    assert sorted(targets) == ["bench", "test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.M)
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert "run: make test" in ci and "make test" in (ROOT / ".ci" / "run").read_text()
    # make bench: test_make_bench_runs_saves_and_reports below


@pytest.mark.pool
def test_make_bench_runs_saves_and_reports(suite_copy, monkeypatch):
    venv = pathlib.Path(sys.prefix)
    if not (venv / "bin" / "ddpbench").exists() or shutil.which("make") is None:
        pytest.skip("needs make and the ddpbench console script in this interpreter's venv")
    # One small case instead of the whole suite; -o: never rebuild the venv from here.
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:cacheprovider -m 'not gpu and not slow' "
                       "-k test_all_reduce --dist-sizes=4KB --dist-rounds=3 --dist-warmup=1")
    try:
        out = subprocess.run(["make", "bench", f"VENV={venv}", "-o", f"{venv}/.ddpbench-installed"],
                             cwd=suite_copy, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:  # say where it stood, not only that it took too long
        def text(data):
            return (data.decode(errors="replace") if isinstance(data, bytes) else data or "")[-4000:]
        pytest.fail(f"make bench ran past 300 s; its output so far:\n{text(exc.stdout)}\n{text(exc.stderr)}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "test_all_reduce[gloo-2p-4KB] PASSED" in out.stdout or "1 passed" in out.stdout
    assert "Bus Bandwidth (GB/s)" in out.stdout  # the report's collectives table
    (saved,) = (suite_copy / ".benchmarks").rglob("*.json")
    (case,) = json.loads(saved.read_text())["benchmarks"]
    assert len(case["stats"]["data"]) == 3  # --benchmark-save-data kept every round


def test_readme_multinode_commands_work_as_tests_multinode_runs_them(monkeypatch):
    assert SECRET_COMMAND in README
    secret = subprocess.run(["bash", "-c", SECRET_COMMAND.replace("python", shlex.quote(sys.executable), 1)
                             + ' && printf %s "$DDPBENCH_SECRET"'],
                            capture_output=True, text=True, timeout=60).stdout
    monkeypatch.setenv("DDPBENCH_SECRET", secret)
    assert len(load_secret()) == 64
    launched = (ROOT / "tests" / "pool" / "test_multinode.py").read_text()
    (torchrun,) = _ids("torchrun")
    for flag in [word.split("=")[0] for word in shlex.split(torchrun) if word.startswith("-")]:
        assert f'"{flag}' in launched or f"'{flag}" in launched, f"{flag} is not what test_multinode uses"
    assert "ddpbench.worker" in launched and _ids("secret")



# TransformerTraining's fields that are no knob of a case (not in its id; compute_only is the switch
# of the compute-only variant that variants() makes, docs/design/families.md): the knob table leaves them out.
TRANSFORMER_SETTINGS = {"seed", "lr", "data_batches", "measure_peak", "compute_only"}


def _transformer_knob_problem(text: str) -> str:
    """'' when README's transformer knob table has exactly one row per TransformerTraining knob,
    else what is missing or extra."""
    import dataclasses

    from ddpbench.workloads.training import TransformerTraining

    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| transformer knob"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1].strip().split(" ")[0].strip("`"))
    knobs = [f.name for f in dataclasses.fields(TransformerTraining) if f.name not in TRANSFORMER_SETTINGS]
    missing = sorted(set(knobs) - set(rows))
    extra = sorted(name for name in set(rows) if rows.count(name) > 1 or name not in knobs)
    return f"missing rows: {missing}; extra or repeated rows: {extra}" if missing or extra else ""


def test_the_transformer_table_has_one_row_per_knob():
    # The table lives in docs/design/families.md#transformers; the README's family table points there.
    design = (ROOT / "docs" / "design" / "families.md").read_text(encoding="utf-8")
    assert "docs/design/families.md#transformers" in README
    assert _transformer_knob_problem(design) == ""
    row = next(line for line in design.splitlines() if line.startswith("| `static_graph`"))
    assert _transformer_knob_problem(design.replace(row + "\n", "")) == \
        "missing rows: ['static_graph']; extra or repeated rows: []"
    assert "repeated rows: ['static_graph']" in _transformer_knob_problem(design.replace(row, row + "\n" + row))
