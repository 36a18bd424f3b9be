"""The pytest plugin end to end (pytester subprocess runs): JSON output, options, markers, Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

TINY_BENCHMARK = '''
from ddpbench.workloads.collectives import Collective

def test_all_reduce(dist_benchmark, dist_message_size):
    result = dist_benchmark(Collective("all_reduce", dist_message_size), rounds=7, warmup=1)
    with open("round_times.json", "w") as fh:
        import json
        json.dump(result.round_times, fh)
'''

CONTRACT_KEYS = {"backend", "world_size", "device", "op", "size_bytes", "algbw_GBps", "busbw_GBps"}


def _run(pytester, *args, timeout=240):
    return pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", timeout=timeout)


def test_a_distributed_case_reaches_pytest_benchmark_json_intact(pytester):
    pytester.makepyfile(test_bench=TINY_BENCHMARK)
    result = _run(pytester, "--dist-sizes=64KB", "-m", "not gpu", "--benchmark-json=out.json",
                  "--benchmark-save-data")
    result.assert_outcomes(passed=1)
    data = json.loads((pytester.path / "out.json").read_text())
    (case,) = data["benchmarks"]
    assert case["name"] == "test_all_reduce[gloo-2p-64KB]"
    assert CONTRACT_KEYS <= set(case["extra_info"])
    assert case["extra_info"]["backend"] == "gloo" and case["extra_info"]["world_size"] == 2
    assert case["extra_info"]["pinned_cores"] is False  # the OS places ranks, as a plain script
    assert case["extra_info"]["size_bytes"] == 65536
    # The per-round max over ranks is exactly what pytest-benchmark stored as the rounds: this is
    # the guard on the pytest-benchmark internals ddpbench relies on.
    round_times = json.loads((pytester.path / "round_times.json").read_text())
    assert case["stats"]["rounds"] == 7 == len(round_times)
    assert case["stats"]["data"] == round_times
    assert "rank_max_round_time" in case["options"]["timer"]
    median = case["stats"]["median"]
    assert case["extra_info"]["algbw_GBps"] == pytest.approx(65536 / median / 1e9, rel=1e-3)


def test_benchmark_disable_still_runs_and_checks_the_workload_once(pytester):
    pytester.makepyfile(test_bench=TINY_BENCHMARK)
    result = _run(pytester, "--dist-sizes=4KB", "-m", "not gpu", "--benchmark-disable")
    result.assert_outcomes(passed=1)
    assert len(json.loads((pytester.path / "round_times.json").read_text())) == 1


@pytest.mark.parametrize("option,message", [
    ("--dist-sizes=abc", "'abc' is not a message size"),
    ("--dist-world-sizes=0", "'0' is not a world size"),
    ("--dist-timeout=-5", "must be larger than 0"),
    ("--dist-backend=mpi", "'mpi' is not a backend"),
    ("--dist-precision=abc", "'abc' is not a precision"),
    ("--dist-ab-threshold=x", "'x' is not a percentage"),
])
def test_bad_options_are_usage_errors_without_a_traceback(pytester, option, message):
    pytester.makepyfile(test_bench=TINY_BENCHMARK)
    result = _run(pytester, option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_gpu_cases_skip_with_a_reason_without_cuda(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no CUDA device, also on a GPU machine
    pytester.makepyfile(test_bench=TINY_BENCHMARK)
    result = _run(pytester, "--dist-sizes=4KB", "--dist-world-sizes=2", "-m", "gpu", "-rs")
    result.assert_outcomes(skipped=2)  # nccl-1p (gpu) and nccl-2p (gpu + multi_gpu)
    result.stdout.fnmatch_lines(["*needs 1 CUDA device(s)*no CUDA device here*",
                                 "*needs 2 CUDA device(s)*no CUDA device here*"])
    nccl = _run(pytester, "--dist-sizes=4KB", "--dist-backend=nccl", "-rs")
    nccl.assert_outcomes(skipped=2)
    assert nccl.ret == pytest.ExitCode.OK


BROKEN_CUDA_CONFTEST = """
import ddpbench.devices

