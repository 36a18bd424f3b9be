"""Every pytest option the plugin adds, and each option a ``ddpbench`` command shares with the
plugin or another command, defined once: its flags, parser, default and help. The plugin and the
commands register them from here (:func:`add_pytest_options`, :func:`add_command_options`), and
docs/reference.md is written from here (:mod:`ddpbench.reference_page`).

One spelling per idea: an option both take is ``--dist-WORDS`` in pytest (every ddpbench option
there carries the plugin's prefix, as pytest-benchmark's carry ``--benchmark-``) and ``--WORDS`` on
a command. A renamed or folded option keeps its old spelling for one more release
(:class:`OldSpelling`): hidden from ``--help`` and the reference, still read, and named once in a
one-line notice with its new spelling (:func:`read_old_spellings`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

from . import options as opts
from .gates.ab.heap import DEFAULT_HEAP, HEAP_MODES
from .gates.ab.profiling import DEFAULT_PROFILE, PROFILE_MODES
from .workloads.collectives import DTYPES, PLACEMENTS, REDUCE_OPS

PYTEST_PREFIX = "--dist-"  # how the plugin's options begin; a command's shared option drops "dist-"


@dataclass(frozen=True)
class Option:
    """One option. ``pytest_flag``: how the plugin spells it (``--dist-...``), None when only
    commands take it; ``command_flag``: how the ``ddpbench`` commands that take it spell it,
    None when only the plugin does. The rest are argparse's keyword arguments, which pytest's
    ``addoption`` takes as they are."""

    pytest_flag: str | None
    help: str
    command_flag: str | None = None
    type: Callable[[str], Any] | None = None
    default: Any = None
    action: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def takes_value(self) -> bool:
        return self.action != "store_true"

    @property
    def dest(self) -> str:
        """Where argparse and pytest keep its value (``config.getoption(dest)``, ``args.dest``)."""
        flag = self.pytest_flag or self.command_flag or ""
        return flag.lstrip("-").replace("-", "_")

    @property
    def command_dest(self) -> str:
        return (self.command_flag or "").lstrip("-").replace("-", "_")

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``argparse``'s ``add_argument`` and pytest's ``addoption``."""
        fields = {"type": self.type, "action": self.action, "metavar": self.metavar, "choices": self.choices}
        kwargs = {key: value for key, value in fields.items() if value is not None}
        if self.takes_value:  # a flag's default is False (argparse's own)
            kwargs["default"] = self.default
        kwargs["help"] = self.help
        return kwargs


def shared(words: str, help: str, **kwargs) -> Option:
    """An option the plugin and ``ddpbench compare`` both take: ``--dist-WORDS`` and ``--WORDS``."""
    return Option(PYTEST_PREFIX + words, help, command_flag="--" + words, **kwargs)


@dataclass(frozen=True)
class OptionGroup:
    """A group of the plugin's options, as ``pytest --help`` and docs/reference.md list them."""

    name: str
    title: str
    options: tuple[Option, ...]


