"""``ddpbench bisect``'s input, checked before any run: its options, the checkout it runs in, GOOD
and BAD, and the commits between them (bad input: :class:`BisectError`, exit 2)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from .processes import git
from .terminal import printable

DEFAULT_MAX_TIME = 60.0
DEFAULT_COLLECT_TIMEOUT = 300.0  # --collect-timeout: GOOD's and BAD's pytest --collect-only
ACCEPT_STRUCTURE_OPTION = "--dist-accept-structure-change"
ACCEPT_MEMORY_OPTION = "--dist-accept-memory-change"
MEMORY_TOLERANCE_OPTION = "--dist-memory-tolerance"
ACCEPT_NUMERICS_OPTION = "--dist-accept-numerics-change"
NUMERICS_TOLERANCE_OPTION = "--dist-numerics-tolerance"
# Options bisect sets itself on every A/B run; given among the pytest args they are refused.
OWN_OPTIONS = ("--dist-baseline-path", "--dist-baseline-python", "--benchmark-json", "--dist-ab-max-time",
               "--dist-fail-on-inconclusive", "--dist-ab-fail-on-inconclusive")


def spellings(option: str) -> tuple[str, ...]:
    """A gate option as the pytest args may spell it: now, and as before (``--dist-ab-...``), which
    the plugin still reads for one more release (ddpbench.option_table.PYTEST_OLD_SPELLINGS)."""
    return (option, option.replace("--dist-", "--dist-ab-", 1))


def _given(option: str, args: list[str]) -> bool:
    return any(arg in spellings(option) for arg in args)


def _value(option: str, args: list[str]) -> str | None:
    """The last value the pytest args give ``option`` (``--opt=V`` or ``--opt V``), or None."""
    found = None
    for i, arg in enumerate(args):
        for spelled in spellings(option):
            if arg.startswith(spelled + "="):
                found = arg.split("=", 1)[1]
            elif arg == spelled and i + 1 < len(args):
                found = args[i + 1]
    return found


class BisectError(Exception):
    """Bad input: the message names the problem and the fix (exit 2)."""


@dataclass
class Options:
    """The command's options (the command line's, see :meth:`from_args`)."""

    max_time: float = DEFAULT_MAX_TIME  # --dist-ab-max-time of each A/B run (twice on a rerun)
    pytest_args: list[str] = field(default_factory=list)  # what follows ``--``
    keyword: str | None = None  # pytest -k
    setup: str | None = None  # run through bash once in each commit's worktree
    python: str | None = None  # the interpreter --setup made, relative to the worktree
    missing_is_bad: bool = False
    collect_timeout: float = DEFAULT_COLLECT_TIMEOUT
    probe_timeout: float | None = None  # None: from --collect-timeout and the cases selected

    @classmethod
    def from_args(cls, args) -> Options:
        return cls(max_time=args.max_time, pytest_args=list(args.pytest_args), keyword=args.keyword,
                   setup=args.setup, python=args.python or None, missing_is_bad=args.missing_is_bad,
                   collect_timeout=args.collect_timeout or DEFAULT_COLLECT_TIMEOUT,
                   probe_timeout=args.probe_timeout)

    @property
    def selection(self) -> list[str]:
        """The pytest arguments that select the cases: -k, then what follows ``--``."""
        return (["-k", self.keyword] if self.keyword else []) + self.pytest_args

    @property
    def accept_structure_change(self) -> bool:
        """Each probe's run is read as its gate did: a structural change it accepted is accepted here."""
        return _given(ACCEPT_STRUCTURE_OPTION, self.pytest_args)

    @property
    def accept_memory_change(self) -> bool:
        """A memory change the probe's gate accepted is accepted here (as the structure's)."""
        return _given(ACCEPT_MEMORY_OPTION, self.pytest_args)

    @property
    def memory_tolerance(self) -> float | None:
        """The probe's gate's --dist-memory-tolerance (None: not set), parsed as the gate parses it;
        ``argparse.ArgumentTypeError`` when it cannot be read (check_input refuses that first)."""
        from ..options import parse_memory_tolerance

        value = _value(MEMORY_TOLERANCE_OPTION, self.pytest_args)
        return None if value is None else parse_memory_tolerance(value)

    def gate_reading(self) -> dict:
        """The rest of how each probe's gate read its run: the memory and numerics changes it
        accepted and the tolerances it allowed (:func:`~ddpbench.gates.verdicts.ab_verdicts_of_run`)."""
        from argparse import ArgumentTypeError

        from ..options import parse_numerics_tolerance

        tolerance = None
        value = _value(NUMERICS_TOLERANCE_OPTION, self.pytest_args)
        if value is not None:
            try:
                tolerance = parse_numerics_tolerance(value)
            except ArgumentTypeError:  # the probe's own pytest refuses it, naming the problem
                tolerance = None
        return {"accept_memory_change": self.accept_memory_change, "memory_tolerance": self.memory_tolerance,
                "accept_numerics_change": _given(ACCEPT_NUMERICS_OPTION, self.pytest_args),
                "numerics_tolerance": tolerance}

    def sets(self, option: str) -> bool:
        """Whether the pytest args set ``option`` (``--dist-ab-threshold``: also ``--dist-ab-threshold=10%``)."""
        return any(a.startswith(option) for a in self.pytest_args)


