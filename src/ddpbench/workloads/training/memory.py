"""CPU peak memory of a loop's set-up and one step (the allocator has no statistic on the CPU)."""

from __future__ import annotations


class _CpuMemoryProbe:
    """Peak of the running sum of torch.profiler's ``[memory]`` events between start and stop."""

    def __init__(self):
        import torch

        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                            profile_memory=True, record_shapes=False)
        self.peak_bytes: int | None = None

    def start(self):
        self._prof.__enter__()
        return self

    def stop(self, floor_bytes: int = 0) -> int | None:
        """The peak, or None when it is below ``floor_bytes`` (tensors known to have been allocated
        under the probe): the profiler then missed events, which happens when kineto was first
        initialised on another thread of the process, and no number beats a wrong one."""
        self._prof.__exit__(None, None, None)
        events = [(e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                  if e.name() == "[memory]"]
        events.sort(key=lambda item: item[0])
        live = peak = 0
        for _, nbytes in events:
            live += nbytes
            peak = max(peak, live)
        self.peak_bytes = int(peak) if peak >= floor_bytes else None
        return self.peak_bytes
