"""The gates' text table reads at a glance: one short row per case (case, ratio and interval,
verdict) with its figures and its structure / memory lines indented under it, every line within a
terminal's 120 columns; the figures say what they are (the A/B ratio is a Hodges–Lehmann estimate,
an inconclusive case says why it rules out more than its interval); the markdown keeps its table."""

from __future__ import annotations

from ddpbench.gates import verdicts
from ddpbench.gates.ab.run_report import exit_line
from ddpbench.gates.structure import StructureVerdict
from helpers.verdict_text import case_blocks

# The memory line of the nanoGPT A/B: ~250 characters on its own.
MEMORY_LINE = ("peak +222.0 KiB: temporaries +512.0 KiB, DDP buckets -257.0 KiB, gradients -257.0 KiB, "
               "activations +128.0 KiB, other +96.0 KiB, in backward (was at GPT backward); kept after the step "
               "+32.0 KiB (other +32.0 KiB)")
NAME = "benchmarks/test_nanogpt.py::test_train_step[gloo-2p-ddp]"


def _ab_report() -> verdicts.GateReport:
    regressed = verdicts.CaseVerdict(NAME, "same", baseline_median_s=0.3323, current_median_s=0.2802, ratio=1.002,
                                     ci_low=0.985, ci_high=1.020, p_value=0.41, method="paired-blocks",
                                     details={"ratio_per_pool_pair": [1.001, 1.003], "ratio_of_block_minima": 0.998,
                                              "pairs": 36, "wall_s": 20.1, "threshold": 0.05})
    regressed.judge_structure(StructureVerdict("same", ""))
    regressed.judge_memory(StructureVerdict("regression", MEMORY_LINE))
    # Stopped early: the stop level's exact bound (1.308), not the interval's end (1.099), is what it
    # has shown.
    early = verdicts.CaseVerdict("t.py::test_other[gloo-2p]", "inconclusive", baseline_median_s=0.01,
                                 current_median_s=0.0102, ratio=1.01, ci_low=0.95, ci_high=1.099, p_value=0.3,
                                 method="paired-blocks",
                                 details={"stop_bound": 1.308, "stop_level": 0.0041, "pairs": 12, "wall_s": 20.0})
    return verdicts.ab_report([regressed, early], {"baseline": {"python": "/base/.venv/bin/python",
                                                               "torch_version": "2.13.0", "env": {}}})


def test_each_case_is_one_short_row_and_its_details_are_indented_under_it():
    text = verdicts.format_text(_ab_report())
    assert max(len(line) for line in text.splitlines()) <= verdicts.TEXT_WIDTH, text
    header = next(line for line in text.splitlines() if line.startswith("case "))
    assert header.split() == ["case", "ratio", "[95%", "interval]", "verdict"]
    blocks = case_blocks(text, {NAME, "t.py::test_other[gloo-2p]"})
    row, *details = blocks[NAME].splitlines()
    assert row.split() == [NAME, "1.002", "[0.985,", "1.020]", "regression", "(memory;", "timing", "same)", "<<"]
    assert row.index("regression") < 90  # was near column 380, after the memory cell
    assert details[0] == ("    medians 332.300 ms baseline, 280.200 ms candidate; p 0.41; per pool pair 1.001 / 1.003; "
                          "block minima 0.998;")
    assert details[1] == "      pairs 36; wall (s) 20.1"  # a figure never splits from its number
    memory = "\n".join(details[2:])
    assert memory.startswith("    memory: regression: peak +222.0 KiB: temporaries +512.0 KiB")
    assert " ".join(memory.split()) == f"memory: regression: {MEMORY_LINE}"
    assert "structure" not in blocks[NAME]  # a component that reads `same` adds no line
    assert text.splitlines()[-1] == "  baseline: python /base/.venv/bin/python, torch 2.13.0"


def test_the_markdown_keeps_one_table_row_per_case():
    markdown = verdicts.format_markdown(_ab_report())
    rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    assert len(rows) == 2 and MEMORY_LINE in rows[0]
    assert "| memory | verdict |" in markdown


def test_the_ratio_is_named_as_what_it_is():
    # A/A: medians 332.3 vs 280.2 ms printed beside 1.002: the A/B ratio is no ratio of medians.
    assert ("ratio = candidate / baseline, the Hodges–Lehmann estimate over the paired blocks (not the ratio "
            "of the two medians), > 1 is slower") in _ab_report().summary()
    stored = verdicts.GateReport("ddpbench compare", [verdicts.CaseVerdict(
        "x", "same", ratio=1.0, ci_low=0.99, ci_high=1.01, method="bootstrap+mann-whitney")], 0.05)
    assert "ratio = candidate / baseline median, > 1 is slower" in stored.summary()  # one word for both gates


