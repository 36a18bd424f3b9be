"""Block summaries that compare like with like where the ranks' placement sets a round's time
(``--dist-ab-stratify-cpu-sharing``; docs/design/ab.md#cpu-sharing-strata)."""

from __future__ import annotations

import statistics

Placement = list[bool]  # per round of a block: whether every rank's main thread was on one CPU


def block_placement(per_rank_cpus: list[list[int] | None]) -> Placement | None:
    """Per round of one block, whether every rank ran on one CPU after it (``per_rank_cpus``: each
    rank's CPU after each round, as the engine records them); None when a rank could not tell, or
    for one rank (nothing to share)."""
    if len(per_rank_cpus) < 2 or any(cpus is None for cpus in per_rank_cpus):
        return None
    return [len(set(cpus)) == 1 for cpus in zip(*per_rank_cpus)]


def pair_summaries(baseline: list[float], candidate: list[float], baseline_placement: Placement,
                   candidate_placement: Placement) -> tuple[float, float]:
    """One pair's two block summaries at the pair's own mix of strata. Only strata both blocks
    have count (their shares renormalised); when the blocks share none, the plain means (the
    engine's summary without stratification)."""
    if not baseline or not candidate:
        raise ValueError("a pair needs rounds in both blocks")
    if len(baseline_placement) != len(baseline) or len(candidate_placement) != len(candidate):
        raise ValueError("a block's placement needs one entry per round")
    strata = []
    for shared in (True, False):
        base = [t for t, s in zip(baseline, baseline_placement) if s == shared]
        cand = [t for t, s in zip(candidate, candidate_placement) if s == shared]
        if base and cand:
            strata.append((len(base) + len(cand), statistics.fmean(base), statistics.fmean(cand)))
    if not strata:
        return statistics.fmean(baseline), statistics.fmean(candidate)
    total = sum(count for count, _, _ in strata)
    return (sum(count * base for count, base, _ in strata) / total,
            sum(count * cand for count, _, cand in strata) / total)


def stratified_summaries(baseline_blocks: list[list[float]], candidate_blocks: list[list[float]],
                         baseline_placements: list[Placement | None],
                         candidate_placements: list[Placement | None]) -> tuple[list[float], list[float]] | None:
    """(baseline summaries, candidate summaries) for pairs of blocks in pair order
    (``baseline_blocks[i]`` ran next to ``candidate_blocks[i]``), or None when some block's
    placement is unknown (the case is then summarised by its plain means, all of it alike)."""
    if not len(baseline_blocks) == len(candidate_blocks) == len(baseline_placements) == len(candidate_placements):
        raise ValueError("stratified summaries need one block and one placement per side and pair")
    if any(p is None for p in (*baseline_placements, *candidate_placements)):
        return None
    pairs = [pair_summaries(b, c, bp, cp) for b, c, bp, cp in
             zip(baseline_blocks, candidate_blocks, baseline_placements, candidate_placements)]
    return [b for b, _ in pairs], [c for _, c in pairs]


def placement_text(placements: list[Placement | None]) -> str | None:
    """The placement of every round of a side, blocks in order, as one string ("1": the ranks shared
    a CPU, "0": they did not) for extra_info, so recorded runs can be replayed stratified; None
    when some block could not tell."""
    if any(p is None for p in placements):
        return None
    return "".join("1" if shared else "0" for block in placements for shared in block)


def placements_from_text(text: str, rounds_per_block: int) -> list[Placement]:
    """:func:`placement_text` read back, block by block."""
    if set(text) - {"0", "1"} or rounds_per_block < 1 or len(text) % rounds_per_block:
        raise ValueError(f"a recorded placement is a string of 0 and 1, {rounds_per_block} per block")
    flags = [c == "1" for c in text]
    return [flags[i:i + rounds_per_block] for i in range(0, len(flags), rounds_per_block)]
