"""Each A/B side runs its own program, data included: the baseline's workload is built by the
baseline's own test function, fixtures, conftest, parametrize values and class defaults
(gates/ab/baseline_workloads.py), never unpickled from the candidate's objects.

Before, the candidate's controller built one workload and pickled it to both sides: a head that
only widened its model (DIM 256 -> 512) through a functools.partial argument, a Workload's
__init__ default, a conftest fixture, a parametrize value or a dataclass default read ``same`` on
every answer, exit 0, since the baseline's ranks unpickled the 512-wide arguments."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ddpbench
from ddpbench.gates.ab.baseline_checkout import CheckoutCopyError, check_checkout_copies, find_checkout
from ddpbench.gates.ab.baseline_workloads import BuiltByBaseline, forwarded_args
from ddpbench.gates.ab.side_environments import Side

SRC = Path(ddpbench.__file__).parent

# The code under test: a DDP step whose width comes in five ways; base and head differ only in DIM.
STEPS = '''
import dataclasses
import functools

import pytest
import torch

import ddpbench

DIM = {dim}


def setup(ctx, dim):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(dim, dim))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(8, dim)


def step(state):
    model, optimizer, batch = state
    optimizer.zero_grad()
    model(batch).square().mean().backward()
    optimizer.step()


class Wide(ddpbench.Workload):
    def __init__(self, dim=DIM):
        self.dim = dim

    def setup(self, ctx):
        return setup(ctx, self.dim)

    def run_round(self, state):
        step(state)


@dataclasses.dataclass
class WideStep(ddpbench.Workload):
    dim: int = DIM

    def setup(self, ctx):
        return setup(ctx, self.dim)

    def run_round(self, state):
        step(state)


def test_partial(dist_benchmark):
    dist_benchmark(ddpbench.FunctionWorkload(functools.partial(setup, dim=DIM), step))


def test_init_default(dist_benchmark):
    dist_benchmark(Wide())


def test_dataclass_default(dist_benchmark):
    dist_benchmark(WideStep())


def test_fixture(dist_benchmark, width):
    dist_benchmark(ddpbench.FunctionWorkload(functools.partial(setup, dim=width), step))


@pytest.mark.parametrize("dim", [DIM], ids=["model"])
def test_parametrize(dist_benchmark, dim):
    dist_benchmark(ddpbench.FunctionWorkload(functools.partial(setup, dim=dim), step))
'''
CONFTEST = '''
import pytest


@pytest.fixture
def width():
    return {dim}
'''
QUICK = ["-p", "no:cacheprovider", "-m", "not gpu", "--dist-ab-pools-per-side=1", "--dist-ab-block-time=0.02",
         "--dist-ab-max-time=2", "--dist-census=collectives", "--dist-numerics-steps=0", "--dist-exposed-comm=off"]


# Cases beside them: one the head adds (new), one whose test the base breaks (baseline-failed).
HEAD_ONLY = """

def test_only_in_the_head(dist_benchmark):
    dist_benchmark(Wide())


def test_broken_in_the_base(dist_benchmark):
    dist_benchmark(Wide())
"""
BASE_ONLY = """

def test_broken_in_the_base(dist_benchmark):
    raise RuntimeError("the base is broken here")
