"""Which family's section shows a case: the family the case recorded (``extra_info["family"]``,
written by the family's workload), the sections in report order."""

from __future__ import annotations

from collections import defaultdict

from ..storage.runs import Case, Run
from . import collectives, datasets, other_cases, syncbn, training, transformer
from .family_table import FamilyTable

# The report's sections, in order; "other" shows every case no family table claims.
FAMILY_TABLES: tuple[FamilyTable, ...] = (collectives.TABLE, syncbn.TABLE, training.TABLE, transformer.TABLE,
                                          datasets.TABLE, other_cases.TABLE)
TABLE_OF = {table.name: table for table in FAMILY_TABLES}


def family_from_keys(info: dict) -> str:
    """The family of a case that recorded none (saved before cases recorded their family, or a
    workload of the user's own), told by the extra_info keys each family writes."""
    if "op" in info and "size_bytes" in info:
        return "collectives"
    if "variant" in info and "hidden_dim" in info:
        return "syncbn"
    if "tokens_per_second" in info and "model_flops_per_step" in info:
        return "transformer"
    if "impl" in info:
        return "training"
    if "layout" in info:
        return "datasets"
    return "other"


def family(case: Case) -> str:
    """The name of the section that shows ``case``: the family it recorded when the report has a
    table of that name (else "other"), or, when it recorded none, :func:`family_from_keys`."""
    recorded = case.extra_info.get("family")
    if recorded is None:
        return family_from_keys(case.extra_info)
    return recorded if isinstance(recorded, str) and recorded in TABLE_OF else "other"


def by_family(run: Run) -> dict[str, list[Case]]:
    groups: dict[str, list[Case]] = defaultdict(list)
    for case in run.cases.values():
        groups[family(case)].append(case)
    return groups