@dataclass
class Checkout:
    """The git checkout bisect runs in and the commits it searches."""

    top: Path  # the checkout's root
    prefix: str  # the folder bisect runs in, relative to ``top``: '' or 'benches/'
    good: str  # full shas
    bad: str
    commits: list[str]  # the first-parent commits after GOOD, oldest first, ending with BAD
    untracked: list[str] = field(default_factory=list)  # files in no commit: named, not refused

    def subject(self, sha: str) -> str:
        return printable(git(self.top, "log", "-1", "--format=%s", sha, check=False).stdout.strip())


def check_input(cwd: Path, good: str, bad: str, options: Options) -> Checkout:
    """The checkout around ``cwd`` with GOOD and BAD (as the user named them) resolved; BisectError
    when it is no checkout, either is no commit of it, GOOD is not an ancestor of BAD, tracked
    files have uncommitted changes, or the pytest args set an option bisect sets itself."""
    found = git(cwd, "rev-parse", "--show-toplevel", check=False)
    if found.returncode != 0:
        raise BisectError(f"{cwd} is not inside a git checkout; run ddpbench bisect in a checkout of the "
                          f"project whose benchmarks to search (cd into it first)")
    top = Path(found.stdout.strip())
    prefix = git(cwd, "rev-parse", "--show-prefix").stdout.strip()
    shas = []
    for name, rev in (("GOOD", good), ("BAD", bad)):
        found = git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        if found.returncode != 0:
            raise BisectError(f"{name} {rev!r} is not a commit of this checkout; name a commit, branch or tag "
                              f"(git log --oneline shows them)")
        shas.append(found.stdout.strip())
    good_sha, bad_sha = shas
    if good_sha == bad_sha:
        raise BisectError("GOOD and BAD are the same commit; name a BAD after GOOD")
    if git(top, "merge-base", "--is-ancestor", good_sha, bad_sha, check=False).returncode != 0:
        raise BisectError(f"GOOD {good} is not an ancestor of BAD {bad}: bisect searches the commits from GOOD "
                          f"to BAD. Swap them if GOOD is the later one, or name as GOOD a commit BAD descends "
                          f"from (git merge-base {good} {bad})")
    commits = git(top, "rev-list", "--first-parent", "--reverse", f"{good_sha}..{bad_sha}").stdout.split()
    status = [line for line in git(top, "status", "--porcelain").stdout.splitlines() if line.strip()]
    dirty = [line for line in status if not line.startswith("??")]
    if dirty:
        files = ", ".join(printable(line[3:]) for line in dirty[:5]) + (", ..." if len(dirty) > 5 else "")
        raise BisectError(f"the work tree has uncommitted changes ({files}); bisect measures committed "
                          f"code in worktrees of its own, which would not see them. Commit or stash them "
                          f"(git stash) and run again")
    for option in OWN_OPTIONS:
        if any(a == option or a.startswith(option + "=") for a in options.pytest_args):
            hint = " (give it as ddpbench bisect --max-time)" if option == "--dist-ab-max-time" else ""
            raise BisectError(f"{option} among the pytest arguments: bisect sets it on every A/B run{hint}")
    try:
        options.memory_tolerance  # noqa: B018 - read for its check: each probe is read with it
    except argparse.ArgumentTypeError as exc:
        raise BisectError(f"{MEMORY_TOLERANCE_OPTION} among the pytest arguments: {exc}") from None
    untracked = [printable(line[3:]) for line in status if line.startswith("??")]
    return Checkout(top, prefix, good_sha, bad_sha, commits, untracked)
