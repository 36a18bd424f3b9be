"""The heap settings both sides' ranks run with in A/B mode (``--dist-ab-heap``).

glibc's malloc adapts to each process's own history: freeing a large block (a tensor, gloo's
flattened buffers) raises its mmap threshold to that size, and the top of the heap goes back to
the kernel once more than a trim threshold lies free there. So two identical rank processes need
not serve a case's buffers alike (one faults in thousands of fresh pages a round, its twin none),
and a pool of such processes can sit off its twin for a whole case.

``steady`` (the default) fixes the thresholds (setting any of them in the environment also turns
glibc's adaptation off): blocks under 32 MiB, glibc's largest mmap threshold, come from the heap,
whose top is never given back; larger blocks are mapped fresh each time. Identical pools then drift
apart less (figures: docs/results.md, "What set identical pools apart"), though not every process
faults alike. The cost is memory: a rank keeps its largest heap for its life. ``adaptive`` leaves
glibc's defaults, as a plain script has them. Other C libraries ignore these variables; a value a
side sets itself (``--dist-*-env``) wins.
"""

from __future__ import annotations

HEAP_MODES = ("steady", "adaptive")
DEFAULT_HEAP = "steady"

STEADY_HEAP_ENV: tuple[tuple[str, str], ...] = (
    ("MALLOC_MMAP_THRESHOLD_", str(32 * 2**20)),  # glibc's largest: blocks under it from the heap
    ("MALLOC_TOP_PAD_", "0"),  # the heap grows by what is asked, no more
    ("MALLOC_TRIM_THRESHOLD_", str(2**36)),  # never give the heap's top back
)


def heap_env(mode: str) -> tuple[tuple[str, str], ...]:
    """The environment both sides' ranks get for ``mode`` (one of :data:`HEAP_MODES`)."""
    if mode not in HEAP_MODES:
        raise ValueError(f"heap mode {mode!r}: expected one of {', '.join(HEAP_MODES)}")
    return STEADY_HEAP_ENV if mode == "steady" else ()