def test_an_inconclusive_case_says_why_it_rules_out_more_than_its_interval_shows():
    report = _ab_report()
    text = " ".join(verdicts.format_text(report).split())
    assert ("inconclusive (rules out >= 30.8% slower) medians 10.000 ms baseline, 10.200 ms candidate; p 0.3; "
            "pairs 12; wall (s) 20.0 rules out >= 30.8% slower: 1.308 is the ratio's exact upper bound at this "
            "look's stop level (0.0041), above the 95% interval's end 1.099; a look stops only within both") in text
    assert ("⚠️ inconclusive (rules out >= 30.8% slower: 1.308 is the ratio's exact upper bound at this look's "
            "stop level (0.0041)") in verdicts.format_markdown(report)
    # An interval that decides alone needs no reason.
    plain = verdicts.CaseVerdict("y", "inconclusive", ratio=1.0, ci_low=0.9, ci_high=1.2,
                                 details={"stop_bound": 1.1})
    assert verdicts.format_text(verdicts.GateReport("g", [plain], 0.05)).count("rules out") == 1


def test_the_last_ab_line_says_the_exit_status_and_why():
    report = _ab_report()
    assert exit_line(1, report) == (f"ddpbench A/B: exit status 1: 1 regression, 1 inconclusive ({NAME}), whatever "
                                    f"pytest counts as passed")
    same = verdicts.ab_report([verdicts.CaseVerdict("z", "same", ratio=1.0, ci_low=0.99, ci_high=1.01)], {})
    assert exit_line(0, same) == "ddpbench A/B: exit status 0: no case fails the gate (1 same)"


def _everything_regressed(name: str) -> verdicts.CaseVerdict:
    """An A/B case whose structure, memory and numerics all regressed, stopped at its first look
    with its timing inconclusive there."""
    case = verdicts.CaseVerdict(name, "inconclusive", baseline_median_s=0.01, current_median_s=0.0102, ratio=1.01,
                                ci_low=0.9, ci_high=1.2, p_value=0.3, method="paired-blocks",
                                details={"stopped_by_structure": True, "pairs": 6, "wall_s": 3.0})
    case.judge_structure(StructureVerdict("regression", "all_reduce float32 in a group of 2: 1 → 2 per step, +4.0 KiB"))
    case.judge_memory(StructureVerdict("regression", MEMORY_LINE))
    case.judge_numerics(StructureVerdict("regression", "changed from step 1 of 3: 1 of 4 tensors differ, first "
                                                       "grad 0.weight (max relative difference 3.1e-02)"))
    return case


def test_a_row_with_every_exact_regression_fits_120_columns_and_names_what_failed_it():
    # Was 142 columns: `regression (structure and memory and numerics; timing inconclusive at its
    # first look)  <<`. The row keeps the verdict and what failed it; the timing's word goes under it.
    long_name = "benchmarks/test_transformer.py::test_transformer_step[gloo-2p-cpu-large-ddp-cap100-bf16]"
    for name in (NAME, long_name):
        report = verdicts.ab_report([_everything_regressed(name)], {})
        text = verdicts.format_text(report)
        assert max(len(line) for line in text.splitlines()) <= verdicts.TEXT_WIDTH, text
        row = next(line for line in text.splitlines() if "regression (" in line)
        assert row.endswith("regression (structure, memory and numerics)  <<"), text
        block = case_blocks(text, {name})[name]
        assert "    why: structure, memory and numerics; timing inconclusive at its first look" in block


def test_every_line_of_both_gates_exit_text_fits_160_columns():
    from ddpbench.gates.ab.run_report import summary_lines
    from ddpbench.gates.exit_decision import LINE_WIDTH, decide_exit, exit_lines

    names = [f"benchmarks/test_transformer.py::test_transformer_step[gloo-2p-cpu-large-ddp-variant{i}]"
             for i in range(6)]
    report = verdicts.ab_report([_everything_regressed(name) for name in names], {})
    report.warnings.append("the candidate run is partial: " + ", ".join(names))
    decision = decide_exit(report)
    for prefix in ("--", "--dist-"):
        lines = exit_lines(decision, prefix)
        assert lines and max(len(line) for line in lines) <= LINE_WIDTH, lines
        assert any(f"({prefix}accept-memory-change accepts a change made on purpose)" in line
                   for line in [" ".join(lines)])
    said = [line for line, _ in summary_lines(report, decision, 7, [])]
    assert max(len(line) for line in said) <= LINE_WIDTH, said
    assert said[-1] == ("ddpbench A/B: exit status 1: 6 regression (the cases marked << above), whatever pytest "
                        "counts as passed")
    assert max(len(line) for line in verdicts.format_text(report).splitlines()) <= LINE_WIDTH
