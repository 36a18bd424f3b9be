"""The baseline's own copy of the project (its checkout): found from --dist-baseline-path, used so
that the baseline's ranks and the build of its workloads take the baseline's test files, conftest
and source instead of the candidate's, and checked so that a baseline interpreter living in
another checkout never quietly runs the candidate's copy of a module under test
(docs/design/ab.md#each-side-its-own-program)."""

from __future__ import annotations

import hashlib
import os

from .side_environments import SameCodeError, Side


def _real(path: str) -> str:
    return os.path.realpath(path)


def _related(folder: str, root: str) -> bool:
    """Whether ``folder`` is ``root``, inside it or above it: never another copy of it."""
    def inside(a: str, b: str) -> bool:
        return a == b or a.startswith(b.rstrip(os.sep) + os.sep)

    return inside(folder, root) or inside(root, folder)


def _relative_files(candidate_root: str, files) -> list[str]:
    root = _real(candidate_root)
    rels = []
    for file in files:
        real = _real(file)
        if real.startswith(root.rstrip(os.sep) + os.sep):
            rels.append(os.path.relpath(real, root))
    return sorted(set(rels))


def find_checkout(candidate_root: str, test_files, start_folders) -> str | None:
    """The nearest folder at or above one of ``start_folders`` (in their order) that holds one of
    ``test_files`` at the place the candidate's project folder ``candidate_root`` holds it: the
    other side's copy of the project. Never the candidate's folder, one inside it or one above it.
    None when no start folder leads to one."""
    root = _real(candidate_root)
    rels = _relative_files(root, test_files)
    if not rels:
        return None
    for start in start_folders:
        folder = _real(start)
        while True:
            if not _related(folder, root) and any(os.path.isfile(os.path.join(folder, rel)) for rel in rels):
                return folder
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return None


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def _import_folder(file: str, sys_path: list[str]) -> str | None:
    """The entry of ``sys_path`` that ``file`` was found under (the longest that holds it)."""
    real = _real(file)
    holding = [_real(p) for p in sys_path if p and real.startswith(_real(p).rstrip(os.sep) + os.sep)]
    return max(holding, key=len) if holding else None


def _shown(path: str) -> str:
    """``path`` as the user would type it from here: relative when that is shorter."""
    relative = os.path.relpath(path)
    return relative if len(relative) < len(path) else path


class CheckoutCopyError(SameCodeError):
    """The baseline's interpreter (or paths) belong to a checkout that holds its own, different copy
    of a module under test, yet its ranks would import another file: exit 2, naming
    --dist-baseline-path."""


def check_checkout_copies(baseline: Side, candidate: Side, candidate_root: str, checkout: str,
                          sys_path: list[str], how_found: str) -> None:
    """CheckoutCopyError when a module under test that the candidate imports from its project
    folder (``candidate_root``) has a copy at the same place in ``checkout`` whose bytes differ,
    and the baseline's ranks would import another file than that copy: the baseline would time
    code that is not its own. ``how_found`` says why ``checkout`` is the baseline's."""
    root = _real(candidate_root)
    wrong = []
    for name, theirs in sorted(candidate.modules.items()):
        ours = baseline.modules.get(name)
        if not theirs or not os.path.isabs(theirs) or not _real(theirs).startswith(root.rstrip(os.sep) + os.sep):
            continue  # not the project's own code (an installed package, a namespace package)
        copy = os.path.join(checkout, os.path.relpath(_real(theirs), root))
        if not os.path.isfile(copy) or (ours and _real(ours) == _real(copy)):
            continue
        if ours and _digest(copy) == _digest(ours):
            continue  # the same bytes: the copy it would run is the checkout's own
        folder = _import_folder(theirs, sys_path)
        suggest = os.path.join(checkout, os.path.relpath(folder, root)) if folder else checkout
        wrong.append((name, ours, copy, os.path.normpath(suggest)))
    if not wrong:
        return
    name, ours, copy, suggest = wrong[0]
    more = f" (and {len(wrong) - 1} more module(s) under test)" if len(wrong) > 1 else ""
    would = f"would import {name} from {ours}" if ours else f"cannot import {name}"
    raise CheckoutCopyError(
        f"{how_found}, which holds its own copy of {name} ({copy}), but the baseline's ranks {would}, "
        f"another file whose bytes differ{more}: the baseline would time code that is not its own. Give "
        f"--dist-baseline-path={_shown(suggest)} so that its ranks import the baseline's own copy")
