"""The public API is importable from ``ddpbench`` itself, without importing torch; --version works."""

import importlib.metadata
import pathlib
import pickle
import subprocess
import sys

import ddpbench

PUBLIC = ["Workload", "FunctionWorkload", "RankContext", "CaseResult", "DistBenchmark", "ModelTraining",
          "LightningTraining", "PackedTensorDataset", "pack_tensors", "__version__"]


def test_the_public_names_resolve_and_are_listed():
    assert sorted(ddpbench.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(ddpbench, name) is not None
        assert name in dir(ddpbench)
    from ddpbench.fixture import CaseResult, DistBenchmark
    from ddpbench.pool import RankContext
    from ddpbench.workloads import FunctionWorkload, Workload

    assert (ddpbench.Workload, ddpbench.FunctionWorkload, ddpbench.RankContext, ddpbench.CaseResult,
            ddpbench.DistBenchmark) == (Workload, FunctionWorkload, RankContext, CaseResult, DistBenchmark)
    assert issubclass(FunctionWorkload, Workload)


def _setup(ctx):
    return None


def _round(state):
    pass


def test_workloads_pickle_by_the_public_module_path():
    """Workloads travel pickled to the ranks, and an A/B baseline's ranks may run an older ddpbench,
    which has ``ddpbench.workloads.FunctionWorkload`` but no ``ddpbench.workloads.base``."""
    payload = pickle.dumps(ddpbench.FunctionWorkload(_setup, _round))
    assert b"ddpbench.workloads.base" not in payload and b"ddpbench.workloads" in payload
    assert type(pickle.loads(payload)) is ddpbench.FunctionWorkload
    assert ddpbench.Workload.__module__ == ddpbench.FunctionWorkload.__module__ == "ddpbench.workloads"


def test_import_ddpbench_the_plugin_and_the_api_do_not_import_torch():
    code = (
        "import sys, ddpbench, ddpbench.plugin, ddpbench.cli\n"
        "for name in ('Workload', 'FunctionWorkload', 'RankContext', 'CaseResult', 'DistBenchmark',\n"
        "             'ModelTraining', 'LightningTraining', '__version__'):\n"
        "    getattr(ddpbench, name)\n"
        "print('torch' in sys.modules or 'pytorch_lightning' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_version_comes_from_the_package_metadata():
    assert ddpbench.__version__ == importlib.metadata.version("ddpbench")
    script = pathlib.Path(sys.executable).parent / "ddpbench"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "ddpbench.cli"]
    out = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"ddpbench {ddpbench.__version__}"
