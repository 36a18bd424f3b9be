"""``ddpbench bisect GOOD BAD``: the first first-parent commit between GOOD and BAD whose code the
A/B gate finds slower than GOOD's.

Each probe is one A/B run (a pytest subprocess): the probe commit's git worktree is the candidate
(pytest runs in it), GOOD's worktree is the baseline (``--dist-baseline-path``: its root, its
``src/`` and the folders of the selected test files), the same interpreter for both unless
``--setup`` / ``--python`` build one per commit. A probe's verdicts are read as the gate it ran
read them (``--dist-ab-accept-structure-change`` among the pytest args accepts structural changes
here too), and judged by :func:`read_probe`:

* ``bad``: any case is ``regression`` (a ``missing`` one too with ``--missing-is-bad``);
* ``skip``: a case that BAD judged is not judged here (absent from the run, ``missing``: crashed,
  hung or failed a check; ``baseline-failed``; ``new``): a slowdown search cannot place a commit
  it could not time, so a missing case is a skip with the reason unless ``--missing-is-bad``;
* ``good``: every case BAD judged is ``same``, ``not-slower`` or ``improvement`` (not on the slow side);
* ``inconclusive``: run once more with twice ``--max-time``; still so, it is skipped;

After BAD is confirmed, the probes ask which side of *that* step a commit lies on, not whether it
is 5% slower: unless the pytest args set ``--dist-ab-threshold``, each later A/B run uses the
step's geometric midpoint, sqrt(the lower end of BAD's ratio interval), as its threshold (never
below the gate's default). A step of x2 then splits at x1.41, so an unchanged commit reads
``same`` after a few pairs instead of ``inconclusive`` at +-5%, which would leave it unclassified.
* ``skip`` too: the run did not produce verdicts (``git worktree add`` or setup failed, the folder
  bisect runs in does not exist at that commit, collection failed, crashed, the run passed
  ``--probe-timeout``), as ``git bisect skip``: the search (:func:`narrow`) tests the untested
  commit nearest the middle instead, and names every candidate when skips leave more than one.

BAD is probed first: without a regression there, nothing is searched. Exit 0: the first bad
commit was found, or there is no regression to search; 1: the search could not decide (BAD
inconclusive or unrunnable, or skipped commits leave several candidates); 2: bad input; 130:
interrupted. Worktrees and the temporary folder are removed at the end, also after Ctrl-C or
SIGTERM.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .gates.verdicts import TIMED, VerdictError, ab_verdicts_of_run

BAD_VERDICTS = ("regression",)  # and "missing" with --missing-is-bad
GOOD_VERDICTS = ("same", "not-slower", "improvement")  # not on the slow side of the step
DEFAULT_MAX_TIME = 60.0
DEFAULT_COLLECT_TIMEOUT = 300.0  # --collect-timeout: GOOD's and BAD's pytest --collect-only
# --probe-timeout's default: --collect-timeout, then per selected case its --max-time and this
# much for the rest (pools started, set-up and warm-up, a hung rank's --dist-timeout, the finish).
PROBE_SLACK_PER_CASE_S = 300.0
ACCEPT_STRUCTURE_OPTION = "--dist-ab-accept-structure-change"
GATE_DEFAULT_THRESHOLD = 0.05  # the A/B gate's --dist-ab-threshold default
# Options bisect sets itself on every A/B run; given among the pytest args they are refused.
OWN_OPTIONS = ("--dist-baseline-path", "--dist-baseline-python", "--benchmark-json", "--dist-ab-max-time",
               "--dist-ab-fail-on-inconclusive")
INTERRUPT_GRACE_S = 60.0


class BisectError(Exception):
    """Bad input: the message names the problem and the fix (exit 2)."""


class Unavailable(Exception):
    """A commit bisect cannot run: its worktree or folder is missing (a probe: skipped)."""


def printable(text: str) -> str:
    """``text`` with its control and format characters (an escape sequence in a commit subject,
    a bidirectional override) shown escaped, so nothing printed can drive the terminal."""
    return "".join(ch if ch == " " or unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp")
                   else ascii(ch)[1:-1] for ch in text)


@dataclass
class ProbeCase:
    """One case's verdict as a probe's A/B run gave it (the gate's ``CaseVerdict``, reduced to
    what the search and its table need)."""

    name: str
    verdict: str
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    structure: str = ""  # what the collective census says changed, when it did
    reason: str = ""  # why a case is missing, new or baseline-failed

    def cell(self) -> str:
        structure = f" (structure: {self.structure})" if self.structure else ""
        if self.ratio is None:
            return f"{self.verdict}{structure}" + (f" ({self.reason})" if self.reason else "")
        ci = f" [{self.ci[0]:.3f}, {self.ci[1]:.3f}]" if self.ci else ""
        return f"x{self.ratio:.3f}{ci} {self.verdict}{structure}"


@dataclass
class Probe:
    index: int  # position in the first-parent list (0 = the first commit after GOOD)
    sha: str
    subject: str
    outcome: str = ""  # good / bad / inconclusive / skip
    cases: list[ProbeCase] = field(default_factory=list)
    seconds: float = 0.0
    runs: int = 0
    note: str = ""
    command: str = ""  # the A/B command of the last run, reproducible (see Bisect.reproduce)

    def summary(self) -> str:
        cases = "; ".join(f"{printable(c.name)}: {printable(c.cell())}" for c in self.cases)
        return " -- ".join(part for part in (cases, printable(self.note)) if part)


def read_probe(cases: Sequence[ProbeCase], reference: Sequence[str] | None = None,
               missing_is_bad: bool = False) -> tuple[str, str]:
    """How bisect reads one A/B run's verdicts: (outcome, note). ``reference``: the cases BAD
    judged (None while BAD itself is read: every case of the run is then one).

    * ``bad``: any case is ``regression``, or ``missing`` with ``missing_is_bad``;
    * ``skip``: a reference case is not judged here (absent, missing, baseline-failed, new): the
      note names each with why; a search for a slowdown cannot place a commit it did not time;
    * ``good``: every reference case is on the fast side (``same``, ``not-slower``, ``improvement``);
    * ``inconclusive``: the rest (an inconclusive reference case, none bad, none unjudged).
    """
    if not cases:
        return "skip", "no A/B verdict in the run"
    if any(c.verdict in BAD_VERDICTS for c in cases):
        return "bad", ""
    missing = [c.name for c in cases if c.verdict == "missing"]
    if missing and missing_is_bad:
        return "bad", f"missing counts as bad (--missing-is-bad): {', '.join(missing)}"
    by_name = {c.name: c for c in cases}
    names = list(by_name) if reference is None else list(reference)
    unjudged = []
    for name in names:
        case = by_name.get(name)
        if case is None:
            unjudged.append(f"{name} (not in the run)")
        elif case.verdict not in TIMED:
            unjudged.append(f"{name} ({case.verdict})")
    if unjudged:
        hint = (" (a case lost is not a slowdown; --missing-is-bad searches for the commit that lost it)"
                if missing else "")
        return "skip", "not judged here: " + ", ".join(unjudged) + hint
    verdicts = {by_name[name].verdict for name in names}
    return ("good" if verdicts <= set(GOOD_VERDICTS) else "inconclusive"), ""


def judged_cases(cases: Sequence[ProbeCase], missing_is_bad: bool = False) -> list[str]:
    """The cases a confirmed BAD judged: each later probe must judge them too (:func:`read_probe`)."""
    return [c.name for c in cases if c.verdict in TIMED or (missing_is_bad and c.verdict == "missing")]


def narrow(n: int, outcome_of: Callable[[int], str]) -> tuple[int, int]:
    """The search over commits 0..n-1 after GOOD, n-1 (BAD) known bad: probe the untested commit
    nearest the middle of (last good, first bad), the earlier on a tie (``outcome_of(index)``:
    good, bad, or anything else: skipped), until none is left between them. Returns (last good,
    first bad), -1 standing for GOOD; adjacent when the first bad commit was found."""
    lo, hi = -1, n - 1
    tested: set[int] = set()
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in tested]
        if not untested:
            return lo, hi
        middle = (lo + hi) / 2
        index = min(untested, key=lambda i: (abs(i - middle), i))
        tested.add(index)
        outcome = outcome_of(index)
        if outcome == "bad":
            hi = index
        elif outcome == "good":
            lo = index


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def _child_env() -> dict:
    """The environment of the pytest runs: this one, less what an enclosing xdist run set."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("PYTEST_XDIST") and k != "PYTEST_CURRENT_TEST"}


