"""What bisect prints of commit subjects, file names, node ids and logs: their control characters
escaped, so nothing printed can drive the terminal."""

from __future__ import annotations

import unicodedata
from pathlib import Path


def printable(text: str) -> str:
    """``text`` with its control and format characters (an escape sequence in a commit subject,
    a bidirectional override) shown escaped."""
    return "".join(ch if ch == " " or unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp")
                   else ascii(ch)[1:-1] for ch in text)


def log_tail(log: Path, lines: int = 6) -> str:
    """The last ``lines`` lines of a run's log that carry something, joined by `` | ``; '' when
    the log cannot be read."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    text = [line.strip() for line in text if line.strip(" =!_-")]  # pytest's rules carry nothing
    return printable(" | ".join(text[-lines:]))
