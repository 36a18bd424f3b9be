"""Replay recorded A/B cases under two rules for the looks: Bonferroni (alpha / K at every look, the
rule before 2026-11-22) and the group-sequential levels ddpbench uses now (ddpbench.gates.stats.
sequential_levels; a case the time cap ended early tests its last look at stats.level_for_last_look,
which the replay applies where the recorded case ended before its last planned look without the
planned level: inconclusive, or decided at a level the cap raised).
Each case's blocks are rebuilt from its saved rounds (the candidate's pytest-benchmark data, the
baseline's raw rounds in extra_info["ab"]), summarised as the engine does (each block's mean round;
--block-summary median: the rule before 2026-11-22's last change) and analysed again look by
look, exactly as the engine would have, up to the pairs the recorded run took: a case that stopped
early ("same" or "regression") cannot be continued, so a rule that would have looked further is
judged on fewer pairs than it would have had. A case recorded with extra looks (past its planned
looks, ABSettings.extra_stage_sizes) is replayed through them too, each at EXTRA_LOOK_LEVEL.

    .venv/bin/python lab/reference/ab_replay.py /tmp/ddpbench-ab-reliability   # ab_reliability.py's --out
    .venv/bin/python lab/reference/ab_replay.py DIR --scale 1.10   # candidate blocks 10% slower
    .venv/bin/python lab/reference/ab_replay.py DIR --block-summary median
    .venv/bin/python lab/reference/ab_replay.py DIR --pool-pair-share 0.5   # each pool pair over half the threshold
    .venv/bin/python lab/reference/ab_replay.py DIR --without-minima-rule   # block minima need not move
    .venv/bin/python lab/reference/ab_replay.py DIR --before-not-slower     # the verdicts before not-slower
    .venv/bin/python lab/reference/ab_replay.py DIR --stratify-placement    # like placements with like
    .venv/bin/python lab/reference/ab_replay.py DIR --without-stop-levels   # same / not-slower by the interval alone

--scale multiplies the candidate's block summaries (a slowdown with the recorded noise, not a real
one; ab_reliability.py --inject measures the real thing). Each rule's line ends with the share of
cases it decided (every verdict but inconclusive) and the median width of their last intervals
(high / low), the figures to compare with and without --before-not-slower or --stratify-placement.
--before-not-slower replays the vocabulary before not-slower existed: such an interval was
inconclusive and the case went on looking. Replayed from runs recorded under the current rule, a
case that stopped at not-slower cannot be continued (as above). A run budget
(--dist-ab-run-budget) cannot be replayed: the recorded pairs are the ones its caps allowed.
--stratify-placement (as --dist-ab-stratify-cpu-sharing) needs runs that kept each round's placement
(extra_info ab.baseline / ab.candidate ``shared_cpu_rounds``); a case recorded without it is
replayed unstratified, and the line says how many were.
Each look may end a case as same or not-slower only at its stop level (ABSettings.stop_level_per_look);
--without-stop-levels replays the rule before 2026-11-26, where the interval alone decided that.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from typing import NamedTuple

from ddpbench.gates import stats
from ddpbench.gates.ab import placement_strata
from ddpbench.gates.ab.pairs_loop import BLOCK_SUMMARY, EXTRA_LOOK_LEVEL, ABSettings, SideRounds

BLOCK_SUMMARIES = {
    "mean": lambda rounds: rounds.block_means,  # the engine's
    "median": lambda rounds: [statistics.median(block) for block in rounds.blocks],
}


def _cap_ended(ab: dict, pairs: int) -> bool:
    """Whether the time cap ended the recorded case: before its last planned look, either
    inconclusive or decided at a last look tested above its planned level."""
    settings = ABSettings()
    if pairs >= settings.max_pairs:  # every planned look taken (extra looks, if any, came after)
        return False
    if ab.get("verdict") == "inconclusive":
        return True
    applied = ab.get("alpha_per_look")
    if not isinstance(applied, list) or not applied:  # saved before the levels were recorded per look
        return False
    planned = settings.alpha_per_look(len(set(ab.get("pool_pair_of_pair") or [0])))
    return len(applied) <= len(planned) and applied[-1] > planned[len(applied) - 1] * (1 + 1e-6)


def recorded_ab_cases(folder: str):
    """(case, its extra_info["ab"]) for every A/B case of the run*.json files in ``folder``, run by run."""
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("run") and name.endswith(".json")):
            continue
        with open(os.path.join(folder, name)) as fh:
            data = json.load(fh)
        for case in data["benchmarks"]:
            ab = case.get("extra_info", {}).get("ab")
            if ab:
                yield case, ab


class RecordedCase(NamedTuple):
    name: str
    baseline: list[float]  # block summaries, pair by pair
    candidate: list[float]
    pools: list[int]  # the pool pair of each pair
    threshold: float
    capped: bool  # whether the time cap ended the recorded case
    order: list[str]  # each pair's order: "AB" (baseline first) or "BA"
    baseline_minima: list[float]  # each block's fastest round
    candidate_minima: list[float]
    baseline_blocks: list[list[float]]  # each block's rounds (--stratify-placement summarises them anew)
    candidate_blocks: list[list[float]]
    baseline_placements: list[list[bool]] | None  # per block, per round: the ranks shared a CPU (None: not kept)
    candidate_placements: list[list[bool]] | None


def recorded_cases(folder: str, block_summary: str = BLOCK_SUMMARY):
    """Every A/B case of ``folder`` saved with all its rounds, as a :class:`RecordedCase`."""
    summarise = BLOCK_SUMMARIES[block_summary]
    for case, ab in recorded_ab_cases(folder):
        pairs, per_block = ab["pairs"], ab["rounds_per_block"]
        baseline, candidate = ab["baseline"]["round_times"], case["stats"].get("data") or []
        if len(baseline) != pairs * per_block or len(candidate) != pairs * per_block:
            continue  # saved without every round: nothing to rebuild the blocks from

        def rounds(times):
            return SideRounds(blocks=[times[i * per_block:(i + 1) * per_block] for i in range(pairs)])

        base, cand = rounds(baseline), rounds(candidate)

        def placements(side):
            text = (ab.get(side) or {}).get("shared_cpu_rounds")
            if not text or len(text) != pairs * per_block:
                return None
            return placement_strata.placements_from_text(text, per_block)

        yield RecordedCase(case["name"], summarise(base), summarise(cand),
                           ab.get("pool_pair_of_pair") or [0] * pairs, ab["threshold"], _cap_ended(ab, pairs),
                           ab["order"].split() if ab.get("order") else [], base.block_minima, cand.block_minima,
                           base.blocks, cand.blocks, placements("baseline"), placements("candidate"))


def replay(baseline, candidate, pools, threshold, levels, stage_size,
           pool_pair_share: float = stats.POOL_PAIR_SHARE, minima=None, blocks=None, scale: float = 1.0,
           before_not_slower: bool = False, stop_levels=None) -> tuple[str, int]:
    """The verdict and the pairs it took, looking after every stage as the engine does (``levels``:
    one per look the recorded pairs reach; ``minima``: both sides' block minima, for the rule that
    a change must show in them too, or None to replay without it)."""
    verdict, seen, _ = replay_result(baseline, candidate, pools, threshold, levels, stage_size, pool_pair_share,
                                     minima, blocks, scale, before_not_slower, stop_levels)
    return verdict, seen


def replay_result(baseline, candidate, pools, threshold, levels, stage_size,
                  pool_pair_share: float = stats.POOL_PAIR_SHARE, minima=None, blocks=None, scale: float = 1.0,
                  before_not_slower: bool = False, stop_levels=None):
    """(verdict, pairs taken, the last look's stats.PairedResult or None). ``stage_size``: the
    pairs every look adds, or a list of them look by look (the planned stages, then the extra
    looks'). ``blocks``: both sides'
    rounds and placements per block (baseline rounds, candidate rounds, baseline placements,
    candidate placements), to summarise each look's pairs by placement as
    --dist-ab-stratify-cpu-sharing does, instead of ``baseline`` / ``candidate``; ``scale``
    multiplies the candidate's summaries; ``before_not_slower``: a not-slower interval reads
    inconclusive and the looks go on, as before that verdict existed; ``stop_levels``: each look's
    stop level (ABSettings.stop_level_per_look), or None for the rule before 2026-11-26."""
    verdict, seen, result = "inconclusive", 0, None
    sizes = [stage_size] * len(levels) if isinstance(stage_size, int) else list(stage_size)
    for look, (level, size) in enumerate(zip(levels, sizes)):
        seen += size
        if blocks is None:
            base, cand = baseline[:seen], [c * scale for c in candidate[:seen]]
        else:
            base, cand = placement_strata.stratified_summaries(blocks[0][:seen], [[t * scale for t in block]
                                                                        for block in blocks[1][:seen]],
                                                     blocks[2][:seen], blocks[3][:seen])
        both = {} if minima is None else {"baseline_minima": minima[0][:seen], "candidate_minima": minima[1][:seen]}
        result = stats.analyse_pairs(base, cand, threshold, level, pool_pair_of=pools[:seen],
                                     pool_pair_share=pool_pair_share,
                                     stop_level=None if stop_levels is None else stop_levels[look], **both)
        verdict = result.verdict
        if before_not_slower and verdict == stats.NOT_SLOWER:
            verdict = "inconclusive"
        if verdict != "inconclusive":
            break
    return verdict, seen, result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder of run*.json files from ab_reliability.py")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the candidate's blocks (e.g. 1.10)")
    parser.add_argument("--block-summary", choices=sorted(BLOCK_SUMMARIES), default=BLOCK_SUMMARY,
                        help=f"how a block of rounds becomes one number (default: the engine's, {BLOCK_SUMMARY})")
    parser.add_argument("--pool-pair-share", type=float, default=stats.POOL_PAIR_SHARE,
                        help="share of the threshold every pool pair's own ratio must show for a regression "
                             f"(default: the engine's, {stats.POOL_PAIR_SHARE:g})")
    parser.add_argument("--without-minima-rule", action="store_true",
                        help="replay without the engine's rule that a change must show in the block minima too "
                             "(the rule before 2026-11-23)")
    parser.add_argument("--before-not-slower", action="store_true",
                        help="replay the verdicts before not-slower: an interval whose upper end is within the "
                             "threshold but whose lower end is not reads inconclusive, and the looks go on")
    parser.add_argument("--stratify-placement", action="store_true",
                        help="summarise each pair's blocks at the pair's own mix of placements (rounds where "
                             "the ranks shared a CPU, rounds where they did not; --dist-ab-stratify-cpu-sharing) "
                             "instead of by the block summary")
    parser.add_argument("--without-stop-levels", action="store_true",
                        help="replay the rule before 2026-11-26: same / not-slower whenever the interval allows, "
                             "not only when the pairs rule out a slowdown of the threshold at the look's stop level")
    args = parser.parse_args(argv)
    cases = list(recorded_cases(args.folder, block_summary=args.block_summary))
    if not cases:
        raise SystemExit(f"no A/B cases with all their rounds in {args.folder}")
    settings = ABSettings()
    verdicts = [v for v in stats.VERDICTS if not (args.before_not_slower and v == stats.NOT_SLOWER)]
    for rule in ("bonferroni", "sequential"):
        counts = {verdict: 0 for verdict in verdicts}
        flagged, widths, unstratified = [], [], 0
        for case in cases:
            sizes = settings.stage_sizes(len(set(case.pools)))
            looks, reached = len(sizes), min(len(sizes), len(case.baseline) // sizes[0])
            if rule == "bonferroni":
                levels = [settings.alpha / looks] * reached
            else:
                levels = list(stats.sequential_levels(settings.alpha, looks)[:reached])
                if case.capped and reached:
                    levels[-1] = stats.level_for_last_look(settings.alpha, looks, reached)
            # The extra looks the recorded case took after its planned ones (at EXTRA_LOOK_LEVEL;
            # every extra look adds the same pairs).
            extra = settings.extra_stage_sizes(len(set(case.pools)))
            past_planned = len(case.baseline) - sum(sizes) if reached == looks else 0
            taken = min(len(extra), past_planned // extra[0]) if extra else 0
            levels += [EXTRA_LOOK_LEVEL] * taken
            minima = None if args.without_minima_rule else (case.baseline_minima,
                                                            [c * args.scale for c in case.candidate_minima])
            blocks = None
            if args.stratify_placement and case.baseline_placements and case.candidate_placements:
                blocks = (case.baseline_blocks, case.candidate_blocks, case.baseline_placements,
                          case.candidate_placements)
            unstratified += args.stratify_placement and blocks is None
            stop_levels = None if args.without_stop_levels else settings.stop_level_per_look(len(set(case.pools)))
            verdict, seen, result = replay_result(case.baseline, case.candidate, case.pools, case.threshold, levels,
                                                  sizes + extra[:taken], args.pool_pair_share, minima, blocks, args.scale,
                                                  args.before_not_slower, stop_levels)
            counts[verdict] += 1
            if result is not None and math.isfinite(result.ci_high) and result.ci_low > 0:
                widths.append(result.ci_high / result.ci_low)
            if verdict in ("regression", "improvement") and args.scale == 1.0:
                flagged.append(f"{case.name} {verdict} after {seen} pairs")
        summary = ", ".join(f"{count} {verdict}" for verdict, count in counts.items())
        decided = len(cases) - counts["inconclusive"]
        width = f"{statistics.median(widths):.3f}" if widths else "-"
        print(f"{rule:10s} {len(cases)} cases: {summary}; decided {decided} of {len(cases)} "
              f"({100 * decided / len(cases):.0f}%); median interval width (high / low) {width}"
              + (f"; {unstratified} case(s) recorded without each round's placement, replayed unstratified"
                 if unstratified else ""))
        for line in flagged:
            print(f"           {line}")


if __name__ == "__main__":
    main()
