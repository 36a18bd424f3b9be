"""What a ddpbench process runs with: its torch, its engine (a hash of ddpbench's source) and the
rank protocol it speaks, collected here alone (:func:`identity`). Two processes that drive one
another must agree on these, or a case measures code other than what it names: A/B sides compare
theirs (:mod:`ddpbench.gates.ab.side_environments`), a multi-node controller refuses workers whose
identity differs from its own (:mod:`ddpbench.pool.external`), and a saved run records them among
its run facts (:mod:`ddpbench.storage.run_facts`).
"""

from __future__ import annotations

import functools
import os

# The engine's identity: a hash of every .py file of the ddpbench package (relative path and
# bytes). Kept as source text because the A/B probe runs it in the side's interpreter, whose
# ddpbench may be another version; every other process runs the same text for its own.
DIGEST_SOURCE = r'''
def source_digest(package_dir):
    import hashlib, os
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                digest.update(os.path.relpath(path, package_dir).replace(os.sep, "/").encode() + b"\0")
                with open(path, "rb") as fh:
                    digest.update(fh.read() + b"\0")
    return digest.hexdigest()
'''
_namespace: dict = {}
exec(DIGEST_SOURCE, _namespace)  # noqa: S102 - our own constant text, shared with the A/B probe
source_digest = _namespace["source_digest"]

# What must be equal between a controller and the ranks it drives, with the words for each.
IDENTITY_KEYS = {"torch_version": "torch", "ddpbench_source_sha256": "ddpbench engine (source hash)",
                 "rank_protocol": "rank protocol"}


@functools.lru_cache(maxsize=1)
def engine_digest() -> str:
    """This process's ddpbench source hash (computed once: the files do not change under it)."""
    import ddpbench

    return source_digest(os.path.dirname(ddpbench.__file__))


def torch_version_without_import() -> str | None:
    """``torch.__version__`` as a process that imports torch reports it (local tag included:
    2.11.0+cu130), read from torch/version.py so the caller need not import torch; else the
    distribution's version (whose metadata may lack the tag); None without torch."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            continue
        match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if match:
            return match.group(1)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def identity(import_torch: bool = True) -> dict:
    """This process's torch version, ddpbench version and source hash, and rank protocol: the one
    place they are collected. ``import_torch``: read the torch version from the imported module
    (call it where torch is loaded anyway); else from torch's files, importing nothing."""
    import ddpbench

    from .rank_process import RANK_PROTOCOL

    if import_torch:
        import torch

        torch_version = torch.__version__
    else:
        torch_version = torch_version_without_import()
    return {"torch_version": torch_version, "ddpbench_version": ddpbench.__version__,
            "ddpbench_source_sha256": engine_digest(), "rank_protocol": RANK_PROTOCOL}


def _shown(key: str, value) -> str:
    if value is None:
        return "(not said: a ddpbench from before workers reported it)"
    if key == "ddpbench_source_sha256":
        return f"#{str(value)[:12]}"
    return str(value)


def identity_differences(ours: dict, theirs: dict) -> list[str]:
    """One line per identity key on which ``theirs`` differs from ``ours``, both values shown:
    'torch: 2.5.1+cpu on the rank, 2.6.0+cpu on the controller'."""
    lines = []
    for key, words in IDENTITY_KEYS.items():
        if theirs.get(key) != ours.get(key):
            extra = ""
            if key == "ddpbench_source_sha256":
                extra = (f" (ddpbench {theirs.get('ddpbench_version', '?')} there, "
                         f"{ours.get('ddpbench_version', '?')} here)")
            lines.append(f"{words}: {_shown(key, theirs.get(key))} on the rank, "
                         f"{_shown(key, ours.get(key))} on the controller{extra}")
    return lines
