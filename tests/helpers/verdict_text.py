"""Reading the gates' text table in tests: each case's row with the detail lines indented under it."""

from __future__ import annotations


def case_blocks(text: str, names) -> dict[str, str]:
    """{case name: its row and the lines indented under it, joined by newlines} for the cases in
    ``names`` (a row starts with the case's name)."""
    blocks: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        first = line.split()[0] if line.split() else None
        if not line.startswith(" ") and first in names:
            current = first
            blocks[current] = line
        elif line.startswith("    ") and current is not None:
            blocks[current] += "\n" + line
        else:
            current = None
    return blocks