class CensusList(argparse.Action):
    """--dist-census's own action: a list of censuses; or, as the option was written before it took
    a list, the word on or off, which turns the collective census alone on or off (with a notice)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values in (("on",), ("off",)):
            word = values[0]
            values, shown = _census_turned("collectives")(word, getattr(namespace, self.dest, None))
            _say(namespace, f"--dist-census={word}", shown)
        setattr(namespace, self.dest, values)


# ----------------------------------------------------------------------------------------------
# Shared by ddpbench compare and the A/B mode's own gate (pytest's --dist-...)
# ----------------------------------------------------------------------------------------------

ALLOW_MISSING = shared(
    "allow-missing", action="store_true",
    help="a case the baseline has and the candidate lost (crashed, hung, removed) is listed but does not "
         "fail the gate; an A/B run skips it instead of failing")
ALLOW_BASELINE_FAILURE = shared(
    "allow-baseline-failure", action="store_true",
    help="A/B: a case whose baseline side failed (raised, died, hung) while the candidate ran it is listed "
         "(its verdict is baseline-failed either way) but does not fail the gate")
ACCEPT_STRUCTURE_CHANGE = shared(
    "accept-structure-change", action="store_true",
    help="a structural regression (more collectives, bytes, buckets, graph breaks or recompiles per step than "
         "the baseline's census) made on purpose: shown as accepted instead of failing the gate")
ACCEPT_MEMORY_CHANGE = shared(
    "accept-memory-change", action="store_true",
    help="a memory regression (a larger memory census peak, more of a category at the peak, or more kept "
         "after the step than the baseline's) made on purpose: shown as accepted instead of failing the gate")
MEMORY_TOLERANCE = shared(
    "memory-tolerance", type=opts.parse_memory_tolerance, default=None, metavar="PCT",
    help="also judge the measured CUDA max allocated (not exact: caching, fragmentation): more than PCT "
         "(e.g. 10%%, as the thresholds are written; a bare number below 1 is refused as ambiguous) above the "
         "baseline's is a memory regression. Default: shown, not judged")
ACCEPT_NUMERICS_CHANGE = shared(
    "accept-numerics-change", action="store_true",
    help="a numerics change (a seeded replay of the first steps computes other values than the baseline's, "
         "past the band its rounding-level perturbations grow into and the tolerance, or an exact figure such "
         "as a learning rate moved) made on purpose: shown as accepted instead of failing the gate")
NUMERICS_TOLERANCE = shared(
    "numerics-tolerance", type=opts.parse_numerics_tolerance, default=None, metavar="PCT",
    help="a relative difference of the replayed steps' figures (norms and sums of parameters, gradients, "
         "optimizer state, loss) up to PCT (e.g. 0.01%%) reads 'rounding' instead of 'changed' where the "
         "band the baseline measured is narrower. Default: 0, the measured band alone")
FAIL_ON_INCONCLUSIVE = shared(
    "fail-on-inconclusive", action="store_true",
    help="exit 1 when a case is inconclusive (neither a change nor the same within the threshold); by "
         "default they are counted and exit 0")

#: The gate's options (the A/B gate's in pytest, ddpbench compare's), in the order both list them.
GATE_OPTIONS = (ALLOW_MISSING, ALLOW_BASELINE_FAILURE, ACCEPT_STRUCTURE_CHANGE, ACCEPT_MEMORY_CHANGE,
                MEMORY_TOLERANCE, ACCEPT_NUMERICS_CHANGE, NUMERICS_TOLERANCE, FAIL_ON_INCONCLUSIVE)

# ----------------------------------------------------------------------------------------------
# Shared by the ddpbench commands that read saved runs (compare, report, history)
# ----------------------------------------------------------------------------------------------

DEFAULT_STORAGE = ".benchmarks"
STORAGE = Option(None, command_flag="--storage", default=DEFAULT_STORAGE,
                 help="pytest-benchmark storage folder (default .benchmarks)")

# ----------------------------------------------------------------------------------------------
# The plugin's groups
# ----------------------------------------------------------------------------------------------

CASES = OptionGroup("ddpbench", "ddpbench distributed benchmarks", (
    Option("--dist-backend", type=opts.parse_backend, default="gloo",
           help="gloo (CPU tensors; the GPU cases of every family still use NCCL), nccl "
                "(only the NCCL/CUDA cases), or auto (nccl when CUDA is present). Default: gloo"),
    Option("--dist-world-sizes", type=opts.parse_world_sizes, default=[2],
           help="comma list of process counts, e.g. 2,4. Default: 2"),
    Option("--dist-sizes", type=opts.parse_sizes, default=None,
           help=f"collective message sizes, KB/MB/GB suffixes (powers of 1024). "
                f"Default: {opts.DEFAULT_SIZES} (plus 1GB under -m slow)"),
    Option("--dist-dtypes", type=opts.name_list(tuple(DTYPES), "data type", "float32,bfloat16"), default=None,
           help=f"collective data types ({', '.join(DTYPES)}); cases gain a dtype id part. Default: float32"),
    Option("--dist-reduce-ops", type=opts.name_list(REDUCE_OPS, "reduction", "sum,max"), default=None,
           help="reductions of all_reduce and reduce_scatter (sum, max, min, avg); cases gain an id part. "
                "Default: sum"),
    Option("--dist-placements", type=opts.name_list(PLACEMENTS, "placement", "out-of-place,in-place"),
           default=None,
           help="collective buffers out-of-place or in-place (as nccl-tests' two column groups); cases gain "
                "an id part. Default: each op's own (all_reduce and broadcast in place, the others out of "
                "place)"),
    Option("--dist-timeout", type=opts.parse_timeout, default=120.0,
           help="seconds a task may run on the ranks before the case fails. Default: 120"),
    # --dist-warmup, --dist-max-time and --dist-precision default to None (not given) so that
    # pytest-benchmark's own option for the same thing applies where only it is given
    # (ddpbench.benchmark_options); their defaults are RoundPlan's.
    Option("--dist-rounds", type=opts.parse_rounds, default=0,
           help="recorded rounds per case; 0 picks enough rounds to fill --dist-max-time (at least "
                "--benchmark-min-rounds, 5). Default: 0"),
    Option("--dist-warmup", type=opts.parse_warmup, default=None,
           help="unrecorded warm-up rounds per case (wins over --benchmark-warmup and "
                "--benchmark-warmup-iterations). Default: 2"),
    Option("--dist-max-time", type=opts.parse_min_time, default=None, metavar="SECONDS",
           help="with --dist-rounds=0: recorded seconds to aim for per case (5 to 1000 rounds), unless "
                "--dist-precision stops it earlier, as pytest-benchmark's --benchmark-max-time (this wins "
                "where both are given). Default: 1.0"),
    Option("--dist-ops-per-round", type=opts.parse_ops_per_round, default=None, metavar="N|auto",
           help="ops each round launches back to back, timed together and recorded per op; auto: enough "
                "that the round's fixed cost (timer, launch, barrier exit) is at most 1%% of it. Default: "
                "auto for CUDA cases, 1 on the CPU (gloo's ops are synchronous: nothing to hide)"),
    Option("--dist-exposed-comm", type=opts.parse_exposed_comm, default="auto", metavar="auto|off|N",
           help="after a case's rounds, time N rounds each of its workload's compute-only step and its "
                "collectives replayed alone, interleaved with N more steps (extra_info compute_s, "
                "exposed_comm_s, comm_isolated_s, comm_overlap_pct); auto: as each case asks (the default "
                "transformer cases do); off: never. Default: auto"),
    Option("--dist-cuda-graphs", action="store_true",
           help="capture each round's ops in a CUDA graph and replay it between the timing events "
                "(nccl-tests -G); CUDA cases only"),
    Option("--dist-census", type=opts.parse_censuses, default=opts.CENSUSES, action=CensusList,
           metavar="collectives,memory|none",
           help="the censuses each case takes after warm-up, untimed. collectives: one more round counts "
                "every collective it issues (kind, dtype, bytes, group size; DDP buckets; graph breaks; "
                "CUDA kernel launches) into extra_info['census']; memory: steps (as many as the collective "
                "census counts, at least two) under torch's memory tracker, compiled code run eager: the "
                "peak of live tensor bytes per rank, what held them at the peak (parameters, gradients, "
                "optimizer state, activations, temporaries, DDP buckets, FSDP2 buffers), where it fell and "
                "what stays after the step, into extra_info['memory']; none: neither. "
                "Default: collectives,memory"),
    Option("--dist-numerics-steps", type=opts.parse_numerics_steps, default=3, metavar="K",
           help="after the recorded rounds (A/B: before the blocks), twice on a state of its own (every "
                "rank's torch, random and numpy seeded before a second set-up, torn down after): K untimed "
                "steps, each with a SHA-256 and norms of the parameters, gradients, optimizer state and "
                "loss and the exact figures (learning rates...), and twice more with every parameter moved "
                "by one unit in the last place for the band rounding grows into, into extra_info['numerics'] "
                "for the numerics verdict; 0: none. Default: 3"),
))

NODES = OptionGroup("ddpbench-nodes", "ddpbench across nodes (ranks started by torchrun)", (
    Option("--dist-controller", default=None, metavar="HOST:PORT",
           help="multi-node: listen on HOST:PORT for ranks started by torchrun (-m ddpbench.worker) "
                "instead of spawning local pools"),
    Option("--dist-secret-file", default=None, metavar="PATH",
           help="with --dist-controller: 0600 file holding the shared secret (default: $DDPBENCH_SECRET)"),
    Option("--dist-controller-wait", type=opts.parse_timeout, default=300.0,
           help="with --dist-controller: seconds to wait for the workers. Default: 300"),
))

AB = OptionGroup("ddpbench-ab", "ddpbench A/B mode (baseline and candidate interleaved in one run)", (
    Option("--dist-baseline-python", default=None, metavar="PATH",
           help="interpreter for the baseline side's ranks (another environment with ddpbench installed, "
                "e.g. ../base/.venv/bin/python)"),
    Option("--dist-baseline-path", action="append", default=None, metavar="DIR",
           help="repeatable: first on the baseline ranks' sys.path (the base checkout's root for a flat "
                "layout, its src/ for a src layout)"),
    Option("--dist-baseline-env", action="append", default=None, metavar="KEY=VALUE",
           help="repeatable: set in the baseline ranks' environment"),
    Option("--dist-candidate-env", action="append", default=None, metavar="KEY=VALUE",
           help="repeatable: set in the candidate ranks' environment"),
    # ddpbench compare's --threshold (10%) is its own option: two saved runs are noisier than
    # interleaved blocks, so it gates at a larger change.
    Option("--dist-ab-threshold", type=opts.parse_percent, default=0.05, metavar="PCT",
           help="smallest slowdown that counts as a regression (it must also be significant). Default: 5%%"),
    Option("--dist-ab-max-time", type=opts.parse_timeout, default=None, metavar="SECONDS",
           help="per case: keep adding pairs of blocks while the verdict is inconclusive, up to this many "
                "seconds; with --dist-ab-run-budget, a cap on each case's share. Default: 60 (none with a "
                "run budget)"),
    Option("--dist-ab-run-budget", type=opts.parse_timeout, default=None, metavar="SECONDS",
           help="for the whole run: each case may add pairs for its share of what is left (the seconds left "
                "over the cases not yet finished), so time the cases that decide early leave goes to the "
                "ones still undecided; a case whose share ends while it is nearly decided may borrow one "
                "more share. Default: none (--dist-ab-max-time per case)"),
    Option("--dist-ab-seed", type=opts.parse_seed, default=None, metavar="N",
           help="seed of the blocks' random order; each run draws a new one and records it (header, "
                "extra_info ab.seed): give it to repeat a run's order"),
    *GATE_OPTIONS,
    Option("--dist-ab-profile", choices=PROFILE_MODES, default=DEFAULT_PROFILE,
           help="after a case's verdict, profile a few rounds on each side with torch.profiler: Chrome "
                "traces per side and rank under <benchmark storage>/ab-profiles/, and the ops whose self "
                "time grew most beneath the verdict table; regressions: the regressed cases, all: every "
                "case. Default: regressions"),
))

ADVANCED = OptionGroup("ddpbench-advanced",
                       "ddpbench advanced settings (the defaults are measured choices: docs/design/)", (
    Option("--dist-precision", type=opts.parse_precision, default=None,
           help="with --dist-rounds=0: stop recording once the median's 95%% interval is within +-this "
                "fraction of it (e.g. 1%%; checked after 20 rounds, then every 1.5x); 0 records until "
                "--dist-max-time is filled. Wins over --benchmark-precision. Default: 1%%"),
    Option("--dist-pin-cores", choices=("auto", "off"), default=None,
           help="off: the OS places the ranks, as in a plain torch.distributed script; auto: each local "
                "rank on a core of its own while it measures, when there are enough cores (steadier, but "
                "it measures that placement). Default: off"),
    Option("--dist-case-pools", type=opts.parse_case_pools, default=2, metavar="N",
           help="pools of ranks each case is measured in, in turn, its rounds split across them (not "
                "multiplied): a saved run holds the spread between its pools (extra_info pool_split), "
                "which ddpbench compare's interval takes as run-to-run variance; 1: the case's pool "
                "alone. Default: 2"),
    Option("--dist-ab-block-time", type=opts.parse_block_time, default=0.1, metavar="SECONDS",
           help="A/B: recorded seconds aimed for per block (at least 3 rounds). Default: 0.1"),
    Option("--dist-ab-pools-per-side", type=opts.parse_pools_per_side, default=2, metavar="N",
           help="A/B: independent pools of ranks per side, taking turns; a regression must show on every "
                "pool pair (1: the whole interval must clear the threshold instead). Default: 2"),
    Option("--dist-ab-stratify-cpu-sharing", action="store_true",
           help="A/B: compare both blocks of a pair at the pair's own mix of rounds where the ranks shared "
                "a CPU and rounds where they did not (the two modes of 1 MB on a small VM), instead of by "
                "their plain means; it cannot see a change in how often the ranks share a CPU. Default: off"),
    Option("--dist-ab-heap", choices=HEAP_MODES, default=DEFAULT_HEAP,
           help="A/B: steady: both sides' ranks run with glibc malloc's thresholds fixed, so every pool "
                "allocates alike; adaptive: glibc's defaults, as a plain script. A side's own --dist-*-env "
                "setting wins. Default: steady"),
))

#: The plugin's options, group by group, in the order ``pytest --help`` lists them.
PLUGIN_GROUPS = (CASES, NODES, AB, ADVANCED)


def plugin_option(flag: str) -> Option:
    """The plugin's option spelled ``flag``."""
    return next(option for group in PLUGIN_GROUPS for option in group.options if option.pytest_flag == flag)


