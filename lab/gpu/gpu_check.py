"""Everything issue 48 asks of a lent GPU, in one device call: run by lab/gpu/check.sh (read its
header and lab/gpu/README.md first).

Parts, in order of value, each under its own ``timeout`` (coreutils: the part's whole process group
is stopped when its budget is spent) so one stuck part costs only its share; a part's budget is cut
to what the total has left, and a part with under MIN_PART_S left is skipped saying so:

=============  ===============================================================================
install        the image's packages against pyproject's ranges (carried wheels from .whl/ for any
               missing or too old), then ``pip install --no-deps --no-build-isolation -e .``;
               when pip fails, every later command runs ddpbench from src/ (PYTHONPATH,
               ``-p ddpbench.plugin``)
suite          ``pytest -m "gpu and not slow" benchmarks/ --dist-backend=nccl`` (less the transformer
               cases, run by ``transformer``, and the CPU dataloader family)
suite_gates    a short slice (the collectives at 1 MB and 10 MB) run twice, ``ddpbench compare``
               of the two, ``report --chart`` of the suite, ``history`` of the runs
transformer    ``benchmarks/test_transformer.py -m "gpu and not slow"``: tokens/s, MFU in (0, 1),
               peak memory, the census with kernel launches, exposed communication
exposed_comm   lab/gpu/bench_exposed_comm.py: DDP's default buckets against one bucket
memory         the memory census against ``max_memory_allocated`` and ``ddpbench census`` at world
               size 1 against the measured peak
nccl_tests     nccl-tests' four ``*_perf`` side by side with ddpbench's NCCL cases, eager and with
               graphs (lab/reference/nccl_tests_side_by_side.py); built in the background from
               the start (lab/gpu/nccl_tests_build.py, nice 19)
ab_gate        the A/B gate on the nccl-1p collectives: A/A, then a 10% slowdown injected into the
               candidate
=============  ===============================================================================

Every pytest run loads lab/gpu/partial_json.py: its --benchmark-json file is rewritten after each
case, so a part stopped at its limit keeps what it measured.

Files: the parts write under --work (a new temporary folder by default); --out (the device call's
$OUT, which brings back at most 8 files) gets ``summary.md``, ``summary.json`` and ``bundle.tar.gz``
(every log, JSON and chart of --work), rewritten after every part so a call cut short still has the
parts done. The run ends by printing a short table (gpu_outputs.render_brief). Exit 0 whatever the
parts did; 2 on bad options.

``--cpu-rehearsal`` runs every part's real commands on a machine without a GPU (gloo in place of
NCCL, the CPU cases in place of the GPU ones, nccl-tests skipped with its reason), under the same
budgets, bundling and summary. ``--dry-run`` runs nothing: it checks that every pytest command
collects (``--collect-only``) and that every flag of every other command exists (its ``--help``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_outputs as outputs  # noqa: E402
import nccl_tests_build as nccl_build  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAB_GPU = ROOT / "lab" / "gpu"
NCCL_TESTS_SOURCE = ROOT / "lab" / "gpu" / "nccl-tests"
NCCL_TESTS_BUILD = ROOT / "lab" / "gpu" / "nccl-tests-build"
WHEELS = ROOT / ".whl"  # carried with the device call (lab/gpu/fetch_wheels.sh fills it)
PARTS = ("install", "suite", "suite_gates", "transformer", "exposed_comm", "memory", "nccl_tests", "ab_gate")
# Seconds per part; they add up to TOTAL_BUDGET_S, 9 minutes, so the device call (timeout_s 580)
# ends with the summary and bundle written. The last part run also gets what the others left unused
# (unless --budget sets its own). The background build of nccl-tests has its own limit.
BUDGETS = {"install": 25, "suite": 120, "suite_gates": 70, "transformer": 100, "exposed_comm": 60,
           "memory": 25, "nccl_tests": 80, "ab_gate": 60}
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
TWICE_SIZES = "1MB,10MB"  # the short slice run twice for ddpbench compare
AB_INJECTION = "DDPBENCH_INJECT_SLOWDOWN=all_reduce:10%,all_gather:10%,reduce_scatter:10%"
AB_SETUP_S = 15  # a run's pools and probes before its first pair, left out of --dist-ab-run-budget
DDPBENCH_CLI = "import sys; from ddpbench.cli import main; sys.exit(main(sys.argv[1:]))"
# Every file of --work goes into bundle.tar.gz unless the bundle would pass this (the device call
# brings back files of at most 16 MiB): then the largest files are left out, and listed.
BUNDLE_LIMIT_BYTES = 15 << 20
# What pytest runs with when ddpbench is not installed (pip failed): the plugin from src/.
TREE_PLUGIN_ADDOPTS = "-p no:ddpbench -p ddpbench.plugin"
NO_TESTS_EXIT = 5  # pytest: nothing selected


class Mode:
    """What the parts run: on a GPU (NCCL, the GPU cases) or as the CPU rehearsal (gloo, the CPU
    cases of the same files), so the rehearsal runs the same commands with these words swapped."""

    def __init__(self, name: str, spec: str, backend: str, markers: str, exposed_slices: tuple, ab_cases: tuple,
                 env: dict | None = None):
        self.name = name
        self.spec = spec  # the pool spec of the A/B and memory cases' ids
        self.backend = backend
        self.markers = markers
        self.exposed_slices = exposed_slices  # (label, -k expression, share of what is left when it starts)
        self.ab_cases = ab_cases
        self.env = dict(env or {})


def _collective_ids(spec: str, sizes: tuple) -> tuple:
    return tuple(f"benchmarks/test_collectives.py::test_{op}[{spec}-{size}]"
                 for op, size in zip(("all_reduce", "all_gather", "reduce_scatter"), sizes))


GPU_MODE = Mode("gpu", "nccl-1p", "nccl", "gpu and not slow", (("nccl-1p", "nccl-1p", 0.3), ("gloo-cuda-2p", "gloo-cuda-2p", 1.0)),
                _collective_ids("nccl-1p", ("1MB", "100MB", "10MB")))
REHEARSAL_MODE = Mode("cpu-rehearsal", "gloo-2p", "gloo", "not gpu and not slow", (("gloo-2p", "gloo-2p", 1.0),),
                      _collective_ids("gloo-2p", ("1MB", "1MB", "1MB")),
                      {"DDPBENCH_GPU_CHECK_REHEARSAL": "1"})  # bench_exposed_comm.py: the CPU cases
# Checks that only a GPU can pass: the rehearsal records them as not applicable.
GPU_ONLY_CHECKS = ("MFU in (0, 1) for every case (measured peak and datasheet)", "census counts kernel launches",
                   "census peak within ±10% of max_memory_allocated (torch's own tests' bound)")

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
    """One run of the parts: options, the mode, the environment found, the clock, the summary so far."""

    def __init__(self, args):
        self.args = args
        self.results: Path = args.out
        self.out: Path = args.work  # the parts' files (bundled into results/bundle.tar.gz)
        found = shutil.which(args.python)
        # absolute: the A/B gate's baseline interpreter (--dist-baseline-python) runs from elsewhere
        self.python = os.path.abspath(found) if found else args.python
        self.mode = REHEARSAL_MODE if args.cpu_rehearsal else GPU_MODE
        self.started = time.monotonic()
        self.started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        self.budgets = dict(BUDGETS, **args.budget)
        self.environment: dict = {}
        self.no_cuda: str | None = None
        self.parts: list[dict] = []
        self.build: subprocess.Popen | None = None
        self.build_plan: dict | None = None
        self.build_started = 0.0
        # Every command's environment: lab/gpu importable (partial_json), the mode's variables; the
        # install part adds the carried wheels' folder and, when pip fails, src/ and TREE_PLUGIN_ADDOPTS.
        self.env = dict(os.environ, **self.mode.env, PYTHONUNBUFFERED="1")
        self.add_path(LAB_GPU)
        self.tree_fallback = False
        self.dry_problems: list[str] | None = None  # --dry-run: what the current part's commands lack
        self._help: dict[tuple, str] = {}
        self.bundle: dict = {}

    def add_path(self, folder: Path) -> None:
        entries = [str(folder)] + [e for e in self.env.get("PYTHONPATH", "").split(os.pathsep) if e and e != str(folder)]
        self.env["PYTHONPATH"] = os.pathsep.join(entries)

    # -- clock and commands ---------------------------------------------------------------------

    def left(self) -> float:
        return self.args.total_budget - (time.monotonic() - self.started)

    def ddpbench(self, *words: str) -> list[str]:
        return [self.python, "-c", DDPBENCH_CLI, *words]

    def pytest(self, *words: str) -> list[str]:
        return [self.python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "partial_json", *words]

    def keyword(self, part: str, keyword: str | None) -> list[str]:
        """``-k``: the part's own expression and/or --select's for the part, and-ed."""
        words = [w for w in (keyword, self.args.select.get(part)) if w]
        return ["-k", " and ".join(f"({w})" for w in words)] if words else []

    def run(self, part: dict, command: list[str], limit_s: float, log: Path, stdout: Path | None = None,
            env: dict | None = None) -> dict:
        """``command`` under ``timeout`` (its process group TERMed at ``limit_s``, KILLed 5 s later),
        from the repository root, output appended to ``log`` (stdout to ``stdout`` when given):
        ``{"rc", "wall_s", "timed_out"}``. Under --dry-run the command is checked instead
        (:meth:`dry_check`) and recorded; nothing runs."""
        if self.dry_problems is not None:
            part["commands"].append(shlex.join(command))
            self.dry_check(command)
            return {"rc": None, "wall_s": 0.0, "timed_out": False}
        return run_limited(command, limit_s, log, stdout=stdout, env=env or self.env, part=part)

    def dry_check(self, command: list[str]) -> None:
        """A pytest command must collect (``--collect-only``: its files, marks, -k and every option
        exist); any other command's flags must appear in its ``--help``."""
        if command[1:3] == ["-m", "pytest"]:
            done = subprocess.run([*command, "--collect-only", "-q"], cwd=ROOT, env=self.env, capture_output=True,
                                  text=True, stdin=subprocess.DEVNULL, timeout=300)
            if done.returncode not in (0, NO_TESTS_EXIT):
                lines = (done.stdout + done.stderr).strip().splitlines()
                self.dry_problems.append(f"`{shlex.join(command[3:])[:160]}` does not collect (exit "
                                         f"{done.returncode}): {' / '.join(lines[-2:])[:300]}")
            return
        if command[1:3] == ["-m", "pip"]:
            base, flags = command[:4], command[4:]
        elif command[1:3] == ["-c", DDPBENCH_CLI]:  # the ddpbench CLI: its subcommand's help
            base, flags = command[:4], command[4:]
        elif command[1] == "-c":  # a probe of this file's own: nothing to look up
            return
        else:  # a script
            base, flags = command[:2], command[2:]
        key = tuple(base)
        label = f"ddpbench {base[3]}" if base[1:3] == ["-c", DDPBENCH_CLI] else shlex.join(base[1:])
        if key not in self._help:
            done = subprocess.run([*base, "--help"], cwd=ROOT, env=self.env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=120)
            self._help[key] = done.stdout if done.returncode == 0 else ""
            if done.returncode:
                self.dry_problems.append(f"`{label} --help` exited {done.returncode}: "
                                         f"{_last_line(done.stderr)}")
                return
        for flag in flags:
            name = flag.split("=", 1)[0]
            if name.startswith("-") and not re.search(rf"(^|[\s,\[]){re.escape(name)}\b", self._help[key], re.M):
                self.dry_problems.append(f"`{label}` has no option {name}")

    # -- summary --------------------------------------------------------------------------------

    def summary(self) -> dict:
        return {"version": outputs.SUMMARY_VERSION, "started": self.started_at, "dry_run": self.args.dry_run,
                "mode": self.mode.name, "out": str(self.results), "work": str(self.out),
                "total_budget_s": self.args.total_budget, "wall_s": round(time.monotonic() - self.started, 1),
                "environment": self.environment, "bundle": self.bundle, "parts": self.parts}

    def write_summary(self) -> None:
        """summary.json and summary.md into the work folder, the bundle of it, then both summaries
        beside the bundle in --out: each written to a new file renamed over the old."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.results.mkdir(parents=True, exist_ok=True)
        for folder in (self.out, self.results):
            doc = self.summary()
            _write(folder / "summary.json", json.dumps(doc, indent=1, default=str))
            _write(folder / "summary.md", outputs.render_markdown(doc))
            if folder == self.out and not self.args.dry_run:
                self.bundle = make_bundle(self.out, self.results / outputs.BUNDLE_NAME)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:200] if lines else ""


def make_bundle(folder: Path, target: Path, limit: int = BUNDLE_LIMIT_BYTES) -> dict:
    """Every file under ``folder`` into ``target`` (tar.gz, paths relative to ``folder``), written to
    a new file renamed over the old. Over ``limit`` bytes, the largest files are left out one at a
    time until it fits: ``{"files", "bytes", "left_out"}``."""
    files = sorted((p for p in folder.rglob("*") if p.is_file() and not p.name.endswith((".tmp", ".partial"))),
                   key=lambda p: p.stat().st_size)
    left_out: list[str] = []
    tmp = target.with_name(target.name + ".tmp")
    while True:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for path in files:
                try:
                    tar.add(path, arcname=str(path.relative_to(folder)))
                except OSError:  # a file a finished part removed meanwhile
                    pass
        size = tmp.stat().st_size
        if size <= limit or not files:
            break
        left_out.append(f"{files.pop().relative_to(folder)}")
    tmp.replace(target)
    return {"name": target.name, "files": len(files), "bytes": size, "left_out": left_out}


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


VERSIONS_PROBE = r"""
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def requirements() -> list[dict]:
    """What ddpbench needs of the image: pyproject's dependencies, matplotlib (charts) and the build
    backend's setuptools, each ``{"name", "spec", "pin"}`` (``pin``: constraints.txt's version)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1)
    wanted = re.findall(r'^\s*"([^"]+)"', block, re.M)
    wanted += re.findall(r'"(matplotlib[^"]*)"', text)[:1] + re.findall(r'requires = \["(setuptools[^"]*)"', text)[:1]
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    pins = {_norm(k): v for k, v in pins.items()}
    out = []
    for item in wanted:
        found = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", item)
        name, spec = found.group(1), found.group(2).strip()
        out.append({"name": name, "spec": spec, "pin": pins.get(_norm(name))})
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def satisfies(version: str | None, spec: str) -> bool | None:
    """Whether ``version`` meets ``spec`` (None when packaging is missing to tell)."""
    if version is None:
        return False
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version
    except ImportError:
        return None
    return SpecifierSet(spec).contains(Version(version), prereleases=True) if spec else True


def wheel_requirements(wheel: Path) -> list[dict]:
    """A wheel's own needs on this interpreter (Requires-Dist whose marker holds here, no extras)
    as :func:`requirements` rows; none when packaging is missing to read the markers."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return []
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode(errors="replace")
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        out.append({"name": req.name, "spec": str(req.specifier), "pin": None, "needed_by": wheel.name.split("-")[0]})
    return out