# This machine "has" an NVIDIA GPU, but the installed torch cannot use it (a CPU build, or a CUDA
# build with no driver): broken, not GPU-less.
ddpbench.devices._nvidia_gpus_present = lambda: ["/dev/nvidia0"]
"""


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA works here: nothing to find broken")
def test_a_broken_cuda_install_is_an_error_when_gpu_cases_are_asked_for(pytester, monkeypatch):
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makeconftest(BROKEN_CUDA_CONFTEST)
    pytester.makepyfile(test_bench=TINY_BENCHMARK)
    # A CPU-only build cannot use the GPUs; a CUDA build (PyPI's Linux wheel) finds no driver here.
    broken = ("is a CPU-only build" if torch.version.cuda is None else
              f"(CUDA {torch.version.cuda}) cannot use them: *")
    for args in (["-m", "gpu"], ["-m", "gpu and not slow"], ["--dist-backend=nccl"]):
        result = _run(pytester, "--dist-sizes=4KB", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
        result.stderr.fnmatch_lines(["*GPU cases were asked for*but CUDA is broken here: this machine has "
                                     f"NVIDIA GPUs (/dev/nvidia0) but torch * {broken}*"])
    # Not asked for: the GPU cases skip, and the reason says why.
    result = _run(pytester, "--dist-sizes=4KB", "-m", "not slow", "-rs", "-k", "nccl")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*needs 1 CUDA device(s)*CUDA is broken here: this machine has NVIDIA GPUs*"])
    # GPUs hidden on purpose are no GPU, not a broken install.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = _run(pytester, "--dist-sizes=4KB", "-m", "gpu", "-rs")
    result.assert_outcomes(skipped=2)


SHARED_GPU_BENCHMARK = '''
import pytest
from ddpbench.pool import PoolSpec
from ddpbench.workloads.collectives import Collective

@pytest.mark.gpu
@pytest.mark.parametrize("dist_spec", [PoolSpec("gloo", 2, "cuda")], ids=["gloo-cuda-2p"])
def test_shared(dist_benchmark, dist_spec):
    dist_benchmark(Collective("all_reduce", 4096), rounds=3, warmup=1)
'''


def test_a_test_may_pin_its_own_dist_spec_and_gloo_ranks_on_cuda_need_one_gpu(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(test_bench=SHARED_GPU_BENCHMARK)
    result = _run(pytester, "--dist-world-sizes=2,3", "-rs", "-v")
    # Only the test's own spec: the plugin adds none of --dist-world-sizes' specs to it.
    result.stdout.fnmatch_lines(["*test_shared?gloo-cuda-2p? SKIPPED*",
                                 "*needs 1 CUDA device(s); no CUDA device here*"])
    result.assert_outcomes(skipped=1)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_on_one_gpu_nccl_1p_and_two_gloo_ranks_sharing_it_run_and_nccl_2p_skips(pytester):
    import torch

    pytester.makepyfile(test_bench=TINY_BENCHMARK, test_shared=SHARED_GPU_BENCHMARK)
    result = _run(pytester, "--dist-sizes=4KB", "--dist-world-sizes=2", "--dist-backend=nccl", "-rs", "-v")
    outcomes = result.parseoutcomes()
    if torch.cuda.device_count() == 1:
        result.stdout.fnmatch_lines(["*test_all_reduce?nccl-1p-4KB? PASSED*",
                                     "*needs 2 CUDA device(s) (NCCL runs one rank per GPU); only 1 CUDA device(s) here*"])
        assert outcomes.get("skipped") == 1
    assert outcomes.get("passed") == (2 if torch.cuda.device_count() == 1 else 3)
    assert "failed" not in outcomes and "errors" not in outcomes


def test_oversubscription_is_announced(pytester):
    pytester.makepyfile(test_bench=TINY_BENCHMARK)
    cores = len(os.sched_getaffinity(0))
    result = _run(pytester, f"--dist-world-sizes={cores + 1}", "--co")
    result.stdout.fnmatch_lines([f"*WARNING: {cores + 1} ranks outnumber the {cores} CPU cores*"])


HANGING_SECOND_CASE = '''
import os, time
from ddpbench.workloads import Workload
from ddpbench.workloads.collectives import Collective

class Hang(Workload):
    def setup(self, ctx):
        with open(os.path.join({where!r}, f"rank{{ctx.rank}}.pid"), "w") as fh:
            fh.write(str(os.getpid()))
        return None
    def run_round(self, state):
        time.sleep(600)

def test_1_quick(dist_benchmark):
    dist_benchmark(Collective("all_reduce", 4096), rounds=3, warmup=0)

def test_2_hangs(dist_benchmark):
    dist_benchmark(Hang(), rounds=1, warmup=0)
'''


def _as_started_from_a_terminal():
    """A shell starts pytest with SIGINT handled and unblocked; a process started from inside a
    pytest-xdist worker may inherit an ignored or blocked SIGINT, which would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_state(pid):
    try:
        with open(f"/proc/{pid}/status") as fh:
            return {k: v.strip() for k, v in (line.split(":", 1) for line in fh) if k in ("SigBlk", "SigIgn", "SigCgt")}
    except OSError:
        return {}


