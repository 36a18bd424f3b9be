"""Where a rank's untimed seconds go: one total per engine phase (set-up, warm-up, the census...),
reported as ``engine_<phase>_s`` in the case's extra_info (docs/results.md, "Harness overhead per
case")."""

from __future__ import annotations

import contextlib
import time


class Phase:
    """One open phase: its start, and the seconds inside it that are not its own (its timed rounds,
    a phase nested in it)."""

    def __init__(self):
        self.started = time.perf_counter()
        self.excluded = 0.0

    def discount(self, seconds: float) -> None:
        """Leave ``seconds`` out of this phase (rounds it ran under the timer: they are the case's)."""
        self.excluded += seconds


class PhaseClock:
    """Seconds per phase, summed over every entry into it. A phase entered inside another is
    charged to itself alone; a phase's seconds are never negative. The phases named at creation are
    reported even when never entered (0.0); the others once entered, in the order first entered."""

    def __init__(self, *always: str):
        self._seconds: dict[str, float] = {name: 0.0 for name in always}
        self._open: list[Phase] = []

    @contextlib.contextmanager
    def phase(self, name: str):
        """``with clock.phase("warmup"): ...`` charges the block's wall time to ``name``."""
        phase = Phase()
        self._open.append(phase)
        try:
            yield phase
        finally:
            self._open.pop()
            wall = time.perf_counter() - phase.started
            if self._open:
                self._open[-1].discount(wall)
            self._seconds[name] = self._seconds.get(name, 0.0) + max(0.0, wall - phase.excluded)

    def metrics(self) -> dict[str, float]:
        """``{"engine_<phase>_s": seconds}``, rounded to the microsecond."""
        return {f"engine_{name}_s": round(seconds, 6) for name, seconds in self._seconds.items()}
