"""The heap settings both sides' ranks run with in A/B mode (``--dist-ab-heap``;
docs/design/ab.md#the-heap-both-sides-run-with)."""

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
