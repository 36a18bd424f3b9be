"""Each A/B side's ranks import exactly what that side's environment holds, also when the two sides
are venvs made from one Python (ab.yml's `make -C base venv` / `make -C head venv`: both venv
pythons link to one binary, and the baseline once got the candidate's whole sys.path). A baseline
rank that imports anything from inside the candidate's environment refuses the run with exit 2.

The venvs are cheap ones made from the test's own Python (``--without-pip``): a ``.pth`` file puts
this checkout's installed packages (torch, pytest...) behind each venv's own ddpbench source and
its own version of a small package the workload imports."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import ddpbench
from ddpbench.pool import RankLaunch

SHARED_PACKAGES = sysconfig.get_paths()["purelib"]  # torch, pytest, ... (its .pth files are not run)
SRC = Path(ddpbench.__file__).parent


def _venv(folder: Path, *entries: str, packages: dict[str, str] = None) -> Path:
    """A venv of this Python with ``entries`` on its path (a .pth) and ``packages`` (module file
    name -> source) in its own site-packages; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True)
    site_packages = next((folder / "lib").glob("python3*/site-packages"))
    (site_packages / "checkout.pth").write_text("".join(f"{entry}\n" for entry in entries))
    for name, text in (packages or {}).items():
        (site_packages / name).write_text(text)
    return folder / "bin" / "python"


def _checkout(root: Path, planted: str | None = None) -> Path:
    """A copy of this ddpbench's source under ``root/src`` (``planted``: a line added after each
    all_reduce of the collective workloads, as a pull request would)."""
    shutil.copytree(SRC, root / "src" / "ddpbench", ignore=shutil.ignore_patterns("__pycache__"))
    if planted:
        path = root / "src" / "ddpbench" / "workloads" / "collectives.py"
        text = path.read_text()
        call = '    dist.all_reduce(state["input"], op=_reduce_op(state["reduce_op"]))\n'
        assert call in text
        path.write_text(text.replace(call, call + planted))
    return root / "src"


def _tinypkg(version: int) -> dict[str, str]:
    return {"tinypkg.py": f"VERSION = {version}\nSLEEP_S = {0.004 * version}\n"}


def _report(ctx):
    import tinypkg
    import torch

    return {"tinypkg": tinypkg.VERSION, "tinypkg_file": tinypkg.__file__, "torch_file": torch.__file__,
            "sys_path": list(sys.path), "prefix": sys.prefix}


def test_two_venvs_of_one_python_are_two_environments(tmp_path):
    base = _venv(tmp_path / "base", str(SRC.parent), SHARED_PACKAGES, packages=_tinypkg(1))
    head = _venv(tmp_path / "head", str(SRC.parent), SHARED_PACKAGES, packages=_tinypkg(2))
    from ddpbench.pool.rank_launch import interpreter_environment

    assert os.path.realpath(base) == os.path.realpath(head)  # one binary...
    assert interpreter_environment(str(base))[0] == str(tmp_path / "base")  # ...two environments
    assert RankLaunch(python=str(base)).foreign_interpreter
    assert not RankLaunch(python=sys.executable).foreign_interpreter


