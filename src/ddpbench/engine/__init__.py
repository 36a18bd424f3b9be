"""The timing engine: :mod:`.timing` runs a workload's rounds inside every rank by the timing rule
(barrier, timer, ops, timer; the slowest rank's time; warm-up; the stopping rule), and
:mod:`.modes` says what the rounds look like beyond their median (two modes, where the ranks ran,
each rank's own times)."""