"""


def _project(root: Path, dim: int, more: str = "") -> Path:
    root.mkdir(parents=True)
    (root / "test_steps.py").write_text(STEPS.format(dim=dim) + more)
    (root / "conftest.py").write_text(CONFTEST.format(dim=dim))
    return root


def _ab(head: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTHONPATH", "PYTEST_ADDOPTS"))}
    return subprocess.run([sys.executable, "-m", "pytest", *args, *QUICK], cwd=head, env=env, capture_output=True,
                          text=True, timeout=600)


def _verdicts(path: Path) -> dict[str, dict]:
    return {case["name"]: case["extra_info"]["ab"] for case in json.loads(path.read_text())["benchmarks"]}


@pytest.mark.pool
def test_each_way_a_test_passes_its_arguments_is_built_on_the_baseline_by_the_baselines_code(tmp_path):
    _project(tmp_path / "base", 256, BASE_ONLY)
    head = _project(tmp_path / "head", 512, HEAD_ONLY)
    run = _ab(head, "test_steps.py", "--dist-baseline-path=../base", "--benchmark-json=ab.json")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert (f"built by its own code from its own checkout {tmp_path / 'base'}: 5 of 7 case(s) (1 absent, "
            f"1 failed)") in out, out[-3000:]
    verdicts = _verdicts(head / "ab.json")
    only = verdicts.pop("test_only_in_the_head[gloo-2p]")
    assert only["verdict"] == "new" and only["reason"] == "the baseline has no case of this id", only
    failed = verdicts.pop("test_broken_in_the_base[gloo-2p]")
    assert failed["verdict"] == "baseline-failed" and "the base is broken here" in failed["error"], failed
    assert sorted(verdicts) == ["test_dataclass_default[gloo-2p]", "test_fixture[gloo-2p]", "test_init_default[gloo-2p]",
                                "test_parametrize[gloo-2p-model]", "test_partial[gloo-2p]"]
    for name, ab in verdicts.items():
        assert ab["verdict"] == "regression", (name, ab["verdict"])
        # The baseline's step all-reduces its own 256-wide model's gradients (256*256 + 256 floats),
        # the candidate's its 512-wide one.
        (base_op,) = ab["census_baseline"]["collectives"]
        assert base_op["kind"] == "all_reduce" and base_op["bytes"] == 4 * (256 * 256 + 256), (name, base_op)


@pytest.mark.pool
def test_a_workload_the_baseline_cannot_pickle_stops_the_run_before_any_rank_starts(tmp_path):
    base = _project(tmp_path / "base", 256)
    text = (base / "test_steps.py").read_text().replace(
        "    dist_benchmark(Wide())", "    wide = Wide()\n    wide.log = lambda: None\n    dist_benchmark(wide)")
    (base / "test_steps.py").write_text(text)
    head = _project(tmp_path / "head", 256)
    run = _ab(head, "test_steps.py", "-k", "init_default", "--dist-baseline-path=../base")
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-3000:]
    assert "1 case(s) cannot be built on the baseline side (test_steps.py::test_init_default[gloo-2p]" in out
    assert "define its functions and classes at module level" in out


@pytest.mark.pool
def test_the_baseline_s_own_ddpbench_dataclass_defaults_decide_its_workload(tmp_path):
    """A pull request that changes a default of ddpbench's own dataclass workload (here Training's
    bucket_cap_mb, 25 -> 0.001 MiB in the base: many more DDP buckets) is seen by the gate: the
    baseline's Training is built by the baseline's ddpbench."""
    shutil.copytree(SRC, tmp_path / "base" / "src" / "ddpbench", ignore=shutil.ignore_patterns("__pycache__"))
    workload = tmp_path / "base" / "src" / "ddpbench" / "workloads" / "training" / "workload.py"
    text = workload.read_text()
    assert "    bucket_cap_mb: float = 25.0\n" in text
    workload.write_text(text.replace("    bucket_cap_mb: float = 25.0\n", "    bucket_cap_mb: float = 0.001\n"))
    head = tmp_path / "head"
    head.mkdir()
    (head / "test_one_step.py").write_text(textwrap.dedent('''
        from ddpbench.workloads.training import Training


        def test_mlp_ddp(dist_benchmark):
            dist_benchmark(Training("mlp", "ddp", batch_size=8, grad_accum=1))
    '''))
    run = _ab(head, "test_one_step.py", f"--dist-baseline-path={tmp_path / 'base' / 'src'}",
              "--benchmark-json=ab.json")
    out = run.stdout + run.stderr
    assert run.returncode in (0, 1) and (head / "ab.json").exists(), out[-3000:]  # the timing decides the exit
    ab = _verdicts(head / "ab.json")["test_mlp_ddp[gloo-2p]"]
    # The candidate's default buckets hold the whole mlp: fewer all_reduce calls per step than the
    # base's tiny buckets (the gate reads the base's as the reference: an improvement in structure)
    base_calls = sum(op["count"] for op in ab["census_baseline"]["collectives"] if op["kind"] == "all_reduce")
    assert ab["structure_verdict"] == "improvement" and base_calls > 1, ab


def test_the_baselines_bytes_reach_its_ranks_unopened():
    inner = pickle.dumps({"dim": 256})
    wrapped = BuiltByBaseline(inner, "test_x.py::test_y")
    assert pickle.loads(pickle.dumps({"workload": wrapped})) == {"workload": {"dim": 256}}
    assert "256" not in repr(wrapped) and "test_x.py::test_y" in repr(wrapped)


def test_the_build_takes_the_options_that_decide_ids_and_the_users_own_but_not_selection(pytester):
    pytester.makeconftest("def pytest_addoption(parser):\n    parser.addoption('--model-dim', default='8')\n")
    config = pytester.parseconfig(
        "tests/test_a.py::test_b", "-k", "ddp", "-m", "not slow", "-n2", "--dist-world-sizes", "2,4",
        "--dist-sizes=1MB", "--dist-baseline-path=../base", "--dist-ab-max-time", "30", "--model-dim", "512",
        "-p", "ddpbench.testing", "--benchmark-json=ab.json", "-x", "-o", "pythonpath=src")
    assert forwarded_args(config) == ["--dist-world-sizes", "2,4", "--dist-sizes=1MB", "--model-dim", "512",
                                      "-p", "ddpbench.testing", "-o", "pythonpath=src"]


def test_the_baselines_checkout_is_found_above_its_paths_never_the_candidates(tmp_path):
    for name in ("base", "head"):
        (tmp_path / name / "benchmarks").mkdir(parents=True)
        (tmp_path / name / "benchmarks" / "test_x.py").write_text("")
        (tmp_path / name / "src").mkdir()
    test_file = str(tmp_path / "head" / "benchmarks" / "test_x.py")
    head = str(tmp_path / "head")
    assert find_checkout(head, [test_file], [str(tmp_path / "base" / "src")]) == str(tmp_path / "base")
    assert find_checkout(head, [test_file], [str(tmp_path / "base")]) == str(tmp_path / "base")
    assert find_checkout(head, [test_file], [str(tmp_path / "head" / "src")]) is None  # the candidate's own
    assert find_checkout(head, [test_file], [str(tmp_path / "elsewhere")]) is None


def test_a_module_the_checkout_holds_another_copy_of_is_refused_naming_the_path(tmp_path):
    for name, body in (("base", "STEP = 1\n"), ("head", "STEP = 2\n")):
        (tmp_path / name / "src" / "mypkg").mkdir(parents=True)
        (tmp_path / name / "src" / "mypkg" / "__init__.py").write_text(body)
    head_file = str(tmp_path / "head" / "src" / "mypkg" / "__init__.py")
    base_file = str(tmp_path / "base" / "src" / "mypkg" / "__init__.py")
    candidate = Side("candidate", modules={"mypkg": head_file})
    wrong = Side("baseline", python="/x/python", modules={"mypkg": head_file})
    with pytest.raises(CheckoutCopyError, match=r"--dist-baseline-path=\S*base/src so that"):
        check_checkout_copies(wrong, candidate, str(tmp_path / "head"), str(tmp_path / "base"),
                              [str(tmp_path / "head" / "src")], "the baseline's interpreter lives in the checkout")
    right = Side("baseline", python="/x/python", modules={"mypkg": base_file})
    check_checkout_copies(right, candidate, str(tmp_path / "head"), str(tmp_path / "base"),
                          [str(tmp_path / "head" / "src")], "found")
    (tmp_path / "base" / "src" / "mypkg" / "__init__.py").write_text("STEP = 2\n")  # the same bytes: no harm
    check_checkout_copies(wrong, candidate, str(tmp_path / "head"), str(tmp_path / "base"),
                          [str(tmp_path / "head" / "src")], "found")