def carried_wheel(name: str, folder: Path | None = None) -> Path | None:
    """The carried wheel of ``name`` in ``folder`` (default: :data:`WHEELS`, read at the call; file
    names hold the name with ``_``)."""
    folder = WHEELS if folder is None else folder
    wanted = _norm(name)
    found = [w for w in sorted(folder.glob("*.whl")) if _norm(w.name.split("-")[0]) == wanted] if folder.is_dir() else []
    return found[-1] if found else None


def part_install(check: Check, part: dict, limit: float) -> None:
    deadline = time.monotonic() + limit
    folder = check.out / "install"
    log = folder / "log.txt"
    needed: list[dict] = []
    to_carry: list[Path] = []
    batch = requirements()
    for round_ in range(3):  # the carried wheels' own needs, checked the same way
        versions_file = folder / f"versions{round_}.json"
        check.run(part, [check.python, "-c", VERSIONS_PROBE, *[r["name"] for r in batch]], 60, log, stdout=versions_file)
        found = _read_json(versions_file) or {}
        carried_now = []
        for req in batch:
            req["found"] = found.get(req["name"])
            req["ok"] = satisfies(req["found"], req["spec"])
            if req["ok"] is False and req["name"] != "torch":
                wheel = carried_wheel(req["name"])
                req["action"] = f"carried {wheel.name}" if wheel else "MISSING: no wheel carried in .whl/"
                if wheel:
                    carried_now.append(wheel)
            else:
                req["action"] = "ok" if req["ok"] else ("torch is never carried" if req["name"] == "torch" else "unknown")
        needed += batch
        to_carry += carried_now
        seen = {_norm(r["name"]) for r in needed}
        batch = [r for w in carried_now for r in wheel_requirements(w) if _norm(r["name"]) not in seen]
        batch = list({_norm(r["name"]): r for r in batch}.values())
        if not batch:
            break
    if to_carry:
        site = check.out.parent / (check.out.name + "-site")  # beside the work folder: not bundled
        done = check.run(part, [check.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, to_carry)],
                         max(1, deadline - time.monotonic()), log)
        if done["rc"] == 0:
            check.add_path(site)
            check.add_path(LAB_GPU)  # first again
        else:
            part["findings"].append(f"installing the carried wheels failed (exit {done['rc']}): {_tail(log, 2)}")
    part["figures"]["requirements"] = needed
    part["table"] = outputs.markdown_table(needed, [("name", "package"), ("spec", "needs"), ("pin", "pinned"),
                                                    ("found", "image has"), ("action", "action")])
    missing = [r["name"] for r in needed if r["action"].startswith("MISSING")]
    if missing:
        part["findings"].append("missing, and no wheel carried: " + ", ".join(missing))
    if to_carry:
        part["findings"].append("carried: " + ", ".join(w.name for w in to_carry))
    pip_rc = None
    if check.args.no_pip_install:
        part["findings"].append("pip install skipped (--no-pip-install)")
    else:
        done = check.run(part, [check.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."],
                         max(1, deadline - time.monotonic() - 5), log)
        pip_rc = done["rc"]
    if check.args.no_pip_install or (pip_rc != 0 and not check.args.dry_run):
        check.tree_fallback = True
        check.add_path(ROOT / "src")
        check.add_path(LAB_GPU)
        check.env["PYTEST_ADDOPTS"] = " ".join(filter(None, [check.env.get("PYTEST_ADDOPTS"), TREE_PLUGIN_ADDOPTS]))
        part["findings"].append(f"later commands run ddpbench from src/: PYTHONPATH=src, PYTEST_ADDOPTS={TREE_PLUGIN_ADDOPTS}")
    where = folder / "ddpbench_path.txt"
    check.run(part, [check.python, "-c", "import ddpbench; print(ddpbench.__file__)"], 30, log, stdout=where)
    path = where.read_text().strip() if where.is_file() else ""
    part["checks"].append({"name": "ddpbench imports from this tree", "ok": path.startswith(str(ROOT)),
                           "detail": path or "not importable"})
    if pip_rc not in (0, None):
        headline = f"pip exited {pip_rc}: {_tail(log, 2)}; ddpbench from src/ instead"
    else:
        headline = ("installed" if pip_rc == 0 else "not installed (ddpbench from src/)") + \
            (f"; carried {len(to_carry)} wheel(s)" if to_carry else "; no wheel needed")
    _finish(part, {"rc": 0 if pip_rc in (0, None) else pip_rc, "timed_out": False}, headline,
            failed=bool(missing) or pip_rc not in (0, None))
    part["brief"] = headline[:120]
    _fail_on_checks(part)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _pytest_part(check: Check, part: dict, limit: float, command: list[str], folder: str) -> tuple[dict, dict]:
    log = check.out / folder / "log.txt"
    done = check.run(part, command, limit, log)
    parsed = outputs.pytest_counts(log.read_text(errors="replace") if log.is_file() else "")
    part["figures"]["pytest"] = parsed
    part["counts"] = outputs.add_counts(part.get("counts"), parsed)
    return done, parsed


def _pytest_outcome(part: dict, done: dict, parsed: dict) -> None:
    line = outputs.counts_line(parsed)
    if done["timed_out"]:
        _finish(part, done, f"stopped at its time limit: {line}")
    elif done["rc"] == NO_TESTS_EXIT:
        _finish(part, done, f"no case selected: {line}", failed=False)
    elif done["rc"] not in (0, 1):
        _finish(part, done, f"pytest exited {done['rc']} (usage or internal error, or interrupted): {line}")
    else:
        _finish(part, done, line, failed=done["rc"] == 1)
    if parsed["failed_cases"]:
        part["findings"].append("failed: " + ", ".join(parsed["failed_cases"][:20]))
    for count, reason in parsed["skip_reasons"][:5]:
        part["findings"].append(f"skipped {count}: {reason}")


def suite_json(check: Check) -> Path:
    return check.out / "suite" / "suite.json"


def part_suite(check: Check, part: dict, limit: float) -> None:
    command = check.pytest("-m", check.mode.markers, "benchmarks/", f"--dist-backend={check.mode.backend}",
                           f"--benchmark-json={suite_json(check)}", *check.keyword("suite", SUITE_DESELECT),
                           f"--dist-max-time={check.args.suite_min_time}", f"--dist-timeout={SUITE_CASE_TIMEOUT_S}",
                           *([f"--dist-sizes={check.args.dist_sizes}"] if check.args.dist_sizes else []), "-v", "-rfEs")
    done, parsed = _pytest_part(check, part, limit, command, "suite")
    _pytest_outcome(part, done, parsed)
    doc = _read_json(suite_json(check))
    part["figures"]["cases_in_json"] = len(doc.get("benchmarks", [])) if doc else 0
    part["brief"] = f"{part['figures']['cases_in_json']} cases in suite.json"
    part["where"] = "suite/"


def part_suite_gates(check: Check, part: dict, limit: float) -> None:
    """The short slice twice (each run its own JSON), ``ddpbench compare`` of the two, the report
    and charts of the suite (else of the second run), the history page of every run here."""
    folder = check.out / "suite_gates"
    log = folder / "log.txt"
    deadline = time.monotonic() + limit
    problems = []
    runs = []
    for index, share in ((1, 0.4), (2, 0.6)):  # the second run gets 0.6 of what is left then: both alike
        target = folder / f"run{index}.json"
        command = check.pytest("benchmarks/test_collectives.py", "-m", check.mode.markers,
                               f"--dist-backend={check.mode.backend}", f"--dist-sizes={TWICE_SIZES}",
                               *check.keyword("suite_gates", None), f"--dist-max-time={check.args.suite_min_time}",
                               f"--dist-timeout={SUITE_CASE_TIMEOUT_S}", f"--benchmark-json={target}", "-v", "-rfEs")
        done = check.run(part, command, (deadline - time.monotonic() - 15) * share, folder / f"run{index}.log")
        parsed = outputs.pytest_counts(_text(folder / f"run{index}.log"))
        part["counts"] = outputs.add_counts(part.get("counts"), parsed)
        part["findings"].append(f"run {index}: {outputs.counts_line(parsed)}"
                                + (", stopped at its time limit" if done["timed_out"] else ""))
        if target.is_file() or check.args.dry_run:
            runs.append(target)
    if len(runs) == 2:
        compare_json = folder / "compare.json"
        done = check.run(part, check.ddpbench("compare", str(runs[0]), str(runs[1]), "--json"),
                         max(1, deadline - time.monotonic()), log, stdout=compare_json)
        check.run(part, check.ddpbench("compare", str(runs[0]), str(runs[1]), "--markdown"),
                  max(1, deadline - time.monotonic()), log, stdout=folder / "compare.md")
        counts = (_read_json(compare_json) or {}).get("counts") if not check.args.dry_run else {}
        if isinstance(counts, dict):
            counts = {k: v for k, v in counts.items() if v}
            part["findings"].append(f"compare run1 run2 (exit {done['rc']}): {counts}")
            part["figures"]["compare_counts"] = counts
        else:
            problems.append(f"compare exited {done['rc']} without a verdict table: {_tail(log, 3)}")
    elif not check.args.dry_run:
        problems.append(f"compare: not run: {len(runs)} of the 2 runs wrote JSON")
    reported = suite_json(check) if suite_json(check).is_file() else (runs[-1] if runs else None)
    if check.args.dry_run:
        reported = suite_json(check)
    if reported is not None:
        done = check.run(part, check.ddpbench("report", str(reported), "--chart", str(folder / "charts"),
                                              "--output", str(folder / "report.md")),
                         max(1, deadline - time.monotonic()), log, stdout=folder / "report.stdout.md")
        if done["rc"]:
            problems.append(f"report exited {done['rc']}")
        else:
            part["findings"].append(f"report of {reported.name}: {len(list((folder / 'charts').glob('**/*.png')))} charts")
    storage = folder / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    history_json = folder / "history.json"
    done = check.run(part, check.ddpbench("history", *map(str, runs), "--storage", str(storage),
                                          "--output", str(folder / "history.html"), "--json"),
                     max(1, deadline - time.monotonic()), log, stdout=history_json)
    if done["rc"]:
        problems.append(f"history exited {done['rc']}")
    else:
        page = _read_json(history_json)
        if page is None and not check.args.dry_run:
            problems.append("history --json printed no JSON")
        elif page is not None:
            part["findings"].append(f"history: {page.get('runs')} runs, {page.get('series')} series, "
                                    f"{len(page.get('steps') or [])} steps")
    part["status"] = "failed" if problems else "passed"
    part["reason"] = "; ".join(problems) or None
    part["headline"] = "; ".join(part["findings"] + problems)
    verdicts = part["figures"].get("compare_counts")
    part["brief"] = f"compare: {verdicts}" if verdicts else (problems[0][:100] if problems else "")
    part["where"] = "suite_gates/"


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# The transformer and exposed-communication cases run in slices, each its own pytest run with its
# own JSON and share of the part's budget, so a slow slice (compiling) cannot starve the others; the
# partial_json plugin keeps a stopped slice's finished cases. (label, -k expression, share of what is
# left when the slice starts)
TRANSFORMER_SLICES = (("eager", "not compiled", 0.4), ("compiled", "compiled", 1.0))


def transformer_jsons(check: Check) -> list[Path]:
    return [p for label, _, _ in TRANSFORMER_SLICES
            if (p := check.out / "transformer" / f"transformer_{label}.json").is_file()]


def exposed_jsons(check: Check) -> list[Path]:
    return [p for label, _, _ in check.mode.exposed_slices
            if (p := check.out / "exposed_comm" / f"exposed_comm_{label}.json").is_file()]


def _sliced_pytest(check: Check, part: dict, limit: float, folder: str, base: list[str],
                   slices: tuple) -> list[dict]:
    """Each slice as its own pytest run (``-k``), sharing the part's budget; the part's outcome is
    the slices' together (failed if any failed, timed-out if any ran out of time; a slice that
    selects nothing, as the compiled one in the CPU rehearsal, is a finding). Returns the rows of
    every JSON written."""
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
        done = check.run(part, check.pytest(*base, *check.keyword(folder, keyword), f"--benchmark-json={target}",
                                            "-v", "-rfEs"), left * share, log)
        parsed = outputs.pytest_counts(_text(log))
        part["figures"][f"pytest_{label}"] = parsed
        part["counts"] = outputs.add_counts(part.get("counts"), parsed)
        line = f"{label}: {outputs.counts_line(parsed)}"
        if done["timed_out"]:
            outcomes.append(("timed-out", f"{line}, stopped at its time limit"))
        elif done["rc"] == NO_TESTS_EXIT:
            outcomes.append(("passed", f"{label}: no case selected"))
        elif done["rc"] not in (0, 1, None):
            outcomes.append(("failed", f"{line}, pytest exited {done['rc']}"))
        else:
            outcomes.append(("failed" if done["rc"] else "passed", line))
        part["findings"] += [f"{label} failed: " + ", ".join(parsed["failed_cases"][:20])] if parsed["failed_cases"] else []
        part["findings"] += [f"{label} skipped {n}: {reason}" for n, reason in parsed["skip_reasons"][:3]]
        doc = _read_json(target)
        if doc:
            rows += outputs.transformer_rows(doc)
    statuses = [status for status, _ in outcomes]
    part["status"] = ("timed-out" if "timed-out" in statuses else "failed" if "failed" in statuses else "passed")
    part["headline"] = "; ".join(line for _, line in outcomes)
    part["reason"] = None if part["status"] == "passed" else part["headline"]
    part["where"] = f"{folder}/"
    return rows


def add_check(check: Check, part: dict, name: str, ok: bool, detail: str | None) -> None:
    """A check of the part; one that only a GPU can pass is not applicable (ok None) in the rehearsal."""
    if check.mode is REHEARSAL_MODE and name in GPU_ONLY_CHECKS:
        ok, detail = None, f"not applicable on the CPU ({detail})" if detail else "not applicable on the CPU"
    part["checks"].append({"name": name, "ok": ok, "detail": detail})


def part_transformer(check: Check, part: dict, limit: float) -> None:
    rows = _sliced_pytest(check, part, limit, "transformer",
                          ["benchmarks/test_transformer.py", "-m", check.mode.markers,
                           f"--dist-backend={check.mode.backend}"], TRANSFORMER_SLICES)
    part["figures"]["cases"] = rows
    problems = outputs.mfu_problems(rows)
    add_check(check, part, GPU_ONLY_CHECKS[0], bool(rows) and not problems,
              "; ".join(problems) or (f"{len(rows)} cases" if rows else "no case ran"))
    problems = outputs.census_problems(rows)
    add_check(check, part, GPU_ONLY_CHECKS[1], bool(rows) and not problems,
              "; ".join(problems) or (None if rows else "no case ran"))
    part["table"] = outputs.markdown_table(rows, [
        ("case", "case"), ("median_s", "step s"), ("tokens_per_second", "tokens/s"), ("mfu", "MFU"),
        ("mfu_datasheet", "MFU datasheet"), ("peak_allocated_bytes", "peak alloc B"), ("kernel_launches", "launches"),
        ("ddp_buckets", "buckets"), ("graph_breaks", "graph breaks"), ("recompiles", "recompiles"),
        ("compute_s", "compute s"), ("exposed_comm_s", "exposed s"), ("exposed_comm_s_ci", "exposed CI"),
        ("comm_overlap_pct", "overlap %")]) if rows else None
    mfus = [r["mfu"] for r in rows if isinstance(r.get("mfu"), (int, float))]
    part["brief"] = f"{len(rows)} cases" + (f", MFU {min(mfus):.3g}-{max(mfus):.3g}" if mfus else "")
    _fail_on_checks(part)


def part_exposed_comm(check: Check, part: dict, limit: float) -> None:
    rows = _sliced_pytest(check, part, limit, "exposed_comm", ["lab/gpu/bench_exposed_comm.py"],
                          check.mode.exposed_slices)
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
    wanted = len(check.mode.exposed_slices)
    add_check(check, part, "default and one bucket paired on every pool spec", len(pairs) == wanted,
              f"{len(pairs)} of {wanted} pairs")
    part["brief"] = "; ".join(f"{p['default'].split('-gpt')[0].split('-cpu')[0]}: exposed "
                              f"{_ms(p['exposed_default_s'])} vs {_ms(p['exposed_one_bucket_s'])} ms" for p in pairs)
    _fail_on_checks(part)


def part_memory(check: Check, part: dict, limit: float) -> None:
    deadline = time.monotonic() + limit
    rows: list[dict] = []
    states = []
    for path in transformer_jsons(check) + exposed_jsons(check):
        state, found = outputs.memory_rows(json.loads(path.read_text()))
        states.append(state)
        rows += found
    if not states and not check.args.dry_run:
        _skip(part, "the transformer and exposed_comm parts wrote no results to read the census from")
        return
    if states and all(state == "not built" for state in states):
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
    add_check(check, part, GPU_ONLY_CHECKS[2], bool(compared) and all(r["within_10pct"] for r in compared),
              f"{sum(r['within_10pct'] for r in compared)} of {len(compared)}; within ±5%: "
              f"{sum(r['within_5pct'] for r in compared)}")
    measured = {r["case"]: r["measured_peak_bytes"] for r in rows}
    log = check.out / "memory" / "log.txt"
    for impl in ("ddp", "fsdp2"):
        left = deadline - time.monotonic()
        if left < 5:
            part["findings"].append(f"census simulation {impl}: no time left")
            continue
        target = check.out / "memory" / f"census_{impl}.json"
        done = check.run(part, check.ddpbench("census", "--size", "gpt2-124m", "--impl", impl, "--dtype", "bf16",
                                              "--world-sizes", "1", "--json", "--no-chart"), left, log, stdout=target)
        try:
            simulated = outputs.simulated_peak(json.loads(target.read_text()))
        except (OSError, ValueError):
            part["findings"].append(f"census simulation {impl}: exit {done['rc']}, no JSON: {_tail(log, 2)}")
            continue
        case = f"{check.mode.spec}-gpt2-124m-{impl}-bf16"
        if simulated is None:
            part["findings"].append(f"census simulation {impl}: reports no per-rank peak (issue 46 item 5 not built)")
        elif measured.get(case):
            part["findings"].append(f"census simulation {impl} at world size 1: {simulated} B against {case}'s measured "
                                    f"{measured[case]} B = {simulated / measured[case]:.3f}")
        else:
            part["findings"].append(f"census simulation {impl}: {simulated} B (no measured {case} to compare)")
    part["status"], part["reason"] = "passed", None
    part["headline"] = "; ".join(c["detail"] or "" for c in part["checks"][-1:])
    ratios = [r["ratio"] for r in compared]
    part["brief"] = (f"census/measured {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} cases" if ratios
                     else f"{len(rows)} census records, none measured")
    part["where"] = "memory/"
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


def side_by_side_command(check: Check, runners: Path = NCCL_TESTS_BUILD / "run") -> list[str]:
    return [check.python, "lab/reference/nccl_tests_side_by_side.py", "--nccl-tests", str(runners),
            "--repeats", str(check.args.nccl_repeats), "--graphs", "off,on", "--placements", check.args.nccl_placements,
            "--out", str(check.out / "nccl_tests" / "side_by_side")]


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
    done = check.run(part, side_by_side_command(check, runners), deadline - time.monotonic(), folder / "log.txt")
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
    part["brief"] = (f"{found['paired_rows']} rows, ddpbench/nccl-tests {found['ratio_range']}; outside 0.95-1.05 "
                     f"at >= 100 MB: {len(found['goal_outside'])} of {found['goal_rows']}")
    part["where"] = "nccl_tests/"
    _fail_on_checks(part)


def part_ab_gate(check: Check, part: dict, limit: float) -> None:
    deadline = time.monotonic() + limit
    folder = check.out / "ab_gate"
    results = {}
    cases = list(check.mode.ab_cases)
    for name, extra, injected in (("aa", [], False),
                                  ("injected", ["-p", "ddpbench.testing", f"--dist-candidate-env={AB_INJECTION}"], True)):
        share = (deadline - time.monotonic()) / (2 if name == "aa" else 1)
        if share < MIN_PART_S:
            part["findings"].append(f"{name}: no time left")
            continue
        run_json = folder / f"{name}.json"
        command = check.pytest(*cases, *check.keyword("ab_gate", None), f"--dist-backend={check.mode.backend}",
                               f"--dist-baseline-python={check.python}",
                               f"--dist-ab-run-budget={max(5, int(share - AB_SETUP_S))}", *extra,
                               f"--benchmark-json={run_json}", "-v", "-rfEs")
        done = check.run(part, command, share, folder / f"{name}.log")
        part["counts"] = outputs.add_counts(part.get("counts"), outputs.pytest_counts(_text(folder / f"{name}.log")))
        if not run_json.is_file() and not check.args.dry_run:
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
    part["brief"] = "; ".join(f"{name} {found['counts']}" for name, found in results.items())
    part["where"] = "ab_gate/"
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
    failed = [c["name"] for c in part["checks"] if c["ok"] is False]
    if failed and part["status"] == "passed":
        part["status"] = "failed"
        part["reason"] = "check failed: " + "; ".join(failed)


def _skip(part: dict, reason: str) -> None:
    part["status"], part["reason"] = "skipped", reason


RUNNERS = {"install": part_install, "suite": part_suite, "suite_gates": part_suite_gates,
           "transformer": part_transformer, "exposed_comm": part_exposed_comm, "memory": part_memory,
           "nccl_tests": part_nccl_tests, "ab_gate": part_ab_gate}


def _nccl_plan_finding(check: Check, part: dict) -> None:
    found = check.build_plan or {}
    part["figures"]["build"] = {k: found.get(k) for k in ("ok", "reason", "commit", "nccl", "nvcc", "make")}
    part["findings"].append(f"build: nvcc {found.get('nvcc') or 'not found'}; make {found.get('make') or 'not found'}; "
                            f"source {'commit ' + found['commit'] if found.get('commit') else 'missing'}; "
                            f"NCCL {(found.get('nccl') or {}).get('version') or 'not found'}")


def run_part(check: Check, name: str) -> dict:
    part = {"name": name, "status": "skipped", "reason": None, "headline": None, "wall_s": 0.0,
            "budget_s": float(check.budgets[name]), "commands": [], "logs": [], "checks": [], "findings": [],
            "figures": {}, "table": None, "counts": None, "brief": None, "where": None}
    check.parts.append(part)
    print(f"[{time.monotonic() - check.started:5.0f} s] {name} ...", flush=True)
    skip = None
    if check.no_cuda and not check.args.dry_run and check.mode is GPU_MODE:
        skip = check.no_cuda
    elif name == "nccl_tests" and (check.mode is REHEARSAL_MODE or not (check.build_plan or {}).get("ok")):
        skip = (check.build_plan or {}).get("reason") or "nccl-tests build not planned"
        if check.mode is REHEARSAL_MODE:
            skip = f"CPU rehearsal: nccl-tests needs a GPU ({skip})"
        if check.args.dry_run:  # the side-by-side script's flags are still checked
            check.dry_problems = []
            check.run(part, side_by_side_command(check), 1, check.out / "nccl_tests" / "log.txt")
            part["findings"] += [f"dry run: {p}" for p in check.dry_problems]
            check.dry_problems = None
    if skip:
        if name == "nccl_tests":
            _nccl_plan_finding(check, part)
        _skip(part, skip)
        part["brief"] = skip[:110]
        check.write_summary()
        return part
    configured = check.budgets[name]
    if name == check.args.parts[-1] and name not in check.args.budget:
        configured = max(configured, check.left() - RESERVE_S)  # the last part also gets what others left
    limit = part_budget(configured, check.left()) if not check.args.dry_run else configured
    part["budget_s"] = limit
    if not limit:
        _skip(part, f"no time left: {max(0.0, check.left()):.0f} s of the {check.args.total_budget:.0f} s total")
        check.write_summary()
        return part
    started = time.monotonic()
    if check.args.dry_run:
        check.dry_problems = []
    try:
        RUNNERS[name](check, part, limit)
    except Exception as exc:  # a bug in reading a part's output must not cost the other parts
        part["status"] = "failed"
        part["reason"] = f"gpu_check.py error: {type(exc).__name__}: {exc}"
    if check.dry_problems is not None:  # --dry-run: the part is its commands' check
        problems, check.dry_problems = check.dry_problems, None
        part.update(status="failed" if problems else "passed", findings=problems, checks=[], table=None, counts=None,
                    reason="; ".join(problems) or None, where=None,
                    headline=f"{len(part['commands'])} commands: " + (f"{len(problems)} problems" if problems else
                                                                       "every pytest run collects, every flag exists"))
        part["brief"] = part["headline"][:110]
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


def _select(text: str) -> tuple[str, str]:
    name, sep, expression = text.partition("=")
    if name not in PARTS or not sep or not expression.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: write PART=EXPRESSION (a pytest -k expression), "
                                         f"e.g. suite=all_reduce; parts: {', '.join(PARTS)}")
    return name, expression.strip()


