"""``ddpbench bisect``: the first first-parent commit between GOOD and BAD whose code the A/B gate
finds slower than GOOD's (docs/design/ab.md#bisect). The command in :mod:`.command`; the search,
a pure function, in :mod:`.search`; how a probe is read in :mod:`.probe`."""

from .command import Bisect, run_bisect
from .inputs import DEFAULT_COLLECT_TIMEOUT, DEFAULT_MAX_TIME, BisectError, Checkout, Options
from .probe import BAD_VERDICTS, GOOD_VERDICTS, Probe, ProbeCase, read_probe
from .search import SearchResult, narrow

__all__ = ["BAD_VERDICTS", "DEFAULT_COLLECT_TIMEOUT", "DEFAULT_MAX_TIME", "GOOD_VERDICTS", "Bisect", "BisectError",
           "Checkout", "Options", "Probe", "ProbeCase", "SearchResult", "narrow", "read_probe", "run_bisect"]
