"""Saved runs on disk: written whole or not at all, numbered without collisions, listed by number
(docs/design/storage-and-report.md#saving-is-whole-or-nothing).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

# A saved run: its number (four digits or more) and the name pytest-benchmark gives it.
RUN_NAME = re.compile(r"^(\d{4,})_.*\.json$")
_TEMP_PREFIX = ".ddpbench-saving-"
_LOCK_NAME = ".ddpbench-save.lock"
_MAX_NUMBER_TRIES = 1000


class SaveError(Exception):
    """A run could not be saved; the storage was left as it was."""


def run_number(path: Path) -> int | None:
    """The run number of a saved run's file name, None for other files."""
    match = RUN_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def saved_run_files(folder: Path) -> list[Path]:
    """The saved runs of one machine folder, oldest first (by run number, not by name: 10000
    sorts after 9999)."""
    files = [p for p in Path(folder).glob("*.json") if run_number(p) is not None]
    return sorted(files, key=lambda p: (run_number(p), p.name))


def next_number(folder: Path) -> int:
    """One past the highest run number in ``folder`` (1 when it holds none)."""
    numbers = [run_number(p) for p in Path(folder).glob("*.json")]
    return max((n for n in numbers if n is not None), default=0) + 1


# ----------------------------------------------------------------------------------------------
# What JSON can hold
# ----------------------------------------------------------------------------------------------

_JSON_KEYS = (str, int, float, bool, type(None))


def unsaveable(value: Any, where: str = "value", _depth: int = 0) -> str | None:
    """Why ``value`` cannot be written as JSON (a dict key JSON cannot hold, a cycle, nesting too
    deep), naming where it is, or None when it can. Other objects are fine: pytest-benchmark
    writes them as ``UNSERIALIZABLE[...]`` strings."""
    if _depth > 100:
        return f"{where} is nested more than 100 levels deep (or holds itself)"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, _JSON_KEYS):
                return (f"{where} has the key {key!r} of type {type(key).__name__}: JSON object keys "
                        f"must be strings (or numbers, booleans, None). Use a string key, e.g. "
                        f"{', '.join(map(str, key)) if isinstance(key, tuple) else str(key)!r}")
            problem = unsaveable(item, f"{where}[{key!r}]", _depth + 1)
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = unsaveable(item, f"{where}[{index}]", _depth + 1)
            if problem:
                return problem
    return None


def _where_in_run(doc: Any) -> str | None:
    """The first value of a run document that JSON cannot hold, named by case when it is one's."""
    if isinstance(doc, dict):
        for bench in doc.get("benchmarks") or []:
            if isinstance(bench, dict):
                name = bench.get("fullname") or bench.get("name") or "?"
                problem = unsaveable(bench.get("extra_info"), f"{name}: extra_info")
                if problem:
                    return problem
    return unsaveable(doc, "the run")


def serialise(doc: Any) -> bytes:
    """The run as pytest-benchmark writes it (indented ASCII JSON, other objects as
    ``UNSERIALIZABLE[...]``); :class:`SaveError` naming the value JSON cannot hold."""
    from ..benchmark_internals import safe_dumps

    try:
        return safe_dumps(doc, ensure_ascii=True, indent=4).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        problem = _where_in_run(doc) or f"{type(exc).__name__}: {exc}"
        raise SaveError(f"the run cannot be written as JSON: {problem}") from None


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------