# ----------------------------------------------------------------------------------------------
# Old spellings: read for one more release, hidden, named once with the new one
# ----------------------------------------------------------------------------------------------

#: Where argparse's namespace (pytest's ``config.option``) keeps the notices of the old spellings
#: it read, in the order given: the plugin and the commands say each once.
NOTICES = "ddpbench_old_spelling_notices"


def old_spelling_notice(old: str, new: str) -> str:
    return f"ddpbench: {old} is now {new} (the old spelling still works, for one more release)"


def _say(namespace, old: str, new: str) -> None:
    notices = list(getattr(namespace, NOTICES, None) or [])
    if not any(line.startswith(f"ddpbench: {old} is now ") for line in notices):  # once, as first said
        notices.append(old_spelling_notice(old, new))
    setattr(namespace, NOTICES, notices)


def old_spelling_notices(namespace) -> list[str]:
    """The notices of the old spellings argparse read into ``namespace``, each once."""
    return list(getattr(namespace, NOTICES, None) or [])


@dataclass(frozen=True)
class OldSpelling:
    """A flag as it was spelled before it was renamed or folded into another option: hidden from
    ``--help`` and the reference, and read as the option that replaced it (``dest``) as argparse
    meets it, with a notice naming the new spelling. ``convert(old value, the new option's value
    so far)``: for a folded option, the new option's value and how it is spelled now; None: the
    value carries over as it is."""

    flag: str
    new_flag: str
    dest: str  # the replacing option's
    kwargs: dict = field(default_factory=dict)  # how argparse reads the old flag's value
    convert: Callable[[Any, Any], tuple[Any, str]] | None = None

    def add_to(self, add: Callable[..., Any]) -> None:
        """Register with ``add``: argparse's ``add_argument`` or pytest's ``addoption``."""
        spelling = self
        is_flag = self.kwargs.get("action") == "store_true"

        class ReadAsNew(argparse.Action):
            def __call__(self, parser, namespace, values, option_string=None):
                value, old, shown = True if is_flag else values, spelling.flag, spelling.new_flag
                if spelling.convert is not None:
                    old = f"{spelling.flag}={values}"
                    value, shown = spelling.convert(values, getattr(namespace, spelling.dest, None))
                setattr(namespace, spelling.dest, value)
                _say(namespace, old, shown)

        kwargs = {key: value for key, value in self.kwargs.items() if key != "action"}
        if is_flag:
            kwargs["nargs"] = 0
        add(self.flag, dest="old_spelling_" + self.flag.lstrip("-").replace("-", "_"), default=None,
            help=argparse.SUPPRESS, action=ReadAsNew, **kwargs)


