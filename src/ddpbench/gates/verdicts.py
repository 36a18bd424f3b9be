"""The verdict table of an A/B run: for the terminal at the end of the run, and for
``ddpbench compare FILE.json`` (text, markdown for a PR comment, JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CaseVerdict:
    name: str
    ab: dict[str, Any]
    candidate_median_s: float | None = None

    @property
    def verdict(self) -> str:
        return self.ab.get("verdict", "inconclusive")


# The key of a pytest-benchmark JSON run under which an A/B run lists the cases that have no
# benchmark entry of their own: lost on the candidate side (crashed, hung).
LOST_CASES_KEY = "ddpbench_ab_lost"


def verdicts_of_run(data: dict) -> list[CaseVerdict]:
    """The A/B verdicts stored in a pytest-benchmark JSON run (cases without ``ab`` are skipped),
    lost cases included."""
    out = []
    for case in data.get("benchmarks", []):
        ab = (case.get("extra_info") or {}).get("ab")
        if isinstance(ab, dict) and "verdict" in ab:
            out.append(CaseVerdict(case.get("fullname") or case.get("name", "?"), ab,
                                   (case.get("stats") or {}).get("median")))
    for lost in data.get(LOST_CASES_KEY) or []:
        if isinstance(lost, dict) and isinstance(lost.get("ab"), dict):
            out.append(CaseVerdict(str(lost.get("name", "?")), lost["ab"], None))
    return out


def ab_verdicts(results: list[tuple[str, dict, float | None]]) -> list[CaseVerdict]:
    """The verdicts of an A/B run in progress: (case id, extra_info["ab"], candidate median)."""
    return [CaseVerdict(name, summary, median) for name, summary, median in results]


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _rows(cases: list[CaseVerdict]) -> list[list[str]]:
    rows = []
    for case in cases:
        ab = case.ab
        low, high = ab.get("ratio_ci") or [None, None]
        candidate = case.candidate_median_s
        if candidate is None:
            candidate = (ab.get("candidate") or {}).get("median_s")
        ratio = "-" if ab.get("ratio") is None else f"{ab['ratio']:.3f} [{low:.3f}, {high:.3f}]"
        rows.append([case.name, _ms((ab.get("baseline") or {}).get("median_s")), _ms(candidate), ratio,
                     " / ".join(f"{r:.3f}" for r in ab.get("ratio_per_pool_pair") or []) or "-",
                     f"{ab['ratio_of_block_minima']:.3f}" if ab.get("ratio_of_block_minima") is not None else "-",
                     "-" if ab.get("p_value") is None else f"{ab['p_value']:.2g}",
                     str(ab.get("pairs", "-")), "-" if ab.get("wall_s") is None else f"{ab['wall_s']:.1f}",
                     case.verdict + (f" ({ab['reason']})" if ab.get("reason") else "")])
    return rows


HEADER = ["case", "baseline median (ms)", "candidate median (ms)", "ratio [95% interval]", "per pool pair",
          "block minima", "p", "pairs", "wall (s)", "verdict"]


def _counts(cases: list[CaseVerdict]) -> str:
    counts: dict[str, int] = {}
    for case in cases:
        counts[case.verdict] = counts.get(case.verdict, 0) + 1
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))


def format_text(cases: list[CaseVerdict], threshold: float | None = None, sides: dict | None = None) -> str:
    if not cases:
        return "ddpbench A/B: no A/B cases in this run"
    rows = [HEADER] + _rows(cases)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = [f"ddpbench A/B verdicts ({_counts(cases)}"
             + (f"; a regression is a slowdown over {threshold * 100:g}% that is significant" if threshold else "")
             + "; ratio = candidate / baseline)"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    for name, desc in (sides or {}).items():
        lines.append(f"  {name}: {desc}")
    return "\n".join(lines)


def gate_outcome(cases: list[CaseVerdict], allow_missing: bool, fail_on_inconclusive: bool,
                 option_prefix: str = "--") -> tuple[int, list[str]]:
    """(exit status, lines saying why) of a gate over these verdicts: 1 for a regression or a
    case the candidate lost (unless allowed), and for inconclusive cases only when asked.
    ``option_prefix``: how the options are spelled ("--" for ddpbench compare, "--dist-ab-" in pytest)."""
    allow, fail = f"{option_prefix}allow-missing", f"{option_prefix}fail-on-inconclusive"
    by_verdict: dict[str, list[str]] = {}
    for case in cases:
        by_verdict.setdefault(case.verdict, []).append(case.name)
    status, lines = 0, []
    if by_verdict.get("regression"):
        status = 1
        lines.append(f"{len(by_verdict['regression'])} regression(s): exit status 1")
    missing = by_verdict.get("missing", [])
    if missing:
        names = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        if allow_missing:
            lines.append(f"{len(missing)} case(s) the baseline ran were lost on the candidate side ({names}); "
                         f"allowed by {allow}")
        else:
            status = 1
            lines.append(f"{len(missing)} case(s) the baseline ran were lost on the candidate side ({names}): "
                         f"exit status 1 (allow them with {allow})")
    inconclusive = by_verdict.get("inconclusive", [])
    if inconclusive:
        if fail_on_inconclusive:
            status = 1
            lines.append(f"{len(inconclusive)} inconclusive case(s): exit status 1 ({fail})")
        else:
            lines.append(f"{len(inconclusive)} inconclusive case(s): not a failure ({fail} makes them one)")
    return status, lines


def format_markdown(cases: list[CaseVerdict], threshold: float | None = None, sides: dict | None = None) -> str:
    lines = ["### ddpbench A/B verdicts", ""]
    if not cases:
        return "\n".join(lines + ["No A/B cases in this run."])
    icon = {"regression": "❌ regression", "improvement": "✅ improvement", "same": "same",
            "inconclusive": "⚠️ inconclusive"}
    lines.append(f"{_counts(cases)}" + (f" (threshold {threshold * 100:g}%)" if threshold else "")
                 + "; ratio = candidate / baseline, > 1 is slower.")
    lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in _rows(cases):
        row[-1] = icon.get(row[-1], row[-1])
        row[0] = f"`{row[0]}`"
        lines.append("| " + " | ".join(row) + " |")
    if sides:
        lines.append("")
        lines += [f"- **{name}**: {desc}" for name, desc in sides.items()]
    return "\n".join(lines)


def format_json(cases: list[CaseVerdict]) -> str:
    return json.dumps([{"name": c.name, "verdict": c.verdict, **{k: v for k, v in c.ab.items()
                                                                  if k not in ("baseline", "candidate")},
                        "baseline_median_s": (c.ab.get("baseline") or {}).get("median_s"),
                        "candidate_median_s": c.candidate_median_s} for c in cases], indent=2)


def side_descriptions(cases: list[CaseVerdict]) -> dict[str, str]:
    """One line per side from the first case's ``sides``."""
    for case in cases:
        sides = case.ab.get("sides")
        if isinstance(sides, dict):
            return {name: describe(desc) for name, desc in sides.items()}
    return {}


def describe(desc: dict) -> str:
    parts = [f"python {desc.get('python')}", f"torch {desc.get('torch_version')}"]
    parts += [f"sys.path+ {p}" for p in desc.get("sys_path_prepended") or []]
    parts += [f"{k}={v}" for k, v in (desc.get("env") or {}).items()]
    return ", ".join(parts)
