"""What every ``ddpbench`` command reports alike: bad input (exit 2, the problem and the fix on
stderr) and an output path it cannot write to."""

from __future__ import annotations

import sys
from pathlib import Path


def error(command: str, message: str) -> int:
    """Print ``ddpbench COMMAND: error: MESSAGE`` to stderr; returns the exit status of bad input, 2."""
    print(f"ddpbench {command}: error: {message}", file=sys.stderr)
    return 2


def output_problem(option: str, path: str, default: str | None = None, folder: bool = False) -> str | None:
    """Why an output path given to ``option`` cannot be used, or None. The folder it goes in must
    exist, as a shell's ``> FILE`` and ``mkdir DIR`` need: a mistyped path is named, not created
    folder by folder. The default path's folders are created (reports/ on a fresh clone).
    ``folder``: the option names a folder to write into (created itself), not a file."""
    target = Path(path)
    if folder and target.exists() and not target.is_dir():
        return f"{option} {path}: is a file, not a folder; name a folder for the files"
    if not folder and target.is_dir():
        return f"{option} {path}: is a folder; name a file in it"
    parent = target.parent
    if str(path) != str(default) and not parent.is_dir():
        return (f"{option} {path}: the folder {parent} does not exist; create it (mkdir -p {parent}) or "
                f"give {option} a path in an existing folder")
    return None
