"""A step that trains nothing, said beside its case: when the numerics replay
(``extra_info["numerics"]``, :mod:`.numerics`) shows every parameter bitwise the same after each of
its steps as after set-up, on every rank, the case records why in ``parameters_unchanged`` and the
run's summary shows it (all gradients zero, a frozen model, an optimizer given other parameters).
Such a case times a step, but not a training step, and passes every other check."""

from __future__ import annotations

from typing import Any

#: The names the replay gives a module's parameters and their gradients (:class:`.numerics.Fingerprint`).
PARAM, GRAD = "param ", "grad "


def unchanged_parameters(record: Any) -> str | None:
    """Why no parameter changed over the replay's steps on any rank, or None: when some did, when
    the state has no parameters (a collective), or when the record cannot say (none, not counted,
    unreadable, no steps)."""
    from ..storage.records import Numerics, RecordError, read_numerics

    if record is None:
        return None
    try:
        numerics = read_numerics(record)
    except RecordError:
        return None
    if not isinstance(numerics, Numerics) or numerics.steps < 1 or not numerics.ranks:
        return None
    params = 0
    for steps in numerics.ranks:
        start = {name: figures[0] for name, figures in steps[0].items() if name.startswith(PARAM)}
        params += len(start)
        for step in steps[1:]:
            if any(step.get(name, [None])[0] != digest for name, digest in start.items()):
                return None
    if not params:
        return None
    grads = [figures for steps in numerics.ranks for step in steps[1:] for name, figures in step.items()
             if name.startswith(GRAD)]
    if not grads:
        why = "no parameter received a gradient (a frozen model, or a loss that does not reach them)"
    elif all(figures[2] == 0 for figures in grads):  # the L1 norm: every element zero
        why = "every gradient was zero"
    else:
        why = ("the gradients were not zero, yet nothing moved the parameters (an optimizer given other "
               "parameters, a learning rate of 0, or no optimizer step)")
    steps = f"{numerics.steps} replayed step{'s' if numerics.steps != 1 else ''}"
    ranks = f"{len(numerics.ranks)} rank{'s' if len(numerics.ranks) != 1 else ''}"
    return f"no parameter changed over {steps} on {ranks}: {why}"
