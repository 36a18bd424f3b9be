"""The heap settings both sides' ranks run with in A/B mode (``--dist-ab-heap``).

glibc's malloc adapts to each process's own history: freeing a large block (a tensor, gloo's
flattened buffers) raises its mmap threshold to that size, and the top of the heap goes back to
the kernel once more than a trim threshold lies free there. So two identical rank processes need
not serve a case's buffers alike: in a plain 2-rank gloo script on the dev machine, a 10 MB
all_gather round faulted in 0, 2562 or 5121 fresh pages depending on the process. Identical A/B
pools showed the matching shape: one pool of processes off its twin for a whole case, anew each
case, by a few percent and up to 47% (docs/results.md).

``steady`` (the default) fixes the thresholds (setting any of them in the environment also turns
glibc's adaptation off): blocks under 32 MiB, glibc's largest mmap threshold, come from the heap,
whose top is never given back; larger blocks are mapped fresh each time. With it, pools of
identical processes drifted apart by about a quarter as much per case at 10 MB on the dev machine
(docs/results.md). It does not make every process fault alike: the plain script above still
varied from process to process with it, so part of what it removes is still unexplained. The cost
is memory: a rank keeps its largest heap for its life. ``adaptive`` leaves glibc's defaults, as a
plain script has them. Other C libraries ignore these variables; a value a side sets itself
(``--dist-*-env``) wins.
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