def _run_in_venv(python: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTHONPATH"))}
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.pool
def test_a_baseline_venv_of_the_same_python_imports_its_own_packages(tmp_path):
    """The ranks a venv's interpreter starts import that venv's version of a package, not the
    controller's, and get none of the controller's environment on their path; a task that reaches
    into the controller's environment at run time is recorded by the ranks' import guard, which
    the A/B check refuses."""
    base = _venv(tmp_path / "base", str(SRC.parent), SHARED_PACKAGES, packages=_tinypkg(1))
    head = _venv(tmp_path / "head", str(SRC.parent), SHARED_PACKAGES, packages=_tinypkg(2))
    inside = tmp_path / "head" / "extra"  # a folder inside the controller's environment
    inside.mkdir()
    (inside / "otherpkg.py").write_text("VERSION = 3\n")
    code = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_ab_environments import _guard_task, _report
from ddpbench.gates.ab.side_environments import ImportIsolationError, check_import_isolation, make_side, with_import_guard
from ddpbench.pool import PoolSpec, RankPool
side = with_import_guard(make_side("baseline", {str(base)!r}, None, {{}}), {str(tmp_path)!r})
pool = RankPool(PoolSpec("gloo", 2, "cpu"), launch=side.launch)
try:
    print("REPORT " + json.dumps(pool.run(_report)), flush=True)
    check_import_isolation(side)  # nothing from the candidate's environment so far
    pool.run(_guard_task, {str(inside)!r})
finally:
    pool.close()
try:
    check_import_isolation(side)
except ImportIsolationError as exc:
    print("REFUSED " + str(exc))
"""
    run = _run_in_venv(head, code)
    line = next((x for x in run.stdout.splitlines() if x.startswith("REPORT ")), None)
    assert line is not None, run.stdout + run.stderr
    for report in json.loads(line[len("REPORT "):]):
        assert report["tinypkg"] == 1, report  # before the fix: 2, the candidate's
        assert report["prefix"] == str(tmp_path / "base")
        assert not any(entry.startswith(str(tmp_path / "head")) for entry in report["sys_path"]), report
    refused = next((x for x in run.stdout.splitlines() if x.startswith("REFUSED ")), None)
    assert refused is not None, run.stdout + run.stderr
    assert f"otherpkg from {inside}/otherpkg.py: inside the candidate's environment {tmp_path / 'head'}" in refused


@pytest.mark.pool
def test_a_baseline_that_imports_from_the_candidates_environment_is_refused(tmp_path):
    """A baseline venv whose path reaches into the candidate's venv (here a .pth line) is refused
    before any rank starts, exit 2, the message naming both environments and what was imported."""
    head = tmp_path / "head"
    leaky = _venv(tmp_path / "base", str(SRC.parent), SHARED_PACKAGES, str(head / "lib" / "shared"))
    _venv(head, str(SRC.parent), SHARED_PACKAGES, str(head / "lib" / "shared"))
    (head / "lib" / "shared").mkdir()
    (head / "lib" / "shared" / "tinypkg.py").write_text("VERSION = 2\n")
    (head / "test_bench.py").write_text("import tinypkg\n\n\ndef test_step(dist_benchmark):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTHONPATH"))}
    run = subprocess.run([str(head / "bin" / "python"), "-m", "pytest", "test_bench.py", "-p", "no:cacheprovider",
                          f"--dist-baseline-python={leaky}"], cwd=head, env=env, capture_output=True, text=True,
                         timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    line = next((x for x in out.splitlines() if "inside the candidate's environment" in x), "")
    assert f"inside the candidate's environment {head}" in line, out
    assert f"environment {tmp_path / 'base'}" in line
    assert f"tinypkg from {head}/lib/shared/tinypkg.py" in line


def _guard_task(ctx, folder):
    sys.path.append(folder)
    import otherpkg  # noqa: F401 - imported for the guard to see

    return True


PLANTED_SLEEP = "    __import__('time').sleep(0.004)  # the pull request's slowdown\n"


@pytest.mark.pool
def test_ab_yml_flow_with_two_venvs_of_one_python_flags_a_planted_slowdown(tmp_path):
    """ab.yml's own flow: two checkouts, a venv each made from one Python, pytest from the head with
    --dist-baseline-python=../base/.venv/bin/python; the head's collectives sleep 4 ms after each
    all_reduce. Before the fix the baseline ran the head's code too and the run passed."""
    # tests/gates/ab/ -> the repository (not helpers.paths: ranks in bare venvs import this module)
    benchmarks = Path(__file__).resolve().parents[3] / "benchmarks"
    for name, planted in (("base", None), ("head", PLANTED_SLEEP)):
        root = tmp_path / name
        src = _checkout(root, planted)
        shutil.copytree(benchmarks, root / "benchmarks", ignore=shutil.ignore_patterns("__pycache__", "raw"))
        (root / "pytest.ini").write_text("[pytest]\n")
        _venv(root / ".venv", str(src), SHARED_PACKAGES)
    head = tmp_path / "head"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTHONPATH"))}
    run = subprocess.run([str(head / ".venv" / "bin" / "python"), "-m", "pytest", "benchmarks/test_collectives.py",
                          "-k", "test_all_reduce and 1MB", "-m", "not gpu and not slow", "-p", "no:cacheprovider",
                          "--dist-baseline-python=../base/.venv/bin/python", "--dist-ab-pools-per-side=1",
                          "--dist-ab-block-time=0.02", "--dist-ab-max-time=20", "--dist-census=none",
                          "--benchmark-json=ab.json"],
                         cwd=head, env=env, capture_output=True, text=True, timeout=400)
    out = run.stdout + run.stderr
    assert f"from {tmp_path / 'base' / 'src' / 'ddpbench'}" in out, out  # each side's own engine...
    assert "the sides run DIFFERENT ddpbench engines" in out, out
    assert run.returncode == 1, out  # ...and the planted sleep is a regression
    (case,) = json.loads((head / "ab.json").read_text())["benchmarks"]
    assert case["extra_info"]["ab"]["verdict"] == "regression", case["extra_info"]["ab"]
    assert case["extra_info"]["ab"]["ratio"] > 1.3


BISECT_STEP = '''
import time

import tinypkg


def setup(ctx):
    return None


def step(state):
    time.sleep(tinypkg.SLEEP_S)
'''

BISECT_BENCH = '''
import ddpbench

from mystep import setup, step


def test_step(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(setup, step))
'''


def _commit(repo: Path, message: str) -> str:
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c",
                               "commit.gpgsign=false", *args], cwd=repo, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("add", ".")
    git("commit", "-q", "-m", message)
    return git("rev-parse", "HEAD")


