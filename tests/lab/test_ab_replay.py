"""lab/reference/ab_replay.py: recorded A/B cases analysed again, look by look, under both rules."""

import json
import random

import pytest

from ddpbench.gates.ab.pairs_loop import ABSettings
from helpers.lab_scripts import load_lab_script


@pytest.fixture(scope="module")
def replay_script():
    return load_lab_script("ab_replay")


def _recorded_case(name, slower, pairs=48, per_block=5, seed=1, verdict=None, alpha_per_look=None):
    """A case as ab_reliability.py saves it: the candidate's rounds in stats.data, the baseline's in
    extra_info["ab"], two pool pairs taking turns; candidate rounds ``slower`` x the baseline's."""
    rng = random.Random(seed)
    baseline = [0.010 * rng.uniform(0.95, 1.05) for _ in range(pairs * per_block)]
    candidate = [0.010 * slower * rng.uniform(0.95, 1.05) for _ in range(pairs * per_block)]
    ab = {"pairs": pairs, "rounds_per_block": per_block, "threshold": 0.05,
          "pool_pair_of_pair": [i % 2 for i in range(pairs)], "baseline": {"round_times": baseline}}
    if verdict:
        ab["verdict"] = verdict
    if alpha_per_look:
        ab["alpha_per_look"] = alpha_per_look
    return {"name": name, "stats": {"data": candidate}, "extra_info": {"ab": ab}}


