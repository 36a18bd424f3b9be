"""``ddpbench history``: every saved run of a pytest-benchmark storage (all machine folders) and any
named JSON files, as one static HTML page of series with their detected steps.

* :mod:`.series`: runs -> one series per (machine, backend, case), points in commit order;
* :mod:`.steps`: change points of each series (ruptures), kept when at least ``min_step``;
* :mod:`.build`: the :class:`History` a page shows (runs, series, steps);
* :mod:`.numerics`: each point's numerics replay against the one before, the changes listed;
* :mod:`.page`: the self-contained HTML page (``page.html`` / ``page.css`` / ``page.js``).

The command is a view, not a gate: it exits 0 whatever the steps (``ddpbench compare`` and A/B
mode are the gates); bad input raises :class:`ddpbench.storage.runs.RunError` (exit 2).
"""

from __future__ import annotations

from .build import History, build_history
from .page import write_page
from .series import parse_since
from .steps import DEFAULT_MIN_STEP

DEFAULT_OUTPUT = "reports/history.html"

__all__ = ["DEFAULT_MIN_STEP", "DEFAULT_OUTPUT", "History", "build_history", "parse_since", "write_page"]
