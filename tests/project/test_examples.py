"""examples/tinyddp, a user's own project, runs from a copy in a temporary directory.

This keeps spawn-pickling of user modules proven: the workloads live in the project's own package
(outside ddpbench, on the path only through the project's pytest.ini), and the ranks import them.
"""

import json
import shutil

from helpers.paths import REPO_ROOT as ROOT

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
