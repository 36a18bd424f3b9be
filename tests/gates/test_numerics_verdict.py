"""The numerics verdict (ddpbench.gates.numerics) on records made here: bitwise same, within the
baseline's own replay band or a tolerance, changed (naming the first step, the largest relative
difference and the tensor), not counted (a side without a record, a set-up not reproducible), a
damaged record (bad input, exit 2), and both gates deciding on it (exit 1, accepted: exit 0)."""

from __future__ import annotations

import copy
import json

import pytest

from ddpbench import cli
from ddpbench.engine.numerics import combine_numerics
from ddpbench.gates import verdicts
from ddpbench.gates.numerics import compare_numerics
from ddpbench.storage.records import RecordError, read_numerics


def _rank(scale: float = 1.0, loss: float = 2.0, spread: float = 0.0, first=None) -> dict:
    """One rank's record of 2 steps: a weight and its gradient, the loss; ``scale`` multiplies the
    gradient from step 1 on (a change of the reduction)."""
    steps = [{"param w": ["p0", 4.0, 8.0, 1.0]}]
    for s in (1, 2):
        grad = [f"g{s}-{scale}", 2.0 * scale, 4.0 * scale, -1.0 * scale]
        steps.append({"param w": [f"p{s}-{scale}", 4.0 - s * scale * 0.1, 8.0, 1.0], "grad w": grad,
                      "loss": [f"l{s}-{scale}-{loss}", loss / s, loss / s, loss / s]})
    digests = [str(sorted(step.items())) for step in steps]
    return {"version": 1, "seed": 0, "steps": 2, "replays": 2, "digests": digests, "tensors": steps,
            "replay_spread": spread, "first_nondeterministic_step": first}


def _case(**kwargs) -> dict:
    return combine_numerics([_rank(**kwargs), _rank(**kwargs)])


def test_equal_digests_are_same_bitwise():
    verdict = compare_numerics(_case(), _case())
    assert (verdict.verdict, verdict.line) == ("same", "same (bitwise): 2 steps on 2 ranks, 3 tensors")


def test_a_change_names_its_first_step_the_largest_difference_and_the_tensor():
    verdict = compare_numerics(_case(), _case(scale=2.0))  # gradients summed over 2 ranks, not averaged
    assert verdict.verdict == "regression"
    assert verdict.line.startswith("changed from step 1 of 2")
    assert "largest relative difference 1 (100%) in grad w at step 1 on rank 0" in verdict.line
    assert verdict.fails


def test_the_loss_is_named_when_it_moved():
    verdict = compare_numerics(_case(), _case(loss=1.0))
    assert verdict.verdict == "regression" and "loss at step 1 2 → 1" in verdict.line


def test_a_record_without_a_band_counts_any_bit_and_the_tolerance_reads_rounding():
    moved = _case(scale=1.000001)
    changed = compare_numerics(_case(), moved)  # a bitwise baseline without a band: any change counts
    assert changed.verdict == "regression" and "measured no band and its replays are bitwise equal" in changed.line
    tolerated = compare_numerics(_case(), moved, tolerance=1e-5)
    assert tolerated.verdict == "same" and tolerated.line.startswith("rounding: bits differ from step 1 of 2")
    assert "tolerance 0.001%" in tolerated.line and tolerated.outcome == "rounding"
    assert tolerated.ratio == pytest.approx(0.1, rel=1e-3)
    noisy = compare_numerics(_case(spread=1e-5, first=1), moved)  # replays that differ decide nothing from there
    assert noisy.verdict == "not counted" and "its replays differ from step 1" in noisy.line


def test_another_set_of_tensors_is_a_change_naming_them():
    rank = _rank()
    for step in rank["tensors"][1:]:
        del step["grad w"]  # a parameter left out of the backward
    rank["digests"] = [d + "x" for d in rank["digests"]]
    rank["digests"][0] = _rank()["digests"][0]
    cur = combine_numerics([rank, copy.deepcopy(rank)])
    verdict = compare_numerics(_case(), cur)
    assert verdict.verdict == "regression" and "only the baseline holds grad w" in verdict.line


def test_what_cannot_be_compared_is_not_counted():
    assert compare_numerics(None, _case()).line == "the baseline recorded no numerics replay"
    assert compare_numerics(None, None).line == "neither side recorded a numerics replay"
    lost = dict(_case(), not_reproducible="rank 0: the freshly set-up state differs between two replays")
    verdict = compare_numerics(_case(), lost)  # counted on the baseline only: a regression until accepted
    assert verdict.verdict == "regression" and "not reproducible under fixed seeds" in verdict.line
    assert compare_numerics(lost, lost).verdict == "not counted"
    unknown = compare_numerics(_case(), dict(_case(), version=4))
    assert unknown.verdict == "not counted" and "numerics version 4 (this ddpbench reads versions 1, 2, 3)" in unknown.line
    one_rank = combine_numerics([_rank()])
    assert compare_numerics(_case(), one_rank).verdict == "not counted"
    assert compare_numerics(_case(), combine_numerics([_rank(), None])).verdict == "not counted"


