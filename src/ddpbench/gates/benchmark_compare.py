"""``pytest --benchmark-compare`` in a session that uses ddpbench: ddpbench's noise-aware verdicts
(:func:`ddpbench.gates.stored_run_gate.compare_runs`, the ``ddpbench compare`` defaults) for the pair that
pytest-benchmark compares, the stored run it loaded and this session's results, printed under
pytest-benchmark's table. pytest-benchmark's fixed-percentage ``--benchmark-compare-fail`` on noisy
medians flags unchanged code; these verdicts weigh the rounds' noise and the machine's drift.

Informational: pytest-benchmark's options keep their meaning and alone set the session's exit
status; the gate is ``ddpbench compare`` (exit 1 on a regression), as :data:`GATE_LINE` says.
"""

from __future__ import annotations

from pathlib import Path

from ..storage.records import CALIBRATION_KEY
from ..storage.runs import RunError, history_runs, load_run, run_of_doc
from . import stored_run_gate as cmp

TITLE = "ddpbench: noise-aware verdicts for the same comparison"
GATE_LINE = ("ddpbench: informational here (pytest-benchmark's options, such as --benchmark-compare-fail, set "
             "this session's exit status); `ddpbench compare` is the gate: exit 1 on a regression")
CURRENT_LABEL = "this session"


def compared_files(bench_session) -> list[Path]:
    """The saved runs pytest-benchmark loaded for --benchmark-compare, as files (a storage that is
    not a folder, such as elasticsearch, has none)."""
    folder = getattr(bench_session.storage, "path", None)
    if folder is None:
        return []
    return [Path(folder) / path for path in (bench_session.compared_mapping or {})]


def verdict_lines(baseline_file: Path, current_doc: dict) -> list[str]:
    """ddpbench compare's text for one stored run against this session's results, or the reason
    there is none (runs that are not comparable, a file it cannot read)."""
    try:
        base = load_run(baseline_file)
        cur = run_of_doc(Path(CURRENT_LABEL), current_doc)
        # up to the baseline: by now pytest-benchmark may have saved this session's results after it
        history, skipped = history_runs(baseline_file.parent, through=baseline_file)
        result = cmp.compare_runs(base, cur, history=history)
        result.notes += skipped
    except RunError as exc:
        return [f"ddpbench compare: no verdicts: {exc}"]
    return cmp.format_text(result).splitlines()


def print_verdicts(terminalreporter, bench_session, current_doc: dict, probe=None) -> None:
    """Write the verdicts against each stored run pytest-benchmark compared, and :data:`GATE_LINE`.
    ``probe``: a callable giving this session's calibration probe, run only when a stored run has
    one to compare with."""
    files = compared_files(bench_session)
    if not files or not current_doc.get("benchmarks"):
        return
    terminalreporter.write_sep("-", TITLE)
    for baseline_file in files:
        doc = dict(current_doc)
        if probe is not None and CALIBRATION_KEY not in doc and _has_probe(baseline_file):
            doc[CALIBRATION_KEY] = probe()
        for line in verdict_lines(baseline_file, doc):
            terminalreporter.write_line(line, red=line.endswith("  <<"))
    terminalreporter.write_line(GATE_LINE, bold=True)


def _has_probe(path: Path) -> bool:
    try:
        return load_run(path).calibration is not None
    except RunError:
        return False
