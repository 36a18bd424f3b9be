"""What bisect prints of commit subjects, file names, node ids and logs: their control characters
escaped, so nothing printed can drive the terminal."""

from __future__ import annotations

from pathlib import Path

from ..shown_text import printable


def log_tail(log: Path, lines: int = 6) -> str:
    """The last ``lines`` lines of a run's log that carry something, joined by `` | ``; '' when
    the log cannot be read."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    text = [line.strip() for line in text if line.strip(" =!_-")]  # pytest's rules carry nothing
    return printable(" | ".join(text[-lines:]))
