"""Runs pytest in the commits' worktrees: the selection's collection at GOOD and BAD, and each
probe's A/B run against GOOD, with the shell lines that repeat it."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from ..gates.verdicts import VerdictError
from .inputs import BisectError, Checkout, Options
from .probe import Probe, cases_of_run, read_probe, seed_of_run
from .processes import Children
from .terminal import log_tail
from .worktrees import Worktrees

# --probe-timeout's default: --collect-timeout, then per selected case its --max-time and this
# much for the rest (pools started, set-up and warm-up, a hung rank's --dist-timeout, the finish).
PROBE_SLACK_PER_CASE_S = 300.0


class ProbeRunner:
    """The pytest runs of a bisect: GOOD's and BAD's collection, then one probe per commit; once
    BAD is confirmed, ``threshold`` and ``reference`` say how later probes are run and read."""

    def __init__(self, checkout: Checkout, options: Options, worktrees: Worktrees, children: Children):
        self.checkout = checkout
        self.options = options
        self.worktrees = worktrees
        self.children = children
        self.cases_selected = 1  # the cases the selection collects at BAD (run_limit)
        self.test_dirs: list[str] = []  # their import folders, relative to the checkout's root
        self.threshold: float | None = None  # the probes' --dist-ab-threshold once BAD is confirmed
        self.reference: list[str] | None = None  # the cases BAD judged, once it is confirmed

    def collect(self, sha: str, name: str) -> list[str]:
        """The node ids the selection collects at ``sha``; BisectError when none."""
        problem = self.worktrees.build(sha)
        if problem:
            raise BisectError(f"{name} {sha[:12]} cannot be set up: {problem}")
        log = self.worktrees.scratch / f"collect-{sha[:12]}.log"
        timeout = self.options.collect_timeout
        status = self.children.run([self.worktrees.python(sha), "-m", "pytest", "--collect-only", "-q",
                                    *self.options.selection],
                                   self.worktrees.cwd(sha), log, self.worktrees.env(sha), timeout=timeout)
        if status is None:
            raise BisectError(f"collecting the selection at {name} {sha[:12]} did not finish within "
                              f"{timeout:g} s (--collect-timeout); it hangs or imports slowly: "
                              f"{log_tail(log, 3) or 'no output'}. Check it with pytest --collect-only -q, "
                              f"or raise --collect-timeout")
        ids = [line.strip() for line in log.read_text(errors="replace").splitlines() if "::" in line]
        if status != 0 or not ids:
            shown = " ".join(shlex.quote(a) for a in self.options.selection)
            raise BisectError(f"the selection ({shown or 'no -k'}) collects no case at {name} {sha[:12]} (pytest exit "
                              f"{status}: {log_tail(log, 3)}); check it with pytest --collect-only -q {shown}")
        return ids

    def use_selection(self, ids: list[str]) -> None:
        """The node ids collected at BAD: the probes' time limit counts them, and GOOD's side
        imports from their folders."""
        self.cases_selected = len(ids)
        self.test_dirs = import_dirs(self.worktrees.root(self.checkout.bad), ids, self.checkout.prefix)

    def probe(self, sha: str) -> Probe:
        """The commit's A/B run against GOOD, read (:func:`read_probe`); an inconclusive one is run
        once more with twice --max-time, and a commit that cannot be set up is a skip."""
        probe = Probe(self.checkout.commits.index(sha), sha, self.checkout.subject(sha))
        started = time.monotonic()
        problem = self.worktrees.build(sha)
        if problem:
            probe.outcome, probe.note = "skip", problem
        else:
            max_time = self.options.max_time
            while True:
                self._ab_run(probe, max_time)
                if probe.outcome != "inconclusive" or probe.runs >= 2:
                    break
                max_time *= 2  # once: more pairs, up to twice the cap
            if probe.outcome == "inconclusive":
                probe.note = f"inconclusive at --dist-ab-max-time {max_time:g}: skipped"
        probe.seconds = time.monotonic() - started
        return probe

    def _ab_run(self, probe: Probe, max_time: float) -> None:
        probe.runs += 1
        sha = probe.sha
        result = self.worktrees.scratch / f"ab-{sha[:12]}-{probe.runs}.json"
        log = self.worktrees.scratch / f"ab-{sha[:12]}-{probe.runs}.log"
        cwd = self.worktrees.cwd(sha)
        good_root = os.path.relpath(self.worktrees.root(self.checkout.good), cwd)
        command = self.ab_command(good_root, self.worktrees.python(sha), max_time, str(result))
        limit = self.run_limit(max_time)
        status = self.children.run(command, cwd, log, self.worktrees.env(sha), timeout=limit)
        if status is None:
            probe.outcome, probe.cases = "skip", []
            probe.note = (f"the A/B run did not finish within {limit:g} s (--probe-timeout; hung in collection "
                          f"or a case?): {log_tail(log, 3) or 'no output'}")
            return
        try:
            doc = json.loads(result.read_text())
        except (OSError, ValueError):
            doc = None
        if status not in (0, 1) or doc is None:
            probe.outcome, probe.cases = "skip", []
            probe.note = f"the A/B run did not give verdicts (pytest exit {status}): {log_tail(log, 3)}"
            return
        try:
            cases = cases_of_run(doc, self.options.accept_structure_change, self.options.accept_memory_change,
                                 self.options.memory_tolerance)
        except VerdictError as exc:
            probe.outcome, probe.cases, probe.note = "skip", [], f"the A/B run's verdicts cannot be read: {exc}"
            return
        probe.cases = cases
        probe.command = self.reproduce(sha, max_time, seed_of_run(doc))
        probe.outcome, probe.note = read_probe(cases, self.reference, self.options.missing_is_bad)
        if not cases:
            probe.note += f" (pytest exit {status})"

    def run_limit(self, max_time: float) -> float:
        """How long one A/B run may take: --probe-timeout, else --collect-timeout and, per case the
        selection collected at BAD, its --max-time and PROBE_SLACK_PER_CASE_S."""
        if self.options.probe_timeout:
            return self.options.probe_timeout
        return self.options.collect_timeout + self.cases_selected * (max_time + PROBE_SLACK_PER_CASE_S)

    def baseline_paths(self, good_root: str) -> list[str]:
        """GOOD's root, its src/ and the import folders of the selected test files (pytest's
        rootdir-less 'prepend' import: the first folder above the file without __init__.py)."""
        paths = [good_root]
        if (self.worktrees.root(self.checkout.good) / "src").is_dir():
            paths.append(f"{good_root}/src")
        paths += [f"{good_root}/{d}" for d in self.test_dirs]
        return list(dict.fromkeys(paths))

    def ab_command(self, good_root: str, python: str, max_time: float, json_path: str,
                   seed: int | None = None) -> list[str]:
        """The A/B run of a probe: ``good_root`` (relative to where it runs) the baseline."""
        command = [python, "-m", "pytest", *self.options.selection]
        # OPTION=VALUE, never two words: pytest takes a bare path argument for a place to look for
        # its rootdir and ini file, and would then read GOOD's pytest.ini in the probe's run.
        command += [f"--dist-baseline-path={path}" for path in self.baseline_paths(good_root)]
        if self.options.python:
            command.append(f"--dist-baseline-python={good_root}/{self.options.python}")
        if not self.options.sets("--dist-ab-profile"):
            command.append("--dist-ab-profile=off")  # profiles cost time at every bad probe
        if self.threshold is not None:
            command.append(f"--dist-ab-threshold={100 * self.threshold:.1f}%")
        command += [f"--dist-ab-max-time={max_time:g}", f"--benchmark-json={json_path}"]
        if seed is not None:
            command.append(f"--dist-ab-seed={seed}")
        return command

    def reproduce(self, sha: str, max_time: float, seed: int | None) -> str:
        """The shell lines that repeat a probe's A/B run in worktrees of the user's own."""
        good_dir, probe_dir = "../ddpbench-good", "../ddpbench-probe"
        prefix = self.checkout.prefix
        cwd = f"{probe_dir}/{prefix}".rstrip("/")
        good_root = os.path.relpath(good_dir, cwd) if prefix else good_dir
        python = f"{probe_dir}/{self.options.python}" if self.options.python else sys.executable
        command = self.ab_command(good_root, python, max_time, "ab.json", seed)
        if (self.worktrees.root(sha) / "src").is_dir():
            command = ["PYTHONPATH=src"] + command
        setup = self.options.setup
        lines = [f"cd {shlex.quote(str(self.checkout.top))}",
                 f"git worktree add {good_dir} {self.checkout.good[:12]} && git worktree add {probe_dir} {sha[:12]}"]
        if setup:
            lines.append(f"(cd {good_dir} && {setup}) && (cd {probe_dir} && {setup})")
        lines.append(f"cd {shlex.quote(cwd)} && " + " ".join(shlex.quote(a) if not a.startswith("PYTHONPATH=") else a
                                                              for a in command))
        return "\n".join(lines)


def import_dirs(root: Path, ids: list[str], prefix: str) -> list[str]:
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
