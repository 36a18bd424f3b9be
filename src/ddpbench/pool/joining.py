"""What the controller knows about each torchrun rank while the pool forms (its phase, its
connections, where it runs)."""

from __future__ import annotations

from dataclasses import dataclass

from .channel import SignedConnection


@dataclass
class JoiningRank:
    """What the controller knows about one rank while the pool forms."""

    info: dict  # the hello's info, updated with each phase's details
    since: float  # monotonic time the current phase was reported
    task: SignedConnection | None = None
    control: SignedConnection | None = None
    phase: str = "connected"  # connected -> joining -> ready; or failed / lost
    error: str = ""

    @property
    def rank(self) -> int:
        return self.info["rank"]

    @property
    def where(self) -> str:
        """'hostname 10.0.0.2': the host's name and the address it reached the controller from."""
        return " ".join(str(self.info[key]) for key in ("host", "address") if self.info.get(key))

    @property
    def node(self) -> str:
        return f"node {self.info.get('node_rank', '?')} ({self.where})"

    def close(self) -> None:
        for conn in (self.task, self.control):
            if conn is not None:
                conn.close()
