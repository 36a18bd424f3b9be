"""The chart of a stored-run comparison (``ddpbench compare --chart``): each case's ratio with its
interval."""

from __future__ import annotations

import math
from pathlib import Path

from ..gates.stored_run_gate import Comparison
from .charts import pyplot


def compare_chart(result: Comparison, path: str | Path) -> Path:
    """Ratios (candidate / baseline median) with their intervals, one row per compared case."""
    plt = pyplot()
    # An unbounded interval (too few rounds to tell) has no bar to draw.
    cases = [c for c in result.cases if c.ratio is not None and c.ci_high is not None and math.isfinite(c.ci_high)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.3 * len(cases) + 1.2)))
    for y, case in enumerate(cases):
        ax.errorbar(case.ratio, y, xerr=[[case.ratio - case.ci_low], [case.ci_high - case.ratio]],
                    fmt="o", color=case.verdict.chart_colour, capsize=3)
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels([c.name for c in cases], fontsize=7)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(1 + result.threshold, color="tab:red", ls="--", lw=0.8, label=f"+{result.threshold * 100:g}%")
    ax.axvline(1 / (1 + result.threshold), color="tab:green", ls="--", lw=0.8)
    ax.set_xlabel("candidate / baseline median" + (" (CPU cases drift-normalised)" if result.normalised else ""))
    ax.set_title(f"{result.confidence * 100:g}% intervals; red = regression")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