def test_replay_flags_a_real_slowdown_and_not_identical_sides(tmp_path, replay_script, capsys):
    cases = [_recorded_case("test_slow", 1.3), _recorded_case("test_same", 1.0, seed=2)]
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": cases}))
    rebuilt = list(replay_script.recorded_cases(str(tmp_path)))
    assert [name for name, *_ in rebuilt] == ["test_slow", "test_same"]
    replay_script.main([str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    # Bonferroni flags the 30% slowdown at the first look; the sequential levels need more pairs.
    assert out[0].startswith("bonferroni 2 cases: 1 regression, 0 improvement, 1 same")
    assert "test_slow regression after 12 pairs" in out[1]
    sequential = out.index(next(line for line in out if line.startswith("sequential")))
    assert out[sequential].startswith("sequential 2 cases: 1 regression, 0 improvement, 1 same")
    assert "test_slow regression after 24 pairs" in out[sequential + 1] or \
        "test_slow regression after 36 pairs" in out[sequential + 1]
    # --scale slows the candidate's recorded blocks: the identical case becomes a regression too.
    replay_script.main([str(tmp_path), "--scale", "1.3"])
    assert capsys.readouterr().out.splitlines()[0].startswith("bonferroni 2 cases: 2 regression")


def test_a_case_the_time_cap_ended_is_replayed_with_the_rest_of_alpha_at_its_last_look(tmp_path, replay_script,
                                                                                      capsys):
    # Recorded inconclusive after 12 pairs (the cap ended it at look 1): the sequential rule tests
    # that look at alpha itself, and 12 pairs of a 30% slowdown (p = 2 / 2**12) pass it; Bonferroni's
    # alpha / 8 passes it too. Recorded as "same" after 12 pairs (not cut by the cap), the look
    # keeps its planned near-zero level.
    cases = [_recorded_case("test_capped", 1.3, pairs=12, verdict="inconclusive"),
             _recorded_case("test_stopped", 1.3, pairs=12, verdict="same")]
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": cases}))
    replay_script.main([str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    sequential = out.index(next(line for line in out if line.startswith("sequential")))
    assert out[sequential].startswith("sequential 2 cases: 1 regression, 0 improvement, 0 same, 0 not-slower, 1 inconclusive")
    assert "test_capped regression after 12 pairs" in out[sequential + 1]


def test_a_case_decided_at_a_level_the_cap_raised_counts_as_cap_ended(replay_script):
    planned = ABSettings().alpha_per_look(2)
    raised = {"verdict": "regression", "pool_pair_of_pair": [0, 1], "alpha_per_look": [planned[0], 0.0099]}
    assert replay_script._cap_ended(raised, pairs=24)
    kept = dict(raised, alpha_per_look=list(planned[:2]))
    assert not replay_script._cap_ended(kept, pairs=24)
    assert replay_script._cap_ended({"verdict": "inconclusive"}, pairs=24)
    assert not replay_script._cap_ended({"verdict": "inconclusive"}, pairs=ABSettings().max_pairs)
    assert not replay_script._cap_ended({"verdict": "same", "alpha_per_look": 0.01}, pairs=24)  # older files


def _two_mode_case(name, slow_rounds_candidate, pairs=24, per_block=25):
    """Rounds in two modes (1 and 3 ms): the baseline's blocks have 12 slow rounds of 25, the
    candidate's ``slow_rounds_candidate``."""
    rng = random.Random(len(name))

    def rounds(slow):
        return [(3e-3 if i < slow else 1e-3) * rng.uniform(0.995, 1.005) for _ in range(pairs) for i in range(per_block)]

    ab = {"pairs": pairs, "rounds_per_block": per_block, "threshold": 0.05, "verdict": "same",
          "pool_pair_of_pair": [i % 2 for i in range(pairs)], "baseline": {"round_times": rounds(12)}}
    return {"name": name, "stats": {"data": rounds(slow_rounds_candidate)}, "extra_info": {"ab": ab}}


def test_replay_summarises_blocks_by_their_mean_as_the_engine_does_or_by_the_median(tmp_path, replay_script, capsys):
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": [_two_mode_case("test_one_round_moved", 13)]}))
    replay_script.main([str(tmp_path)])
    assert "1 same" in capsys.readouterr().out.splitlines()[0]
    # By block medians one moved round reads as a 3x regression; the engine's rule that the block
    # minima must move too (they did not) holds it back unless the replay leaves that rule out.
    replay_script.main([str(tmp_path), "--block-summary", "median"])
    assert capsys.readouterr().out.splitlines()[0].startswith("bonferroni 1 cases: 0 regression")
    replay_script.main([str(tmp_path), "--block-summary", "median", "--without-minima-rule"])
    assert capsys.readouterr().out.splitlines()[0].startswith("bonferroni 1 cases: 1 regression")


def test_replay_of_a_folder_without_ab_cases_says_so(tmp_path, replay_script):
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": [{"name": "x", "extra_info": {}}]}))
    with pytest.raises(SystemExit, match="no A/B cases"):
        replay_script.main([str(tmp_path)])


def test_replay_asks_each_pool_pair_for_the_threshold_as_the_engine_does_or_for_a_share(tmp_path, replay_script,
                                                                                        capsys):
    # The candidate is 8% slower on pool pair 0 and 3.5% on pool pair 1 (about 5.7% overall): the
    # engine's rule (each pool pair over the whole threshold) waits; half the threshold per pool
    # pair makes it a regression.
    rng = random.Random(9)
    pairs, per_block = 48, 5
    pools = [i % 2 for i in range(pairs)]
    baseline = [0.010 * rng.uniform(0.95, 1.05) for _ in range(pairs * per_block)]
    candidate = [0.010 * (1.08 if pools[i // per_block] == 0 else 1.035) * rng.uniform(0.95, 1.05)
                 for i in range(pairs * per_block)]
    ab = {"pairs": pairs, "rounds_per_block": per_block, "threshold": 0.05, "pool_pair_of_pair": pools,
          "baseline": {"round_times": baseline}, "verdict": "regression"}
    case = {"name": "test_uneven", "stats": {"data": candidate}, "extra_info": {"ab": ab}}
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": [case]}))
    replay_script.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "sequential 1 cases: 0 regression, 0 improvement, 0 same, 0 not-slower, 1 inconclusive" in out
    replay_script.main([str(tmp_path), "--pool-pair-share", "0.5"])
    out = capsys.readouterr().out
    assert "sequential 1 cases: 1 regression" in out


def _line(out, rule):
    return next(line for line in out.splitlines() if line.startswith(rule))


def test_replay_under_the_verdicts_before_not_slower_keeps_looking(tmp_path, replay_script, capsys):
    # 7% faster: after the first stage the interval lies below 1.05 (not-slower now, the case
    # stops), but an improvement needs more pairs than the first look's level allows.
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": [_recorded_case("test_faster", 0.93)]}))
    replay_script.main([str(tmp_path)])
    now = _line(capsys.readouterr().out, "sequential")
    assert "0 improvement, 0 same, 1 not-slower, 0 inconclusive; decided 1 of 1 (100%)" in now
    replay_script.main([str(tmp_path), "--before-not-slower"])
    before = _line(capsys.readouterr().out, "sequential")
    assert "not-slower" not in before
    assert "1 improvement" in before or "1 inconclusive" in before  # it went on looking


def _placed_case(name, seed, pairs=24, per_block=20, scale=1.0, keep_placement=True):
    """An A/A case (candidate ``scale`` x) in two placements: rounds 1 ms when the ranks shared a
    CPU, 3 ms apart, each block's share apart drawn anew; its placement kept as the engine keeps it."""
    rng = random.Random(seed)

    def side(factor):
        times, flags = [], ""
        for _ in range(pairs):
            apart = rng.uniform(0.2, 0.8)
            for _ in range(per_block):
                shared = rng.random() >= apart
                times.append((1e-3 if shared else 3e-3) * factor * rng.uniform(0.99, 1.01))
                flags += "1" if shared else "0"
        return times, flags

    (base, base_flags), (cand, cand_flags) = side(1.0), side(scale)
    ab = {"pairs": pairs, "rounds_per_block": per_block, "threshold": 0.05, "verdict": "inconclusive",
          "pool_pair_of_pair": [i % 2 for i in range(pairs)], "baseline": {"round_times": base}, "candidate": {}}
    if keep_placement:
        ab["baseline"]["shared_cpu_rounds"], ab["candidate"]["shared_cpu_rounds"] = base_flags, cand_flags
    return {"name": name, "stats": {"data": cand}, "extra_info": {"ab": ab}}


def test_replay_stratified_by_placement_narrows_two_placement_intervals(tmp_path, replay_script, capsys):
    cases = [_placed_case(f"test_aa{i}", seed=i) for i in range(3)]
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": cases}))
    replay_script.main([str(tmp_path)])
    plain = _line(capsys.readouterr().out, "sequential")
    replay_script.main([str(tmp_path), "--stratify-placement"])
    stratified = _line(capsys.readouterr().out, "sequential")
    assert "3 same" in stratified and "3 same" not in plain

    def width(line):
        return float(line.split("median interval width (high / low) ")[1].split(";")[0])

    assert width(stratified) < 1.02 < 1.1 < width(plain)
    # A 10% slowdown of every round still reads as one.
    replay_script.main([str(tmp_path), "--stratify-placement", "--scale", "1.1"])
    assert "3 regression" in _line(capsys.readouterr().out, "sequential")
    # A case recorded without each round's placement is replayed as it was, and said so.
    (tmp_path / "run01.json").write_text(json.dumps({"benchmarks": [_placed_case("test_old", 7, keep_placement=False)]}))
    replay_script.main([str(tmp_path), "--stratify-placement"])
    assert "1 case(s) recorded without each round's placement, replayed unstratified" in \
        _line(capsys.readouterr().out, "sequential")


def test_the_replay_applies_each_looks_stop_level_unless_asked_for_the_rule_before(tmp_path, replay_script, capsys):
    # 12 pairs 2.5% slower in steady blocks: the interval ends at 1.044, within the threshold, but
    # 12 pairs do not rule out 5% at the first look's stop level (the bound ends at 1.054).
    cases = [_recorded_case("test_near", 1.025, pairs=12, verdict="not-slower")]
    (tmp_path / "run00.json").write_text(json.dumps({"benchmarks": cases}))
    replay_script.main([str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("sequential 1 cases: 0 regression, 0 improvement, 0 same, 0 not-slower, 1 inconclusive")
    replay_script.main([str(tmp_path), "--without-stop-levels"])
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("sequential 1 cases: 0 regression, 0 improvement, 1 same")
