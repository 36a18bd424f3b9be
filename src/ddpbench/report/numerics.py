"""The numerics section, after the memory one: every case with a numerics replay, its steps, ranks
and tensors, whether its own two replays were bitwise equal, the band its perturbed replays measured
on the first step's gradients (the smallest change of them it tells from rounding), the last step's
digest and loss: what a later run's numerics verdict compares with."""

from __future__ import annotations

from ..gates.numerics import BAND_MARGIN
from ..storage.records import Numerics
from ..storage.runs import Case
from .cells import table

INTRODUCTION = ("The numerics replay: a few seeded, untimed steps of each case from a fresh set-up, twice, and "
                "perturbed by one unit in the last place for its band; the last step's digest over every rank's "
                "parameters, gradients, optimizer state and loss.")


def step_one_band(record: Numerics) -> str:
    """The band on the first step's gradients (what a change of them must pass to read `changed`),
    ``-`` where the record has none."""
    if record.band is None or len(record.band) < 2 or "grad" not in record.band[1]:
        return "-"
    return f"{BAND_MARGIN * record.band[1]['grad']:.2g}"


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
        rows.append([case.name, str(record.steps), str(len(record.ranks)), str(record.tensor_count), agree,
                     step_one_band(record), record.digests[-1][:12], _loss(record)])
    return table(["Case", "Steps", "Ranks", "Tensors", "Replays agree", "Band, step 1 gradients",
                  "Last step digest", "Loss (rank 0)"], rows)
