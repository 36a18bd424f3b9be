"""The ``ddpbench bisect`` command: :class:`Bisect` collects the selection, confirms BAD, searches
(:func:`.search.narrow`) and prints the probes' table; :func:`run_bisect` checks the input first
and removes the worktrees at the end, also after Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

from .inputs import BisectError, Checkout, Options, check_input
from .probe import Probe, judged_cases, step_threshold
from .processes import Children
from .runner import ProbeRunner
from .search import SearchResult, narrow
from .terminal import printable
from .worktrees import Worktrees


class Bisect:
    """One search over ``checkout``'s commits; its worktrees and logs go under ``scratch``."""

    def __init__(self, checkout: Checkout, options: Options, scratch: Path, out=sys.stdout):
        self.checkout = checkout
        self.options = options
        self.scratch = scratch
        self.out = out
        self.children = Children()
        self.worktrees = Worktrees(checkout, options, scratch, self.children)
        self.runner = ProbeRunner(checkout, options, self.worktrees, self.children)
        self.probes: dict[str, Probe] = {}  # commit -> its probe, in the order probed

    def say(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    def run(self) -> int:
        """The selection collected at BAD and GOOD, then the search; the exit status."""
        checkout = self.checkout
        self.say(f"ddpbench bisect: {len(checkout.commits)} first-parent commit(s) after GOOD {checkout.good[:12]} "
                 f"up to BAD {checkout.bad[:12]}; worktrees in {self.scratch}")
        if checkout.untracked:
            shown = ", ".join(checkout.untracked[:5]) + (", ..." if len(checkout.untracked) > 5 else "")
            self.say(f"note: {len(checkout.untracked)} untracked file(s) ({shown}) are in no commit: the probes' "
                     f"worktrees do not have them (commit them if the benchmarks need them)")
        ids = self.runner.collect(checkout.bad, "BAD")
        self.runner.collect(checkout.good, "GOOD")
        self.runner.use_selection(ids)
        self.say(f"selection: {len(ids)} case(s) at BAD, e.g. {printable(ids[0])}")
        return self.search()

    def probe(self, sha: str) -> Probe:
        probe = self.runner.probe(sha)
        self.probes[sha] = probe
        self.say(f"  [{len(self.probes)}] {sha[:12]} {probe.subject[:50]}: {probe.outcome.upper()}  "
                 f"({probe.summary()}; {probe.seconds:.0f} s)")
        return probe

    def search(self) -> int:
        """BAD confirmed first, then the probes; the exit status."""
        good, bad = self.checkout.good, self.checkout.bad
        self.say("confirming that BAD is slower than GOOD:")
        confirm = self.probe(bad)
        if confirm.outcome == "good":
            self.say(f"no regression between GOOD {good[:12]} and BAD {bad[:12]}: nothing to bisect")
            return 0
        if confirm.outcome != "bad":
            self.say(f"could not confirm a regression at BAD {bad[:12]} ({confirm.outcome}: "
                     f"{confirm.summary()}); raise --max-time or narrow -k, and run again")
            return 1
        # Later probes ask which side of BAD's step a commit lies on, unless the user chose the threshold.
        threshold = None if self.options.sets("--dist-ab-threshold") else step_threshold(confirm.cases)
        if threshold is not None:
            self.say(f"probes are classified against the step's midpoint: --dist-ab-threshold="
                     f"{100 * threshold:.1f}% (sqrt of BAD's lowest interval end; set "
                     f"--dist-ab-threshold among the pytest args to choose it)")
        reference = judged_cases(confirm.cases, self.options.missing_is_bad)
        self.runner.threshold, self.runner.reference = threshold, reference
        self.say(f"searching {len(self.checkout.commits) - 1} commit(s) between them (each must judge the "
                 f"{len(reference)} case(s) BAD judged, or it is skipped):")
        result = narrow(self.checkout.commits, lambda sha: self.probe(sha).outcome)
        self.report(result)
        return 0 if result.found else 1

    def report(self, result: SearchResult) -> None:
        self.say()
        self.say("probes (ratio candidate/GOOD with its interval, verdict):")
        self.say(f"  {'commit':12}  {'outcome':12}  {'seconds':>7}  subject / cases")
        for p in sorted(self.probes.values(), key=lambda p: p.index):
            self.say(f"  {p.sha[:12]}  {p.outcome:12}  {p.seconds:7.0f}  {printable(p.subject)[:60]}")
            self.say(f"  {'':12}  {'':12}  {'':7}  {p.summary()}")
        total = sum(p.seconds for p in self.probes.values())
        self.say(f"{len(self.probes)} probe(s), {total:.0f} s of A/B runs, for {len(self.checkout.commits)} commit(s)")
        first = self.probes[result.first_bad]
        if result.found:
            self.say(f"first bad commit: {first.sha} {printable(first.subject)}")
        else:
            left = [sha[:12] for sha in result.candidates]
            self.say(f"the first bad commit is one of {', '.join(left)} (the others could not be measured: skip)")
        self.say(f"its A/B verdict: {first.summary()}")
        self.say("reproduce it (the same A/B run, block order seed included):")
        for line in first.command.splitlines():
            self.say(f"  {line}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_bisect(args, out=sys.stdout) -> int:
    """The command: exit 0 found (or nothing to search), 1 undecided, 2 bad input, 130 interrupted."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    bisect: Bisect | None = None
    try:
        options = Options.from_args(args)
        checkout = check_input(Path.cwd(), args.good, args.bad, options)
        bisect = Bisect(checkout, options, Path(tempfile.mkdtemp(prefix="ddpbench-bisect-")), out)
        return bisect.run()
    except BisectError as exc:
        print(f"ddpbench bisect: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if bisect is not None:
            bisect.children.stop_all()
        print("ddpbench bisect: interrupted; removing its worktrees", file=sys.stderr)
        return 130
    finally:
        try:
            if bisect is not None:
                bisect.children.stop_all()
        finally:
            if bisect is not None:
                bisect.worktrees.remove_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
