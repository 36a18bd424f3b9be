"""The two sides of an A/B run: made from the options before any rank starts (each side's interpreter
run once: it must import torch and a ddpbench of this run's rank protocol), the code under test each
side's ranks import resolved after collection, and the baseline ranks' import guard read. Bad input
and mixed environments stop the run with exit 2, naming the fix."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import pytest

from .baseline_checkout import check_checkout_copies, find_checkout
from .baseline_workloads import BaselineBuildError, BaselineBuilds, build_on_baseline, forwarded_args
from .heap import DEFAULT_HEAP, heap_env
from .side_environments import (ImportIsolationError, SameCodeError, Side, SideError, check_import_isolation,
                                check_modules_differ, local_facts, make_side, modules_under_test,
                                parse_env_assignments, probe, resolve_modules, with_import_guard)


@dataclass
class Sides:
    """Both sides as they stand: made from the options, then with the code under test resolved."""

    baseline: Side
    candidate: Side

    def named(self) -> tuple[tuple[str, Side], ...]:
        return ("baseline", self.baseline), ("candidate", self.candidate)

    def describe(self) -> dict:
        return {"baseline": self.baseline.describe(), "candidate": self.candidate.describe()}


def sides_from_options(config) -> Sides:
    """The sides the options name, each interpreter probed (the candidate's only when its
    environment differs from this process's)."""
    common = heap_env(config.getoption("dist_ab_heap", DEFAULT_HEAP))
    try:
        baseline = make_side("baseline", config.getoption("dist_baseline_python"),
                             config.getoption("dist_baseline_path"),
                             parse_env_assignments(config.getoption("dist_baseline_env"), "--dist-baseline-env"),
                             common)
        candidate = make_side("candidate", None, None,
                              parse_env_assignments(config.getoption("dist_candidate_env"),
                                                    "--dist-candidate-env"), common)
        baseline = with_import_guard(baseline, _import_guard_folder())
        ours = local_facts()
        baseline = probe(baseline, ours["rank_protocol"])
        candidate = (probe(candidate, ours["rank_protocol"]) if candidate.env
                     else dataclasses.replace(candidate, facts=ours))
    except ImportIsolationError as exc:
        refuse_mixed_environments(exc)
    except SideError as exc:
        raise pytest.UsageError(f"ddpbench A/B: {exc}") from None
    return Sides(baseline, candidate)


def resolve_code_under_test(sides: Sides, session) -> None:
    """Where each side's ranks import the modules under test from, into ``sides``; a usage error
    when a baseline that names other code would import the candidate's."""
    test_modules = {item.module for item in session.items if getattr(item, "module", None) is not None}
    project = {str(session.config.rootpath)} | {os.path.dirname(m.__file__) for m in test_modules
                                                 if getattr(m, "__file__", None)}
    names = set(modules_under_test(test_modules, project))
    if sides.baseline.launch.foreign_interpreter:
        # Another environment may differ from the candidate's by torch alone (does upgrading
        # torch slow our step?): torch counts then, and the header shows both sides' torch.
        names.add("torch")
    names = sorted(names)
    root = os.path.realpath(str(session.config.rootpath))
    test_files = _test_files(session.items)
    if sides.baseline.paths:
        checkout = find_checkout(root, test_files, sides.baseline.paths)
        if checkout is not None:  # its ranks and its build take its own test files and source
            sides.baseline = dataclasses.replace(sides.baseline, checkout=checkout, project_root=root)
    try:
        sides.baseline = resolve_modules(sides.baseline, names)
        sides.candidate = resolve_modules(sides.candidate, names)
        _check_the_baselines_checkout(sides, root, test_files)
        check_modules_differ(sides.baseline, sides.candidate)
    except (ImportIsolationError, SameCodeError) as exc:
        refuse_mixed_environments(exc)
    except SideError as exc:
        raise pytest.UsageError(f"ddpbench A/B: {exc}") from None


def _test_files(items) -> list[str]:
    return sorted({str(item.path) for item in items if getattr(item, "path", None) is not None})


def _check_the_baselines_checkout(sides: Sides, root: str, test_files: list[str]) -> None:
    """A baseline whose paths name its checkout, or whose interpreter lives in one (a venv under
    ../base), must import the modules under test from that checkout's own copies where they
    differ from what its ranks would otherwise import (baseline_checkout.check_checkout_copies)."""
    import sys

    baseline = sides.baseline
    if baseline.checkout is not None:
        check_checkout_copies(baseline, sides.candidate, root, baseline.checkout, sys.path,
                              f"--dist-baseline-path names the baseline's checkout {baseline.checkout}")
        return
    if not baseline.launch.foreign_interpreter:
        return
    from ...pool.rank_launch import interpreter_environment

    environment = interpreter_environment(baseline.python)
    checkout = find_checkout(root, test_files, [environment[0]]) if environment else None
    if checkout is not None:
        check_checkout_copies(baseline, sides.candidate, root, checkout, sys.path,
                              f"the baseline's interpreter {baseline.python} lives in the checkout {checkout}")


def build_baseline_cases(sides: Sides, session) -> BaselineBuilds:
    """The baseline's own workload for each A/B case, built by its own code
    (ddpbench.gates.ab.baseline_workloads); exit 2 when they cannot be built there."""
    config = session.config
    items = [item for item in session.items if "dist_benchmark" in getattr(item, "fixturenames", ())]
    try:
        builds = build_on_baseline(sides.baseline, items, str(config.rootpath), str(config.invocation_params.dir),
                                   forwarded_args(config))
        enforce_import_isolation(sides)  # the build ran the baseline's interpreter: it, too, imports its own
        unbuildable = builds.unbuildable()
        if unbuildable:
            shown = "; ".join(f"{case_id}: {case.detail}" for case_id, case in unbuildable[:3])
            raise BaselineBuildError(
                f"{len(unbuildable)} case(s) cannot be built on the baseline side ({shown}). Each side runs its "
                f"own workload, which must pickle on its side: define its functions and classes at module level")
    except BaselineBuildError as exc:
        pytest.exit(f"ddpbench A/B: {exc}", returncode=exc.EXIT_STATUS)
    return builds


def enforce_import_isolation(sides: Sides) -> None:
    """Ends the run with exit 2 when the baseline's ranks imported anything from inside the
    candidate's environment (their import guard's log; see ddpbench.pool.rank_launch)."""
    try:
        check_import_isolation(sides.baseline)
    except ImportIsolationError as exc:
        refuse_mixed_environments(exc)


def refuse_mixed_environments(error: ImportIsolationError | SameCodeError) -> None:
    """Stop the run with exit 2 (bad input): no verdict, no saved results (an interrupted run saves
    none), the message naming both sides and the fix."""
    pytest.exit(f"ddpbench A/B: {error}", returncode=error.EXIT_STATUS)


def _import_guard_folder() -> str:
    """A folder of this run's own for the baseline ranks' import-guard log, removed at exit."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="ddpbench-ab-imports-")
    atexit.register(shutil.rmtree, folder, True)
    return folder
