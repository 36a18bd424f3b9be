"""examples/tinyddp and examples/own_model, a user's own projects, run from a copy in a temporary
directory (own_model's also under the A/B gate, against a copy whose model changed).

This keeps spawn-pickling of user modules proven: the workloads live in the project's own package
(outside ddpbench, on the path only through the project's pytest.ini), and the ranks import them.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers.paths import REPO_ROOT as ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")

EXAMPLE = ROOT / "examples" / "tinyddp"

pytest_plugins = ["pytester"]


def test_the_example_project_runs_from_a_copy(pytester):
    shutil.copytree(EXAMPLE, pytester.path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", ".benchmarks", ".pytest_cache"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not gpu", "--dist-rounds=3",
                                           "--dist-warmup=1", "--benchmark-json=out.json", timeout=300)
    # 4 cases on gloo; each test's NCCL cases (gpu markers) are deselected.
    result.assert_outcomes(passed=4, deselected=8)
    cases = {c["name"]: c for c in json.loads((pytester.path / "out.json").read_text())["benchmarks"]}
    assert sorted(cases) == ["test_ddp_step[gloo-2p-128]", "test_ddp_step[gloo-2p-32]",
                             "test_ddp_step_by_width[gloo-2p-128]", "test_ddp_step_by_width[gloo-2p-512]"]
    step = cases["test_ddp_step[gloo-2p-32]"]
    assert step["extra_info"]["workload"] == "tinyddp-step" and step["stats"]["rounds"] == 3
    wide = cases["test_ddp_step_by_width[gloo-2p-512]"]
    assert wide["group"] == "tinyddp-width"
    assert wide["extra_info"]["hidden"] == 512 and wide["extra_info"]["world_size"] == 2


# ----------------------------------------------------------------------------------------------
# examples/own_model: a model, a transformer and a LightningModule, benchmarked as they train
# ----------------------------------------------------------------------------------------------

OWN_MODEL = ROOT / "examples" / "own_model"
OWN_MODEL_CASES = ["test_ddp_mlp[gloo-2p]", "test_fsdp2_gpt[gloo-2p]", "test_lightning_module[gloo-2p]",
                   "test_fsdp2_gpt_bf16_accumulated[gloo-2p]"]
# What a pull request might change in the project's own code (src/own_model/model.py): each adds
# communication to every step, the kind a gate must catch whatever the timing says.
PLANTED = {
    # a wider hidden layer: more gradient bytes all-reduced
    "nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES)":
        "nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, CLASSES)",
    # a third transformer block: one more unit for FSDP2 to gather and scatter
    "    def __init__(self, layers=2):": "    def __init__(self, layers=3):",
    # the loss averaged over the ranks for logging: one more all_reduce a step
    "    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())":
        "    loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())\n"
        "    torch.distributed.all_reduce(loss.detach().clone())\n"
        "    return loss",
    # Lightning's logging synced over the ranks: one more all_reduce a step
    "        loss = F.cross_entropy(self.model(inputs), labels)\n":
        "        loss = F.cross_entropy(self.model(inputs), labels)\n"
        "        self.log('train_loss', loss, sync_dist=True)\n",
}


def _copy_own_model(where):
    shutil.copytree(OWN_MODEL, where, ignore=shutil.ignore_patterns("__pycache__", ".benchmarks", ".pytest_cache"))
    return where


def _per_step(census):
    return {(e["kind"], e["dtype"]): (e["count"], e["bytes"]) for e in census["collectives"]}


def test_the_readmes_own_model_lines_are_the_examples():
    """README's block under "Your own model" runs: each of its lines is one of the example's."""
    block = README.split("**Your own model, as you train it**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    example = {line.strip() for line in (OWN_MODEL / "benchmarks" / "test_own_model.py").read_text().splitlines()}
    assert [line for line in block.splitlines() if line.strip() not in example] == []
    assert len(block.splitlines()) == 3


def test_the_own_model_example_runs_each_kind_one_optimizer_step_a_round(pytester):
    _copy_own_model(pytester.path / "own_model")
    result = pytester.runpytest_subprocess("own_model/benchmarks", "-p", "no:cacheprovider", "-m", "not gpu",
                                           "-c", "own_model/pytest.ini", "--rootdir=own_model", "--dist-rounds=3",
                                           "--dist-warmup=2", "--benchmark-json=out.json", timeout=600)
    result.assert_outcomes(passed=4, deselected=8)
    cases = {c["name"]: c["extra_info"] for c in json.loads((pytester.path / "out.json").read_text())["benchmarks"]}
    assert sorted(cases) == sorted(OWN_MODEL_CASES)
    ddp, fsdp2, lightning, accumulated = (cases[name] for name in OWN_MODEL_CASES)
    mlp_gradients = 4 * (64 * 128 + 128 + 128 * 10 + 10)
    assert _per_step(ddp["census"]) == {("all_reduce", "float32"): (1, mlp_gradients)}
    assert sorted(_per_step(fsdp2["census"])) == [("all_gather", "float32"), ("reduce_scatter", "float32")]
    assert _per_step(lightning["census"]) == {("all_reduce", "float32"): (1, mlp_gradients),
                                             ("broadcast", "int64"): (2, 16)}  # Lightning's SIGTERM flag
    # Accumulation: the first micro-batch's backward reduces nothing, so a step still scatters once per unit.
    assert _per_step(accumulated["census"])[("reduce_scatter", "float32")] == _per_step(fsdp2["census"])[
        ("reduce_scatter", "float32")]
    assert ddp["samples_per_second"] > 0 and fsdp2["tokens_per_second"] > 0 and "mfu" not in fsdp2
    assert accumulated["autocast"] == "bf16" and accumulated["grad_accum"] == 2 and 0 < accumulated["mfu"] < 1
    assert lightning["samples_per_step"] == 2 * 2 * 32 and lightning["final_loss"] > 0


@pytest.mark.pool
def test_an_ab_run_of_the_own_model_example_catches_what_a_change_to_the_model_sends(tmp_path):
    """The project as a pull request would find it: the base checkout's model, and a head checkout
    whose model.py carries the planted changes; the A/B gate, each side's ranks importing its own
    src/, reads a structural regression in each case after its first look and exits 1."""
    base = _copy_own_model(tmp_path / "base")
    head = _copy_own_model(tmp_path / "head")
    model = head / "src" / "own_model" / "model.py"
    text = model.read_text()
    for before, after in PLANTED.items():
        assert before in text, before
        text = text.replace(before, after)
    model.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not gpu",
                          f"--dist-baseline-path={base / 'src'}", "--dist-ab-pools-per-side=1",
                          "--dist-ab-max-time=10", "--dist-ab-profile=off", "--benchmark-json=ab.json"],
                         cwd=head, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    cases = {c["name"]: c["extra_info"]["ab"] for c in json.loads((head / "ab.json").read_text())["benchmarks"]}
    assert sorted(cases) == sorted(OWN_MODEL_CASES)
    for name, ab in cases.items():
        assert ab["verdict"] == "regression" and ab["stopped_by_structure"], (name, ab.get("structure_line"))
    assert f"own_model (2 modules): baseline {base}/src/own_model/ | candidate {head}/src/own_model/" in run.stdout
