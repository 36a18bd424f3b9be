"""The verdict words both gates speak, as one type, :class:`Verdict`: each word with what it means to
a gate's exit status and how each output shows it. A member is the str it spells, so saved runs,
JSON and printed tables hold the word itself. Declared here, below the gates that decide them
(``ddpbench.gates.verdict_words`` re-exports them) and the saved runs that hold them
(:mod:`ddpbench.storage.records`). What each word means: docs/design/gates.md#gates."""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    """A verdict word. ``fails``: a case with it fails the gate (exit status 1; ``missing`` and
    ``baseline-failed`` unless an option allows them); ``markdown``: its cell in a pull-request
    comment; ``chart_colour``: its mark in the compare chart (matplotlib); ``page_colour``: the
    colour of its point on the history page (page.css ``.pt.<word>``), None for a plain point.
    Members are declared most urgent first: the order of a report's rows and counts."""

    REGRESSION = ("regression", True, "❌ **regression**", "tab:red", "regression")
    MISSING = ("missing", True, "❌ **missing**", "black", None)
    BASELINE_FAILED = ("baseline-failed", True, "❌ **baseline-failed**", "black", None)
    IMPROVEMENT = ("improvement", False, "✅ improvement", "tab:green", "improvement")
    INCONCLUSIVE = ("inconclusive", False, "⚠️ inconclusive", "tab:orange", "inconclusive")
    NOT_SLOWER = ("not-slower", False, "✅ not-slower", "tab:gray", "same")
    SAME = ("same", False, "same", "tab:gray", "same")
    NEW = ("new", False, "new", "black", "same")
    NOT_COUNTED = ("not counted", False, "not counted", "black", None)  # a structure or memory census only

    def __new__(cls, word: str, fails: bool, markdown: str, chart_colour: str, page_colour: str | None):
        member = str.__new__(cls, word)
        member._value_ = word
        member.fails, member.markdown, member.chart_colour, member.page_colour = (
            fails, markdown, chart_colour, page_colour)
        return member

    # Printed, formatted and joined as the word itself, as the plain strings they replace were.
    __str__ = str.__str__
    __format__ = str.__format__


# A case's verdict, most urgent first.
CASE_VERDICTS = tuple(v for v in Verdict if v is not Verdict.NOT_COUNTED)
# What a timing comparison gives (not-slower included): only a case so judged gets a structure and
# memory verdict too.
TIMING_VERDICTS = (Verdict.REGRESSION, Verdict.IMPROVEMENT, Verdict.SAME, Verdict.NOT_SLOWER, Verdict.INCONCLUSIVE)
# What comparing two structure (or memory) censuses gives.
COMPONENT_VERDICTS = (Verdict.REGRESSION, Verdict.IMPROVEMENT, Verdict.SAME, Verdict.NOT_COUNTED)