def _write_temp(folder: Path, data: bytes) -> Path:
    """``data`` in a hidden temporary file of ``folder``, on disk; removed again on failure."""
    fd, name = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fh.fileno(), 0o666 & ~umask)  # as open() would create it (mkstemp: owner only)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def _claim(temp: Path, final: Path) -> bool:
    """Give ``final`` the contents of ``temp`` (which stays) unless that name exists; False when it
    does."""
    try:
        os.link(temp, final)  # atomic, and fails if ``final`` exists
    except FileExistsError:
        return False
    except OSError as exc:  # a file system without hard links: reserve the name, then fill it
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        try:
            os.close(os.open(final, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        try:
            shutil.copyfile(temp, final)
        except OSError:
            os.unlink(final)  # the name we reserved
            raise
    return True


def _others_with_number(folder: Path, number: int, mine: Path) -> bool:
    return any(run_number(p) == number and p.name != mine.name for p in Path(folder).glob("*.json"))


@contextlib.contextmanager
def _folder_lock(folder: Path):
    """Saves into one folder take turns (an flock on a hidden file), so two never pick one number."""
    try:
        import fcntl
    except ImportError:  # no flock here: the check after naming still keeps numbers apart
        yield
        return
    fd = os.open(folder / _LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def save_run(folder: str | Path, name: str, doc: Any,
             number: Callable[[Path], int] = next_number) -> Path:
    """Save ``doc`` as ``<folder>/NNNN_<name>.json`` under the next free number, whole or not at
    all; :class:`SaveError` (nothing written) when it cannot be."""
    folder = Path(folder)
    data = serialise(doc)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temp = _write_temp(folder, data)
    except OSError as exc:
        raise SaveError(f"cannot write the run in {folder} ({exc.strerror or exc}); nothing was saved "
                        f"and the saved runs are as they were. Free space, or save elsewhere "
                        f"(--benchmark-storage)") from None
    try:
        with _folder_lock(folder):
            for _ in range(_MAX_NUMBER_TRIES):
                n = number(folder)
                final = folder / f"{n:04d}_{name}.json"
                if not _claim(temp, final):
                    continue
                if _others_with_number(folder, n, final):  # a saver that takes no lock took n too
                    os.unlink(final)
                    continue
                return final
        raise SaveError(f"no free run number in {folder} after {_MAX_NUMBER_TRIES} tries (other runs "
                        f"saving all the time?); nothing was saved")
    except OSError as exc:
        raise SaveError(f"cannot name the run in {folder} ({exc.strerror or exc}); nothing was "
                        f"saved and the saved runs are as they were") from None
    finally:
        if temp.exists():
            temp.unlink()


def write_json(path: str | Path, doc: Any) -> Path:
    """``--benchmark-json FILE``: replace ``path`` whole (temporary file + rename) or leave it as
    it was; :class:`SaveError` when it cannot be written."""
    path = Path(path)
    data = serialise(doc)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        temp = _write_temp(folder, data)
    except OSError as exc:
        raise SaveError(f"cannot write {path} ({exc.strerror or exc}); it is as it was") from None
    try:
        os.replace(temp, path)
    except OSError as exc:
        temp.unlink()
        raise SaveError(f"cannot write {path} ({exc.strerror or exc}); it is as it was") from None
    return path


# ----------------------------------------------------------------------------------------------
# pytest-benchmark's session
# ----------------------------------------------------------------------------------------------


def install(bench_session, on_error: Callable[[str], None]) -> None:
    """Route a pytest-benchmark session's saves through :func:`save_run` / :func:`write_json`
    (a file storage only: other storages keep their own). A failed save goes to ``on_error``
    instead of raising, so pytest can still end the run and say what happened."""
    from ..benchmark_internals import FileStorage

    storage = bench_session.storage
    if isinstance(storage, FileStorage) and not getattr(storage, "_ddpbench_saves", False):
        def save(output_json, save_name):
            folder = storage.path / storage.default_machine_id if storage.default_machine_id else storage.path
            try:
                path = save_run(folder, save_name, output_json)
            except SaveError as exc:
                on_error(f"the run was not saved: {exc}")
                return
            storage.logger.info(f"Saved benchmark data in: {path}")

        storage.save = save
        storage._ddpbench_saves = True

    if not getattr(bench_session, "_ddpbench_saves", False):
        def save_json(output_json):
            try:
                write_json(bench_session.json, output_json)
            except SaveError as exc:
                on_error(f"--benchmark-json was not written: {exc}")
                return
            bench_session.logger.info(f"Wrote benchmark data in: {bench_session.json}", purple=True)

        bench_session.save_json = save_json
        bench_session._ddpbench_saves = True
