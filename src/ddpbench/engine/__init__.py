"""The timing engine: :mod:`.timing` runs a workload's rounds inside every rank by the timing rule
(barrier, timer, ops, timer; the slowest rank's time; warm-up; the stopping rule), with a round's
mechanics in :mod:`.rounds`, the phase times in :mod:`.phases` and the variant rounds in
:mod:`.variants`; :mod:`.modes` says what the rounds look like beyond their median (two modes,
where the ranks ran, each rank's own times)."""
