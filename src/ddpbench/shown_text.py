"""Text read from a run file, a commit or a log, made safe to print: on a terminal (:func:`printable`:
control characters escaped, so nothing printed can drive the terminal) and in markdown
(:func:`markdown_text`, :func:`markdown_code`: nothing can start a line, a heading, an image, a
link, raw HTML or an @mention). Run files are input: whoever wrote one chooses every string in it."""

from __future__ import annotations

import re
import unicodedata

# Control, format and line/paragraph separator characters: a newline would end a table row, an
# escape sequence would drive the terminal, a bidirectional override would reorder what is read.
_HIDDEN = ("Cc", "Cf", "Zl", "Zp")
_MENTION = re.compile(r"@(?=[A-Za-z0-9_-])")  # @user, @org/team: GitHub notifies them


def printable(text: object) -> str:
    """``text`` with its control and format characters (a newline, an escape sequence, a
    bidirectional override) shown escaped (``\\n``, ``\\x1b``)."""
    return "".join(ch if ch == " " or unicodedata.category(ch) not in _HIDDEN else ascii(ch)[1:-1]
                   for ch in str(text))


def markdown_text(text: object) -> str:
    """``text`` as one markdown table cell or list item shows it literally: printable, ``|``
    escaped (it would end the cell), ``<`` as an entity (raw HTML: an <img>), ``](`` broken (links
    and images), a leading ``#`` escaped (a heading), and an @mention broken by a zero-width space
    (``@&#8203;user``, as GitHub's own bots write it) so that it notifies nobody."""
    out = printable(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
    out = out.replace("](", "]\\(")  # [text](url), ![alt](url): no link without the ( right after ]
    out = _MENTION.sub("@&#8203;", out)
    return re.sub(r"^(\s*)#", r"\1\\#", out)


def markdown_code(text: object) -> str:
    """``text`` as a code span in a markdown table cell: printable, ``|`` escaped (GitHub's table
    parser splits on it even in code), fenced by more backticks than any run inside it. Nothing
    else is active inside a code span."""
    out = printable(text).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", out)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest or out.startswith(" ") or out.endswith(" ") else ""
    return f"{fence}{pad}{out}{pad}{fence}"
