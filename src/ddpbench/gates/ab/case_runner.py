"""Each A/B case measured on both sides, interleaved: its figures go into the case's
``extra_info["ab"]`` and the run's results; a case one side lost becomes a verdict of its own. It
measures and records; the verdicts are decided at the run's end (ddpbench.gates.ab.run_report)."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from ...engine.timing import CaseRounds, measure_workload
from ..verdict_words import Verdict
from .baseline_workloads import BaselineBuilds, BaselineCase
from .budget import RunBudget
from .pairs_loop import ABSettings, SideFailed, run_case
from .profiling import MIN_PROFILED_ROUNDS, CaseProfile, case_folder, profile_case, profiled_plan, should_profile
from .run_plan import ABPlan
from .run_sides import Sides, enforce_import_isolation


@dataclass
class CaseRunner:
    """Measures the run's cases; ``results`` collects (case id, extra_info["ab"], candidate median or
    None, the case's extra_info or None), ``profiles`` the profiles taken."""

    sides: Sides
    plan: ABPlan
    budget: RunBudget | None = None
    results: list = field(default_factory=list)
    profiles: list[CaseProfile] = field(default_factory=list)
    # The baseline's own workload per case, built by its own code (gates/ab/baseline_workloads.py);
    # None: not built (a run that only lists its cases, tests that drive the runner directly).
    baseline_builds: BaselineBuilds | None = None

    def plan_cases(self, items) -> None:
        """The run's A/B cases (the collected tests that use dist_benchmark), for the run budget's
        shares; a case skipped later counts until then, so earlier shares are cautious."""
        if self.budget is not None:
            self.budget.planned = [item.nodeid for item in items
                                   if "dist_benchmark" in getattr(item, "fixturenames", ())]

    def case_settings(self, case_id: str) -> ABSettings:
        """The settings a case runs with: the run's, its time cap its share of the run budget and
        what it may borrow past it if nearly decided then (gates/ab/budget.py)."""
        if self.budget is None:
            return self.plan.settings
        cap = self.budget.cap_for(case_id)
        return dataclasses.replace(self.plan.settings, max_time_s=cap,
                                   borrow_time_s=self.budget.borrow_for(case_id))

    def measure(self, pool_for: Callable[[str, Any, int], Any], own_pool, workload, plan, timeout_s: float,
                case_id: str, extra_info: dict) -> CaseRounds:
        """The case on both sides, interleaved; returns the candidate's rounds (the case's own) and
        puts the verdict's figures in ``extra_info["ab"]``. ``pool_for(side, launch, index)``
        gives a side's pools: each side owns its own, even when both sides launch alike (A/A)."""
        baseline_workload = workload
        if self.baseline_builds is not None:
            built = self.baseline_builds.case(case_id)
            if built.workload is None:  # nothing of the baseline's own to run: new, or baseline-failed
                if self.budget is not None:
                    self.budget.finish(case_id)
                return self._without_baseline(own_pool, workload, plan, timeout_s, case_id, extra_info, built)
            baseline_workload = built.workload
        pools = {name: [pool_for(name, side.launch, j) for j in range(self.plan.settings.pools_per_side)]
                 for name, side in self.sides.named()}
        workloads = {"baseline": baseline_workload, "candidate": workload}
        try:
            outcome = run_case(pools, workload, plan, self.case_settings(case_id), timeout_s, case_id,
                               self.plan.seed, baseline_workload=baseline_workload)
        except SideFailed as failure:
            enforce_import_isolation(self.sides)  # a failure of ranks that ran the wrong code says nothing
            if getattr(failure.error, "refusal", lambda: None)() is not None:
                raise failure.error  # a rank refused how the workload uses it: the fixture stops the run (exit 2)
            if failure.side == "candidate":
                self._lost(case_id, failure)
            return self._alone(own_pool, workload, plan, timeout_s, case_id, extra_info, failure)
        finally:
            if self.budget is not None:
                self.budget.finish(case_id)
        enforce_import_isolation(self.sides)  # before the verdict is kept: none from a baseline that ran the wrong code
        summary = self._summary(outcome, pools)
        extra_info["ab"] = summary
        self.results.append((case_id, summary, statistics.median(outcome.candidate.round_times), extra_info))
        if should_profile(self.plan.profile, summary["verdict"]):  # the verdict and rounds are final here
            self._profile(pools, workloads, plan, outcome, timeout_s, case_id, summary)
        candidate = outcome.candidate
        return CaseRounds(candidate.round_times, outcome.candidate_metrics, candidate.rank_cpus,
                          candidate.rank_round_times)

    def _summary(self, outcome, pools) -> dict:
        """``extra_info["ab"]`` of a case both sides ran: the outcome's figures and the run's setting."""
        summary = outcome.summary(self.sides.describe())
        summary["heap"] = self.plan.heap
        if self.budget is not None:
            summary["run_budget_s"] = self.budget.budget_s
        summary["pool_pids"] = {name: [p.pids for p in side_pools] for name, side_pools in pools.items()}
        return summary

    def _profile(self, pools, workloads, plan, outcome, timeout_s: float, case_id: str, summary: dict) -> None:
        profile = profile_case({name: side_pools[0] for name, side_pools in pools.items()}, workloads,
                               profiled_plan(plan, outcome.candidate_metrics),
                               max(MIN_PROFILED_ROUNDS, outcome.rounds_per_block),
                               case_folder(self.plan.profile_root, case_id), case_id, summary["verdict"], timeout_s)
        summary["profile"] = profile.to_dict()
        self.profiles.append(profile)

    def _lost(self, case_id: str, failure: SideFailed) -> None:
        """The candidate lost a case the baseline ran (crashed, hung): a verdict of its own that
        fails the run, or skips the case with --dist-allow-missing."""
        summary = {"verdict": Verdict.MISSING, "reason": f"candidate pool {failure.pool} failed",
                   "error": str(failure), "seed": self.plan.seed, "sides": self.sides.describe()}
        self.results.append((case_id, summary, None, None))
        message = f"ddpbench A/B: the candidate lost this case (the baseline ran it): {failure}"
        if self.plan.allow_missing:
            pytest.skip(f"{message.splitlines()[0]} (allowed by --dist-allow-missing)")
        pytest.fail(message, pytrace=False)

    def _without_baseline(self, own_pool, workload, plan, timeout_s, case_id, extra_info,
                          built: BaselineCase) -> CaseRounds:
        """The baseline's own build of this case gave no workload: it lacks or skips the case
        (``new``), or its test fails before handing one over (``baseline-failed``, which fails the
        run unless --dist-ab-allow-baseline-failure). The candidate is measured alone."""
        lacks = built.status in ("absent", "skipped")
        summary = {"verdict": Verdict.NEW if lacks else Verdict.BASELINE_FAILED,
                   "reason": built.detail.splitlines()[0] if built.detail else built.status,
                   "error": built.detail, "seed": self.plan.seed, "sides": self.sides.describe()}
        extra_info["ab"] = summary
        rounds = CaseRounds.of(own_pool.run(measure_workload, workload, plan, timeout_s=timeout_s))
        self.results.append((case_id, summary, statistics.median(rounds.round_times), extra_info))
        return rounds

    def _alone(self, own_pool, workload, plan, timeout_s, case_id, extra_info, failure) -> CaseRounds:
        """The baseline side failed this case: nothing to compare with, so the candidate is
        measured alone. The verdict is ``new`` when the baseline lacks the case's code (its ranks
        cannot import what the case names), else ``baseline-failed``, which fails the run unless
        --dist-allow-baseline-failure: a baseline that crashes, hangs or computes a wrong result
        must not let every change pass as new."""
        lacks = baseline_lacks_case(failure.error)
        summary = {"verdict": Verdict.NEW if lacks else Verdict.BASELINE_FAILED,
                   "reason": (f"baseline pool {failure.pool} lacks its code" if lacks
                              else f"baseline pool {failure.pool} failed"),
                   "error": str(failure), "seed": self.plan.seed, "sides": self.sides.describe()}
        extra_info["ab"] = summary
        rounds = CaseRounds.of(own_pool.run(measure_workload, workload, plan, timeout_s=timeout_s))
        self.results.append((case_id, summary, statistics.median(rounds.round_times), extra_info))
        return rounds


def baseline_lacks_case(error: BaseException) -> bool:
    """Whether a baseline's failure says it lacks the case (every failing rank could not import
    what the task names: a case the baseline does not have), not that it ran it and failed."""
    from ...pool import TaskFailed
    from ...pool.picklecheck import LOAD_FAILURE_PREFIX

    return (isinstance(error, TaskFailed) and bool(error.errors) and not error.dead and not error.stuck
            and all(text.startswith(LOAD_FAILURE_PREFIX) for text in error.errors.values()))
