"""The history page: one self-contained static HTML file (inline CSS and JS, data as embedded JSON).

Nothing is fetched when the page is viewed (no CDN, fonts or scripts from elsewhere), so it opens
from a CI artifact or a laptop offline. Python writes the text a reader needs without JavaScript
(what was read, the steps table, one captioned container per chart); ``page.js`` draws the charts
from the embedded JSON, whose ``<`` is escaped so no string in a run can end the script tag.
"""

from __future__ import annotations

import json
import math
from html import escape
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from ..report import FAMILY_TABLES
from .series import FAMILIES, Point, RunRecord, Series
from .steps import shown_commit

if TYPE_CHECKING:
    from .build import History

FAMILY_TITLES = {table.name: table.title for table in FAMILY_TABLES}
LEGEND = (
    '<span><svg width="14" height="10"><circle cx="7" cy="5" r="3" fill="#0969da"/></svg> run median</span>'
    '<span><svg width="14" height="10"><rect width="14" height="10" fill="rgba(9,105,218,0.18)"/></svg> '
    'IQR of its rounds</span>'
    '<span><svg width="14" height="10"><circle cx="7" cy="5" r="3" fill="#fff" stroke="#0969da" '
    'stroke-width="1.5"/></svg> no spread (saved without --benchmark-save-data)</span>'
    '<span><svg width="10" height="14"><line x1="5" y1="0" x2="5" y2="14" stroke="#8250df" '
    'stroke-dasharray="4 3" stroke-width="1.5"/></svg> detected step</span>'
    '<span><svg width="14" height="12"><path d="M7,1L13,11L1,11Z" fill="#cf222e"/></svg> A/B regression</span>'
    '<span><svg width="14" height="12"><path d="M7,11L13,1L1,1Z" fill="#1a7f37"/></svg> A/B improvement</span>'
    '<span><svg width="14" height="10"><circle cx="7" cy="5" r="4" fill="#bc4c00"/></svg> A/B inconclusive</span>'
    '<span><svg width="14" height="10"><circle cx="7" cy="5" r="4" fill="#6e7781"/></svg> A/B same, not-slower or new</span>'
)


