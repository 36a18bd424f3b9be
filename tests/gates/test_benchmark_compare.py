"""ddpbench's verdicts under ``pytest --benchmark-compare`` (gates/benchmark_compare.py), on recorded
runs: the pair pytest-benchmark compares, printed after its table with the line saying which
command is the gate; runs that cannot be compared say why instead of a traceback."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from helpers.benchjson import bench, run_doc, write
from ddpbench.gates import benchmark_compare


class Terminal:
    def __init__(self):
        self.lines = []

    def write_sep(self, sep, title):
        self.lines.append(f"--- {title} ---")

    def write_line(self, line, **markup):
        self.lines.append(line)


def _session(tmp_path, stored_doc):
    stored = write(tmp_path / "Linux-CPython" / "0001_base.json", stored_doc)
    # pytest-benchmark keys compared_mapping by the run's path relative to its storage folder
    return SimpleNamespace(storage=SimpleNamespace(path=tmp_path),
                           compared_mapping={stored.relative_to(tmp_path): {}})


def test_the_verdicts_for_the_pair_and_the_gate_line(tmp_path):
    rng = np.random.default_rng(3)
    rounds = list(0.01 * np.exp(rng.normal(0, 0.03, 40)))
    session = _session(tmp_path, run_doc([bench("test_a", rounds)]))
    slower = run_doc([bench("test_a", [r * 1.5 for r in rounds])])
    terminal = Terminal()
    probes = []
    benchmark_compare.print_verdicts(terminal, session, slower, probe=lambda: probes.append(1) or {"min_s": 0.001})
    text = "\n".join(terminal.lines)
    assert terminal.lines[0] == f"--- {benchmark_compare.TITLE} ---"
    assert "candidate: this session" in text and "test_a" in text and "regression" in text
    assert terminal.lines[-1] == benchmark_compare.GATE_LINE and probes == [1]  # the stored run has a probe


def test_runs_that_cannot_be_compared_say_why(tmp_path):
    rounds = [0.01, 0.011, 0.012]
    session = _session(tmp_path, run_doc([bench("test_a", rounds)], fingerprint={"torch": "2.13.0+cpu"}))
    other_torch = run_doc([bench("test_a", rounds)], fingerprint={"torch": "2.15.0+cpu"})
    terminal = Terminal()
    benchmark_compare.print_verdicts(terminal, session, other_torch)
    (reason,) = [line for line in terminal.lines if line.startswith("ddpbench compare: no verdicts:")]
    assert "not comparable" in reason and "torch" in reason
    # nothing measured in this session: nothing to print
    quiet = Terminal()
    benchmark_compare.print_verdicts(quiet, session, {"benchmarks": []})
    assert quiet.lines == []