@pytest.mark.parametrize("damage, message", [
    (lambda r: r.update(digests="abc"), r"numerics.digests is 'abc', expected a list of digests"),
    (lambda r: r["tensors"][0][1].__setitem__(r["names"].index("grad w"), "g1 2.0 x 1.0"),
     r"numerics.tensors\[0\]\[1\]\[1\] \(grad w\) is 'g1 2.0 x 1.0', expected '<digest> <l2> <l1> <sum>' or null"),
    (lambda r: r["tensors"][0][1].__setitem__(0, ["p1", 1.0, 1.0, 1.0]), r"numerics.tensors\[0\]\[1\]\[0\] \(param w\) is"),
    (lambda r: r["tensors"][0][1].__setitem__(0, 0), r"numerics.tensors\[0\]\[1\]\[0\] \(param w\) is 0"),
    (lambda r: r["tensors"][0][2].pop(), r"numerics.tensors\[0\]\[2\] is .*, expected a list of 3 cells"),
    (lambda r: r["tensors"][1].__setitem__(1, []), r"numerics.tensors\[1\]\[1\] is \[\], expected an object"),
    (lambda r: r["tensors"][1][1].update(v="d 1.0 1.0 1.0"), r"numerics.tensors\[1\]\[1\].v is not one of its names"),
    (lambda r: r["tensors"][1][1].update({"grad w": 5}), r"numerics.tensors\[1\]\[1\].grad w is 5, expected"),
    (lambda r: r.pop("names"), r"numerics.names is missing"),
    (lambda r: r.update(ranks=3), r"numerics.tensors holds 2 ranks, expected 3 \(its ranks\)"),
    (lambda r: r["rank_digests"].pop(), r"numerics.rank_digests holds 1 ranks, expected 2"),
    (lambda r: r.update(rank_digests=["x"]), r"numerics.rank_digests is \['x'\], expected per rank, a list"),
    (lambda r: r.update(replays=0), r"numerics.replays is 0, expected a whole number of replays >= 1"),
    (lambda r: r.update(seed="0"), r"numerics.seed is '0', expected a whole number"),
    (lambda r: r.update(names=[1, 2, 3]), r"numerics.names is \[1, 2, 3\], expected a list of distinct tensor names"),
    (lambda r: r.update(steps=5), r"numerics.digests holds 3 digests, expected 6"),
    (lambda r: r.update(replay_spread=-1), r"numerics.replay_spread is -1, expected a number >= 0"),
])
def test_a_damaged_record_is_named(damage, message):
    record = _case()
    damage(record)
    with pytest.raises(RecordError, match=message):
        compare_numerics(_case(), record)


def _version_1(case: dict) -> dict:
    """A case's record as ddpbench saved it before version 2: each rank's step as {name: figures},
    a later rank's only where it differs from rank 0's."""
    names = case["names"]
    def figures(text):
        return [text.split()[0], *map(float, text.split()[1:])]

    steps = [[{n: figures(c) for n, c in zip(names, cells) if c is not None} for cells in case["tensors"][0]]]
    steps += [[{n: figures(c) for n, c in cells.items() if c is not None} for cells in rank]
              for rank in case["tensors"][1:]]
    return {**{k: v for k, v in case.items() if k != "names"}, "version": 1, "tensors": steps}