def renamed(option: Option, old_flag: str, command: bool = False) -> OldSpelling:
    """``old_flag``, which reads as ``option`` now does (its pytest spelling, or with ``command``
    a ``ddpbench`` command's)."""
    kwargs = {key: value for key, value in option.kwargs().items() if key not in ("help", "default")}
    return OldSpelling(old_flag, option.command_flag if command else option.pytest_flag,
                       option.command_dest if command else option.dest, kwargs)


def _census_turned(kind: str) -> Callable[[Any, Any], tuple[Any, str]]:
    """--dist-memory-census=on|off, and --dist-census=on|off, which named the collective census alone
    before the option took a list: one kind of census turned on or off within --dist-census's list."""

    def convert(word: str, censuses: Any) -> tuple[Any, str]:
        chosen = {c for c in tuple(censuses or ()) if c in opts.CENSUSES and c != kind}
        if word == "on":
            chosen.add(kind)
        value = tuple(c for c in opts.CENSUSES if c in chosen)
        return value, f"--dist-census={','.join(value) or 'none'}"

    return convert


#: Every old spelling of a plugin option, with the option it reads as now.
PYTEST_OLD_SPELLINGS: tuple[OldSpelling, ...] = (
    *(renamed(option, "--dist-ab-" + option.command_flag[2:]) for option in GATE_OPTIONS),
    renamed(plugin_option("--dist-max-time"), "--dist-min-time"),
    renamed(plugin_option("--dist-ab-stratify-cpu-sharing"), "--dist-ab-stratify-placement"),
    OldSpelling("--dist-memory-census", "--dist-census", "dist_census", {"choices": ("on", "off")},
                _census_turned("memory")),
)


def add_pytest_options(parser) -> None:
    """Register the plugin's options with pytest's ``parser`` (its ``pytest_addoption``), their old
    spellings hidden."""
    for group in PLUGIN_GROUPS:
        pytest_group = parser.getgroup(group.name, group.title)
        for option in group.options:
            pytest_group.addoption(option.pytest_flag, **option.kwargs())
    hidden = parser.getgroup(CASES.name)
    for spelling in PYTEST_OLD_SPELLINGS:
        spelling.add_to(hidden.addoption)


def add_command_options(parser, options: tuple[Option, ...] | list[Option],
                        old_spellings: tuple[OldSpelling, ...] = ()) -> None:
    """Register ``options`` with a ``ddpbench`` command's argparse ``parser``, as it spells them,
    and ``old_spellings`` (of those or of the command's own options) hidden."""
    for option in options:
        parser.add_argument(option.command_flag, **option.kwargs())
    for spelling in old_spellings:
        spelling.add_to(parser.add_argument)
