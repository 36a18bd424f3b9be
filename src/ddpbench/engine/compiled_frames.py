"""Whether the recorded rounds ran the program the warm-up ran: dynamo's compiled frames counted per
round (torch's guard-complete hook: one call per entry into a compiled frame) and the frames dynamo
compiled (its counters). A round that compiled, or compiled code that stopped running (dynamo marks a
frame's code skipped for good when it meets it under a dispatch mode), makes the rounds' times those
of another program; :func:`check_rounds` refuses them (docs/design/census-and-memory.md#one-program)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from ..pool.base import TaskError


def frames_compiled() -> int | None:
    """Frames dynamo has compiled in this process so far; None when torch.compile was never used
    (torch._dynamo not imported)."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


class CompiledFrameEntries:
    """Context manager counting entries into compiled frames (cache hits), any thread's; inactive
    (``take()`` None) where torch._dynamo is not imported or torch has no guard-complete hook. The
    hook is one Python call per compiled frame entered (well under a microsecond, beside dynamo's own
    guard evaluation), the same on both sides of an A/B run. A hook set before is called too."""

    def __init__(self) -> None:
        self.count = 0
        self.active = False
        self._previous: Any = None

    def __enter__(self) -> "CompiledFrameEntries":
        if "torch._dynamo" not in sys.modules:
            return self
        try:
            from torch._C._dynamo.eval_frame import set_guard_complete_hook
        except ImportError:  # a torch without the hook: only the compile counters are checked
            return self
        previous = set_guard_complete_hook(self._entered)
        self._previous, self.active = previous, True
        return self

    def _entered(self, cache_hit: bool) -> bool:
        # What the hook returns decides: False makes dynamo compile the frame anew. Pass the
        # lookup's own answer on (or the hook set before ours).
        if cache_hit:
            self.count += 1
        return self._previous(cache_hit) if self._previous is not None else cache_hit

    def take(self) -> int | None:
        """Entries since the last take (None: not counting)."""
        if not self.active:
            return None
        count, self.count = self.count, 0
        return count

    def __exit__(self, *exc) -> None:
        if self.active:
            from torch._C._dynamo.eval_frame import set_guard_complete_hook

            set_guard_complete_hook(self._previous)
            self.active = False


class ProgramChanged(TaskError, AssertionError):
    """The recorded rounds did not all run the program the others (or the warm-up) ran."""


def round_entries(entries: int | None, compiled_before: int | None, compiled_after: int | None) -> int | None:
    """A round's compiled-frame entries as the history counts them: a round in which dynamo
    compiled a frame ran that frame's compiled code too (its first run is a compile, not a cache
    hit, so the guard hook did not count it)."""
    if entries is None:
        return None
    compiled = compiled_after is not None and compiled_after > (compiled_before or 0)
    return entries + (1 if compiled else 0)


@dataclasses.dataclass
class EntryHistory:
    """A session's rounds (warm-up and recorded) as compiled-frame entries: how many rounds entered a
    compiled frame, the longest run of rounds without between two that did (a step whose compiled
    frames come every other step has such runs: its cycle), and the rounds without since the last
    that did."""

    entered_rounds: int = 0
    longest_gap: int = 0
    trailing: int = 0

    @property
    def entered(self) -> bool:
        return self.entered_rounds > 0

    @property
    def cycle_seen(self) -> bool:
        """Two rounds entered compiled code: the gap between them is a whole cycle of the step."""
        return self.entered_rounds >= 2

    def add(self, counts: list[int | None]) -> None:
        for count in counts:
            if count:
                if self.entered:
                    self.longest_gap = max(self.longest_gap, self.trailing)
                self.entered_rounds += 1
                self.trailing = 0
            elif count is not None:
                self.trailing += 1


def check_rounds(entries: list[int | None], compiled_before: int | None, compiled_after: int | None,
                 history: EntryHistory) -> None:
    """Refuse recorded rounds that ran other code: dynamo compiled a frame during them
    (``compiled_before`` / ``compiled_after``: :func:`frames_compiled` around them), or compiled code
    stopped running: the rounds since the last that entered a compiled frame are at least two and
    more than the longest such run before, judged once a whole cycle was seen (two rounds that
    entered compiled code: a step that enters it every 4th round has runs of 3 without; with one
    such round seen, a run of rounds without is as likely the rest of its cycle). ``history``: the
    earlier rounds, warm-up included (it takes ``entries`` in when they pass); ``entries``: each
    round's compiled-frame entries."""
    if compiled_before is not None and compiled_after is not None and compiled_after > compiled_before:
        raise ProgramChanged(
            f"dynamo compiled {compiled_after - compiled_before} frame(s) during the recorded rounds: those rounds "
            f"ran other code than the rest (a compile or recompile; TORCH_LOGS=recompiles says why). Warm the "
            f"step up past its compiles: --dist-warmup of at least the rounds until the last one (a step that "
            f"compiles part of its work only every Nth round, an optimizer step after N accumulated rounds, "
            f"compiles it in its Nth round: --dist-warmup=N, and 2N lets the check below see its whole cycle), or "
            f"keep what a step changes out of its guards")
    after = dataclasses.replace(history)
    after.add(entries)
    if after.cycle_seen and after.trailing >= 2 and after.trailing > after.longest_gap:
        first = max(1, len(entries) - after.trailing + 1)
        raise ProgramChanged(
            f"compiled code stopped running: recorded rounds {first} to {len(entries)} of {len(entries)} entered no "
            f"compiled frame, a longer run than any between the rounds that did (at most {after.longest_gap}), so "
            f"they ran eager (dynamo skips a frame for good once it meets it under a dispatch mode or past its "
            f"recompile limit: TORCH_LOGS=recompiles); their times are another program's. A step that enters "
            f"compiled code only every Nth round in a cycle the warm-up did not show whole: --dist-warmup=2N")
    history.add(entries)
