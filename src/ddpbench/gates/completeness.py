"""Whether a saved run measured everything it set out to: a partial run is never a default baseline
(docs/design.md#a-partial-run-is-never-a-default-baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RUN_KEY = "ddpbench_run"
_NAMED_FAILURES = 20


def record(exitstatus: int, failed: int, stopped: str | None, failed_cases: list[str]) -> dict[str, Any]:
    """What a run says about itself when saved: ``complete``, pytest's ``exitstatus``, the number
    of ``failed`` reports (failures and errors), the first failing cases, and why it ``stopped``
    early (``-x`` / ``--maxfail``), if it did."""
    complete = int(exitstatus) == 0 and failed == 0 and not stopped
    return {"complete": complete, "exitstatus": int(exitstatus), "failed": int(failed),
            "failed_cases": list(failed_cases)[:_NAMED_FAILURES], "stopped": stopped or None}


@dataclass(frozen=True)
class Completeness:
    complete: bool
    recorded: bool  # False: saved before ddpbench recorded it (or by another tool)
    why: str = ""  # for an incomplete run: what happened

    def describe(self) -> str:
        if not self.recorded:
            return "completeness not recorded (saved by an older ddpbench or another tool)"
        return "complete" if self.complete else f"incomplete: {self.why}"


def completeness_of(doc: Any) -> Completeness:
    """The record of a run document (a pytest-benchmark JSON run)."""
    rec = doc.get(RUN_KEY) if isinstance(doc, dict) else None
    if not isinstance(rec, dict) or not isinstance(rec.get("complete"), bool):
        return Completeness(True, False)
    if rec["complete"]:
        return Completeness(True, True)
    parts = []
    failed = rec.get("failed")
    if isinstance(failed, int) and failed:
        names = [str(n) for n in rec.get("failed_cases") or []]
        shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        parts.append(f"{failed} failed or erroring case(s)" + (f" ({shown})" if shown else ""))
    if rec.get("stopped"):
        parts.append(f"stopped early ({rec['stopped']})")
    status = rec.get("exitstatus")
    if isinstance(status, int) and status not in (0, 1):
        parts.append(f"pytest exit status {status}" + (" (internal error)" if status == 3 else ""))
    return Completeness(False, True, "; ".join(parts) or "pytest did not finish cleanly")