def _template(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _ms(seconds: float | None):
    """Milliseconds to 5 significant digits: enough to read, and the embedded JSON stays small."""
    return None if seconds is None else float(f"{seconds * 1e3:.5g}")


def _date(record: RunRecord) -> str:
    return f"{record.when:%Y-%m-%d}" if record.when else "date unknown"


def page_data(history: History) -> dict:
    """The JSON the charts are drawn from: runs once, and per series its points and steps.

    runs: [commit, branch, time text, file, dirty]; a point: [run, median, q1, q3] in ms (q1 / q3
    null without spread), then [verdict, ratio] in A/B runs, the memory census's peak in bytes, the
    numerics replay in words and its verdict against the series' previous replay, each null where
    the run has none and the row cut after the last one it has; a step: [first point after, ratio]."""
    run_index = {id(record): i for i, record in enumerate(history.runs)}

    def point(p: Point) -> list:
        row = [run_index[id(p.record)], _ms(p.median_s), _ms(p.q1_s), _ms(p.q3_s)]
        extra = [p.verdict or None, p.ab_ratio, p.memory_peak_bytes, p.numerics_state, p.numerics_line]
        while extra and extra[-1] is None:
            extra.pop()
        return row + extra

    steps: dict[int, list] = {}
    for step in history.steps:
        steps.setdefault(step.series.index, []).append([step.index, round(step.ratio, 4)])
    return {"runs": [[r.commit, r.branch, r.when_text(), r.file, r.dirty] for r in history.runs],
            "series": [{"points": [point(p) for p in s.points], "steps": sorted(steps.get(s.index, []))}
                       for s in history.series]}


def embedded_json(data: dict) -> str:
    """JSON safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` left to end or open a tag."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def read_section(history: History) -> str:
    """What the page was built from: runs and their dates, machines, sources, filters, skips."""
    runs, dated = history.runs, [r for r in history.runs if r.when]
    rows = []
    span = f", {_date(min(dated, key=RunRecord.order_key))} to {_date(max(dated, key=RunRecord.order_key))}" if dated else ""
    rows.append(("Runs", f"{len(runs)}{span} (ordered by commit time, else the run's time)"))
    per_machine: dict[str, int] = {}
    for record in runs:
        per_machine[record.machine.label] = per_machine.get(record.machine.label, 0) + 1
    rows.append(("Machines", "; ".join(f"{escape(label)}: {count} runs" for label, count in per_machine.items())))
    sources = f"storage <code>{escape(str(history.storage))}</code> (every machine folder)"
    if history.files:
        sources += "; files " + ", ".join(f"<code>{escape(str(f))}</code>" for f in history.files)
    rows.append(("Read from", sources))
    if history.skipped:
        rows.append(("Skipped", "<br>".join(escape(message) for message in history.skipped)))
    filters = []
    if history.since:
        filters.append(f"runs since {history.since:%Y-%m-%d}")
    if history.case_patterns:
        filters.append("cases matching " + ", ".join(f"<code>{escape(p)}</code>" for p in history.case_patterns))
    if filters:
        rows.append(("Filters", "; ".join(filters)))
    rows.append(("Series", f"{len(history.series)}, one per machine, backend and case; steps are searched in "
                           f"series of at least {history.min_points} runs and reported from "
                           f"{history.min_step * 100:g}% up"))
    return '<dl class="read">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _commit_cell(point: Point) -> str:
    record = point.record
    return f"<code>{escape(shown_commit(record.commit))}</code> {_date(record)}"


def _bisect_cell(step) -> str:
    command = step.bisect_command()
    if command is None:  # why not, escaped: the reason quotes what the run file holds
        return f'<span class="muted">&mdash; {escape(step.bisect_unavailable())}</span>'
    return f"<code>{escape(command)}</code>"


def _interval_cell(step) -> str:
    """The step's interval as the stored gate reads it (its run-to-run component from the series)."""
    if not math.isfinite(step.ci_high):
        return ""
    return f' <span class="muted">[{step.ci_low:.2f}, {step.ci_high:.2f}]</span>'


def steps_section(history: History) -> str:
    """The table of detected steps, largest first, each linking to its chart."""
    if not history.steps:
        return (f'<p class="muted">No step of {history.min_step * 100:g}% or more in any series of at least '
                f"{history.min_points} runs.</p>")
    rows = []
    for step in history.steps:
        series = step.series
        direction = "slower" if step.ratio > 1 else "faster"
        rows.append(
            f'<tr><td class="num {direction}">&times;{step.ratio:.2f}{_interval_cell(step)}</td>'
            f'<td><a href="#{series.chart_id}">{escape(series.name)}</a></td>'
            f"<td>{escape(series.machine.label)}</td><td>{escape(series.backend)}</td>"
            f'<td class="num">{step.before_s * 1e3:.4g}</td><td class="num">{step.after_s * 1e3:.4g}</td>'
            f"<td>{_commit_cell(step.last_before)} &rarr; {_commit_cell(step.first_after)}</td>"
            f"<td>{_bisect_cell(step)}</td></tr>")
    return ('<table class="steps"><thead><tr><th>Ratio</th><th>Case</th><th>Machine</th><th>Backend</th>'
            "<th>Before (ms)</th><th>After (ms)</th><th>Between (last run before &rarr; first after)</th>"
            "<th>Find the commit</th>"
            "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def numerics_section(history: History) -> str:
    """The table of numerics changes: where a case's seeded replay computed other values than the
    run before it (a run without a replay is passed over), each with the verdict's line."""
    replays = sum(1 for s in history.series for p in s.points if p.numerics_state is not None)
    if not history.numerics_changes:
        what = ("no run recorded a numerics replay (--dist-numerics-steps)" if not replays else
                f"every case's replay computes what its run before computed ({replays} replays)")
        return f'<p class="muted">No numerics change: {what}.</p>'
    rows = []
    for change in history.numerics_changes:
        series = change.series
        rows.append(f'<tr><td><a href="#{series.chart_id}">{escape(series.name)}</a></td>'
                    f"<td>{escape(series.machine.label)}</td><td>{escape(series.backend)}</td>"
                    f"<td>{_commit_cell(change.before)} &rarr; {_commit_cell(change.after)}</td>"
                    f"<td>{escape(change.line)}</td></tr>")
    return ('<table class="steps numerics"><thead><tr><th>Case</th><th>Machine</th><th>Backend</th>'
            "<th>Between (run before &rarr; run)</th><th>Numerics</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _figure(series: Series) -> str:
    where = " &middot; ".join([escape(series.machine.label), escape(series.backend), f"{len(series.points)} runs"])
    return (f'<figure class="chart" id="{series.chart_id}" data-series="{series.index}">'
            f'<figcaption><b>{escape(series.name)}</b> <span class="where">{where}'
            f'</span><br><code class="muted">{escape(series.fullname)}</code></figcaption>'
            f'<div class="plot"></div></figure>')


def families_section(history: History) -> str:
    parts = []
    for key in FAMILIES:
        members = [s for s in history.series if s.family == key]
        if members:
            parts.append(f'<section class="family" id="family-{key}"><h3>{FAMILY_TITLES[key]}</h3>'
                         f'<div class="grid">{"".join(_figure(s) for s in members)}</div></section>')
    return "\n".join(parts)


def render_page(history: History) -> str:
    return Template(_template("page.html")).substitute(
        css=_template("page.css"), js=_template("page.js"), read=read_section(history),
        steps=steps_section(history), numerics=numerics_section(history), legend=LEGEND, families=families_section(history),
        data=embedded_json(page_data(history)))


def write_page(history: History, path: str | Path) -> Path:
    """Write the page (creating its folder); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(history), encoding="utf-8")
    return path