def test_version_2_names_each_tensor_once_and_a_version_1_record_still_compares():
    from ddpbench.engine.numerics import NUMERICS_VERSION
    from ddpbench.storage.records import NUMERICS_VERSION as SAVED, READABLE_NUMERICS_VERSIONS

    case = _case()
    assert case["version"] == NUMERICS_VERSION == SAVED and READABLE_NUMERICS_VERSIONS == (1, 2, 3)
    assert case["names"] == ["param w", "grad w", "loss"]
    assert case["tensors"][0][0] == ["p0 4.0 8.0 1.0", None, None]  # no gradient at the set-up
    assert case["tensors"][1][1] == {}  # rank 1 holds rank 0's values: kept once
    old = _version_1(case)
    assert "names" not in old and old["tensors"][1][1] == {}
    names = [f"opt encoder.layers.{i}.self_attn.in_proj_weight.exp_avg_sq" for i in range(50)]
    many = dict(_rank(), tensors=[{n: [f"{i:08x}{s:08x}", 1.0 / (i + 1), 2.0 / (i + 3), 0.1 * i] for i, n in enumerate(names)}
                                  for s in range(3)])
    big = combine_numerics([many, copy.deepcopy(many)])
    for indent in (None, 4):  # a saved run's JSON is indented: a tensor's figures are one line there
        assert len(json.dumps(big, indent=indent)) < 0.75 * len(json.dumps(_version_1(big), indent=indent))
    odd = dict(_rank(), tensors=[{"w": ["d", float("nan"), float("inf"), -1e-300]}] * 3)
    assert read_numerics(combine_numerics([odd]), "numerics").ranks[0][2]["w"][1:] == [pytest.approx(float("nan"),
                                                                                          nan_ok=True), float("inf"), -1e-300]
    assert compare_numerics(old, case).line == "same (bitwise): 2 steps on 2 ranks, 3 tensors"
    assert compare_numerics(old, _case(scale=2.0)).line == compare_numerics(case, _case(scale=2.0)).line
    assert compare_numerics(_version_1(_case(scale=2.0)), case).verdict == "regression"
    other = _rank()
    other["tensors"][2]["loss"] = ["l-other", 9.0, 9.0, 9.0]  # rank 1's own loss differs
    mixed = combine_numerics([_rank(), other])
    assert mixed["tensors"][1][2] == {"loss": "l-other 9.0 9.0 9.0"}
    assert compare_numerics(_version_1(mixed), mixed).verdict == "same"
    fewer = copy.deepcopy(other)
    del fewer["tensors"][2]["grad w"]  # rank 1 lacks a tensor rank 0 holds
    lacking = combine_numerics([_rank(), fewer])
    assert lacking["tensors"][1][2] == {"grad w": None, "loss": "l-other 9.0 9.0 9.0"}
    assert "grad w" not in read_numerics(lacking, "numerics").ranks[1][2]


def test_the_decided_verdict_fails_on_it_and_an_accepted_change_passes():
    case = verdicts.CaseVerdict("test_step", "same")
    case.judge_numerics(compare_numerics(_case(), _case(scale=2.0)))
    assert case.verdict == "regression" and case.failed_by == ["numerics"]
    assert case.timing_verdict == "same"
    accepted = verdicts.CaseVerdict("test_step", "same")
    accepted.judge_numerics(compare_numerics(_case(), _case(scale=2.0)), accepted=True)
    assert accepted.verdict == "same" and accepted.numerics.accepted
    ab: dict = {}
    verdicts.record_decision(ab, case)
    assert ab["numerics_verdict"] == "regression" and ab["numerics_line"].startswith("changed from step 1")


def test_the_stored_gate_exits_1_on_a_change_and_0_when_accepted(tmp_path, capsys):
    from helpers.benchjson import after_quiet_history, bench, run_doc, write

    rounds = [0.010, 0.0101, 0.0099, 0.0100, 0.0102, 0.0098] * 3  # the same rounds: the timing reads same
    base, cur = after_quiet_history(tmp_path, run_doc([bench("test_step", rounds, {"numerics": _case()})]),
                                    run_doc([bench("test_step", rounds, {"numerics": _case(scale=2.0)})]))
    same = write(base.parent / "0007_same.json", run_doc([bench("test_step", rounds, {"numerics": _case()})]))
    assert cli.main(["compare", str(base), str(same)]) == 0
    assert "same (bitwise): 2 steps on 2 ranks, 3 tensors" in capsys.readouterr().out
    assert cli.main(["compare", str(base), str(cur)]) == 1
    out = capsys.readouterr().out
    assert "changed from step 1 of 2: largest relative difference 1 (100%) in grad w" in out
    assert "regression (numerics; timing same)" in out and "--accept-numerics-change accepts" in out
    assert cli.main(["compare", str(base), str(cur), "--accept-numerics-change"]) == 0
    assert "1 numerics change(s) accepted by --accept-numerics-change" in capsys.readouterr().out
    assert cli.main(["compare", str(base), str(cur), "--numerics-tolerance", "150%"]) == 0
    assert "rounding: bits differ" in capsys.readouterr().out
    damaged = _case()
    damaged["digests"] = 7
    bad = write(tmp_path / "bad.json", run_doc([bench("test_step", rounds, {"numerics": damaged})]))
    assert cli.main(["compare", str(base), str(bad)]) == 2
    assert "numerics.digests is 7" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # a usage error, exit status 2
        cli.main(["compare", str(base), str(cur), "--numerics-tolerance", "lots"])
    assert exited.value.code == 2


def test_an_ab_record_is_judged_against_its_baseline_s_replay():
    ab = {"verdict": "same", "timing_verdict": "same", "ratio": 1.0, "numerics_baseline": _case()}
    case = verdicts.ab_verdict("test_step", copy.deepcopy(ab), 0.01, numerics=_case(scale=2.0))
    assert case.verdict == "regression" and case.numerics.line.startswith("changed from step 1 of 2")
    assert verdicts.ab_verdict("test_step", copy.deepcopy(ab), 0.01, numerics=_case(scale=2.0),
                               accept_numerics_change=True).verdict == "same"
    broken = dict(ab, numerics_baseline=dict(_case(), tensors="x"))
    with pytest.raises(verdicts.VerdictError, match="ab.numerics_baseline.tensors"):
        verdicts.ab_verdict("test_step", broken, 0.01, numerics=_case())
    report = verdicts.format_text(verdicts.ab_report([case]))
    assert "numerics" in report.splitlines()[1] and json.dumps(verdicts.ab_report([case]).to_dict())


