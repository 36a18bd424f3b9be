"""The numerics section, after the memory one: every case with a numerics replay, its steps and
ranks, whether its own two replays were bitwise equal (else their band), the last step's digest
and loss: what a later run's numerics verdict compares with."""

from __future__ import annotations

from ..storage.records import Numerics
from ..storage.runs import Case
from .cells import table

INTRODUCTION = ("The numerics replay: a few seeded, untimed steps of each case from a fresh set-up, twice; "
                "the last step's digest over every rank's parameters, gradients, optimizer state and loss.")


def _loss(record: Numerics) -> str:
    figures = record.ranks[0][-1].get("loss") if record.ranks and record.ranks[0] else None
    return "-" if figures is None else f"{figures[3]:.6g}"


def numerics_table(cases: list[Case]) -> str:
    """Every case whose numerics replay was read as counted (a record marked incomplete or not
    reproducible is left out, as the gates leave it out): steps, ranks, its replays' agreement,
    the last step's digest (12 hex digits) and the rank 0 loss there."""
    counted = [c for c in cases if isinstance(c.numerics, Numerics)]
    if not counted:
        return ""
    rows = []
    for case in sorted(counted, key=lambda c: c.fullname):
        record = case.numerics
        agree = ("bitwise" if record.first_nondeterministic_step is None
                 else f"from step {record.first_nondeterministic_step}, up to {record.replay_spread:.3g}")
        rows.append([case.name, str(record.steps), str(len(record.ranks)), agree, record.digests[-1][:12],
                     _loss(record)])
    return table(["Case", "Steps", "Ranks", "Replays agree", "Last step digest", "Loss (rank 0)"], rows)
