"""Load a script of lab/ (lab/reference/, lab/investigations/ or lab/gpu/) as a module, for tests
of its functions."""

import importlib.util
import pathlib
import sys

from .paths import REPO_ROOT

LAB = REPO_ROOT / "lab"
FOLDERS = (LAB / "reference", LAB / "investigations", LAB / "gpu")


def lab_script_path(name: str) -> pathlib.Path:
    """The path of lab's script ``name``.py, from whichever of its script folders holds it."""
    found = [folder / f"{name}.py" for folder in FOLDERS if (folder / f"{name}.py").is_file()]
    if len(found) != 1:
        raise FileNotFoundError(f"{name}.py: expected in exactly one of {[str(f) for f in FOLDERS]}, "
                                f"found {[str(f) for f in found]}")
    return found[0]


def load_lab_script(name: str):
    """lab's script ``name``.py as a module; its own folder is on sys.path while it imports, as when
    it runs (ab_pair_checks.py imports ab_replay from beside it, broadcast_modes.py plain_ranks)."""
    path = lab_script_path(name)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