def _parts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'nothing'}: parts are {', '.join(PARTS)}")
    return [n for n in PARTS if n in names]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="summary.md, summary.json and bundle.tar.gz (the device call's $OUT: at most 8 files)")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the parts' logs, JSON and charts, bundled into --out (default: a new "
                             "temporary folder)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="run nothing: check that every pytest command collects and every other flag exists")
    mode.add_argument("--cpu-rehearsal", action="store_true",
                      help="every part's real commands on a machine without a GPU: gloo in place of NCCL, the CPU "
                           "cases, nccl-tests skipped with its reason")
    parser.add_argument("--parts", type=_parts, default=list(PARTS), help=f"comma list (default all: {','.join(PARTS)})")
    parser.add_argument("--budget", type=_budget, action="append", default=[], metavar="PART=SECONDS",
                        help="repeatable: another budget for a part")
    parser.add_argument("--select", type=_select, action="append", default=[], metavar="PART=EXPRESSION",
                        help="repeatable: a pytest -k expression and-ed into the part's pytest runs (fewer cases)")
    parser.add_argument("--dist-sizes", default=None, help="the suite's --dist-sizes (default the plugin's)")
    parser.add_argument("--total-budget", type=float, default=TOTAL_BUDGET_S, metavar="SECONDS",
                        help=f"all parts together (default {TOTAL_BUDGET_S})")
    parser.add_argument("--no-pip-install", action="store_true",
                        help="install nothing with pip: run ddpbench from src/ (PYTHONPATH, -p ddpbench.plugin)")
    parser.add_argument("--python", default=os.environ.get("PYTHON", "python3"),
                        help="the interpreter with torch and ddpbench (default $PYTHON or python3)")
    parser.add_argument("--suite-min-time", default=SUITE_MIN_TIME, help=f"suite's --dist-max-time (default {SUITE_MIN_TIME})")
    parser.add_argument("--nccl-repeats", type=int, default=1, help="side-by-side repeats (default 1)")
    parser.add_argument("--nccl-placements", default="out-of-place",
                        help="ddpbench's placements in the side by side (default out-of-place: at one GPU an "
                             "in-place collective moves nothing, so its time is torch's per-call cost; "
                             "out-of-place,in-place adds those rows)")
    args = parser.parse_args(argv)
    args.budget = dict(args.budget)
    args.select = dict(args.select)
    if args.work is None:
        args.work = Path(tempfile.mkdtemp(prefix="ddpbench-gpu-work.")) / "work"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
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
    print(f"work folder: {args.work}; full summary: {args.out / 'summary.md'}")
    print(outputs.render_brief(check.summary()), end="")  # last: the device call returns the output's end
    return 0


if __name__ == "__main__":
    sys.exit(main())