@pytest.mark.pool
def test_bisect_with_a_venv_per_commit_times_each_commits_own_packages(tmp_path):
    """`ddpbench bisect --setup ... --python .venv/bin/python` builds a venv of one Python per probed
    commit: GOOD's ranks must import GOOD's package. The one commit after GOOD vendors a version of
    the step's package that sleeps twice as long; before the fix GOOD's ranks imported the probe's
    and bisect found nothing to bisect."""
    repo = tmp_path / "project"
    (repo / "vendor").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    (repo / "pytest.ini").write_text("[pytest]\n")
    (repo / "test_bench.py").write_text(BISECT_BENCH)
    (repo / "mystep.py").write_text(BISECT_STEP)
    (repo / "vendor" / "tinypkg.py").write_text(_tinypkg(1)["tinypkg.py"])
    good = _commit(repo, "GOOD: the step on tinypkg 1")
    (repo / "vendor" / "tinypkg.py").write_text(_tinypkg(2)["tinypkg.py"])
    bad = _commit(repo, "vendor tinypkg 2")
    setup = (f"{sys.executable} -m venv --without-pip .venv && sp=$(echo .venv/lib/python3*/site-packages) && "
             f"printf '%s\\n' {SRC.parent} {SHARED_PACKAGES} > $sp/checkout.pth && cp vendor/tinypkg.py $sp/")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTHONPATH"))}
    env["TMPDIR"] = str(tmp_path)
    run = subprocess.run([sys.executable, "-m", "ddpbench.cli", "bisect", good, bad, "-k", "test_step",
                          "--max-time", "3", "--setup", setup, "--python", ".venv/bin/python", "--",
                          "-p", "no:cacheprovider", "-m", "not gpu", "--dist-ab-block-time=0.02",
                          "--dist-ab-threshold=50%", "--dist-ab-pools-per-side=1", "--dist-census=none"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"first bad commit: {bad} vendor tinypkg 2" in run.stdout, run.stdout + run.stderr


# ----------------------------------------------------------------------------------------------
# A baseline that names other code but would run the candidate's (issue: flat projects)
# ----------------------------------------------------------------------------------------------

README_EXAMPLE = re.search(r"<!-- readme-example: test_my_step.py -->\n```python\n(.*?)```",
                           (Path(__file__).resolve().parents[3] / "README.md").read_text(), re.S).group(1)
QUICK_AB = ["-p", "no:cacheprovider", "-m", "not gpu", "--dist-ab-pools-per-side=1", "--dist-ab-block-time=0.02",
            "--dist-ab-max-time=8", "--dist-census=none", "--dist-ab-threshold=25%"]


def _pytest(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTHONPATH"))}
    return subprocess.run([str(python), "-m", "pytest", *args, *QUICK_AB], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.pool
def test_the_readme_example_gated_as_the_readme_shows_times_each_sides_own_file(tmp_path):
    """README's first benchmark, a flat test file, in a base and a head checkout (the head's batch
    4x larger), a venv for the base (in the base checkout) with its own copy of this ddpbench. With
    only --dist-baseline-python both sides would import the head's file, while the checkout the
    baseline's venv lives in holds another: the run stops with exit 2 naming --dist-baseline-path,
    with which (README's command) each side times its own file."""
    for name, batch in (("base", 32), ("head", 128)):
        (tmp_path / name).mkdir()
        text = README_EXAMPLE.replace("torch.randn(32, 256", f"torch.randn({batch}, 256")
        (tmp_path / name / "test_my_step.py").write_text(text)
    assert "randn(128, 256" in (tmp_path / "head" / "test_my_step.py").read_text()
    base_python = _venv(tmp_path / "base" / ".venv", str(_checkout(tmp_path / "base-ddpbench")), SHARED_PACKAGES)
    _unrelated_distribution(base_python)  # before: any distribution that differed let the run through
    head = tmp_path / "head"
    python = _venv(head / ".venv", str(SRC.parent), SHARED_PACKAGES)
    run = _pytest(python, head, "test_my_step.py", "--dist-baseline-python=../base/.venv/bin/python")
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert (f"the baseline's interpreter {tmp_path / 'base' / '.venv' / 'bin' / 'python'} lives in the checkout "
            f"{tmp_path / 'base'}, which holds its own copy of test_my_step") in out, out[-1500:]
    assert f"would import test_my_step from {head / 'test_my_step.py'}" in out
    assert "--dist-baseline-path=../base so that" in out
    run = _pytest(python, head, "test_my_step.py", "--dist-baseline-python=../base/.venv/bin/python",
                  "--dist-baseline-path=../base", "--benchmark-json=ab.json")
    out = run.stdout + run.stderr
    assert f"test_my_step: baseline {tmp_path / 'base' / 'test_my_step.py'} | candidate" in out, out
    (case,) = json.loads((head / "ab.json").read_text())["benchmarks"]  # timed: each side its own file
    assert case["extra_info"]["ab"]["sides"]["baseline"]["modules"]["test_my_step"] == str(tmp_path / "base" /
                                                                                            "test_my_step.py")


EDITABLE_FINDER = '''
import importlib.util
import sys

MAPPING = {mapping!r}


class _EditableFinder:  # what setuptools' editable install adds to sys.meta_path, at its end
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in MAPPING:
            return importlib.util.spec_from_file_location(fullname, MAPPING[fullname] + "/__init__.py")
        return None


def install():
    if _EditableFinder not in sys.meta_path:
        sys.meta_path.append(_EditableFinder)
'''
MYLIB = '''
import time


def setup(ctx):
    return None


def step(state):
    time.sleep({seconds})
'''
MYLIB_TEST = '''
import ddpbench
import mylib


def test_step(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(mylib.setup, mylib.step))
'''


def _editable_project(root: Path, seconds: float, ddpbench_src: str) -> Path:
    """A flat-layout project (mylib/, tests/) installed editable in its own venv, as setuptools does
    it (a finder module mapping mylib to the checkout and a .pth that installs it); its python."""
    (root / "mylib").mkdir(parents=True)
    (root / "mylib" / "__init__.py").write_text(MYLIB.format(seconds=seconds))
    (root / "tests").mkdir()
    (root / "tests" / "test_bench.py").write_text(MYLIB_TEST)
    (root / "pytest.ini").write_text("[pytest]\n")
    python = _venv(root / ".venv", ddpbench_src, SHARED_PACKAGES)
    site_packages = next((root / ".venv" / "lib").glob("python3*/site-packages"))
    finder = "__editable___mylib_0_1_finder"
    (site_packages / f"{finder}.py").write_text(EDITABLE_FINDER.format(mapping={"mylib": str(root / "mylib")}))
    (site_packages / "__editable__.mylib-0.1.pth").write_text(f"import {finder}; {finder}.install()\n")
    return python


@pytest.mark.pool
def test_a_flat_project_installed_editable_in_two_venvs_is_refused_not_compared_with_itself(tmp_path):
    """Two venvs, each with its checkout of a flat project installed editable; the head's step
    sleeps 4x longer. The head's folders on the baseline ranks' path came before the base venv's
    editable finder: `mylib: same on both sides`, exit 0. Now the import guard knows editable
    source folders: exit 2 naming --dist-baseline-path, with which each side times its own mylib."""
    _editable_project(tmp_path / "base", 0.002, str(_checkout(tmp_path / "base-ddpbench")))
    head = tmp_path / "head"
    python = _editable_project(head, 0.008, str(SRC.parent))
    run = _pytest(python, head, "tests/test_bench.py", "--dist-baseline-python=../base/.venv/bin/python")
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert f"its ranks imported mylib from {head / 'mylib' / '__init__.py'}: the candidate's source" in out
    assert "installs editable" in out and "Give --dist-baseline-path the baseline checkout's root" in out
    run = _pytest(python, head, "tests/test_bench.py", "--dist-baseline-python=../base/.venv/bin/python",
                  "--dist-baseline-path=../base", "--benchmark-json=ab.json")
    out = run.stdout + run.stderr
    assert f"mylib: baseline {tmp_path / 'base' / 'mylib' / '__init__.py'} | candidate" in out, out
    assert run.returncode in (0, 1) and "inside the candidate" not in out, out  # timed, not refused


def _sides(tmp_path, base_facts=None, base_env=(), base_paths=(), base_packages=None, **modules):
    """A baseline naming another interpreter and the candidate, each with the facts and modules
    given (name -> (baseline file, candidate file)); each module under test named torch or numpy
    comes from the distribution of that name (the baseline's versions: ``base_packages``)."""
    from ddpbench.gates.ab.side_environments import Side

    facts = {"python_version": "3.11.7", "torch_version": "2.13.0+cpu", "ddpbench_source_sha256": "e" * 64,
             "distributions": {"torch": "2.13.0", "numpy": "2.1.0"}}
    versions = {"torch": "2.13.0", "numpy": "2.1.0"}

    def packages(own):
        return {n: ({n: own[n]} if n in own else {}) for n in modules}

    base = Side("baseline", python=str(tmp_path / "other" / "python"), env=tuple(base_env), paths=tuple(base_paths),
                facts={**facts, **(base_facts or {})}, modules={n: b for n, (b, _) in modules.items()},
                module_packages=packages({**versions, **(base_packages or {})}))
    cand = Side("candidate", facts=facts, modules={n: c for n, (_, c) in modules.items()},
                module_packages=packages(versions))
    return base, cand


def test_one_file_on_both_sides_is_refused_unless_something_else_differs_in_content(tmp_path):
    from ddpbench.gates.ab.side_environments import SameCodeError, check_modules_differ

    for name in ("base", "head", "other"):
        (tmp_path / name / "mypkg").mkdir(parents=True)
        (tmp_path / name / "mypkg" / "__init__.py").write_text("STEP = 1\n")
    (tmp_path / "other" / "mypkg" / "__init__.py").write_text("STEP = 2\n")
    test = str(tmp_path / "head" / "test_step.py")
    torch_files = ("/base/.venv/torch/__init__.py", "/head/.venv/torch/__init__.py")  # two venvs, one version
    copies = (str(tmp_path / "base" / "mypkg" / "__init__.py"), str(tmp_path / "head" / "mypkg" / "__init__.py"))
    # Copies of one revision in two venvs: the test file would be timed twice.
    with pytest.raises(SameCodeError, match="nothing else differs between the sides in content"):
        check_modules_differ(*_sides(tmp_path, test_step=(test, test), torch=torch_files, mypkg=copies))
    # Does upgrading torch slow our step: one test file, two torches.
    check_modules_differ(*_sides(tmp_path, {"torch_version": "2.12.0+cpu"}, test_step=(test, test),
                                 torch=torch_files))
    # Another numpy, another environment variable, another package's bytes, a module through the
    # baseline's paths: each is a difference that one test file may be timed against.
    numpy_files = ("/base/.venv/numpy/__init__.py", "/head/.venv/numpy/__init__.py")
    check_modules_differ(*_sides(tmp_path, {"distributions": {"torch": "2.13.0", "numpy": "2.0.0"}},
                                 base_packages={"numpy": "2.0.0"}, test_step=(test, test), torch=torch_files,
                                 numpy=numpy_files))
    # ...but not a distribution that no module under test imports (before: any one at all passed,
    # so two venvs differing in matplotlib timed the candidate's file against itself).
    with pytest.raises(SameCodeError, match="nothing else differs between the sides in content"):
        check_modules_differ(*_sides(tmp_path, {"distributions": {"torch": "2.13.0", "numpy": "2.1.0",
                                                                  "matplotlib": "3.9.0"}},
                                     test_step=(test, test), torch=torch_files, numpy=numpy_files))
    check_modules_differ(*_sides(tmp_path, base_env=(("OMP_NUM_THREADS", "2"),), test_step=(test, test),
                                 torch=torch_files))
    other = str(tmp_path / "other" / "mypkg" / "__init__.py")
    check_modules_differ(*_sides(tmp_path, test_step=(test, test), mypkg=(other, copies[1])))
    check_modules_differ(*_sides(tmp_path, base_paths=(str(tmp_path / "base"),), test_step=(test, test),
                                 mypkg=copies))
    # A/A on copies (nothing shared) and the tooling that made the venvs are no reason to refuse.
    check_modules_differ(*_sides(tmp_path, test_step=(str(tmp_path / "base" / "test_step.py"), test), mypkg=copies))
    with pytest.raises(SameCodeError):
        check_modules_differ(*_sides(tmp_path, {"distributions": {"torch": "2.13.0", "numpy": "2.1.0", "pip": "9"}},
                                     test_step=(test, test), mypkg=copies))


def _unrelated_distribution(python: Path) -> None:
    """An installed distribution in ``python``'s venv that no module under test imports."""
    site_packages = next((python.parent.parent / "lib").glob("python3*/site-packages"))
    info = site_packages / "unrelated_plotting-3.9.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unrelated-plotting\nVersion: 3.9.0\n")
    (site_packages / "unrelated_plotting.py").write_text("")


SRC_LAYOUT_TEST = '''
import ddpbench
import mypkg


def test_step(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(mypkg.setup, mypkg.step))
'''


@pytest.mark.pool
def test_a_src_layout_on_pythonpath_without_the_baseline_path_is_refused(tmp_path):
    """A src-layout project run as `PYTHONPATH=src pytest ...` with the base's venv in the base
    checkout and --dist-baseline-path forgotten: the baseline's ranks imported the head's src/ (the
    project folders the candidate's tasks append) and the gate compared the head with itself. Now
    the checkout the baseline's venv lives in holds another copy of mypkg: exit 2 naming
    --dist-baseline-path=../base/src."""
    for name, seconds in (("base", 0.001), ("head", 0.004)):
        (tmp_path / name / "src" / "mypkg").mkdir(parents=True)
        (tmp_path / name / "src" / "mypkg" / "__init__.py").write_text(MYLIB.format(seconds=seconds))
        (tmp_path / name / "tests").mkdir()
        (tmp_path / name / "tests" / "test_bench.py").write_text(SRC_LAYOUT_TEST)
        (tmp_path / name / "pytest.ini").write_text("[pytest]\n")
    base_python = _venv(tmp_path / "base" / ".venv", str(_checkout(tmp_path / "base-ddpbench")), SHARED_PACKAGES)
    _unrelated_distribution(base_python)  # before: any distribution that differed let the run through
    head = tmp_path / "head"
    python = _venv(head / ".venv", str(SRC.parent), SHARED_PACKAGES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTHONPATH"))}
    run = subprocess.run([str(python), "-m", "pytest", "tests/test_bench.py", "--dist-baseline-python=../base/.venv/bin/python",
                          *QUICK_AB], cwd=head, env={**env, "PYTHONPATH": "src"}, capture_output=True, text=True,
                         timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-3000:]
    assert f"which holds its own copy of mypkg ({tmp_path / 'base' / 'src' / 'mypkg' / '__init__.py'})" in out, out
    assert "--dist-baseline-path=../base/src so that" in out
