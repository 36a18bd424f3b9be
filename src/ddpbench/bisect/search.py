"""The search for the first bad commit, a pure function of the probes' outcomes (no git, no
subprocess): a test drives it with a table of outcomes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class SearchResult:
    """Where the search stopped."""

    candidates: list[str]  # the first commit read bad, after the skipped commits that may be it instead
    probed: list[str]  # the commits probed, in order

    @property
    def first_bad(self) -> str:
        return self.candidates[-1]

    @property
    def found(self) -> bool:
        """Whether the commit before :attr:`first_bad` read good (or is GOOD): no skip leaves it open."""
        return len(self.candidates) == 1


def narrow(commits: Sequence[str], outcome_of: Callable[[str], str]) -> SearchResult:
    """The search over ``commits`` (the first-parent commits after GOOD, oldest first; the last,
    BAD, known bad): probe the untested commit nearest the middle of (last good, first bad), the
    earlier on a tie (``outcome_of(commit)``: good, bad, or anything else: skipped, as ``git
    bisect skip``), until none is left between them."""
    lo, hi = -1, len(commits) - 1  # the last commit read good (-1: GOOD), the first read bad
    tested: set[int] = set()
    probed: list[str] = []
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in tested]
        if not untested:
            return SearchResult(list(commits[lo + 1:hi + 1]), probed)
        middle = (lo + hi) / 2
        index = min(untested, key=lambda i: (abs(i - middle), i))
        tested.add(index)
        probed.append(commits[index])
        outcome = outcome_of(commits[index])
        if outcome == "bad":
            hi = index
        elif outcome == "good":
            lo = index
