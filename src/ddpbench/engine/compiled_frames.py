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


@dataclasses.dataclass
class EntryHistory:
    """A session's rounds (warm-up and recorded) as compiled-frame entries: whether one entered a
    compiled frame, the longest run of rounds without between two that did (a step whose compiled
    frames come every other step has such runs), and the rounds without since the last that did."""

    entered: bool = False
    longest_gap: int = 0
    trailing: int = 0

    def add(self, counts: list[int | None]) -> None:
        for count in counts:
            if count:
                if self.entered:
                    self.longest_gap = max(self.longest_gap, self.trailing)
                self.entered, self.trailing = True, 0
            elif count is not None:
                self.trailing += 1


def check_rounds(entries: list[int | None], compiled_before: int | None, compiled_after: int | None,
                 history: EntryHistory) -> None:
    """Refuse recorded rounds that ran other code: dynamo compiled a frame during them
    (``compiled_before`` / ``compiled_after``: :func:`frames_compiled` around them), or compiled code
    stopped running: the rounds since the last that entered a compiled frame are at least two and
    more than the longest such run before (``history``: the earlier rounds, warm-up included; it
    takes ``entries`` in when they pass). ``entries``: each round's compiled-frame entries."""
    if compiled_before is not None and compiled_after is not None and compiled_after > compiled_before:
        raise ProgramChanged(
            f"dynamo compiled {compiled_after - compiled_before} frame(s) during the recorded rounds: those rounds "
            f"ran other code than the rest (a compile or recompile; TORCH_LOGS=recompiles says why). Warm the "
            f"step up until its guards hold (--dist-warmup), or keep what a step changes out of its guards")
    after = dataclasses.replace(history)
    after.add(entries)
    if after.entered and after.trailing >= 2 and after.trailing > after.longest_gap:
        first = max(1, len(entries) - after.trailing + 1)
        raise ProgramChanged(
            f"compiled code stopped running: recorded rounds {first} to {len(entries)} of {len(entries)} entered no "
            f"compiled frame where earlier rounds did, so they ran eager (dynamo skips a frame for good once it "
            f"meets it under a dispatch mode or past its recompile limit); their times are another program's")
    history.add(entries)
