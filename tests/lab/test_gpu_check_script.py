"""lab/gpu/check.sh, the one-call GPU check of issue 48, without a GPU: its dry run end to end, the
per-part time limits and budgets, and its readers of recorded outputs (pytest's, nccl-tests', the
benchmark JSON of the transformer and exposed-communication cases, A/B verdicts)."""

import json
import os
import pathlib
import shlex
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

from helpers.benchjson import bench
from helpers.lab_scripts import lab_script_path, load_lab_script
from helpers.paths import REPO_ROOT as ROOT

DATA = pathlib.Path(__file__).parent / "data"
gpu_check = load_lab_script("gpu_check")
outputs = load_lab_script("gpu_outputs")
nccl_build = load_lab_script("nccl_tests_build")
side_by_side = load_lab_script("nccl_tests_side_by_side")


@pytest.mark.pool  # each pytest command is collected in its own pytest run
def test_dry_run_collects_every_pytest_command_and_finds_every_flag(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    done = subprocess.run(["bash", str(lab_script_path("gpu_check").parent / "check.sh"), "--dry-run",
                           "--work", str(tmp_path / "work"), "--parts", "suite,suite_gates,nccl_tests,ab_gate"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    doc = outputs.load_summary(tmp_path / "out" / "summary.json")
    assert doc["dry_run"] and [p["name"] for p in doc["parts"]] == ["suite", "suite_gates", "nccl_tests", "ab_gate"]
    suite, gates, nccl, ab = doc["parts"]
    for part in (suite, gates, ab):
        assert part["status"] == "passed", part
        assert not part["logs"] and part["headline"].endswith("every pytest run collects, every flag exists")
    assert "-m 'gpu and not slow' benchmarks/ --dist-backend=nccl" in suite["commands"][0]
    assert [shlex.split(c)[3] for c in gates["commands"][2:]] == ["compare", "compare", "report", "history"]
    assert nccl["status"] == "skipped" and not nccl["findings"][-1].startswith("dry run")  # its script's flags exist
    assert len(ab["commands"]) == 4 and "test_all_gather[nccl-1p-100MB]" in ab["commands"][0]
    assert not (tmp_path / "out" / outputs.BUNDLE_NAME).exists()  # nothing ran: nothing to bundle
    assert done.stdout.rstrip().splitlines()[-5].startswith("part | status")  # the brief table ends the output


def test_the_dry_run_names_a_flag_a_command_lacks(tmp_path):
    check = _check(tmp_path, "--dry-run")
    check.dry_problems = []
    check.dry_check(check.ddpbench("compare", "a.json", "b.json", "--json", "--no-such-flag"))
    check.dry_check([sys.executable, "lab/reference/nccl_tests_side_by_side.py", "--nccl-tests", "x", "--repeat", "1"])
    first, second = check.dry_problems
    assert first == "`ddpbench compare` has no option --no-such-flag"  # --json exists
    assert second == "`lab/reference/nccl_tests_side_by_side.py` has no option --repeat"  # it is --repeats


def test_a_part_past_its_time_limit_is_stopped_with_its_process_group_and_recorded(tmp_path):
    log, pid_file = tmp_path / "log.txt", tmp_path / "sleep.pid"
    started = time.monotonic()
    result = gpu_check.run_limited(["bash", "-c", f"sleep 30 & echo $! > {pid_file}; wait; echo END$((6*7))"], 1, log)
    assert result["timed_out"] and result["rc"] == 124 and time.monotonic() - started < 10
    text = log.read_text()
    assert "END42" not in text and "# exit 124" in text and "(time limit)" in text
    assert not _running(int(pid_file.read_text()))  # the part's child of a child went with it


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a killed child whose parent died may stay a zombie a moment)."""
    for _ in range(20):
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.05)
    return True


def _check(tmp_path, *argv):
    check = gpu_check.Check(gpu_check.parse_args(["--out", str(tmp_path), "--work", str(tmp_path / "work"),
                                                  "--python", sys.executable, *argv]))
    check.no_cuda = None  # as on a GPU machine
    return check


def test_a_failing_part_costs_only_itself_and_budgets_are_cut_to_what_is_left(tmp_path, monkeypatch):
    limits = {}

    def broken(check, part, limit):
        raise KeyError("no such figure")

    def records(check, part, limit):
        limits[part["name"]] = limit
        part["status"] = "passed"

    monkeypatch.setattr(gpu_check, "RUNNERS", {"suite": broken, "transformer": records, "ab_gate": records})
    check = _check(tmp_path, "--total-budget", "100")
    assert gpu_check.run_part(check, "suite")["reason"] == "gpu_check.py error: KeyError: 'no such figure'"
    assert gpu_check.run_part(check, "transformer")["status"] == "passed"
    assert 90 <= limits["transformer"] <= 100 - gpu_check.RESERVE_S  # 100 s configured, cut to the total's rest
    check.started -= 95  # 5 s left: under MIN_PART_S
    part = gpu_check.run_part(check, "ab_gate")
    assert part["status"] == "skipped" and part["reason"].startswith("no time left") and "ab_gate" not in limits
    doc = outputs.load_summary(tmp_path / "summary.json")
    assert [p["status"] for p in doc["parts"]] == ["failed", "passed", "skipped"]
    assert gpu_check.part_budget(145, 600) == 145 and gpu_check.part_budget(145, 14) == 0
    last = _check(tmp_path / "last", "--parts", "suite,transformer", "--total-budget", "1000")
    gpu_check.run_part(last, "transformer")  # the last part: what the others left, not its 100 s
    assert limits["transformer"] > 900


def test_options_name_a_wrong_part_or_budget(capsys):
    for argv in (["--parts", "suite,gpu"], ["--budget", "suite:20"], ["--budget", "suite=0"]):
        with pytest.raises(SystemExit) as stopped:
            gpu_check.parse_args(["--out", "x", *argv])
        assert stopped.value.code == 2
    assert "parts are install, suite" in capsys.readouterr().err
    args = gpu_check.parse_args(["--out", "x", "--parts", "ab_gate,suite", "--budget", "suite=300"])
    assert args.parts == ["suite", "ab_gate"] and args.budget == {"suite": 300.0}


def test_pytest_counts_of_a_finished_run_and_of_one_stopped_before_its_closing_line():
    text = (DATA / "pytest_verbose_mixed.txt").read_text()
    parsed = outputs.pytest_counts(text)
    assert parsed["complete"] and parsed["counts"] == {"failed": 1, "passed": 2, "skipped": 3, "errors": 1}
    assert parsed["failed_cases"] == ["test_rec.py::test_fails", "test_rec.py::test_errors"]
    assert parsed["skip_reasons"] == [[3, "needs 2 CUDA device(s) (NCCL runs one rank per GPU); only 1 CUDA "
                                          "device(s) here"]]
    assert outputs.counts_line(parsed) == "2 passed, 1 failed, 3 skipped, 1 errors"
    cut = outputs.pytest_counts(text[:text.index("==== ERRORS")])  # the part's limit stopped pytest here
    assert not cut["complete"] and cut["counts"] == {"passed": 2, "failed": 1, "skipped": 3, "errors": 1}
    assert outputs.counts_line(cut).endswith("(so far: pytest did not finish)")
    assert outputs.pytest_counts("4 skipped in 4.17s\n")["counts"] == {"skipped": 4}  # -q
    assert outputs.pytest_counts("==== no tests ran in 0.01s ====\n") == {
        "counts": {}, "complete": True, "failed_cases": [], "skip_reasons": []}


def _transformer(case, median, **info):
    return bench(f"test_transformer_gpu[{case}]", [median] * 5, info)


def test_transformer_rows_and_the_mfu_and_census_checks():
    census = {"cuda_kernel_launches": 812, "ddp_buckets": [26214400] * 19, "collectives": [{"kind": "all_reduce"}],
              "graph_breaks": None, "recompiles": None}
    doc = {"benchmarks": [
        _transformer("nccl-1p-gpt2-124m-ddp-bf16", 0.1, mfu=0.42, mfu_datasheet=0.31, tokens_per_second=81920.0,
                     census=census, rank_peak_memory=[{"peak_memory_allocated_bytes": 9 << 30}]),
        _transformer("nccl-1p-gpt2-124m-fsdp2-bf16", 0.1, mfu=1.7, census=dict(census, cuda_kernel_launches=None)),
        _transformer("nccl-1p-gpt2-124m-ddp-bf16-compiled", 0.1, census=census)]}
    rows = outputs.transformer_rows(doc)
    assert rows[0]["case"] == "nccl-1p-gpt2-124m-ddp-bf16" and rows[0]["ddp_buckets"] == 19
    assert rows[0]["peak_allocated_bytes"] == 9 << 30 and rows[0]["kernel_launches"] == 812
    assert outputs.mfu_problems(rows) == ["nccl-1p-gpt2-124m-fsdp2-bf16: mfu 1.7 is outside (0, 1)",
                                          "nccl-1p-gpt2-124m-ddp-bf16-compiled: no mfu in extra_info"]
    assert outputs.census_problems(rows) == ["nccl-1p-gpt2-124m-fsdp2-bf16: census has no cuda_kernel_launches (None)"]
    table = outputs.markdown_table(rows, [("case", "case"), ("mfu", "MFU"), ("graph_breaks", "breaks")])
    assert "| nccl-1p-gpt2-124m-ddp-bf16 | 0.42 | — |" in table


def _exposed(case, compute, compute_ci, exposed, exposed_ci, buckets):
    return _transformer(case, 0.2, compute_s=compute, compute_s_ci=compute_ci, exposed_comm_s=exposed,
                        exposed_comm_s_ci=exposed_ci, census={"ddp_buckets": [1] * buckets})


def test_default_buckets_pair_with_one_bucket_per_pool_spec():
    rows = outputs.transformer_rows({"benchmarks": [
        _exposed("gloo-cuda-2p-gpt2-124m-ddp-bf16", 0.080, [0.078, 0.083], 0.120, [0.110, 0.130], 21),
        _exposed("gloo-cuda-2p-gpt2-124m-ddp-bf16-cap1000", 0.081, [0.079, 0.084], 0.190, [0.170, 0.200], 1),
        _exposed("nccl-1p-gpt2-124m-ddp-bf16", 0.030, [0.029, 0.031], 0.0001, [-0.0004, 0.0006], 21),
        _exposed("nccl-1p-gpt2-124m-ddp-bf16-cap1000", 0.040, [0.039, 0.041], 0.0002, [-0.0003, 0.0008], 1)]})
    pairs = {p["default"]: p for p in outputs.bucket_pairs(rows)}
    gloo, nccl = pairs["gloo-cuda-2p-gpt2-124m-ddp-bf16"], pairs["nccl-1p-gpt2-124m-ddp-bf16"]
    assert gloo["one_bucket"].endswith("-cap1000") and gloo["buckets"] == [21, 1]
    assert gloo["one_bucket_exposes_more"] and gloo["compute_within_spread"] and not gloo["default_holds_zero"]
    assert not nccl["one_bucket_exposes_more"] and not nccl["compute_within_spread"] and nccl["default_holds_zero"]


def test_memory_census_against_the_allocator_when_built_and_not_built():
    measured = [{"peak_memory_allocated_bytes": 1000}, {"peak_memory_allocated_bytes": 990}]
    assert outputs.memory_rows({"benchmarks": [_transformer("a", 1.0, rank_peak_memory=measured)]}) == ("not built", [])
    state, rows = outputs.memory_rows({"benchmarks": [
        _transformer("a", 1.0, rank_peak_memory=measured, memory={"ranks": [{"peak_bytes": 960}, {"peak_bytes": 940}]}),
        _transformer("b", 1.0, memory={"ranks": [{"peak_bytes": 800, "max_memory_allocated_bytes": 1000}]}),
        _transformer("c", 1.0)]})
    assert state == "ok" and [r["case"] for r in rows] == ["a", "b"]
    assert rows[0] == {"case": "a", "census_peak_bytes": 960, "measured_peak_bytes": 1000, "ratio": 0.96,
                       "within_5pct": True, "within_10pct": True}
    assert rows[1]["ratio"] == 0.8 and not rows[1]["within_10pct"]
    state, rows = outputs.memory_rows({"benchmarks": [_transformer("d", 1.0, memory={"top": 5, "by_phase": {}})]})
    assert state == "unreadable" and rows[0]["keys"] == ["by_phase", "top"]
    assert outputs.simulated_peak({"world_sizes": [{"world_size": 1, "memory": {"peak_bytes": 7}}]}) == 7
    assert outputs.simulated_peak({"world_sizes": [{"world_size": 1, "param_bytes_per_rank": 7}]}) is None


def test_side_by_side_findings_from_recorded_nccl_tests_output():
    reference = side_by_side.parse_nccl_tests((DATA / "nccl_tests_all_gather_h100.txt").read_text())["rows"]
    ours = {1 << 20: 34.6, 10 << 20: 36.1, 100 << 20: 73.0, 1000 << 20: 780.0}  # ddpbench, out of place, us
    records = [{"repeat": 0, "graphs": "off", "op": "all_gather", "placement": placement, "size_bytes": size,
                "nccl_tests_us": placed[placement], "ddpbench_us": ours[size] if placement == "out-of-place" else None}
               for size, placed in reference.items() for placement in side_by_side.PLACEMENTS]
    found = outputs.side_by_side_findings(side_by_side.summarize(records))
    assert found["paired_rows"] == 4 and found["goal_rows"] == 2
    assert found["goal_outside"] == ["all_gather out-of-place 1000 MB graphs off: 1.125"]  # 780 / 693.33
    # even one repeat runs each tool first once: eager starts with nccl-tests, graphs with ddpbench
    assert [side_by_side.first_side_swapped(r, m) for r in (0, 1) for m in (0, 1)] == [False, True, True, False]


def test_ab_findings_count_false_regressions_and_what_the_injection_caught():
    doc = {"counts": {"regression": 2, "same": 1, "inconclusive": 0},
           "cases": [{"name": "test_all_reduce[nccl-1p-1MB]", "verdict": "regression", "ratio": 1.11, "ci_low": 1.06,
                      "ci_high": 1.15, "details": {"wall_s": 13.4, "pairs": 6}},
                     {"name": "test_all_gather[nccl-1p-100MB]", "verdict": "regression", "ratio": 1.1,
                      "ci_low": 1.08, "ci_high": 1.12, "details": {"wall_s": 9.0}},
                     {"name": "test_reduce_scatter[nccl-1p-10MB]", "verdict": "same", "ratio": 1.0, "ci_low": 0.98,
                      "ci_high": 1.02, "details": {}}]}
    injected = outputs.ab_findings(doc, injected=True)
    assert injected["caught"] == "2 of 3" and injected["counts"] == {"regression": 2, "same": 1}
    assert injected["cases"][0] == {"case": "test_all_reduce[nccl-1p-1MB]", "verdict": "regression", "ratio": 1.11,
                                    "ci": [1.06, 1.15], "wall_s": 13.4, "pairs": 6}
    assert outputs.ab_findings(doc, injected=False)["false_regressions"] == 2


def test_nccl_is_found_in_the_wheel_layout_torch_ships_and_linked_for_the_build(tmp_path):
    wheel = tmp_path / "site" / "nvidia" / "nccl"
    (wheel / "include").mkdir(parents=True)
    (wheel / "lib").mkdir()
    (wheel / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n")
    (wheel / "lib" / "libnccl.so.2").write_bytes(b"\x7fELF")
    (wheel / "lib" / "libnccl_device.bc").write_bytes(b"")
    torch_lib = tmp_path / "site" / "torch" / "lib"
    torch_lib.mkdir(parents=True)
    found = nccl_build.find_nccl([torch_lib, wheel])
    assert found == {"include": wheel / "include", "library": wheel / "lib" / "libnccl.so.2", "version": "2.28.9"}
    home = nccl_build.make_nccl_home(found, tmp_path / "build")
    assert (home / "lib" / "libnccl.so").resolve() == (wheel / "lib" / "libnccl.so.2").resolve()
    assert (home / "include" / "nccl.h").is_file()
    assert nccl_build.make_nccl_home(found, tmp_path / "build") == home  # again: links kept
    with pytest.raises(ValueError, match="no NCCL headers and library found in .*torch/lib"):
        nccl_build.find_nccl([torch_lib])
    assert nccl_build.gencode("9.0") == "-gencode=arch=compute_90,code=sm_90"
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    assert nccl_build.cuda_home_of(wrapper) == toolkit
    build = tmp_path / "build"
    (build / "all_reduce_perf").write_text('#!/bin/sh\necho "$LD_LIBRARY_PATH $*"\n')
    (build / "all_reduce_perf").chmod(0o755)
    runners = nccl_build.write_runners(build, [str(wheel / "lib")])
    ran = subprocess.run([str(runners / "all_reduce_perf"), "-g", "1"], capture_output=True, text=True,
                         env=dict(os.environ, LD_LIBRARY_PATH="/c"))
    assert ran.stdout.strip() == f"{wheel / 'lib'}:/c -g 1"  # only the binary gets the wheel's folder


def test_the_build_plan_asks_for_nvcc_and_make_before_the_source(tmp_path, monkeypatch):
    source = tmp_path / "nccl-tests"
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "make").write_text("#!/bin/sh\n")
    (tools / "make").chmod(0o755)
    monkeypatch.setattr(nccl_build, "find_nvcc", lambda environ=None: None)
    found = nccl_build.plan(source, tmp_path / "b", "9.0", 8, [], environ={"PATH": str(tools)})
    assert found["reason"].startswith("no nvcc") and not found["ok"]  # not "no source": no machine to build on
    monkeypatch.setattr(nccl_build, "find_nvcc", lambda environ=None: tools / "nvcc")
    assert nccl_build.plan(source, tmp_path / "b", "9.0", 8, [], environ={"PATH": ""})["reason"].startswith("no make")
    found = nccl_build.plan(source, tmp_path / "b", "9.0", 8, [], environ={"PATH": str(tools)})
    assert "run lab/gpu/fetch_nccl_tests.sh" in found["reason"] and found["make"] == str(tools / "make")
    (source / "src").mkdir(parents=True)
    (source / "src" / "Makefile").write_text("")
    (source / "COMMIT").write_text("a0b82b2\n")
    found = nccl_build.plan(source, tmp_path / "b", "9.0", 8, [], environ={"PATH": str(tools)})
    assert found["commit"] == "a0b82b2" and "no NCCL headers" in found["reason"] and not found["ok"]


# ----------------------------------------------------------------------------------------------
# Each part's glue on recorded outputs: its commands are answered by a stand-in for Check.run that
# writes what pytest, ddpbench or the side-by-side script would (nothing runs).
# ----------------------------------------------------------------------------------------------


def _fake_runs(check, monkeypatch, answer):
    """Check.run answered by ``answer(command) -> (rc, log text, stdout text, {path: document})``."""
    seen = []

    def run(part, command, limit_s, log, stdout=None, env=None):
        seen.append(command)
        part["commands"].append(" ".join(command))
        rc, text, out, files = answer(command)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(text)
        if stdout is not None:
            stdout.write_text(out)
        for path, doc in files.items():
            pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(path).write_text(doc if isinstance(doc, str) else json.dumps(doc))
        return {"rc": rc, "wall_s": 0.1, "timed_out": False}

    monkeypatch.setattr(check, "run", run)
    return seen


def _json_target(command):
    return next((w.split("=", 1)[1] for w in command if w.startswith("--benchmark-json=")), None)


def test_transformer_memory_and_exposed_parts_read_what_their_runs_wrote(tmp_path, monkeypatch):
    census = {"cuda_kernel_launches": 900, "ddp_buckets": [1] * 19}
    slices = {
        "eager": [_transformer("nccl-1p-gpt2-124m-ddp-bf16", 0.1, mfu=0.4, census=census,
                               rank_peak_memory=[{"peak_memory_allocated_bytes": 1000}], memory={"peak_bytes": 970}),
                  _transformer("nccl-1p-gpt2-124m-fsdp2-bf16", 0.1, mfu=0.35, census=census,
                               rank_peak_memory=[{"peak_memory_allocated_bytes": 800}], memory={"peak_bytes": 700})],
        "compiled": [_transformer("nccl-1p-gpt2-124m-ddp-bf16-compiled", 0.08, mfu=0.5, census=census)],
        "nccl-1p": [_exposed("nccl-1p-gpt2-124m-ddp-bf16", 0.03, [0.029, 0.031], 0.0, [-0.001, 0.001], 19),
                    _exposed("nccl-1p-gpt2-124m-ddp-bf16-cap1000", 0.03, [0.029, 0.031], 0.0, [-0.001, 0.001], 1)],
        "gloo-cuda-2p": [_exposed("gloo-cuda-2p-gpt2-124m-ddp-bf16", 0.08, [0.07, 0.09], 0.1, [0.09, 0.11], 19),
                         _exposed("gloo-cuda-2p-gpt2-124m-ddp-bf16-cap1000", 0.08, [0.07, 0.09], 0.2, [0.18, 0.22], 1)]}

    def answer(command):
        target = _json_target(command)
        if target:  # a pytest slice
            label = pathlib.Path(target).stem.removeprefix("transformer_").removeprefix("exposed_comm_")
            docs = slices[label]
            return 0, f"=== {len(docs)} passed in 9.0s ===\n", "", {target: {"benchmarks": docs}}
        impl = command[command.index("--impl") + 1]  # ddpbench census
        return 0, "", json.dumps({"world_sizes": [{"world_size": 1, "peak_bytes": 990 if impl == "ddp" else 640}]}), {}

    check = _check(tmp_path)
    seen = _fake_runs(check, monkeypatch, answer)
    for name in ("transformer", "exposed_comm", "memory"):
        gpu_check.run_part(check, name)
    transformer, exposed, memory = check.parts
    assert transformer["status"] == "passed", transformer
    assert [c["ok"] for c in transformer["checks"]] == [True, True]
    assert "| nccl-1p-gpt2-124m-ddp-bf16-compiled | 0.08 |" in transformer["table"]
    assert ["-k", "(not compiled)"] == seen[0][seen[0].index("-k"):seen[0].index("-k") + 2]
    assert seen[0][seen[0].index("benchmarks/test_transformer.py") + 1:][:2] == ["-m", "gpu and not slow"]  # not 1B
    assert exposed["status"] == "passed" and len(exposed["figures"]["pairs"]) == 2, exposed["reason"]
    assert any("one bucket exposes more: yes" in f for f in exposed["findings"])
    assert memory["status"] == "failed"  # fsdp2's census reads 700 of 800 measured: outside ±10%
    assert memory["checks"][-1]["detail"] == "1 of 2; within ±5%: 1"
    assert ("census simulation ddp at world size 1: 990 B against nccl-1p-gpt2-124m-ddp-bf16's measured 1000 B "
            "= 0.990") in memory["findings"]
    assert outputs.load_summary(tmp_path / "summary.json")["parts"][2]["name"] == "memory"


def test_the_ab_part_counts_verdicts_of_both_runs(tmp_path, monkeypatch):
    def verdicts(verdict):
        return {"counts": {verdict: 3}, "cases": [{"name": f"case{i}", "verdict": verdict, "ratio": 1.1,
                                                   "ci_low": 1.05, "ci_high": 1.2, "details": {"wall_s": 9.5}}
                                                  for i in range(3)]}

    def answer(command):
        target = _json_target(command)
        if target:
            injected = any("DDPBENCH_INJECT_SLOWDOWN" in w for w in command)
            return (1 if injected else 0), "", "", {target: {"benchmarks": []}}
        return 0, "", json.dumps(verdicts("regression" if "injected" in command[-2] else "same")), {}

    check = _check(tmp_path)
    seen = _fake_runs(check, monkeypatch, answer)
    part = gpu_check.run_part(check, "ab_gate")
    assert part["status"] == "passed", part
    assert part["findings"] == ["aa: {'same': 3}, false regressions 0", "injected: {'regression': 3}, caught 3 of 3"]
    aa = seen[0]
    assert f"--dist-baseline-python={check.python}" in aa and any(w.startswith("--dist-ab-run-budget=") for w in aa)


def test_the_nccl_tests_part_reads_the_side_by_side_records(tmp_path, monkeypatch):
    build = tmp_path / "build"
    build.mkdir()
    for op in nccl_build.OPS:
        (build / f"{op}_perf").write_text("")
    monkeypatch.setattr(gpu_check, "NCCL_TESTS_BUILD", build)
    reference = side_by_side.parse_nccl_tests((DATA / "nccl_tests_all_gather_h100.txt").read_text())["rows"]
    records = [{"repeat": 0, "graphs": "off", "op": "all_gather", "placement": "out-of-place", "size_bytes": size,
                "nccl_tests_us": placed["out-of-place"], "ddpbench_us": placed["out-of-place"] * 1.01}
               for size, placed in reference.items()]
    rows = side_by_side.summarize(records)

    def answer(command):
        out = pathlib.Path(command[command.index("--out") + 1])
        return 0, "", "", {out / "records.json": {"records": records, "summary": rows},
                           out / "summary.md": side_by_side.table(rows)}

    check = _check(tmp_path / "out")
    check.environment = {"nccl": "2.28.9"}
    check.build_plan = {"ok": True, "commit": "a0b82b2", "nvcc": "/usr/local/cuda/bin/nvcc", "cuda_home": None,
                        "nccl": {"include": "/x/include", "library": "/x/lib/libnccl.so.2", "version": "2.28.9"}}
    seen = _fake_runs(check, monkeypatch, answer)
    part = gpu_check.run_part(check, "nccl_tests")
    assert part["status"] == "passed", part
    assert part["figures"]["side_by_side"]["goal_rows"] == 2 and "outside 0.95-1.05: none" in part["findings"][0]
    assert "--placements" in seen[0] and str(build / "run") in seen[0]
    assert (build / "run" / "all_gather_perf").read_text().startswith('#!/bin/sh\nLD_LIBRARY_PATH="/x/lib')
    check.environment = {"nccl": "2.27.3"}  # nccl-tests linked against another NCCL than torch's
    assert gpu_check.run_part(check, "nccl_tests")["reason"] == "check failed: nccl-tests built against the NCCL torch uses"


def test_the_suite_and_its_gates_count_cases_and_verdicts(tmp_path, monkeypatch):
    recorded = (DATA / "pytest_verbose_mixed.txt").read_text()

    def answer(command):
        target = _json_target(command)
        if target:  # the suite and the short slice's two runs: 1 failed, 2 passed, 3 skipped, 1 error
            return 1, recorded, "", {target: {"benchmarks": [{}] * 2}}
        if "compare" in command:
            return 1, "", json.dumps({"counts": {"regression": 2, "same": 5, "new": 0}, "cases": []}), {}
        if "report" in command:
            charts = pathlib.Path(command[command.index("--chart") + 1])
            return 0, "", "", {charts / "run" / "a.png": "", charts / "run" / "b.png": ""}
        return 0, "", json.dumps({"runs": 2, "series": 103, "steps": [{}]}), {}  # history --json

    check = _check(tmp_path)
    seen = _fake_runs(check, monkeypatch, answer)
    suite = gpu_check.run_part(check, "suite")
    assert suite["status"] == "failed" and suite["reason"] == "2 passed, 1 failed, 3 skipped, 1 errors"
    assert "failed: test_rec.py::test_fails, test_rec.py::test_errors" in suite["findings"]
    assert suite["counts"] == {"passed": 2, "failed": 1, "skipped": 3, "errors": 1} and suite["where"] == "suite/"
    gates = gpu_check.run_part(check, "suite_gates")
    assert gates["status"] == "passed", gates["reason"]  # compare's exit 1 (regressions) is a finding
    work = check.out / "suite_gates"
    compare = next(c for c in seen if "compare" in c)
    assert compare[-3:] == [str(work / "run1.json"), str(work / "run2.json"), "--json"]  # the two runs, named
    assert gates["findings"][2:] == ["compare run1 run2 (exit 1): {'regression': 2, 'same': 5}",
                                     "report of suite.json: 2 charts", "history: 2 runs, 103 series, 1 steps"]
    assert gates["counts"]["passed"] == 4  # both runs' cases
    brief = outputs.render_brief(outputs.load_summary(tmp_path / "summary.json"))
    assert "suite | failed |" in brief and "| 2/2/3 |" in brief and "suite_gates/" in brief


def test_the_bundle_leaves_out_the_largest_files_past_its_limit_and_the_brief_stays_short(tmp_path):
    work = tmp_path / "work"
    (work / "suite").mkdir(parents=True)
    (work / "suite" / "log.txt").write_text("ok\n")
    (work / "suite" / "big.json").write_bytes(os.urandom(50_000))  # does not compress
    found = gpu_check.make_bundle(work, tmp_path / "bundle.tar.gz")
    assert found["files"] == 2 and not found["left_out"]
    found = gpu_check.make_bundle(work, tmp_path / "bundle.tar.gz", limit=20_000)
    assert found["left_out"] == ["suite/big.json"] and found["bytes"] <= 20_000
    with tarfile.open(tmp_path / "bundle.tar.gz") as tar:
        assert tar.getnames() == ["suite/log.txt"]
    parts = [{"name": f"part{i}", "status": "failed", "wall_s": 1.0, "budget_s": 2.0, "brief": "x" * 300,
              "counts": {"passed": 1, "failed": 0, "skipped": 0, "errors": 0}, "where": "p/"} for i in range(30)]
    brief = outputs.render_brief({"parts": parts, "bundle": found, "environment": {}})
    assert len(brief) <= outputs.BRIEF_LIMIT and brief.endswith("summary.md has it all)\n")
    assert all(len(line) <= 200 for line in brief.splitlines())


def _wheel(folder, name, version, requires=()):
    folder.mkdir(exist_ok=True)
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        archive.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", f"Name: {name}\n{meta}")
    return path


def test_install_carries_what_the_image_lacks_and_falls_back_to_the_tree_when_pip_fails(tmp_path, monkeypatch):
    wheels = tmp_path / "whl"
    _wheel(wheels, "pytest-benchmark", "5.3.1", ["py-cpuinfo2>=10.1", "pytest>=8.1", 'tomli; python_version < "3"'])
    _wheel(wheels, "py-cpuinfo2", "10.1.1")
    _wheel(wheels, "ruptures", "1.1.10")
    monkeypatch.setattr(gpu_check, "WHEELS", wheels)
    image = {"torch": "2.11.0+cu130", "pytest": "8.3.5", "pytest-benchmark": "4.0.0", "pytest-xdist": "3.6.1",
             "pytest-timeout": "2.3.1", "psutil": "7.0.0", "numpy": "2.5.2", "scipy": "1.16.0", "ruptures": None,
             "matplotlib": "3.10.0", "setuptools": "80.9.0", "py-cpuinfo2": None}

    def answer(command):
        if command[1] == "-c" and "metadata.version" in command[2]:
            return 0, "", json.dumps({name: image.get(name) for name in command[3:]}), {}
        if command[-2:] == ["-e", "."]:
            return 1, "error: invalid pyproject.toml: project.license\n", "", {}
        if command[1] == "-c":  # where ddpbench imports from
            return 0, "", str(ROOT / "src" / "ddpbench" / "__init__.py"), {}
        return 0, "", "", {}  # pip install --target of the carried wheels

    check = _check(tmp_path)
    seen = _fake_runs(check, monkeypatch, answer)
    part = gpu_check.run_part(check, "install")
    carried = next(c for c in seen if "--target" in c)
    assert sorted(pathlib.Path(w).name.split("-")[0] for w in carried[carried.index("--target") + 2:]) == [
        "py_cpuinfo2", "pytest_benchmark", "ruptures"]  # too old, missing, and what the carried one needs
    site = carried[carried.index("--target") + 1]
    assert check.env["PYTHONPATH"].split(os.pathsep)[:3] == [str(gpu_check.LAB_GPU), str(ROOT / "src"), site]
    assert check.env["PYTEST_ADDOPTS"].endswith(gpu_check.TREE_PLUGIN_ADDOPTS) and check.tree_fallback
    assert part["status"] == "failed" and part["reason"].startswith("pip exited 1: ")
    rows = {r["name"]: r for r in part["figures"]["requirements"]}
    assert rows["pytest"]["action"] == "ok" and rows["torch"]["found"] == "2.11.0+cu130"
    assert rows["setuptools"]["ok"] and "tomli" not in rows  # a marker that does not hold here


PLAIN_BENCHMARKS = """
import os


def test_first(benchmark):
    benchmark(sum, range(10))


def test_second_is_killed(benchmark):
    os._exit(1)  # as a part's time limit kills pytest: no session end, no JSON of its own
"""


def test_a_run_killed_midway_keeps_the_cases_it_measured(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(lab_script_path("partial_json").parent))
    pytester.makepyfile(test_plain=PLAIN_BENCHMARKS)
    result = pytester.runpytest_subprocess("-p", "partial_json", "-p", "no:cacheprovider", "--benchmark-json=out.json")
    assert result.ret == 1
    doc = json.loads((pytester.path / "out.json").read_text())
    assert [b["name"] for b in doc["benchmarks"]] == ["test_first"] and doc["benchmarks"][0]["stats"]["data"]
    assert doc["ddpbench_run"]["complete"] is False and doc["ddpbench_run"]["stopped"].startswith("partial")
    assert not list(pytester.path.glob("*.partial")) and not (ROOT / "out.json").exists()


@pytest.mark.pool
def test_the_cpu_rehearsal_runs_the_real_commands_through_budgets_bundle_and_summary(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    done = subprocess.run(["bash", str(lab_script_path("gpu_check").parent / "check.sh"), "--cpu-rehearsal",
                           "--work", str(work), "--no-pip-install", "--parts", "install,suite,suite_gates,nccl_tests",
                           "--dist-sizes", "64KB", "--select", "suite=test_all_reduce",
                           "--select", "suite_gates=test_all_reduce and 1MB", "--budget", "suite_gates=240",
                           "--total-budget", "500"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(out)) == ["bundle.tar.gz", "summary.json", "summary.md"]  # the call brings back 8 at most
    brief = done.stdout[done.stdout.index("ddpbench GPU check (cpu-rehearsal)"):]
    assert len(brief) <= outputs.BRIEF_LIMIT and brief.rstrip().splitlines()[-1].startswith("nccl_tests | skipped")
    doc = outputs.load_summary(out / "summary.json")
    install, suite, gates, nccl = doc["parts"]
    assert install["status"] == "passed" and "ddpbench from src/" in install["headline"], install
    assert suite["status"] == "passed" and suite["counts"]["passed"] == 1, suite
    assert gates["status"] == "passed" and sum(gates["figures"]["compare_counts"].values()) == 1, gates
    assert nccl["status"] == "skipped" and nccl["reason"].startswith("CPU rehearsal: nccl-tests needs a GPU")
    with tarfile.open(out / "bundle.tar.gz") as tar:
        names = set(tar.getnames())
        run = json.load(tar.extractfile("suite/suite.json"))
    assert {"suite/log.txt", "suite_gates/run1.json", "suite_gates/run2.json", "suite_gates/compare.json",
            "suite_gates/report.md", "suite_gates/history.html", "summary.md"} <= names
    assert any(n.startswith("suite_gates/charts/") and n.endswith(".png") for n in names)
    assert [b["name"] for b in run["benchmarks"]] == ["test_all_reduce[gloo-2p-64KB]"]
    assert run["ddpbench_run"]["complete"]  # pytest finished: its own JSON replaced the partial one
