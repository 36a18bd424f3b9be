"""Everything issue 48 asks of a lent GPU, in one device call: run by lab/gpu/check.sh (read its
header and lab/gpu/README.md first).

Parts, in order of value, each under its own ``timeout`` (coreutils: the part's whole process group
is stopped when its budget is spent) so one stuck part costs only its share; a part's budget is cut
to what the total has left, and a part with under MIN_PART_S left is skipped saying so:

=============  ===============================================================================
install        ``python3 -m pip install --no-deps --no-build-isolation -e .``
suite          ``pytest -m "gpu and not slow" benchmarks/ --dist-backend=nccl --benchmark-autosave
               --benchmark-save-data`` (less the transformer cases, run by ``transformer``, and the
               CPU dataloader family ``test_dataset_sharing``; ``--dist-min-time`` shortened):
               pass / fail / skip counts
suite_gates    ``ddpbench compare`` (when .benchmarks holds an earlier run), ``report --charts``,
               ``history``
transformer    ``benchmarks/test_transformer.py -m gpu``: tokens/s, MFU in (0, 1), peak memory, the
               census with kernel launches, exposed communication
exposed_comm   lab/gpu/bench_exposed_comm.py: DDP's default buckets against one bucket
memory         the memory census against ``max_memory_allocated`` (when the census is built) and
               ``ddpbench census`` at world size 1 against the measured peak
nccl_tests     nccl-tests' four ``*_perf`` side by side with ddpbench's NCCL cases, eager and with
               graphs (lab/reference/nccl_tests_side_by_side.py); built in the background from
               the start (lab/gpu/nccl_tests_build.py, nice 19)
ab_gate        the A/B gate on NCCL: A/A, then a 10% slowdown injected into the candidate
=============  ===============================================================================

Writes under --out: summary.json (gpu_outputs.load_summary reads it), summary.md, environment.json
and one folder per part (its log, JSON and tables). Exit 0 whatever the parts did; 2 on bad
options. ``--dry-run`` runs the same sequence without installing, building or starting GPU work:
each part records ``skipped`` with its reason and the commands it would run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_outputs as outputs  # noqa: E402
import nccl_tests_build as nccl_build  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NCCL_TESTS_SOURCE = ROOT / "lab" / "gpu" / "nccl-tests"
NCCL_TESTS_BUILD = ROOT / "lab" / "gpu" / "nccl-tests-build"
PARTS = ("install", "suite", "suite_gates", "transformer", "exposed_comm", "memory", "nccl_tests", "ab_gate")
# Seconds per part; they add up to TOTAL_BUDGET_S, 9 minutes, so the device call (timeout_s ~560)
# ends with the summary written. The last part run also gets what the others left unused (unless
# --budget sets its own). The background build of nccl-tests has its own limit.
BUDGETS = {"install": 25, "suite": 145, "suite_gates": 20, "transformer": 100, "exposed_comm": 75,
           "memory": 30, "nccl_tests": 85, "ab_gate": 60}
TOTAL_BUDGET_S = 540
MIN_PART_S = 10
RESERVE_S = 5  # kept back from the last part for the summary
BUILD_LIMIT_S = 420
BUILD_JOBS = 8
# timeout's grace between its TERM and a KILL of the part's process group.
KILL_AFTER_S = 5
SUITE_DESELECT = "not test_dataset_sharing and not test_transformer_gpu"
SUITE_MIN_TIME = "0.3"
SUITE_CASE_TIMEOUT_S = 60  # --dist-timeout: a hung case fails after this, not at the part's limit
AB_AA_CASES = ["benchmarks/test_collectives.py::test_all_reduce[nccl-1p-1MB]",
               "benchmarks/test_collectives.py::test_all_gather[nccl-1p-100MB]",
               "benchmarks/test_collectives.py::test_reduce_scatter[nccl-1p-10MB]",
               "benchmarks/test_syncbn.py::test_syncbn_shared_gpu[gloo-cuda-2p-fused-bs32-h128]",
               "benchmarks/test_training.py::test_training_shared_gpu[gloo-cuda-2p-mlp-ddp]"]
AB_POWER_CASES = AB_AA_CASES[:3]
AB_INJECTION = "DDPBENCH_INJECT_SLOWDOWN=all_reduce:10%,all_gather:10%,reduce_scatter:10%"
AB_SETUP_S = 15  # a run's pools and probes before its first pair, left out of --dist-ab-run-budget
DDPBENCH_CLI = "import sys; from ddpbench.cli import main; sys.exit(main(sys.argv[1:]))"

PROBE = r"""
import json, os, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable, "cpus": os.cpu_count()}
try:
    from importlib import metadata
    for name in ("pytest", "pytest-benchmark", "lightning", "pytorch-lightning", "matplotlib"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
except Exception:
    pass
# torch/version.py first, without importing torch (seconds): a CPU build needs no more.
import importlib.util
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    out["torch_error"] = "no module named torch"
    print(json.dumps(out)); sys.exit(0)
version = {}
try:
    path = os.path.join(spec.submodule_search_locations[0], "version.py")
    exec(compile(open(path).read(), path, "exec"), version)
except Exception as exc:
    out["torch_error"] = f"cannot read torch/version.py: {type(exc).__name__}: {exc}"
    print(json.dumps(out)); sys.exit(0)
out["torch"] = version.get("__version__")
out["cuda"] = version.get("cuda")
if out["cuda"] is None:
    out["device_count"] = 0
    print(json.dumps(out)); sys.exit(0)
try:
    import torch
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out)); sys.exit(0)
try:
    out["device_count"] = torch.cuda.device_count()
    if out["device_count"]:
        out["gpu"] = torch.cuda.get_device_name(0)
        out["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as exc:
    out["cuda_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


class Check:
    """One run of the parts: options, the environment found, the clock, and the summary so far."""

    def __init__(self, args):
        self.args = args
        self.out: Path = args.out
        found = shutil.which(args.python)
        # absolute: the A/B gate's baseline interpreter (--dist-baseline-python) runs from elsewhere
        self.python = os.path.abspath(found) if found else args.python
        self.started = time.monotonic()
        self.started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        self.budgets = dict(BUDGETS, **args.budget)
        self.environment: dict = {}
        self.no_cuda: str | None = None
        self.parts: list[dict] = []
        self.build: subprocess.Popen | None = None
        self.build_plan: dict | None = None
        self.build_started = 0.0

    # -- clock and commands ---------------------------------------------------------------------

    def left(self) -> float:
        return self.args.total_budget - (time.monotonic() - self.started)

    def ddpbench(self, *words: str) -> list[str]:
        return [self.python, "-c", DDPBENCH_CLI, *words]

    def pytest(self, *words: str) -> list[str]:
        return [self.python, "-m", "pytest", *words]

    def run(self, part: dict, command: list[str], limit_s: float, log: Path, stdout: Path | None = None,
            env: dict | None = None) -> dict:
        """``command`` under ``timeout`` (its process group TERMed at ``limit_s``, KILLed 5 s later),
        from the repository root, output appended to ``log`` (stdout to ``stdout`` when given):
        ``{"rc", "wall_s", "timed_out"}``."""
        return run_limited(command, limit_s, log, stdout=stdout, env=env, part=part)

    # -- summary --------------------------------------------------------------------------------

    def summary(self) -> dict:
        return {"version": outputs.SUMMARY_VERSION, "started": self.started_at, "dry_run": self.args.dry_run,
                "out": str(self.out), "total_budget_s": self.args.total_budget,
                "wall_s": round(time.monotonic() - self.started, 1), "environment": self.environment,
                "parts": self.parts}

    def write_summary(self) -> None:
        doc = self.summary()
        self.out.mkdir(parents=True, exist_ok=True)
        for name, text in (("summary.json", json.dumps(doc, indent=1, default=str)),
                           ("summary.md", outputs.render_markdown(doc))):
            tmp = self.out / (name + ".tmp")
            tmp.write_text(text)
            tmp.replace(self.out / name)


def run_limited(command: list[str], limit_s: float, log: Path, stdout: Path | None = None,
                env: dict | None = None, part: dict | None = None) -> dict:
    """See :meth:`Check.run`; ``part`` (when given) records the command and the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    limit = max(1, int(limit_s))
    if part is not None:
        part["commands"].append(shlex.join(command))
        rel = _rel(log)
        if rel not in part["logs"]:
            part["logs"].append(rel)
    started = time.monotonic()
    with log.open("a") as err:
        err.write(f"$ {shlex.join(command)}   # limit {limit} s\n")
        err.flush()
        out = stdout.open("w") if stdout is not None else err
        try:
            done = subprocess.run(["timeout", f"--kill-after={KILL_AFTER_S}", str(limit), *command], cwd=ROOT,
                                  env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        finally:
            if stdout is not None:
                out.close()
        wall = time.monotonic() - started
        timed_out = done.returncode in (124, 137) and wall >= limit - 1
        err.write(f"# exit {done.returncode} after {wall:.1f} s{' (time limit)' if timed_out else ''}\n")
    return {"rc": done.returncode, "wall_s": round(wall, 1), "timed_out": timed_out}


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(path.parents[1]))
    except (ValueError, IndexError):
        return str(path)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " / ".join(line.strip() for line in text[-lines:])


def part_budget(configured: float, left: float) -> float:
    """A part's limit: its configured budget, cut to what the total has left less the summary's
    reserve; below MIN_PART_S there is no time for it (0)."""
    budget = min(configured, left - RESERVE_S)
    return budget if budget >= MIN_PART_S else 0.0


# ----------------------------------------------------------------------------------------------
# The environment
# ----------------------------------------------------------------------------------------------


def probe_environment(check: Check) -> None:
    env: dict = {}
    log = check.out / "environment.log"
    probe_out = check.out / "probe.json"
    result = run_limited([check.python, "-c", PROBE], 90, log, stdout=probe_out)
    try:
        env.update(json.loads(probe_out.read_text()))
    except (OSError, ValueError):
        env["probe_error"] = f"the torch probe exited {result['rc']}: {_tail(log)}"
    probe_out.unlink(missing_ok=True)
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if smi.returncode == 0 and smi.stdout.strip():
            name, driver, memory = (x.strip() for x in smi.stdout.splitlines()[0].split(",")[:3])
            env.update(gpu=env.get("gpu") or name, driver=driver, gpu_memory=memory)
    git = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
                         capture_output=True, text=True)
    env["ddpbench_commit"] = git.stdout.strip() if git.returncode == 0 else "unknown (no git history here)"
    commit = NCCL_TESTS_SOURCE / "COMMIT"
    env["nccl_tests_commit"] = commit.read_text().strip() if commit.is_file() else None
    nvcc = nccl_build.find_nvcc()
    if nvcc:
        version = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True)
        env["nvcc"] = next((line.strip() for line in version.stdout.splitlines() if "release" in line), str(nvcc))
    check.environment = env
    (check.out / "environment.json").write_text(json.dumps(env, indent=1))
    if "torch_error" in env or "probe_error" in env:
        check.no_cuda = f"torch cannot be imported by {check.python}: {env.get('torch_error') or env.get('probe_error')}"
    elif env.get("cuda_error"):
        check.no_cuda = f"CUDA is broken here: {env['cuda_error']}"
    elif not env.get("device_count"):
        check.no_cuda = (f"no CUDA device here (torch {env.get('torch')}, " +
                         ("a CPU build" if env.get("cuda") is None else f"CUDA {env.get('cuda')}, 0 devices") + ")")


# ----------------------------------------------------------------------------------------------
# Parts
# ----------------------------------------------------------------------------------------------


def part_install(check: Check, part: dict, limit: float) -> None:
    log = check.out / "install" / "log.txt"
    done = check.run(part, [check.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."],
                     limit, log)
    where = check.out / "install" / "ddpbench_path.txt"
    check.run(part, [check.python, "-c", "import ddpbench; print(ddpbench.__file__)"], 30, log, stdout=where)
    found = where.read_text().strip() if where.is_file() else ""
    part["checks"].append({"name": "ddpbench imports from this tree", "ok": found.startswith(str(ROOT)),
                           "detail": found or "not importable"})
    _finish(part, done, "installed" if done["rc"] == 0 else f"pip exited {done['rc']}: {_tail(log, 3)}")
    _fail_on_checks(part)


def _pytest_part(check: Check, part: dict, limit: float, command: list[str], folder: str) -> tuple[dict, dict]:
    log = check.out / folder / "log.txt"
    done = check.run(part, command, limit, log)
    parsed = outputs.pytest_counts(log.read_text(errors="replace"))
    part["figures"]["pytest"] = parsed
    return done, parsed


def _pytest_outcome(part: dict, done: dict, parsed: dict) -> None:
    line = outputs.counts_line(parsed)
    if done["timed_out"]:
        _finish(part, done, f"stopped at its time limit: {line}")
    elif done["rc"] not in (0, 1):
        _finish(part, done, f"pytest exited {done['rc']} (usage or internal error, or interrupted): {line}")
    else:
        _finish(part, done, line, failed=done["rc"] == 1)
    if parsed["failed_cases"]:
        part["findings"].append("failed: " + ", ".join(parsed["failed_cases"][:20]))
    for count, reason in parsed["skip_reasons"][:5]:
        part["findings"].append(f"skipped {count}: {reason}")


def saved_runs() -> list[Path]:
    """pytest-benchmark's saved runs in .benchmarks (``<machine>/0001_<commit>_<date>.json``; not the
    A/B profiles' Chrome traces kept beside them)."""
    return list((ROOT / ".benchmarks").glob("*/[0-9][0-9][0-9][0-9]_*.json"))


def suite_json(check: Check) -> Path:
    return check.out / "suite" / "suite.json"


def part_suite(check: Check, part: dict, limit: float) -> None:
    command = check.pytest("-m", "gpu and not slow", "benchmarks/", "--dist-backend=nccl", "--benchmark-autosave",
                           "--benchmark-save-data", f"--benchmark-json={suite_json(check)}", "-k", SUITE_DESELECT,
                           f"--dist-min-time={check.args.suite_min_time}", f"--dist-timeout={SUITE_CASE_TIMEOUT_S}",
                           "-v", "-rfEs")
    done, parsed = _pytest_part(check, part, limit, command, "suite")
    _pytest_outcome(part, done, parsed)
    saved = sorted(saved_runs(), key=lambda p: p.stat().st_mtime)
    part["figures"]["saved_runs"] = len(saved)
    if saved:
        part["figures"]["newest_saved_run"] = str(saved[-1].relative_to(ROOT))


def part_suite_gates(check: Check, part: dict, limit: float) -> None:
    folder = check.out / "suite"
    log = folder / "gates.log"
    deadline = time.monotonic() + limit
    saved = saved_runs()
    problems = []
    if len(saved) >= 2:
        compare_json = folder / "compare.json"
        done = check.run(part, check.ddpbench("compare", "--allow-different", "engine", "--json"),
                         deadline - time.monotonic(), log, stdout=compare_json)
        check.run(part, check.ddpbench("compare", "--allow-different", "engine", "--markdown"),
                  max(1, deadline - time.monotonic()), log, stdout=folder / "compare.md")
        try:
            counts = {k: v for k, v in json.loads(compare_json.read_text())["counts"].items() if v}
            part["findings"].append(f"compare (exit {done['rc']}, newest two saved runs): {counts}")
            part["figures"]["compare_counts"] = counts
        except (OSError, ValueError, KeyError):
            problems.append(f"compare exited {done['rc']} without a verdict table: {_tail(log, 3)}")
    else:
        part["findings"].append(f"compare: not run: {len(saved)} saved run(s) in .benchmarks; a second "
                                f"`bash lab/gpu/check.sh --parts suite,suite_gates` on this warm machine gives "
                                f"the run a baseline")
    done = check.run(part, check.ddpbench("report", str(suite_json(check)), "--charts", str(folder / "charts"),
                                          "--output", str(folder / "report.md")),
                     max(1, deadline - time.monotonic()), log, stdout=folder / "report.stdout.md")
    if done["rc"]:
        problems.append(f"report exited {done['rc']}")
    else:
        part["findings"].append(f"report: {len(list((folder / 'charts').glob('**/*.png')))} charts")
    history_json = folder / "history.json"
    done = check.run(part, check.ddpbench("history", "--output", str(folder / "history.html"), "--json"),
                     max(1, deadline - time.monotonic()), log, stdout=history_json)
    if done["rc"]:
        problems.append(f"history exited {done['rc']}")
    else:
        try:
            page = json.loads(history_json.read_text())
            part["findings"].append(f"history: {page.get('runs')} runs, {page.get('series')} series, "
                                    f"{len(page.get('steps') or [])} steps")
        except (OSError, ValueError):
            problems.append("history --json printed no JSON")
    part["status"] = "failed" if problems else "passed"
    part["reason"] = "; ".join(problems) or None
    part["headline"] = "; ".join(part["findings"])


# The transformer and exposed-communication cases run in slices, each its own pytest run with its
# own JSON and share of the part's budget: pytest writes --benchmark-json only at its end, so a slice
# stopped at its limit loses its own cases, not the earlier slices'. (label, -k expression, share
# of what is left when the slice starts)
TRANSFORMER_SLICES = (("eager", "not compiled", 0.4), ("compiled", "compiled", 1.0))
EXPOSED_SLICES = (("nccl-1p", "nccl-1p", 0.3), ("gloo-cuda-2p", "gloo-cuda-2p", 1.0))


def transformer_jsons(check: Check) -> list[Path]:
    return [p for label, _, _ in TRANSFORMER_SLICES
            if (p := check.out / "transformer" / f"transformer_{label}.json").is_file()]


def exposed_jsons(check: Check) -> list[Path]:
    return [p for label, _, _ in EXPOSED_SLICES
            if (p := check.out / "exposed_comm" / f"exposed_comm_{label}.json").is_file()]


def _sliced_pytest(check: Check, part: dict, limit: float, folder: str, base: list[str],
                   slices: tuple) -> list[dict]:
    """Each slice as its own pytest run (``-k``), sharing the part's budget; the part's outcome is
    the slices' together (failed if any failed, timed-out if any ran out of time). Returns the rows
    of every JSON written."""
    deadline = time.monotonic() + limit
    rows: list[dict] = []
    outcomes = []
    for label, keyword, share in slices:
        left = deadline - time.monotonic()
        if left < MIN_PART_S:
            part["findings"].append(f"{label}: not run, {max(0.0, left):.0f} s left")
            outcomes.append(("timed-out", f"{label}: not run (no time left)"))
            continue
        target = check.out / folder / f"{folder}_{label}.json"
        log = check.out / folder / f"{label}.log"
        done = check.run(part, check.pytest(*base, "-k", keyword, f"--benchmark-json={target}", "-v", "-rfEs"),
                         left * share, log)
        parsed = outputs.pytest_counts(log.read_text(errors="replace"))
        part["figures"][f"pytest_{label}"] = parsed
        line = f"{label}: {outputs.counts_line(parsed)}"
        if done["timed_out"]:
            outcomes.append(("timed-out", f"{line}, stopped at its time limit"))
        elif done["rc"] not in (0, 1):
            outcomes.append(("failed", f"{line}, pytest exited {done['rc']}"))
        else:
            outcomes.append(("failed" if done["rc"] else "passed", line))
        part["findings"] += [f"{label} failed: " + ", ".join(parsed["failed_cases"][:20])] if parsed["failed_cases"] else []
        part["findings"] += [f"{label} skipped {n}: {reason}" for n, reason in parsed["skip_reasons"][:3]]
        if target.is_file():
            rows += outputs.transformer_rows(json.loads(target.read_text()))
    statuses = [status for status, _ in outcomes]
    part["status"] = ("timed-out" if "timed-out" in statuses else "failed" if "failed" in statuses else "passed")
    part["headline"] = "; ".join(line for _, line in outcomes)
    part["reason"] = None if part["status"] == "passed" else part["headline"]
    return rows


def part_transformer(check: Check, part: dict, limit: float) -> None:
    rows = _sliced_pytest(check, part, limit, "transformer",
                          ["benchmarks/test_transformer.py", "-m", "gpu", "--dist-backend=nccl"], TRANSFORMER_SLICES)
    part["figures"]["cases"] = rows
    problems = outputs.mfu_problems(rows)
    part["checks"].append({"name": "MFU in (0, 1) for every case (measured peak and datasheet)",
                           "ok": bool(rows) and not problems,
                           "detail": "; ".join(problems) or (f"{len(rows)} cases" if rows else "no case ran")})
    problems = outputs.census_problems(rows)
    part["checks"].append({"name": "census counts kernel launches", "ok": bool(rows) and not problems,
                           "detail": "; ".join(problems) or (None if rows else "no case ran")})
    part["table"] = outputs.markdown_table(rows, [
        ("case", "case"), ("median_s", "step s"), ("tokens_per_second", "tokens/s"), ("mfu", "MFU"),
        ("mfu_datasheet", "MFU datasheet"), ("peak_allocated_bytes", "peak alloc B"), ("kernel_launches", "launches"),
        ("ddp_buckets", "buckets"), ("graph_breaks", "graph breaks"), ("recompiles", "recompiles"),
        ("compute_s", "compute s"), ("exposed_comm_s", "exposed s"), ("exposed_comm_s_ci", "exposed CI"),
        ("comm_overlap_pct", "overlap %")]) if rows else None
    _fail_on_checks(part)


def part_exposed_comm(check: Check, part: dict, limit: float) -> None:
    rows = _sliced_pytest(check, part, limit, "exposed_comm", ["lab/gpu/bench_exposed_comm.py"], EXPOSED_SLICES)
    pairs = outputs.bucket_pairs(rows)
    part["figures"].update(cases=rows, pairs=pairs)
    for pair in pairs:
        part["findings"].append(
            f"{pair['default']} vs {pair['one_bucket']}: buckets {pair['buckets']}; exposed "
            f"{_ms(pair['exposed_default_s'])} {_ms_ci(pair['exposed_default_ci'])} vs "
            f"{_ms(pair['exposed_one_bucket_s'])} {_ms_ci(pair['exposed_one_bucket_ci'])} ms; one bucket exposes "
            f"more: {_yes(pair['one_bucket_exposes_more'])}; compute {_ms(pair['compute_default_s'])} vs "
            f"{_ms(pair['compute_one_bucket_s'])} ms, within spread: {_yes(pair['compute_within_spread'])}; "
            f"default's interval holds 0: {_yes(pair['default_holds_zero'])}")
    part["table"] = outputs.markdown_table(rows, [
        ("case", "case"), ("median_s", "step s"), ("ddp_buckets", "buckets"), ("compute_s", "compute s"),
        ("compute_s_ci", "compute CI"), ("exposed_comm_s", "exposed s"), ("exposed_comm_s_ci", "exposed CI"),
        ("comm_isolated_s", "isolated s"), ("comm_overlap_pct", "overlap %")]) if rows else None
    part["checks"].append({"name": "default and one bucket paired on both pool specs", "ok": len(pairs) == 2,
                           "detail": f"{len(pairs)} pairs"})
    _fail_on_checks(part)


def part_memory(check: Check, part: dict, limit: float) -> None:
    deadline = time.monotonic() + limit
    rows: list[dict] = []
    states = []
    for path in transformer_jsons(check) + exposed_jsons(check):
        state, found = outputs.memory_rows(json.loads(path.read_text()))
        states.append(state)
        rows += found
    if not states:
        _skip(part, "the transformer and exposed_comm parts wrote no results to read the census from")
        return
    if all(state == "not built" for state in states):
        _skip(part, "memory census not built: no case has extra_info['memory'] (issue 46)")
        return
    part["figures"]["cases"] = rows
    part["table"] = outputs.markdown_table(rows, [
        ("case", "case"), ("census_peak_bytes", "census peak B"), ("measured_peak_bytes", "max_memory_allocated B"),
        ("ratio", "census / measured"), ("within_5pct", "±5%"), ("within_10pct", "±10%"), ("keys", "record keys")])
    if "unreadable" in states:
        part["checks"].append({"name": "the memory census records have a peak figure", "ok": False,
                               "detail": "none of gpu_outputs.MEMORY_PEAK_KEYS; the records' keys are in the table"})
    compared = [r for r in rows if "ratio" in r]
    part["checks"].append({"name": "census peak within ±10% of max_memory_allocated (torch's own tests' bound)",
                           "ok": bool(compared) and all(r["within_10pct"] for r in compared),
                           "detail": f"{sum(r['within_10pct'] for r in compared)} of {len(compared)}; within ±5%: "
                                     f"{sum(r['within_5pct'] for r in compared)}"})
    measured = {r["case"]: r["measured_peak_bytes"] for r in rows}
    log = check.out / "memory" / "log.txt"
    for impl in ("ddp", "fsdp2"):
        left = deadline - time.monotonic()
        if left < 5:
            part["findings"].append(f"census simulation {impl}: no time left")
            continue
        target = check.out / "memory" / f"census_{impl}.json"
        done = check.run(part, check.ddpbench("census", "--size", "gpt2-124m", "--impl", impl, "--precision", "bf16",
                                              "--world-sizes", "1", "--json", "--no-chart"), left, log, stdout=target)
        try:
            simulated = outputs.simulated_peak(json.loads(target.read_text()))
        except (OSError, ValueError):
            part["findings"].append(f"census simulation {impl}: exit {done['rc']}, no JSON: {_tail(log, 2)}")
            continue
        case = f"nccl-1p-gpt2-124m-{impl}-bf16"
        if simulated is None:
            part["findings"].append(f"census simulation {impl}: reports no per-rank peak (issue 46 item 5 not built)")
        elif measured.get(case):
            part["findings"].append(f"census simulation {impl} at world size 1: {simulated} B against {case}'s measured "
                                    f"{measured[case]} B = {simulated / measured[case]:.3f}")
        else:
            part["findings"].append(f"census simulation {impl}: {simulated} B (no measured {case} to compare)")
    part["status"], part["reason"] = "passed", None
    part["headline"] = "; ".join(c["detail"] or "" for c in part["checks"][-1:])
    _fail_on_checks(part)


def start_nccl_tests_build(check: Check) -> None:
    """Start the nccl-tests build in the background (nice 19, BUILD_JOBS jobs) when the source,
    NCCL and nvcc are there and the binaries are not: it compiles while the first parts measure."""
    arch = check.environment.get("capability")
    check.build_plan = nccl_build.plan(NCCL_TESTS_SOURCE, NCCL_TESTS_BUILD, arch, BUILD_JOBS)
    if check.args.dry_run or check.no_cuda or not check.build_plan["ok"] or "nccl_tests" not in check.args.parts:
        return
    if all(p.is_file() for p in nccl_build.binaries(NCCL_TESTS_BUILD).values()):
        check.build_plan["prebuilt"] = True
        return
    log = check.out / "nccl_tests" / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = ["timeout", f"--kill-after={KILL_AFTER_S}", str(BUILD_LIMIT_S), "nice", "-n", "19", check.python,
               "lab/gpu/nccl_tests_build.py", "--source", str(NCCL_TESTS_SOURCE), "--build", str(NCCL_TESTS_BUILD),
               "--arch", arch, "--jobs", str(BUILD_JOBS)]
    check.build_plan["background_command"] = shlex.join(command)
    check.build_started = time.monotonic()
    check.build = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log.open("w"),
                                   stderr=subprocess.STDOUT)


def part_nccl_tests(check: Check, part: dict, limit: float) -> None:
    deadline = time.monotonic() + limit
    plan = check.build_plan or {}
    part["figures"]["build"] = {k: plan.get(k) for k in ("commit", "nccl", "nvcc", "cuda_home", "command", "prebuilt")}
    if check.build is not None:
        part["commands"].append(plan["background_command"])
        part["logs"].append(_rel(check.out / "nccl_tests" / "build.log"))
        try:
            check.build.wait(timeout=max(1, deadline - time.monotonic() - 30))
        except subprocess.TimeoutExpired:
            _finish(part, {"timed_out": True, "rc": None}, f"the nccl-tests build was still running "
                    f"{time.monotonic() - check.build_started:.0f} s after it started; its log: nccl_tests/build.log")
            return
        part["figures"]["build"]["wall_s"] = round(time.monotonic() - check.build_started, 1)
        part["figures"]["build"]["rc"] = check.build.returncode
    missing = [str(p) for p in nccl_build.binaries(NCCL_TESTS_BUILD).values() if not p.is_file()]
    if missing:
        part["status"], part["reason"] = "failed", (f"nccl-tests build failed (exit {check.build and check.build.returncode}): "
                                                    f"{_tail(check.out / 'nccl_tests' / 'build.log', 4)}")
        return
    headers, torch_nccl = (plan.get("nccl") or {}).get("version"), check.environment.get("nccl")
    part["checks"].append({"name": "nccl-tests built against the NCCL torch uses", "ok": headers == torch_nccl,
                           "detail": f"nccl.h {headers}, torch.cuda.nccl.version() {torch_nccl}"})
    runners = nccl_build.write_runners(NCCL_TESTS_BUILD, nccl_build.library_dirs(plan))
    folder = check.out / "nccl_tests"
    command = [check.python, "lab/reference/nccl_tests_side_by_side.py", "--nccl-tests", str(runners),
               "--repeats", str(check.args.nccl_repeats), "--graphs", "off,on", "--placements", check.args.nccl_placements,
               "--out", str(folder / "side_by_side")]
    done = check.run(part, command, deadline - time.monotonic(), folder / "log.txt")
    records = folder / "side_by_side" / "records.json"
    if not records.is_file():
        _finish(part, done, f"side by side wrote no records (exit {done['rc']}): {_tail(folder / 'log.txt', 3)}")
        return
    summary = json.loads(records.read_text())["summary"]
    found = outputs.side_by_side_findings(summary)
    part["figures"]["side_by_side"] = found
    part["table"] = (folder / "side_by_side" / "summary.md").read_text()
    part["findings"].append(f"{found['goal_rows']} rows out of place at >= 100 MB (the comparable ones at n = 1); "
                            f"outside 0.95-1.05: {', '.join(found['goal_outside']) or 'none'}")
    _finish(part, done, f"{found['paired_rows']} paired rows, ratios {found['ratio_range']}; " + part["findings"][-1])
    _fail_on_checks(part)


def part_ab_gate(check: Check, part: dict, limit: float) -> None:
    deadline = time.monotonic() + limit
    folder = check.out / "ab_gate"
    results = {}
    for name, cases, extra, injected in (("aa", AB_AA_CASES, [], False),
                                         ("injected", AB_POWER_CASES,
                                          ["-p", "ddpbench.testing", f"--dist-candidate-env={AB_INJECTION}"], True)):
        share = (deadline - time.monotonic()) / (2 if name == "aa" else 1)
        if share < MIN_PART_S:
            part["findings"].append(f"{name}: no time left")
            continue
        run_json = folder / f"{name}.json"
        command = check.pytest(*cases, "--dist-backend=nccl", f"--dist-baseline-python={check.python}",
                               f"--dist-ab-run-budget={max(5, int(share - AB_SETUP_S))}", *extra,
                               f"--benchmark-json={run_json}", "-v", "-rfEs")
        done = check.run(part, command, share, folder / f"{name}.log")
        if not run_json.is_file():
            part["findings"].append(f"{name}: no results (exit {done['rc']}{', time limit' if done['timed_out'] else ''}): "
                                    f"{_tail(folder / f'{name}.log', 2)}")
            continue
        verdicts = folder / f"{name}_verdicts.json"
        check.run(part, check.ddpbench("compare", str(run_json), "--json"), 30, folder / f"{name}.log", stdout=verdicts)
        try:
            results[name] = outputs.ab_findings(json.loads(verdicts.read_text()), injected)
        except (OSError, ValueError):
            part["findings"].append(f"{name}: compare printed no verdicts")
            continue
        part["findings"].append(f"{name}: {results[name]['counts']}" +
                                (f", caught {results[name]['caught']}" if injected else
                                 f", false regressions {results[name]['false_regressions']}"))
    part["figures"].update(results)
    rows = [dict(c, run=name) for name, found in results.items() for c in found["cases"]]
    part["table"] = outputs.markdown_table(rows, [("run", "run"), ("case", "case"), ("verdict", "verdict"),
                                                  ("ratio", "ratio"), ("ci", "interval"), ("wall_s", "wall s"),
                                                  ("pairs", "pairs")])
    if "aa" in results:
        part["checks"].append({"name": "A/A: no false regression", "ok": results["aa"]["false_regressions"] == 0,
                               "detail": None})
    part["status"] = "passed" if results else "failed"
    part["reason"] = None if results else "no A/B run gave verdicts"
    part["headline"] = "; ".join(part["findings"])
    _fail_on_checks(part)


# ----------------------------------------------------------------------------------------------
# Helpers of the parts
# ----------------------------------------------------------------------------------------------


def _ms(seconds) -> str:
    return "—" if seconds is None else f"{1e3 * seconds:.2f}"


def _ms_ci(interval) -> str:
    return "[—]" if not interval else f"[{1e3 * interval[0]:.2f}, {1e3 * interval[1]:.2f}]"


def _yes(value) -> str:
    return {True: "yes", False: "no", None: "unknown"}[value]


def _finish(part: dict, done: dict, headline: str, failed: bool | None = None) -> None:
    if done.get("timed_out"):
        part["status"] = "timed-out"
    elif failed is None:
        part["status"] = "passed" if done.get("rc") == 0 else "failed"
    else:
        part["status"] = "failed" if failed else "passed"
    part["reason"] = None if part["status"] == "passed" else headline
    part["headline"] = headline


def _fail_on_checks(part: dict) -> None:
    failed = [c["name"] for c in part["checks"] if not c["ok"]]
    if failed and part["status"] == "passed":
        part["status"] = "failed"
        part["reason"] = "check failed: " + "; ".join(failed)


def _skip(part: dict, reason: str) -> None:
    part["status"], part["reason"] = "skipped", reason


RUNNERS = {"install": part_install, "suite": part_suite, "suite_gates": part_suite_gates,
           "transformer": part_transformer, "exposed_comm": part_exposed_comm, "memory": part_memory,
           "nccl_tests": part_nccl_tests, "ab_gate": part_ab_gate}
# Parts that read another part's output, and what they need.
NEEDS = {"suite_gates": (suite_json, "the suite wrote no results (suite.json)")}
# Parts that run without a GPU when not a dry run (none: everything here is for a lent GPU).
DRY_RUN_PLANS = {
    "install": lambda c: [[c.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."]],
    "suite": lambda c: [c.pytest("-m", "gpu and not slow", "benchmarks/", "--dist-backend=nccl",
                                 "--benchmark-autosave", "--benchmark-save-data", "--benchmark-json=OUT/suite/suite.json",
                                 "-k", SUITE_DESELECT, f"--dist-min-time={c.args.suite_min_time}",
                                 f"--dist-timeout={SUITE_CASE_TIMEOUT_S}", "-v", "-rfEs")],
    "suite_gates": lambda c: [c.ddpbench("compare", "--allow-different", "engine", "--json"),
                              c.ddpbench("report", "OUT/suite/suite.json", "--charts", "OUT/suite/charts"),
                              c.ddpbench("history", "--output", "OUT/suite/history.html", "--json")],
    "transformer": lambda c: [c.pytest("benchmarks/test_transformer.py", "-m", "gpu", "--dist-backend=nccl", "-k", k,
                                       f"--benchmark-json=OUT/transformer/transformer_{label}.json")
                              for label, k, _ in TRANSFORMER_SLICES],
    "exposed_comm": lambda c: [c.pytest("lab/gpu/bench_exposed_comm.py", "-k", k,
                                        f"--benchmark-json=OUT/exposed_comm/exposed_comm_{label}.json")
                               for label, k, _ in EXPOSED_SLICES],
    "memory": lambda c: [c.ddpbench("census", "--size", "gpt2-124m", "--impl", impl, "--precision", "bf16",
                                    "--world-sizes", "1", "--json", "--no-chart") for impl in ("ddp", "fsdp2")],
    "nccl_tests": lambda c: [[c.python, "lab/reference/nccl_tests_side_by_side.py", "--nccl-tests",
                              str(NCCL_TESTS_BUILD / "run"), "--repeats", str(c.args.nccl_repeats), "--graphs", "off,on",
                              "--placements", c.args.nccl_placements, "--out", "OUT/nccl_tests/side_by_side"]],
    "ab_gate": lambda c: [c.pytest(*AB_AA_CASES, "--dist-backend=nccl", f"--dist-baseline-python={c.python}"),
                          c.pytest(*AB_POWER_CASES, "--dist-backend=nccl", f"--dist-baseline-python={c.python}",
                                   "-p", "ddpbench.testing", f"--dist-candidate-env={AB_INJECTION}")],
}


def run_part(check: Check, name: str) -> dict:
    part = {"name": name, "status": "skipped", "reason": None, "headline": None, "wall_s": 0.0,
            "budget_s": float(check.budgets[name]), "commands": [], "logs": [], "checks": [], "findings": [],
            "figures": {}, "table": None}
    check.parts.append(part)
    skip = None
    if check.no_cuda:
        skip = check.no_cuda
    elif check.args.dry_run:
        skip = "dry run"
    elif name in NEEDS and not NEEDS[name][0](check).is_file():
        skip = NEEDS[name][1]
    elif name == "nccl_tests" and not (check.build_plan or {}).get("ok"):
        skip = (check.build_plan or {}).get("reason") or "nccl-tests build not planned"
    if skip:
        part["commands"] = [shlex.join(c) for c in DRY_RUN_PLANS[name](check)]
        if name == "nccl_tests" and check.build_plan:
            part["figures"]["build"] = {k: check.build_plan.get(k) for k in ("ok", "reason", "commit", "nccl", "nvcc")}
            found = check.build_plan
            part["findings"].append(f"build: source {'commit ' + found['commit'] if found.get('commit') else 'missing'}; "
                                    f"NCCL {(found.get('nccl') or {}).get('version') or 'not found'}; "
                                    f"nvcc {found.get('nvcc') or 'not found'}"
                                    + (f"; {found['reason']}" if found.get("reason") else ""))
        _skip(part, skip)
        check.write_summary()
        return part
    configured = check.budgets[name]
    if name == check.args.parts[-1] and name not in check.args.budget:
        configured = max(configured, check.left() - RESERVE_S)  # the last part also gets what others left
    limit = part_budget(configured, check.left())
    part["budget_s"] = limit
    if not limit:
        _skip(part, f"no time left: {max(0.0, check.left()):.0f} s of the {check.args.total_budget:.0f} s total")
        check.write_summary()
        return part
    started = time.monotonic()
    try:
        RUNNERS[name](check, part, limit)
    except Exception as exc:  # a bug in reading a part's output must not cost the other parts
        part["status"] = "failed"
        part["reason"] = f"gpu_check.py error: {type(exc).__name__}: {exc}"
    part["wall_s"] = round(time.monotonic() - started, 1)
    check.write_summary()
    return part


def _budget(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    if name not in PARTS:
        raise argparse.ArgumentTypeError(f"{name!r}: not a part; parts: {', '.join(PARTS)}")
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write PART=SECONDS, e.g. suite=200") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a budget is more than 0 seconds")
    return name, seconds


def _parts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'nothing'}: parts are {', '.join(PARTS)}")
    return [n for n in PARTS if n in names]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the summary, logs and JSON")
    parser.add_argument("--dry-run", action="store_true",
                        help="install, build and run nothing: each part records skipped, its reason and its commands")
    parser.add_argument("--parts", type=_parts, default=list(PARTS), help=f"comma list (default all: {','.join(PARTS)})")
    parser.add_argument("--budget", type=_budget, action="append", default=[], metavar="PART=SECONDS",
                        help="repeatable: another budget for a part")
    parser.add_argument("--total-budget", type=float, default=TOTAL_BUDGET_S, metavar="SECONDS",
                        help=f"all parts together (default {TOTAL_BUDGET_S})")
    parser.add_argument("--python", default=os.environ.get("PYTHON", "python3"),
                        help="the interpreter with torch and ddpbench (default $PYTHON or python3)")
    parser.add_argument("--suite-min-time", default=SUITE_MIN_TIME, help=f"suite's --dist-min-time (default {SUITE_MIN_TIME})")
    parser.add_argument("--nccl-repeats", type=int, default=1, help="side-by-side repeats (default 1)")
    parser.add_argument("--nccl-placements", default="out-of-place",
                        help="ddpbench's placements in the side by side (default out-of-place: at one GPU an "
                             "in-place collective moves nothing, so its time is torch's per-call cost; "
                             "out-of-place,in-place adds those rows)")
    args = parser.parse_args(argv)
    args.budget = dict(args.budget)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check(args)
    probe_environment(check)
    check.write_summary()
    start_nccl_tests_build(check)
    try:
        for name in args.parts:
            run_part(check, name)
    finally:
        if check.build is not None and check.build.poll() is None:
            check.build.terminate()  # timeout passes the TERM on to the build's process group
            check.build.wait(timeout=15)
        check.write_summary()
    print((args.out / "summary.md").read_text())
    print(f"summary: {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