def test_ctrl_c_stops_the_ranks_and_saves_nothing_over_the_baselines(pytester, tmp_path):
    pytester.makepyfile(test_bench=HANGING_SECOND_CASE.format(where=str(tmp_path)))
    storage = pytester.path / "store"
    baseline = storage / "Linux-CPython-3-64bit" / "0001_baseline.json"
    baseline.parent.mkdir(parents=True)
    baseline.write_text('{"benchmarks": []}')
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_bench.py", "-m", "not gpu", "-p", "no:cacheprovider",
         "--benchmark-autosave", f"--benchmark-storage=file://{storage}"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_as_started_from_a_terminal)
    pid_files = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    deadline = time.monotonic() + 180
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert proc.poll() is None and time.monotonic() < deadline, "the hanging case never started"
        time.sleep(0.2)
    rank_pids = [int(f.read_text()) for f in pid_files]
    signal_state = _signal_state(proc.pid)
    proc.send_signal(signal.SIGINT)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        alive = [p for p in rank_pids if psutil.pid_exists(p)]
        raise AssertionError(f"pytest did not stop within 120 s of Ctrl-C; ranks alive: {alive}; "
                             f"its signal state: {signal_state}; output so far:\n{exc.output}") from None
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "no benchmark results were saved" in output
    assert sorted(p.name for p in storage.rglob("*.json")) == ["0001_baseline.json"]
    assert baseline.read_text() == '{"benchmarks": []}'
    deadline = time.monotonic() + 15
    while any(psutil.pid_exists(p) for p in rank_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(psutil.pid_exists(p) for p in rank_pids), "rank processes outlived Ctrl-C"


def test_case_ids_name_a_backend_off_its_usual_device():
    from ddpbench.plugin import spec_id
    from ddpbench.pool import PoolSpec

    assert [spec_id(PoolSpec(*args)) for args in (("gloo", 2, "cpu"), ("nccl", 1, "cuda"), ("gloo", 2, "cuda"))] \
        == ["gloo-2p", "nccl-1p", "gloo-cuda-2p"]


VARIANT_BENCHMARK = '''
from ddpbench.workloads.collectives import Collective

def test_all_reduce(dist_benchmark, dist_message_size, dist_dtype, dist_reduce_op, dist_placement):
    dist_benchmark(Collective("all_reduce", dist_message_size, dist_dtype, dist_reduce_op, dist_placement))
'''


def test_collective_variants_and_ops_per_round_reach_the_case_ids_and_extra_info(pytester):
    pytester.makepyfile(test_bench=VARIANT_BENCHMARK)
    result = _run(pytester, "--dist-sizes=64KB", "-m", "not gpu", "--dist-rounds=4", "--dist-warmup=1",
                  "--dist-dtypes=bfloat16,int32", "--dist-reduce-ops=max,avg", "--dist-placements=in-place,out-of-place",
                  "--dist-ops-per-round=3", "-rs", "--benchmark-json=out.json")
    result.assert_outcomes(passed=3, skipped=5)
    result.stdout.fnmatch_lines(["*gloo averages floating types only (ReduceOp.AVG on int32 is refused)*"])
    result.stdout.fnmatch_lines(["*torch.distributed's all_reduce exists only in-place*"])
    cases = {c["name"]: c for c in json.loads((pytester.path / "out.json").read_text())["benchmarks"]}
    assert sorted(cases) == ["test_all_reduce[gloo-2p-64KB-bfloat16-avg-in-place]",
                             "test_all_reduce[gloo-2p-64KB-bfloat16-max-in-place]",
                             "test_all_reduce[gloo-2p-64KB-int32-max-in-place]"]
    info = cases["test_all_reduce[gloo-2p-64KB-bfloat16-max-in-place]"]["extra_info"]
    assert (info["dtype"], info["reduce_op"], info["placement"], info["ops_per_round"]) == \
        ("bfloat16", "max", "in-place", 3)
    assert info["size_bytes"] == 64 * 1024 and len(info["rank_median_s"]) == 2
    assert info["rank_median_min_s"] <= info["rank_median_avg_s"] <= info["rank_median_max_s"]
    assert info["straggler_rank"] in (0, 1) and 0.5 <= info["straggler_share"] <= 1


def test_default_collective_ids_and_ops_per_round_are_unchanged(pytester):
    pytester.makepyfile(test_bench=VARIANT_BENCHMARK)
    result = _run(pytester, "--dist-sizes=64KB", "-m", "not gpu", "--dist-rounds=3", "--dist-warmup=1",
                  "--benchmark-json=out.json", "-v")
    result.stdout.fnmatch_lines(["*test_all_reduce[[]gloo-2p-64KB[]] PASSED*"])
    (case,) = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    info = case["extra_info"]
    assert info["ops_per_round"] == 1 and "round_fixed_cost_s" not in info  # one op a round on the CPU
    assert (info["dtype"], info["reduce_op"], info["placement"]) == ("float32", "sum", "in-place")


@pytest.mark.parametrize("args,message", [
    (["--dist-cuda-graphs"], "--dist-cuda-graphs: CUDA graphs capture and replay GPU work, and this machine has "
                             "no CUDA device"),
    (["--dist-dtypes=float8"], "'float8': not a data type; choose from float32"),
    (["--dist-reduce-ops=product"], "'product': not a reduction; choose from sum, max, min, avg"),
    (["--dist-placements=sideways"], "'sideways': not a placement"),
    (["--dist-ops-per-round=0"], "'0' is not a number of ops per round; give auto or a whole number"),
])
def test_collective_options_refuse_what_cannot_run_here(pytester, monkeypatch, args, message):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(test_bench=VARIANT_BENCHMARK)
    result = _run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str() and "Traceback" not in result.stderr.str()


# ---------------------------------------------------------------------------------------------
# A session without a ddpbench case pays nothing for the installed plugin
# ---------------------------------------------------------------------------------------------

MODULES_AT_END = '''
import sys

def pytest_sessionfinish(session):
    with open("modules_at_end.txt", "w") as fh:
        fh.write("\\n".join(sorted(sys.modules)))
'''


def _modules_at_end(pytester) -> set[str]:
    return set((pytester.path / "modules_at_end.txt").read_text().split())


def test_a_session_without_a_ddpbench_case_imports_no_torch_and_starts_nothing(pytester):
    pytester.makeconftest(MODULES_AT_END)
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    modules = _modules_at_end(pytester)
    assert "ddpbench.plugin" in modules  # loaded, through the pytest11 entry point
    assert not {"torch", "ddpbench.pool", "ddpbench.engine", "ddpbench.fixture"} & modules
    assert "ddpbench:" not in result.stdout.str()  # no header line either


def test_a_ddpbench_case_brings_the_header_after_collection(pytester):
    pytester.makeconftest(MODULES_AT_END)
    pytester.makepyfile(test_plan="def test_plan(dist_round_plan):\n    assert dist_round_plan.warmup == 2\n")
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["collected 1 item", "ddpbench: backend gloo, world sizes 2, * CPU cores, * CUDA devices*"])
    assert "torch" in _modules_at_end(pytester)  # the header's CUDA count
