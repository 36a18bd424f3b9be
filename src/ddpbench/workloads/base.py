"""The public base classes of a workload: :class:`Workload` and :class:`FunctionWorkload`. A workload
is a small picklable descriptor (the nccl-tests model): the engine calls ``setup`` once per rank,
``run_round`` once per round, then ``rank_metrics``, ``check`` and ``teardown``; the controller calls
``extra_info`` (:func:`case_extra_info`). A workload never times itself and the engine never knows
what a workload does."""

from __future__ import annotations

import inspect
from typing import Any, Callable


#: A variant whose round computes what the workload's round computes but sends nothing between
#: ranks: each collective hands its data back unreduced (the step's compute time).
COMPUTE_ONLY = "compute_only"
#: A variant whose round issues the collectives of one workload round alone, back to back (the
#: step's communication time in isolation).
COMMUNICATION_ONLY = "communication_only"


class Workload:
    """Base class of a benchmark workload, with the optional hooks filled in.

    Subclass it at module level (the ranks import the class by module and name) and override
    ``setup`` and ``run_round``; instances travel to the ranks pickled, so keep only picklable
    parameters on them and build tensors, models and process-local objects in ``setup``.
    """

    #: pytest-benchmark group the case is shown in (None: pytest-benchmark's default grouping).
    group: str | None = None
    #: On pools with --dist-pin-cores=auto, keep each rank on its own core while measuring.
    #: Workloads that start processes of their own (DataLoader workers) set this to False.
    pin_to_core: bool = True
    #: Whether its rounds are GPU work only, which --dist-cuda-graphs can capture and replay.
    cuda_graph_safe: bool = False
    #: Whether the numerics replay (--dist-numerics-steps) runs for it. A workload with no trainable
    #: state, whose check already verifies every result (the dataset family), sets False: its replay
    #: would only cost set-ups and rounds, and its case then has no numerics record (never `same`).
    numerics_replay: bool = True
    #: Whether a round is a training step, meant to change the parameters in its state: when the
    #: numerics replay shows it changed none, the run says so beside the case (extra_info
    #: ``parameters_unchanged``). A round of forward and backward alone (SyncBN's) sets False.
    updates_parameters: bool = True

    def setup(self, ctx) -> Any:
        """Build this rank's state (tensors, models...) outside the timed rounds."""
        raise NotImplementedError

    def run_round(self, state: Any) -> None:
        """One timed round. Must issue the same collectives on every rank."""
        raise NotImplementedError

    def rank_metrics(self, state: Any) -> dict[str, Any]:
        """Extra numbers measured on this rank (numbers are combined as the max over ranks)."""
        return {}

    def check(self, state: Any) -> dict[str, Any] | None:
        """Raise (AssertionError with a message) if the workload computed a wrong result. Runs
        after ``rank_metrics``, untimed; it may return numbers it measured while checking (the
        peak memory of a check epoch), which join the rank's metrics."""

    def teardown(self, state: Any) -> None:
        """Free what setup made; runs even when a round or the check raised."""

    def census_details(self, state: Any) -> dict[str, Any]:
        """What the collective census cannot see from outside, after its counted round (untimed):
        ``{"ddp_buckets": [bytes, ...]}`` for a workload that trains with DDP (its reducer's
        bucket sizes, ``ddpbench.engine.census.ddp_bucket_sizes(model)``); ``{"incomplete": why}``
        when the step issues collectives from threads the census cannot see (it counts the threads
        the round and autograd run on), so that the gates do not judge a partial count. The census
        itself (every collective a round issues) needs nothing from the workload."""
        return {}

    def memory_census_targets(self, state: Any) -> list:
        """What the memory census (``extra_info["memory"]``, one untimed step) counts from the
        step's start: the ``nn.Module`` objects (parameters, buffers, gradients), optimizers (their
        state) and tensors this rank keeps between steps; tensors the step makes are counted as
        they are made. The default finds them in ``state`` (dicts, lists, tuples and objects'
        attributes, three levels deep); override it when the state hides them elsewhere."""
        from ..engine.memory import discover_targets

        return discover_targets(state)

    def numerics_targets(self, state: Any) -> list | dict:
        """What the numerics replay (``extra_info["numerics"]``: a few seeded, untimed steps on a
        state of their own) fingerprints after set-up and after each step: the ``nn.Module``
        objects (parameters, gradients, buffers), optimizers (their state) and tensors of the
        training state, besides the loss ``run_round`` returns; a list, or a dict naming each (a
        tensor is then named by its key). Modules are named through their wrappers (DDP,
        ``torch.compile``) and order-free. The default is what the memory census follows where a
        workload overrides :meth:`memory_census_targets`, else what the replay finds in the state
        (dicts, lists, tuples, objects' attributes, callable ones too, three levels deep); override
        it to leave out what may differ from run to run without changing what the step computes (a
        timestamp, a cache), or to name what the state does not hold (a model kept elsewhere)."""
        return self.memory_census_targets(state)

    def numerics_scalars(self, state: Any) -> dict[str, Any]:
        """Figures of the step that rounding cannot move, compared exactly by the numerics verdict
        after each replayed step: ``{name: number or bool}`` (tokens seen, whether the gradient
        clip fired, the loss scale). Beside them the replay compares each optimizer parameter
        group's hyperparameters (the learning rate...), its parameter count and how many had a
        gradient, and the optimizer's steps. Default: none."""
        return {}

    def extra_info(self, world_size: int, median_s: float,
                   rank_metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """Case-level extra_info computed in the controller from the median round time and, when
        the override names a ``rank_metrics`` parameter, what the ranks measured: their
        ``rank_metrics`` (and the numbers ``check`` returned) combined, numbers as the max over
        ranks. An override of the older form ``extra_info(world_size, median_s)`` is called
        that way."""
        return {}

    def variants(self) -> dict[str, "Workload"]:
        """Workloads the engine times interleaved with this one's rounds when a case asks for them
        (``RoundPlan.variant_rounds``; ``--dist-exposed-comm``), each recorded as its own rounds,
        never as the case's. ddpbench reads two names (:data:`COMPUTE_ONLY`,
        :data:`COMMUNICATION_ONLY`); ``{}``: none, the default."""
        return {}

    def skip_reason(self, spec) -> str | None:
        """Why this workload cannot run on ``spec`` (backend, world_size, device), or None: the
        case is skipped with this reason before any rank runs it (e.g. a data type the backend
        lacks)."""
        return None


class FunctionWorkload(Workload):
    """A workload made of module-level functions, for the common case where no class is needed::

        def setup(ctx): ...          # -> state, once per rank and case, not timed
        def run_round(state): ...    # one timed round, on every rank

        dist_benchmark(ddpbench.FunctionWorkload(setup, run_round))

    ``check(state)`` (raise on a wrong result) and ``teardown(state)`` are optional; ``name`` goes
    to the case's extra_info as ``workload`` (default: run_round's qualified name); ``group`` is
    the pytest-benchmark group. Parameters travel with ``functools.partial`` of a module-level
    function. Every function is checked here, in the controller, for what the ranks need: a
    lambda or a function defined inside another function raises TypeError naming it.

    The functions become the instance's own hooks, so a round calls ``run_round`` directly.
    """

    def __init__(self, setup: Callable[[Any], Any], run_round: Callable[[Any], Any],
                 check: Callable[[Any], Any] | None = None, *,
                 teardown: Callable[[Any], Any] | None = None, name: str | None = None,
                 group: str | None = None):
        from ..pool.picklecheck import unpicklable_message  # not at import: the plugin loads this package

        self.name = name or _qualified_name(run_round)
        hooks = {"setup": setup, "run_round": run_round, "check": check, "teardown": teardown}
        for hook, fn in hooks.items():
            if fn is None and hook in ("check", "teardown"):
                continue
            if not callable(fn):
                raise TypeError(f"ddpbench.FunctionWorkload: {hook} must be a function, got {fn!r}")
            problem = unpicklable_message(fn, f"FunctionWorkload's {hook} function")
            if problem:
                raise TypeError(problem)
            setattr(self, hook, fn)
        if group is not None:
            self.group = group

    def extra_info(self, world_size: int, median_s: float) -> dict[str, Any]:
        return {"workload": self.name}

    def __repr__(self) -> str:
        return f"FunctionWorkload({self.name!r})"


def case_extra_info(workload, world_size: int, median_s: float, rank_metrics: dict[str, Any]) -> dict[str, Any]:
    """``workload.extra_info`` called as its signature asks: with ``rank_metrics=`` when it names
    that parameter (or takes ``**kwargs``), else as ``extra_info(world_size, median_s)``, the form
    workloads written before the ranks' metrics were passed keep."""
    method = workload.extra_info
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature to read: the older form
        params = ()
    takes = any(p.kind is p.VAR_KEYWORD or (p.name == "rank_metrics" and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                                    p.KEYWORD_ONLY))
                for p in params)
    if takes:
        return method(world_size, median_s, rank_metrics=dict(rank_metrics))
    return method(world_size, median_s)


def _qualified_name(fn) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module and qualname:
        return f"{module}.{qualname}"
    return repr(fn)


# Both classes are pickled by their public path, ddpbench.workloads: an A/B baseline's ranks may run
# an older ddpbench, which has no ddpbench.workloads.base.
Workload.__module__ = FunctionWorkload.__module__ = "ddpbench.workloads"
