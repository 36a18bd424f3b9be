"""Load a script of benchmarks/raw/ as a module, for tests of its functions."""

import importlib.util
import pathlib
import sys

RAW = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "raw"


def load_raw_script(name: str):
    """benchmarks/raw/``name``.py as a module; its folder is on sys.path while it imports, as when
    it runs (ab_pair_checks.py imports ab_replay from beside it)."""
    spec = importlib.util.spec_from_file_location(name, RAW / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(RAW))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(RAW))
    return module
