"""Reading what lab/gpu/check.sh's parts leave behind: pytest's terminal output, pytest-benchmark
JSON of the transformer and exposed-communication cases, the memory census, nccl-tests side by side,
``ddpbench compare --json`` of A/B runs; and the check's own summary (summary.json, summary.md).

Pure functions of text and parsed JSON, so tests run them on recorded outputs (tests/lab/data/) without
a GPU. gpu_check.py runs the parts and calls these."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

SUMMARY_VERSION = 2
STATUSES = ("passed", "failed", "timed-out", "skipped")
BUNDLE_NAME = "bundle.tar.gz"
BRIEF_LIMIT = 2000  # characters of the table printed last (the device call returns the output's end)

# ----------------------------------------------------------------------------------------------
# pytest's terminal output (run with -v -rfEs)
# ----------------------------------------------------------------------------------------------

_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?|rerun)\b")
_FINAL = re.compile(r"^=*\s*((?:\d+ \w+,? ?)+) in [\d.]+s\b")
_NO_TESTS = re.compile(r"^=*\s*no tests ran in [\d.]+s\b")
_VERBOSE = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
_SHORT_FAILED = re.compile(r"^(FAILED|ERROR) (\S+::\S+?)(?: - (.*))?$")
_SHORT_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$")
_VERBOSE_KEYS = {"PASSED": "passed", "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "errors",
                 "XFAIL": "xfailed", "XPASS": "xpassed"}


def pytest_counts(text: str) -> dict[str, Any]:
    """pytest's output -> ``{"counts": {"passed": n, ...}, "complete": bool, "failed_cases": [...],
    "skip_reasons": [[n, reason], ...]}``.

    ``complete``: pytest printed its closing line (``== 103 passed, 68 skipped in 195.12s ==``);
    the counts are that line's. A run stopped before it (a part's time limit) has none: the counts
    are then those of the ``-v`` result lines printed so far, and ``complete`` is False. Failed and
    errored cases come from ``-rfE``'s short summary or the ``-v`` lines, skip reasons (most
    frequent first) from ``-rs``."""
    final = None
    verbose: dict[str, int] = {}
    failed: list[str] = []
    skips: dict[str, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        found = _FINAL.match(line)
        if found:
            final = found.group(1)
            continue
        if _NO_TESTS.match(line):
            final = ""
            continue
        found = _VERBOSE.match(line)
        if found:
            key = _VERBOSE_KEYS[found.group(2)]
            verbose[key] = verbose.get(key, 0) + 1
            if key in ("failed", "errors") and found.group(1) not in failed:
                failed.append(found.group(1))
            continue
        found = _SHORT_FAILED.match(line)
        if found:
            if found.group(2) not in failed:
                failed.append(found.group(2))
            continue
        found = _SHORT_SKIPPED.match(line)
        if found:
            reason = found.group(2).strip()
            skips[reason] = skips.get(reason, 0) + int(found.group(1))
    if final is not None:
        counts: dict[str, int] = {}
        for number, word in _COUNT.findall(final):
            key = {"error": "errors", "warning": "warnings"}.get(word, word)
            counts[key] = counts.get(key, 0) + int(number)
    else:
        counts = verbose
    return {"counts": counts, "complete": final is not None, "failed_cases": failed,
            "skip_reasons": sorted(([n, r] for r, n in skips.items()), key=lambda item: (-item[0], item[1]))}


def add_counts(total: dict[str, int] | None, parsed: dict[str, Any]) -> dict[str, int]:
    """``total`` (passed / failed / skipped / errors over a part's pytest runs) plus one run's."""
    total = dict(total or {"passed": 0, "failed": 0, "skipped": 0, "errors": 0})
    for key in total:
        total[key] += parsed["counts"].get(key, 0)
    return total


def counts_line(parsed: dict[str, Any]) -> str:
    """``103 passed, 0 failed, 68 skipped`` (+ errors when any; ``so far`` when incomplete)."""
    counts = parsed["counts"]
    words = [f"{counts.get('passed', 0)} passed", f"{counts.get('failed', 0)} failed",
             f"{counts.get('skipped', 0)} skipped"]
    if counts.get("errors"):
        words.append(f"{counts['errors']} errors")
    return ", ".join(words) + ("" if parsed["complete"] else " (so far: pytest did not finish)")


# ----------------------------------------------------------------------------------------------
# pytest-benchmark JSON: the transformer family, exposed communication, memory
# ----------------------------------------------------------------------------------------------


def case_id(bench: dict) -> str:
    name = bench.get("name", "?")
    return name[name.index("[") + 1:-1] if "[" in name and name.endswith("]") else name


def _max_rank(info: dict, key: str) -> int | None:
    values = [rank.get(key) for rank in info.get("rank_peak_memory") or [] if isinstance(rank, dict)]
    values = [v for v in values if isinstance(v, (int, float))]
    return int(max(values)) if values else None


def transformer_rows(doc: dict) -> list[dict[str, Any]]:
    """One row per case of a --benchmark-json document: step time, tokens/s, MFU (against the
    measured matmul peak and the datasheet), peak allocated memory (max over ranks), the census's
    kernel launches, buckets and compile counts, and exposed communication."""
    rows = []
    for bench in doc.get("benchmarks", []):
        info = bench.get("extra_info") or {}
        census = info.get("census") if isinstance(info.get("census"), dict) else {}
        buckets = census.get("ddp_buckets")
        rows.append({
            "case": case_id(bench), "median_s": (bench.get("stats") or {}).get("median"),
            "tokens_per_second": info.get("tokens_per_second"), "mfu": info.get("mfu"),
            "mfu_datasheet": info.get("mfu_datasheet"),
            "peak_allocated_bytes": _max_rank(info, "peak_memory_allocated_bytes"),
            "peak_reserved_bytes": _max_rank(info, "peak_memory_reserved_bytes"),
            "kernel_launches": census.get("cuda_kernel_launches"),
            "collectives": len(census.get("collectives") or []) if census else None,
            "ddp_buckets": len(buckets) if isinstance(buckets, list) else None,
            "graph_breaks": census.get("graph_breaks"), "recompiles": census.get("recompiles"),
            "census_incomplete": census.get("incomplete"),
            **{key: info.get(key) for key in ("compute_s", "compute_s_ci", "exposed_comm_s", "exposed_comm_s_ci",
                                              "comm_isolated_s", "comm_overlap_pct")},
        })
    return rows


def mfu_problems(rows: list[dict]) -> list[str]:
    """A case whose MFU (measured peak or datasheet) lies outside (0, 1), or that has none: a figure
    above 1 is a bug in the FLOP or peak accounting, not a result."""
    problems = []
    for row in rows:
        if row["mfu"] is None:
            problems.append(f"{row['case']}: no mfu in extra_info")
        for key in ("mfu", "mfu_datasheet"):
            value = row[key]
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < 1):
                problems.append(f"{row['case']}: {key} {value} is outside (0, 1)")
    return problems


def census_problems(rows: list[dict]) -> list[str]:
    """A CUDA case whose census has no kernel-launch count (or is marked incomplete)."""
    problems = []
    for row in rows:
        if not row["kernel_launches"]:
            problems.append(f"{row['case']}: census has no cuda_kernel_launches ({row['kernel_launches']!r})")
        if row["census_incomplete"]:
            problems.append(f"{row['case']}: census incomplete: {row['census_incomplete']}")
    return problems


def _interval(value) -> tuple[float, float] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        low, high = float(value[0]), float(value[1])
        if math.isfinite(low) and math.isfinite(high):
            return low, high
    return None


def bucket_pairs(rows: list[dict], default_cap: str = "", one_bucket_cap: str = "cap1000") -> list[dict]:
    """Default buckets against one bucket, per pool spec: ``exposed_comm_s`` of each with its
    interval, whether one bucket exposes more (its interval entirely above the default's), and
    whether compute stayed (the two ``compute_s`` intervals overlap). Case ids read
    ``<spec>-<size>-ddp[-bf16][-capN]`` (:class:`TransformerTraining`'s ``case_id``): a row whose
    id holds ``one_bucket_cap`` pairs with the same id without it."""
    by_id = {row["case"]: row for row in rows}
    pairs = []
    for case, one in by_id.items():
        if f"-{one_bucket_cap}" not in case:
            continue
        default = by_id.get(case.replace(f"-{one_bucket_cap}", default_cap))
        if default is None:
            continue
        exposed = [_interval(r["exposed_comm_s_ci"]) for r in (default, one)]
        compute = [_interval(r["compute_s_ci"]) for r in (default, one)]
        pairs.append({
            "default": default["case"], "one_bucket": case,
            "exposed_default_s": default["exposed_comm_s"], "exposed_one_bucket_s": one["exposed_comm_s"],
            "exposed_default_ci": exposed[0], "exposed_one_bucket_ci": exposed[1],
            "compute_default_s": default["compute_s"], "compute_one_bucket_s": one["compute_s"],
            "buckets": [default["ddp_buckets"], one["ddp_buckets"]],
            "one_bucket_exposes_more": (None if None in exposed else exposed[1][0] > exposed[0][1]),
            "compute_within_spread": (None if None in compute else
                                      compute[0][0] <= compute[1][1] and compute[1][0] <= compute[0][1]),
            "default_holds_zero": None if exposed[0] is None else exposed[0][0] <= 0 <= exposed[0][1],
        })
    return pairs


# Keys the memory census (issue 46: extra_info["memory"]) may give its per-rank peak under, and the
# measured allocator figure beside it. The census was being built when this was written: a record
# with none of these keys is reported with its keys, so this list can be updated to match.
MEMORY_PEAK_KEYS = ("peak_bytes", "peak_live_bytes", "census_peak_bytes", "peak")
MEASURED_KEYS = ("max_memory_allocated_bytes", "cuda_max_memory_allocated_bytes", "max_memory_allocated",
                 "measured_peak_allocated_bytes")


def _find_numbers(record, keys: tuple[str, ...]) -> list[int]:
    """Every number under one of ``keys`` (the first key present at each level), searched through
    nested dicts and lists: a per-rank list gives one number per rank."""
    found: list[int] = []
    if isinstance(record, dict):
        for key in keys:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return [int(value)]
        for value in record.values():
            if isinstance(value, (dict, list)):
                found += _find_numbers(value, keys)
    elif isinstance(record, list):
        for item in record:
            found += _find_numbers(item, keys)
    return found


def memory_rows(doc: dict) -> tuple[str, list[dict]]:
    """The memory census against ``torch.cuda.max_memory_allocated``, per case ->
    ``(state, rows)``; state ``not built`` (no case has ``extra_info["memory"]``), ``unreadable``
    (records whose peak is under none of :data:`MEMORY_PEAK_KEYS`: rows then name their keys) or
    ``ok``. A row: the census peak (max over ranks), the measured peak (the record's own figure, else
    the case's ``rank_peak_memory``), census / measured and whether it lies within +-5% and +-10%."""
    benches = doc.get("benchmarks", [])
    records = [(b, (b.get("extra_info") or {}).get("memory")) for b in benches]
    if not any(record is not None for _, record in records):
        return "not built", []
    rows, readable = [], True
    for bench, record in records:
        if record is None:
            continue
        peaks = _find_numbers(record, MEMORY_PEAK_KEYS)
        measured = _find_numbers(record, MEASURED_KEYS) or \
            [v for v in [_max_rank(bench.get("extra_info") or {}, "peak_memory_allocated_bytes")] if v]
        row = {"case": case_id(bench), "census_peak_bytes": max(peaks) if peaks else None,
               "measured_peak_bytes": max(measured) if measured else None}
        if not peaks:
            readable = False
            row["keys"] = sorted(record) if isinstance(record, dict) else type(record).__name__
        if row["census_peak_bytes"] and row["measured_peak_bytes"]:
            ratio = row["census_peak_bytes"] / row["measured_peak_bytes"]
            row.update(ratio=round(ratio, 4), within_5pct=abs(ratio - 1) <= 0.05, within_10pct=abs(ratio - 1) <= 0.10)
        rows.append(row)
    return ("ok" if readable else "unreadable"), rows


def simulated_peak(census_json: dict) -> int | None:
    """``ddpbench census --json``'s per-rank peak at its (one) world size, or None where the
    simulation reports no peak (issue 46's item 5 not built)."""
    found = _find_numbers(census_json.get("world_sizes") or [], MEMORY_PEAK_KEYS)
    return max(found) if found else None


# ----------------------------------------------------------------------------------------------
# nccl-tests side by side (lab/reference/nccl_tests_side_by_side.py's records.json summary)
# ----------------------------------------------------------------------------------------------


def side_by_side_findings(summary_rows: list[dict], low: float = 0.95, high: float = 1.05) -> dict[str, Any]:
    """The side-by-side summary rows -> the rows with both tools' figures, and which of them hold
    ddpbench / nccl-tests within [low, high]. At one GPU only out-of-place rows of 100 MB and more
    are comparable (docs/results.md: smaller sizes are torch's per-call cost when eager, in place
    NCCL moves nothing), so ``goal_rows`` are those."""
    paired = [row for row in summary_rows if row.get("ratio")]
    goal = [row for row in paired if row["placement"] == "out-of-place" and row["size_bytes"] >= 100 << 20]
    outside = [f"{r['op']} {r['placement']} {r['size_bytes'] >> 20} MB graphs {r['graphs']}: "
               f"{r['ratio']['median']:.3f}" for r in goal if not low <= r["ratio"]["median"] <= high]
    return {"paired_rows": len(paired), "goal_rows": len(goal), "goal_outside": outside,
            "ratio_range": ([min(r["ratio"]["median"] for r in paired), max(r["ratio"]["median"] for r in paired)]
                            if paired else None)}


# ----------------------------------------------------------------------------------------------
# A/B runs: `ddpbench compare AB.json --json`
# ----------------------------------------------------------------------------------------------


def ab_findings(compare_doc: dict, injected: bool) -> dict[str, Any]:
    """An A/B run's verdicts -> counts, per case (verdict, ratio, interval, wall seconds) and, for
    an A/A run, the false regressions; for a run with a slowdown injected into the candidate, the
    cases that caught it (power = regressions / cases)."""
    cases = []
    for case in compare_doc.get("cases", []):
        details = case.get("details") or {}
        cases.append({"case": case.get("name"), "verdict": case.get("verdict"), "ratio": case.get("ratio"),
                      "ci": [case.get("ci_low"), case.get("ci_high")], "wall_s": details.get("wall_s"),
                      "pairs": details.get("pairs")})
    regressions = sum(1 for c in cases if c["verdict"] == "regression")
    out: dict[str, Any] = {"counts": {k: v for k, v in (compare_doc.get("counts") or {}).items() if v},
                           "cases": cases}
    if injected:
        out["caught"] = f"{regressions} of {len(cases)}"
    else:
        out["false_regressions"] = regressions
    return out


# ----------------------------------------------------------------------------------------------
# The check's own summary
# ----------------------------------------------------------------------------------------------


def load_summary(path: str | Path) -> dict[str, Any]:
    """summary.json -> its document, checked: ValueError naming what is wrong (a summary cut short
    or written by another version)."""
    doc = json.loads(Path(path).read_text())
    if doc.get("version") != SUMMARY_VERSION:
        raise ValueError(f"{path}: summary version {doc.get('version')!r}, expected {SUMMARY_VERSION}")
    for part in doc.get("parts", []):
        missing = {"name", "status", "reason", "wall_s", "budget_s"} - set(part)
        if missing:
            raise ValueError(f"{path}: part {part.get('name', '?')} lacks {sorted(missing)}")
        if part["status"] not in STATUSES:
            raise ValueError(f"{path}: part {part['name']} has status {part['status']!r}, not one of {STATUSES}")
    return doc


def status_counts(doc: dict) -> dict[str, int]:
    counts = {status: 0 for status in STATUSES}
    for part in doc.get("parts", []):
        counts[part["status"]] += 1
    return counts


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(doc: dict) -> str:
    """summary.md: the environment, one table row per part, then each part's details."""
    env = doc.get("environment") or {}
    kind = " (dry run)" if doc.get("dry_run") else " (CPU rehearsal)" if doc.get("mode") == "cpu-rehearsal" else ""
    lines = [f"# ddpbench GPU check, {doc.get('started', '?')}{kind}", ""]
    for key in ("gpu", "driver", "torch", "cuda", "nccl", "python", "ddpbench_commit", "nccl_tests_commit", "nvcc",
                "cpus"):
        if env.get(key) is not None:
            lines.append(f"- {key}: {env[key]}")
    counts = status_counts(doc)
    lines += ["", f"Total {doc.get('wall_s', 0):.0f} s of a {doc.get('total_budget_s', 0):.0f} s budget; parts: "
              + ", ".join(f"{n} {s}" for s, n in counts.items() if n), "",
              "| part | status | wall / budget (s) | result |", "|---|---|---|---|"]
    for part in doc.get("parts", []):
        result = part.get("headline") or part.get("reason") or ""
        lines.append(f"| {part['name']} | {part['status']} | {part['wall_s']:.0f} / {part['budget_s']:.0f} | "
                     f"{_cell(result)} |")
    for part in doc.get("parts", []):
        lines += ["", f"## {part['name']}: {part['status']}"]
        if part.get("reason"):
            lines.append(f"Reason: {part['reason']}")
        for command in part.get("commands", []):
            lines.append(f"- `{command}`")
        for finding in part.get("findings", []):
            lines.append(f"- {finding}")
        for check in part.get("checks", []):
            verdict = {True: "ok", False: "FAILED", None: "n/a"}[check["ok"]]
            lines.append(f"- check {verdict}: {check['name']}"
                         + (f" ({check['detail']})" if check.get("detail") else ""))
        if part.get("table"):
            lines += ["", part["table"]]
        if part.get("logs"):
            lines.append("Logs: " + ", ".join(part["logs"]))
    return "\n".join(lines) + "\n"


def render_brief(doc: dict, limit: int = BRIEF_LIMIT) -> str:
    """The table the run ends with, at most ``limit`` characters: one line per part (status, wall /
    budget, pytest cases passed / failed / skipped, its key figures, where in the bundle), under a
    line naming the machine and the bundle."""
    env = doc.get("environment") or {}
    bundle = doc.get("bundle") or {}
    head = (f"ddpbench GPU check ({doc.get('mode', 'gpu')}{', dry run' if doc.get('dry_run') else ''}): "
            f"{env.get('gpu') or 'no GPU'}, torch {env.get('torch')}, python {env.get('python')}; "
            f"{doc.get('wall_s', 0):.0f} s of {doc.get('total_budget_s', 0):.0f}")
    where = (f"$OUT: summary.md, summary.json, {bundle['name']} ({bundle['files']} files, {bundle['bytes'] / 1e6:.1f} MB"
             f"{', left out: ' + str(len(bundle['left_out'])) if bundle.get('left_out') else ''})" if bundle else
             "$OUT: summary.md, summary.json (no bundle: nothing ran)")
    lines = [head, where, "part | status | s/budget | cases p/f/s | figures | bundle"]
    for part in doc.get("parts", []):
        counts = part.get("counts")
        cases = f"{counts['passed']}/{counts['failed'] + counts.get('errors', 0)}/{counts['skipped']}" if counts else "-"
        figures = part.get("brief") or part.get("reason") or part.get("headline") or ""
        line = (f"{part['name']} | {part['status']} | {part['wall_s']:.0f}/{part['budget_s']:.0f} | {cases} | "
                f"{_cell(figures)} | {part.get('where') or '-'}")
        lines.append(line if len(line) <= 200 else line[:197] + "...")
    text = "\n".join(lines) + "\n"
    if len(text) > limit:  # keep whole lines; the rest is in summary.md
        cut = text[:limit - 40].rsplit("\n", 1)[0]
        text = cut + "\n... (cut at 2 KB: summary.md has it all)\n"
    return text


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A markdown table of ``rows`` with ``columns`` = [(key, heading)]; floats to 4 significant
    digits, None as —."""
    def fmt(value):
        if value is None:
            return "—"
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(fmt(v) for v in value) + "]"
        return _cell(value)

    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(k)) for k, _ in columns) + " |" for row in rows]
    return "\n".join(lines)