class Bisect:
    def __init__(self, args, out=sys.stdout):
        self.args = args
        self.out = out
        self.max_time = args.max_time
        self.pytest_args = list(args.pytest_args)
        self.keyword = args.keyword
        self.tmp: Path | None = None
        self.worktrees: dict[str, Path] = {}
        self.built: dict[str, bool] = {}
        self.probes: dict[int, Probe] = {}
        self.test_dirs: list[str] = []
        self.children: list[subprocess.Popen] = []
        self.threshold: float | None = None  # the probes' --dist-ab-threshold once BAD is confirmed
        self.reference: list[str] | None = None  # the cases BAD judged, once it is confirmed
        self.unavailable: dict[str, str] = {}  # commit -> why its worktree could not be made
        # Read each probe's run as its gate did: a structural change it accepted is accepted here.
        self.accept_structure_change = ACCEPT_STRUCTURE_OPTION in self.pytest_args
        self.missing_is_bad = getattr(args, "missing_is_bad", False)
        self.collect_timeout = getattr(args, "collect_timeout", None) or DEFAULT_COLLECT_TIMEOUT
        self.probe_timeout: float | None = getattr(args, "probe_timeout", None)
        self.cases_selected = 1  # the cases the selection collects at BAD (run_limit)
        self.untracked: list[str] = []  # files in no commit (check_input): named, not refused

    def say(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    # -- input ------------------------------------------------------------------------------------

    def check_input(self) -> None:
        cwd = Path.cwd()
        top = _git(cwd, "rev-parse", "--show-toplevel", check=False)
        if top.returncode != 0:
            raise BisectError(f"{cwd} is not inside a git checkout; run ddpbench bisect in a checkout of the "
                              f"project whose benchmarks to search (cd into it first)")
        self.top = Path(top.stdout.strip())
        self.prefix = _git(cwd, "rev-parse", "--show-prefix").stdout.strip()
        shas = []
        for name, rev in (("GOOD", self.args.good), ("BAD", self.args.bad)):
            found = _git(self.top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
            if found.returncode != 0:
                raise BisectError(f"{name} {rev!r} is not a commit of this checkout; name a commit, branch or tag "
                                  f"(git log --oneline shows them)")
            shas.append(found.stdout.strip())
        self.good, self.bad = shas
        if self.good == self.bad:
            raise BisectError("GOOD and BAD are the same commit; name a BAD after GOOD")
        if _git(self.top, "merge-base", "--is-ancestor", self.good, self.bad, check=False).returncode != 0:
            raise BisectError(f"GOOD {self.args.good} is not an ancestor of BAD {self.args.bad}: bisect searches the "
                              f"commits from GOOD to BAD. Swap them if GOOD is the later one, or name as GOOD a "
                              f"commit BAD descends from (git merge-base {self.args.good} {self.args.bad})")
        self.commits = _git(self.top, "rev-list", "--first-parent", "--reverse",
                            f"{self.good}..{self.bad}").stdout.split()  # ends with BAD
        status = [line for line in _git(self.top, "status", "--porcelain").stdout.splitlines() if line.strip()]
        dirty = [line for line in status if not line.startswith("??")]
        if dirty:
            files = ", ".join(printable(line[3:]) for line in dirty[:5]) + (", ..." if len(dirty) > 5 else "")
            raise BisectError(f"the work tree has uncommitted changes ({files}); bisect measures committed "
                              f"code in worktrees of its own, which would not see them. Commit or stash them "
                              f"(git stash) and run again")
        self.untracked = [printable(line[3:]) for line in status if line.startswith("??")]
        for option in OWN_OPTIONS:
            if any(a == option or a.startswith(option + "=") for a in self.pytest_args):
                hint = " (give it as ddpbench bisect --max-time)" if option == "--dist-ab-max-time" else ""
                raise BisectError(f"{option} among the pytest arguments: bisect sets it on every A/B run{hint}")

    # -- worktrees and environments ---------------------------------------------------------------

    def worktree(self, sha: str) -> Path:
        """The commit's worktree, made once; :class:`Unavailable` when git cannot check it out
        (an LFS or other filter failing, a missing object)."""
        if sha in self.unavailable:
            raise Unavailable(self.unavailable[sha])
        if sha not in self.worktrees:
            path = self.tmp / ("good" if sha == self.good else sha[:12])
            self.worktrees[sha] = path  # registered first: removed even if the add is interrupted
            added = _git(self.top, "worktree", "add", "--detach", "--quiet", str(path), sha, check=False)
            if added.returncode != 0:
                why = " | ".join(line.strip() for line in added.stderr.splitlines() if line.strip())
                self.unavailable[sha] = f"git worktree add failed (exit {added.returncode}): {printable(why)[-300:]}"
                raise Unavailable(self.unavailable[sha])
        return self.worktrees[sha]

    def build(self, sha: str) -> str:
        """Makes the commit's worktree and runs --setup once in it; '' when it worked, else why not
        (its worktree, the folder bisect runs in, --setup, the interpreter)."""
        try:
            root = self.worktree(sha)
        except Unavailable as exc:
            return str(exc)
        if not self.cwd(sha).is_dir():
            return (f"the folder bisect runs in ({printable(self.prefix.rstrip('/'))}) does not exist at this "
                    f"commit")
        if self.args.setup and sha not in self.built:
            done = self._run(["bash", "-c", self.args.setup], root, self.tmp / f"setup-{sha[:12]}.log")
            self.built[sha] = done == 0
        if self.args.setup and not self.built[sha]:
            return f"--setup failed (exit status not 0): {self._tail(self.tmp / f'setup-{sha[:12]}.log')}"
        python = self.python(sha)
        if not Path(python).exists():
            return f"no interpreter {python} (--python) after --setup"
        return ""

    def python(self, sha: str) -> str:
        return str(self.worktree(sha) / self.args.python) if getattr(self.args, "python", None) else sys.executable

    def cwd(self, sha: str) -> Path:
        return self.worktree(sha) / self.prefix

    def cleanup(self) -> None:
        for path in self.worktrees.values():
            _git(self.top, "worktree", "remove", "--force", str(path), check=False)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        _git(self.top, "worktree", "prune", check=False)

    # -- subprocesses -----------------------------------------------------------------------------

    def _run(self, command: list[str], cwd: Path, log: Path, env: dict | None = None,
             timeout: float | None = None) -> int | None:
        """Runs ``command`` in its own session (a Ctrl-C reaches bisect, which then stops it with
        SIGINT, so pytest stops its ranks), output to ``log``; its exit status, or None when it
        ran past ``timeout`` seconds (then stopped as an interrupt would)."""
        with open(log, "w") as handle:
            child = subprocess.Popen(command, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT,
                                     env=env or _child_env(), start_new_session=True)
            self.children.append(child)
            try:
                return child.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
            finally:
                self.children.remove(child)
                if child.poll() is None:
                    self._stop(child)

    @staticmethod
    def _stop(child: subprocess.Popen) -> None:
        try:
            os.killpg(child.pid, signal.SIGINT)
            child.wait(INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        except ProcessLookupError:
            pass

    @staticmethod
    def _tail(log: Path, lines: int = 6) -> str:
        try:
            text = log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        text = [line.strip() for line in text if line.strip(" =!_-")]  # pytest's rules carry nothing
        return printable(" | ".join(text[-lines:]))

    def _env(self, sha: str) -> dict:
        env = _child_env()
        src = self.worktree(sha) / "src"
        if src.is_dir():  # a src layout: the candidate's own package first
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
        return env

    def _selection(self) -> list[str]:
        return (["-k", self.keyword] if self.keyword else []) + self.pytest_args

    def collect(self, sha: str, name: str) -> list[str]:
        """The node ids the selection collects at ``sha``; BisectError when none."""
        problem = self.build(sha)
        if problem:
            raise BisectError(f"{name} {sha[:12]} cannot be set up: {problem}")
        log = self.tmp / f"collect-{sha[:12]}.log"
        status = self._run([self.python(sha), "-m", "pytest", "--collect-only", "-q", *self._selection()],
                           self.cwd(sha), log, self._env(sha), timeout=self.collect_timeout)
        if status is None:
            raise BisectError(f"collecting the selection at {name} {sha[:12]} did not finish within "
                              f"{self.collect_timeout:g} s (--collect-timeout); it hangs or imports slowly: "
                              f"{self._tail(log, 3) or 'no output'}. Check it with pytest --collect-only -q, "
                              f"or raise --collect-timeout")
        ids = [line.strip() for line in log.read_text(errors="replace").splitlines() if "::" in line]
        if status != 0 or not ids:
            shown = " ".join(shlex.quote(a) for a in self._selection())
            raise BisectError(f"the selection ({shown or 'no -k'}) collects no case at {name} {sha[:12]} (pytest exit "
                              f"{status}: {self._tail(log, 3)}); check it with pytest --collect-only -q {shown}")
        return ids

    def baseline_paths(self, good_root: str) -> list[str]:
        """GOOD's root, its src/ and the import folders of the selected test files (pytest's
        rootdir-less 'prepend' import: the first folder above the file without __init__.py)."""
        paths = [good_root]
        if (self.worktree(self.good) / "src").is_dir():
            paths.append(f"{good_root}/src")
        paths += [f"{good_root}/{d}" for d in self.test_dirs]
        return list(dict.fromkeys(paths))

    def ab_command(self, sha: str, good_root: str, python: str, max_time: float, json_path: str,
                   seed: int | None = None) -> list[str]:
        command = [python, "-m", "pytest", *self._selection()]
        # OPTION=VALUE, never two words: pytest takes a bare path argument for a place to look for
        # its rootdir and ini file, and would then read GOOD's pytest.ini in the probe's run.
        command += [f"--dist-baseline-path={path}" for path in self.baseline_paths(good_root)]
        if getattr(self.args, "python", None):
            command.append(f"--dist-baseline-python={good_root}/{self.args.python}")
        if not any(a.startswith("--dist-ab-profile") for a in self.pytest_args):
            command.append("--dist-ab-profile=off")  # profiles cost time at every bad probe
        if self.threshold is not None:
            command.append(f"--dist-ab-threshold={100 * self.threshold:.1f}%")
        command += [f"--dist-ab-max-time={max_time:g}", f"--benchmark-json={json_path}"]
        if seed is not None:
            command.append(f"--dist-ab-seed={seed}")
        return command

    # -- one probe --------------------------------------------------------------------------------

    def probe(self, index: int) -> Probe:
        sha = self.commits[index]
        subject = printable(_git(self.top, "log", "-1", "--format=%s", sha, check=False).stdout.strip())
        probe = Probe(index, sha, subject)
        started = time.monotonic()
        problem = self.build(sha)
        if problem:
            probe.outcome, probe.note = "skip", problem
        else:
            max_time = self.max_time
            while True:
                self._ab_run(probe, max_time)
                if probe.outcome != "inconclusive" or probe.runs >= 2:
                    break
                max_time *= 2  # once: more pairs, up to twice the cap
            if probe.outcome == "inconclusive":
                probe.note = f"inconclusive at --dist-ab-max-time {max_time:g}: skipped"
        probe.seconds = time.monotonic() - started
        self.probes[index] = probe
        self.say(f"  [{len(self.probes)}] {sha[:12]} {subject[:50]}: {probe.outcome.upper()}  "
                 f"({probe.summary()}; {probe.seconds:.0f} s)")
        return probe

    def _ab_run(self, probe: Probe, max_time: float) -> None:
        probe.runs += 1
        sha = probe.sha
        result = self.tmp / f"ab-{sha[:12]}-{probe.runs}.json"
        log = self.tmp / f"ab-{sha[:12]}-{probe.runs}.log"
        good_root = os.path.relpath(self.worktree(self.good), self.cwd(sha))
        command = self.ab_command(sha, good_root, self.python(sha), max_time, str(result))
        limit = self.run_limit(max_time)
        status = self._run(command, self.cwd(sha), log, self._env(sha), timeout=limit)
        if status is None:
            probe.outcome, probe.cases = "skip", []
            probe.note = (f"the A/B run did not finish within {limit:g} s (--probe-timeout; hung in collection "
                          f"or a case?): {self._tail(log, 3) or 'no output'}")
            return
        try:
            doc = json.loads(result.read_text())
        except (OSError, ValueError):
            doc = None
        if status not in (0, 1) or doc is None:
            probe.outcome, probe.cases = "skip", []
            probe.note = f"the A/B run did not give verdicts (pytest exit {status}): {self._tail(log, 3)}"
            return
        try:  # the gate's own reading, its acceptance of structural changes included
            verdicts_of_run = ab_verdicts_of_run(doc, self.accept_structure_change)
        except VerdictError as exc:
            probe.outcome, probe.cases, probe.note = "skip", [], f"the A/B run's verdicts cannot be read: {exc}"
            return
        cases = [ProbeCase(v.name, v.verdict, v.ratio,
                             (v.ci_low, v.ci_high) if v.ci_low is not None and v.ci_high is not None else None,
                             v.structure.cell() if v.structure is not None and v.structure.verdict != "same" else "",
                             v.reason or "")
                 for v in verdicts_of_run]
        seeds = [b["extra_info"]["ab"].get("seed") for b in doc.get("benchmarks", [])
                 if isinstance((b.get("extra_info") or {}).get("ab"), dict)]
        probe.cases = cases
        probe.command = self.reproduce(sha, max_time, seeds[0] if seeds else None)
        probe.outcome, probe.note = read_probe(cases, self.reference, self.missing_is_bad)
        if not cases:
            probe.note += f" (pytest exit {status})"

    def run_limit(self, max_time: float) -> float:
        """How long one A/B run may take: --probe-timeout, else --collect-timeout and, per case the
        selection collected at BAD, its --max-time and PROBE_SLACK_PER_CASE_S."""
        if self.probe_timeout:
            return self.probe_timeout
        return self.collect_timeout + self.cases_selected * (max_time + PROBE_SLACK_PER_CASE_S)

    def reproduce(self, sha: str, max_time: float, seed: int | None) -> str:
        """The shell lines that repeat a probe's A/B run in worktrees of the user's own."""
        good_dir, probe_dir = "../ddpbench-good", "../ddpbench-probe"
        cwd = f"{probe_dir}/{self.prefix}".rstrip("/")
        good_root = os.path.relpath(good_dir, cwd) if self.prefix else good_dir
        python = f"{probe_dir}/{self.args.python}" if getattr(self.args, "python", None) else sys.executable
        command = self.ab_command(sha, good_root, python, max_time, "ab.json", seed)
        if (self.worktree(sha) / "src").is_dir():
            command = ["PYTHONPATH=src"] + command
        lines = [f"cd {shlex.quote(str(self.top))}",
                 f"git worktree add {good_dir} {self.good[:12]} && git worktree add {probe_dir} {sha[:12]}"]
        if self.args.setup:
            lines.append(f"(cd {good_dir} && {self.args.setup}) && (cd {probe_dir} && {self.args.setup})")
        lines.append(f"cd {shlex.quote(cwd)} && " + " ".join(shlex.quote(a) if not a.startswith("PYTHONPATH=") else a
                                                              for a in command))
        return "\n".join(lines)

    # -- the search -------------------------------------------------------------------------------

    def run(self) -> int:
        self.check_input()
        self.tmp = Path(tempfile.mkdtemp(prefix="ddpbench-bisect-"))
        n = len(self.commits)
        self.say(f"ddpbench bisect: {n} first-parent commit(s) after GOOD {self.good[:12]} up to BAD "
                 f"{self.bad[:12]}; worktrees in {self.tmp}")
        if self.untracked:
            shown = ", ".join(self.untracked[:5]) + (", ..." if len(self.untracked) > 5 else "")
            self.say(f"note: {len(self.untracked)} untracked file(s) ({shown}) are in no commit: the probes' "
                     f"worktrees do not have them (commit them if the benchmarks need them)")
        ids = self.collect(self.bad, "BAD")
        self.collect(self.good, "GOOD")
        self.cases_selected = len(ids)
        self.test_dirs = _import_dirs(self.worktree(self.bad), ids, self.prefix)
        self.say(f"selection: {len(ids)} case(s) at BAD, e.g. {printable(ids[0])}")
        return self.search()

    def search(self) -> int:
        """BAD confirmed first, then the probes; the exit status."""
        n = len(self.commits)
        self.say("confirming that BAD is slower than GOOD:")
        confirm = self.probe(n - 1)
        if confirm.outcome == "good":
            self.say(f"no regression between GOOD {self.good[:12]} and BAD {self.bad[:12]}: nothing to bisect")
            return 0
        if confirm.outcome != "bad":
            self.say(f"could not confirm a regression at BAD {self.bad[:12]} ({confirm.outcome}: "
                     f"{confirm.summary()}); raise --max-time or narrow -k, and run again")
            return 1
        self.threshold = self.step_threshold(confirm)
        if self.threshold is not None:
            self.say(f"probes are classified against the step's midpoint: --dist-ab-threshold="
                     f"{100 * self.threshold:.1f}% (sqrt of BAD's lowest interval end; set "
                     f"--dist-ab-threshold among the pytest args to choose it)")
        self.reference = judged_cases(confirm.cases, self.missing_is_bad)
        self.say(f"searching {n - 1} commit(s) between them (each must judge the {len(self.reference)} case(s) "
                 f"BAD judged, or it is skipped):")
        lo, hi = narrow(n, lambda index: self.probe(index).outcome)
        self.report(lo, hi)
        return 0 if hi - lo == 1 else 1

    def step_threshold(self, confirm: Probe) -> float | None:
        """The threshold that splits GOOD's timing from BAD's in the middle (geometrically): from
        the lowest interval end among BAD's regressions, never below the gate's default. None when
        the user chose a threshold or BAD's regressions carry no interval (a missing case)."""
        if any(a.startswith("--dist-ab-threshold") for a in self.pytest_args):
            return None
        lows = [c.ci[0] for c in confirm.cases if c.verdict == "regression" and c.ci and c.ci[0] > 1.0]
        if not lows:
            return None
        return max(GATE_DEFAULT_THRESHOLD, math.sqrt(min(lows)) - 1.0)

    def report(self, lo: int, hi: int) -> None:
        self.say()
        self.say("probes (ratio candidate/GOOD with its interval, verdict):")
        self.say(f"  {'commit':12}  {'outcome':12}  {'seconds':>7}  subject / cases")
        for index in sorted(self.probes):
            p = self.probes[index]
            self.say(f"  {p.sha[:12]}  {p.outcome:12}  {p.seconds:7.0f}  {printable(p.subject)[:60]}")
            self.say(f"  {'':12}  {'':12}  {'':7}  {p.summary()}")
        total = sum(p.seconds for p in self.probes.values())
        self.say(f"{len(self.probes)} probe(s), {total:.0f} s of A/B runs, for {len(self.commits)} commit(s)")
        first = self.probes[hi]
        if hi - lo == 1:
            self.say(f"first bad commit: {first.sha} {printable(first.subject)}")
        else:
            left = [self.commits[i][:12] for i in range(lo + 1, hi + 1)]
            self.say(f"the first bad commit is one of {', '.join(left)} (the others could not be measured: skip)")
        self.say(f"its A/B verdict: {first.summary()}")
        self.say("reproduce it (the same A/B run, block order seed included):")
        for line in first.command.splitlines():
            self.say(f"  {line}")


def _import_dirs(root: Path, ids: list[str], prefix: str) -> list[str]:
    """Folders (relative to the checkout's ``root``) that pytest's 'prepend' import mode puts on
    sys.path for the collected test files: the first folder above each file without __init__.py.
    Node ids are relative to pytest's rootdir: the folder run in, or the checkout's root."""
    dirs = []
    for node in ids:
        name = node.split("::", 1)[0]
        path = root / prefix / name if (root / prefix / name).exists() else root / name
        folder = path.parent
        while (folder / "__init__.py").exists() and folder != root:
            folder = folder.parent
        rel = os.path.relpath(folder, root)
        if rel != "." and not rel.startswith(".."):
            dirs.append(rel)
    return list(dict.fromkeys(dirs))


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_bisect(args, out=sys.stdout) -> int:
    """The command: exit 0 found (or nothing to search), 1 undecided, 2 bad input, 130 interrupted."""
    bisect = Bisect(args, out)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return bisect.run()
    except BisectError as exc:
        print(f"ddpbench bisect: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        for child in list(bisect.children):
            bisect._stop(child)
        print("ddpbench bisect: interrupted; removing its worktrees", file=sys.stderr)
        return 130
    finally:
        try:
            for child in list(bisect.children):
                bisect._stop(child)
        finally:
            if hasattr(bisect, "top"):
                bisect.cleanup()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
