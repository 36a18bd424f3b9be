"""Rank-side tasks of an A/B case: the steps of :class:`ddpbench.engine.timing.RankSession` as separate
pool tasks, so that the two sides' blocks can alternate while each side's workload state stays
alive in its ranks (ctx.scratch, under the case's key)."""

from __future__ import annotations

from ...engine.timing import RankSession


def start(ctx, key: str, workload, plan) -> dict:
    """Set-up and warm-up; returns ``estimate_s`` (the fastest warm-up round, max over ranks, all
    its ops), ``ops_per_round`` (what "auto" chose) and ``census`` / ``memory`` / ``numerics`` (this rank's
    records, or None: the plan asked for none)."""
    stop(ctx, key)  # a session a failed case left behind
    session = RankSession(ctx, workload, plan)
    ctx.scratch[key] = session
    try:
        session.start()
        session.replay_numerics(rebuild=True)  # both sides alike, before any block: decided at the first look
    except BaseException:
        ctx.scratch.pop(key, None)
        session.close()
        raise
    return {"estimate_s": session.round_estimate_s, "ops_per_round": session.ops_per_round,
            "census": session.census, "memory": session.memory_census, "numerics": session.numerics}


def numerics_again(ctx, key: str) -> dict:
    """The numerics' second replay, asked for where a lone first replay (``plan.numerics_replays``
    1) differs from the other side's: the state is torn down, replayed, built and warmed up anew
    (as in :func:`start`); returns ``numerics``, this rank's record of both replays."""
    session = ctx.scratch[key]
    try:
        session.replay_numerics_again(rebuild=True)
    except BaseException:
        ctx.scratch.pop(key, None)
        session.close()
        raise
    return {"numerics": session.numerics}


def block(ctx, key: str, rounds: int, fresh_state: bool = False) -> tuple[list[float], list | None]:
    """One block of recorded rounds: (this rank's round times, its CPU per round); with
    ``fresh_state``, the workload is set up anew (and warmed up one round) first, untimed."""
    session = ctx.scratch[key]
    if fresh_state:
        session.refresh()
    return session.record(rounds)


def finish(ctx, key: str) -> dict:
    """Metrics, the workload's check and teardown; returns this rank's metrics."""
    return ctx.scratch.pop(key).finish()


def stop(ctx, key: str) -> None:
    """Tear the session down without checking (the case failed on the other side)."""
    session = ctx.scratch.pop(key, None)
    if session is not None:
        session.close()
