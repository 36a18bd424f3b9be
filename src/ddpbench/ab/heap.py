"""The heap settings both sides' ranks run with in A/B mode (``--dist-ab-heap``).

glibc's malloc adapts to each process's own history. When a large block (a tensor, gloo's
flattened buffers) is freed, the mmap threshold rises to its size, so later blocks of that size
come from the heap instead of freshly mapped pages, and the top of the heap goes back to the
kernel once more than a trim threshold lies free there. Two identical rank processes that went
through slightly different allocations can therefore hold a case's buffers differently for the
whole case: one reuses its pages every round, the other maps and faults in fresh ones every
round. On the dev machine, identical sides showed exactly that shape: one pool of processes off
its twin by 2-47% for a whole case, with a new offset for each case (docs/results.md).

``steady`` (the default) fixes the thresholds; setting any of them in the environment also turns
glibc's adaptation off. Blocks under 32 MiB (glibc's largest mmap threshold) then always come from
the heap, whose top is never given back, and larger blocks are always mapped fresh, so every round
of every pool allocates the same way. The cost is memory: a rank keeps its largest heap for
its life. ``adaptive`` leaves glibc's defaults, as a plain script has them. Other C libraries
ignore these variables. A value a side sets itself (``--dist-*-env``) wins.
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
