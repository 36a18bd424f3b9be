"""What only the report knows about a case: the keys its family's table cannot do without. Every
other field was checked once when the run was read (:mod:`ddpbench.storage.records`)."""

from __future__ import annotations

from ..storage.runs import Case, Run, RunError
from .families import TABLE_OF, family


class ReportError(RunError):
    """A run whose figures the tables cannot show: the message names the case and the field."""


def case_problem(case: Case) -> str | None:
    """The first key the case's family table needs and the case does not record, or None."""
    table = TABLE_OF[family(case)]
    missing = [key for key in table.required if key not in case.extra_info]
    if missing:
        return f"extra_info has no {missing[0]}, which every case of the {table.name} family records"
    return None


def check_run(run: Run) -> None:
    """Raise :class:`ReportError` naming each case (up to five) that lacks a key its family's table
    needs: a damaged or hand-edited run is named, not a traceback."""
    problems = [f"{case.fullname}: {problem}" for case in run.cases.values()
                for problem in [case_problem(case)] if problem]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ReportError(f"{run.path}: " + "; ".join(problems[:5]) + more
                          + ". The file is damaged or was edited: restore it or rerun those cases")
