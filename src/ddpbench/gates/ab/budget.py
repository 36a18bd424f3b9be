"""A run budget for the A/B gate (``--dist-ab-run-budget SECONDS``): the time a case may spend
adding pairs is its share of what the run has left (recomputed as each case starts), and a case
whose share ends while it is nearly decided may borrow up to one more share
(docs/design/ab.md#the-run-budget, docs/design/ab.md#borrowed-time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


def case_cap(budget_s: float, spent_s: float, cases_left: int, max_time_s: float | None = None) -> float:
    """Seconds the next case may spend adding pairs: an even share of what is left of the budget
    over the cases not yet finished (this one included), at most ``max_time_s`` when given; 0 once
    the budget is spent (the case runs its first stage only)."""
    if budget_s <= 0 or cases_left < 1:
        raise ValueError(f"a run budget needs seconds above 0 and at least one case left "
                         f"(got {budget_s:g} s, {cases_left} case(s))")
    share = max(0.0, budget_s - spent_s) / cases_left
    return share if max_time_s is None else min(share, max_time_s)


# How many more shares a nearly decided case may borrow past its own (ab_gate_model.py: one
# share gets the modelled decided share to within half a point of giving every case all it needs).
BORROW_SHARES = 1.0


def case_borrow(budget_s: float, spent_s: float, cases_left: int, max_time_s: float | None = None) -> float:
    """Seconds past its share (``case_cap``) that the next case may borrow if its share ends while
    it is nearly decided: ``BORROW_SHARES`` shares, but never past what is left of the budget nor
    past ``max_time_s`` in all; 0 for a case that has the budget's rest already."""
    share = case_cap(budget_s, spent_s, cases_left)
    left = max(0.0, budget_s - spent_s)
    borrow = min(BORROW_SHARES * share, left - share)
    if max_time_s is not None:
        borrow = min(borrow, max_time_s - min(share, max_time_s))
    return max(0.0, borrow)


@dataclass
class RunBudget:
    """The run's budget and the A/B cases it is shared by (node ids, in collection order)."""

    budget_s: float
    max_time_s: float | None = None  # --dist-ab-max-time when given: each case's own cap too
    planned: list[str] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    started_at: float | None = None  # time.monotonic() when the first case started
    clock: Callable[[], float] = time.monotonic  # tests give their own

    def cases_left(self, case_id: str) -> int:
        """The planned cases not yet finished, ``case_id`` included even if it was not planned."""
        left = {case for case in self.planned if case not in self.finished}
        return len(left | {case_id})

    def cap_for(self, case_id: str) -> float:
        """The time cap of the case starting now (starts the budget's clock at the first case)."""
        now = self.clock()
        if self.started_at is None:
            self.started_at = now
        return case_cap(self.budget_s, now - self.started_at, self.cases_left(case_id), self.max_time_s)

    def borrow_for(self, case_id: str) -> float:
        """Seconds the case starting now may borrow past its cap (``case_borrow``; call after
        :meth:`cap_for`, which starts the clock)."""
        return case_borrow(self.budget_s, self.spent_s(), self.cases_left(case_id), self.max_time_s)

    def finish(self, case_id: str) -> None:
        self.finished.add(case_id)

    def spent_s(self) -> float:
        return 0.0 if self.started_at is None else self.clock() - self.started_at
