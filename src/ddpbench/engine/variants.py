"""Variant rounds (``RoundPlan.variant_rounds``): after the recorded rounds, the workload's variants
(``Workload.variants``, e.g. its compute-only step) and the workload itself take turns, round by
round, timed by the same rule; they are reported apart and never join the case's rounds."""

from __future__ import annotations

from typing import Any

from .rounds import repeated

# The name of the workload's own rounds among the variant rounds.
STEP = "step"


def variants_of(workload, rounds: int) -> dict[str, Any]:
    """The workload's variants by name ({} when ``rounds`` is 0 or it has none); a variant named
    :data:`STEP` is a ValueError (that name is the workload's own rounds)."""
    variants = dict(workload.variants() or {}) if rounds > 0 else {}
    if STEP in variants:
        raise ValueError(f"{type(workload).__name__}.variants() names a variant {STEP!r}: that name "
                         f"is the workload's own rounds; rename the variant")
    return variants


def interleave_variants(ctx, step: tuple, variants: dict[str, Any], rounds: int, ops_per_round: int,
                        time_round) -> tuple[dict[str, list[float]], float]:
    """``rounds`` rounds of each variant and as many more of ``step`` (the workload's ``(run_round,
    state)``, under :data:`STEP`), interleaved: round group i runs each of them once, the order
    rotated by one from group to group, so that drift and "who runs first" hit all alike. Each
    variant is set up (and warmed up one round) first and torn down after. Returns the times per op
    by name and the seconds spent under the timer (``time_round(ctx, run_round, state)``)."""
    states: dict[str, Any] = {}
    times: dict[str, list[float]] = {STEP: [], **{name: [] for name in variants}}
    timed = 0.0
    try:
        for name, variant in variants.items():
            states[name] = variant.setup(ctx)
        runs = {STEP: step, **{name: (variant.run_round, states[name]) for name, variant in variants.items()}}
        names = list(runs)
        for name in names[1:]:  # one warm-up round each (the workload itself is warm)
            time_round(ctx, repeated(runs[name][0], ops_per_round), runs[name][1])
        for i in range(rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                run, state = runs[name]
                elapsed = time_round(ctx, repeated(run, ops_per_round), state)
                times[name].append(elapsed / ops_per_round)
                timed += elapsed
    finally:
        for name, state in states.items():
            variants[name].teardown(state)
    return times, timed