def _banded(scale: float = 1.0, lr: float = 1e-3, band=(1e-6, 1e-3), moved=(), clip=True) -> dict:
    """A 2-rank record of 2 steps with a band (step 1: ``band[0]``, step 2: ``band[1]`` for every
    group) and exact figures: each step's learning rate and whether the clip fired."""
    rank = _rank(scale)
    rank.update(band=[{}, {"param": band[0], "grad": band[0], "loss": band[0]},
                      {"param": band[1], "grad": band[1], "loss": band[1]}], band_replays=2,
                rounding_scalars=list(moved),
                scalars=[{"group 0 lr": lr, "group 0 params": 1}] + [
                    {"group 0 lr": lr * s, "group 0 params": 1, "workload clip fired": clip} for s in (1, 2)])
    return combine_numerics([rank, copy.deepcopy(rank)])


def test_the_band_measured_per_step_tells_rounding_from_a_change():
    from ddpbench.gates.numerics import BAND_MARGIN

    base = _banded()
    assert compare_numerics(base, _banded()).line == "same (bitwise): 2 steps on 2 ranks, 3 tensors"
    small = compare_numerics(base, _banded(scale=1 + 1e-6))  # within 4 x 1e-6 at step 1
    assert small.verdict == "same" and small.outcome == "rounding" and small.line.startswith("rounding: bits differ")
    assert 0 < small.ratio <= 1 and small.band == pytest.approx(BAND_MARGIN * 1e-6)
    assert "of the band" in small.line
    bug = compare_numerics(base, _banded(scale=0.5))
    assert bug.verdict == "regression" and bug.outcome == "changed" and bug.resolving_step == 1
    assert bug.ratio > 10 and "x the band (grad at step 1" in bug.line
    assert bug.to_record()["numerics_outcome"] == "changed" and bug.to_record()["numerics_ratio"] == bug.ratio
    # a difference step 2's band holds but step 1's does not: judged step by step
    later = _banded(scale=1 + 1e-4)
    assert compare_numerics(base, later).verdict == "regression"
    wide = _banded(band=(1e-3, 1e-3))
    assert compare_numerics(wide, later).outcome == "rounding"


def test_exact_figures_are_changed_whatever_the_band_says():
    base = _banded()
    lr = compare_numerics(base, _banded(lr=2e-3))
    assert lr.verdict == "regression" and "group 0 lr 0.001 → 0.002 at the set-up" in lr.line
    assert "exact: rounding cannot move it" in lr.line
    both = compare_numerics(base, _banded(lr=2e-3, scale=0.5))  # the tensors' own ratio beside the exact figure
    assert both.exact.startswith("group 0 lr") and both.ratio > 10 and "; tensors: largest relative" in both.line
    assert both.to_record()["numerics_exact"] == both.exact
    clip = compare_numerics(base, _banded(clip=False))
    assert clip.verdict == "regression" and "workload clip fired True → False at step 1" in clip.line
    # a figure the baseline's own perturbed replays moved is not exact: only the tensors decide
    edge = compare_numerics(_banded(moved=("workload clip fired",)), _banded(clip=False, scale=1 + 1e-6))
    assert edge.verdict == "same" and edge.outcome == "rounding"


def test_a_bitwise_equal_replay_with_other_exact_figures_is_changed_and_json_has_no_inf(tmp_path, capsys):
    from helpers.benchjson import bench, run_doc, write

    rounds = [0.010, 0.0101, 0.0099, 0.0100, 0.0102, 0.0098] * 3
    base = write(tmp_path / "base.json", run_doc([bench("test_step", rounds, {"numerics": _banded()})]))
    cur = write(tmp_path / "cur.json", run_doc([bench("test_step", rounds, {"numerics": _banded(lr=2e-3)})]))
    near = write(tmp_path / "near.json", run_doc([bench("test_step", rounds,
                                                        {"numerics": _banded(scale=1 + 1e-6)})]))
    assert cli.main(["compare", str(base), str(near)]) == 0
    assert "rounding: bits differ from step 1 of 2" in capsys.readouterr().out
    assert cli.main(["compare", str(base), str(cur), "--json"]) == 1
    (case,) = json.loads(capsys.readouterr().out)["cases"]
    assert case["numerics"]["outcome"] == "changed" and case["numerics"]["ratio"] is None  # inf: no band there
