"""ab.yml's flow with two venvs made from one Python: does the A/B gate see a slowdown planted in
the head's ddpbench?

Builds ``base/`` and ``head/`` under a scratch folder, each a copy of a ddpbench source tree (this
checkout's ``src/``, or ``--source-commit``'s) and of ``benchmarks/``, with a cheap venv of this
Python each (``--without-pip``; a ``.pth`` puts this checkout's installed packages behind the
copy's own source); the head's collectives sleep ``--sleep-ms`` after each all_reduce. Then, from
``head/``, ab.yml's command on the 1 MB all_reduce, ``--runs`` times, and one line per run: the
verdict, ratio [interval], exit status and what the header says about the engines.

    .venv/bin/python lab/reference/ab_two_venvs.py --runs 3                            # this code
    .venv/bin/python lab/reference/ab_two_venvs.py --runs 3 --source-commit b862717    # before the fix
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CALL = '    dist.all_reduce(state["input"], op=_reduce_op(state["reduce_op"]))\n'


def _source(commit: str | None, where: Path) -> Path:
    """A copy of ddpbench's package at ``commit`` (None: this checkout's) under ``where``."""
    if commit is None:
        shutil.copytree(ROOT / "src" / "ddpbench", where / "ddpbench", ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(["git", "archive", commit, "src/ddpbench"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-x", "--strip-components=1", "-C", str(where)], input=archive, check=True)
    return where


def _checkout(root: Path, commit: str | None, sleep_ms: float) -> None:
    src = _source(commit, root / "src")
    if sleep_ms:
        path = src / "ddpbench" / "workloads" / "collectives.py"
        text = path.read_text()
        if CALL not in text:
            sys.exit(f"cannot plant the sleep: {path} has no line {CALL.strip()!r}")
        path.write_text(text.replace(CALL, CALL + f"    __import__('time').sleep({sleep_ms / 1000!r})\n"))
    shutil.copytree(ROOT / "benchmarks", root / "benchmarks", ignore=shutil.ignore_patterns("__pycache__", "raw"))
    (root / "pytest.ini").write_text("[pytest]\n")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
    site_packages = next((root / ".venv" / "lib").glob("python3*/site-packages"))
    (site_packages / "checkout.pth").write_text(f"{src}\n{sysconfig.get_paths()['purelib']}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sleep-ms", type=float, default=4.0, help="planted after each all_reduce in head/ (default 4)")
    parser.add_argument("--source-commit", default=None, help="ddpbench's source at this commit (default: this checkout)")
    parser.add_argument("--max-time", default="20", help="--dist-ab-max-time (default 20)")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="ab-two-venvs-"))
    try:
        _checkout(scratch / "base", args.source_commit, 0.0)
        _checkout(scratch / "head", args.source_commit, args.sleep_ms)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTHONPATH"))}
        print(f"source {args.source_commit or 'this checkout'}; head sleeps {args.sleep_ms:g} ms after each all_reduce")
        for run in range(1, args.runs + 1):
            out = subprocess.run(
                [str(scratch / "head" / ".venv" / "bin" / "python"), "-m", "pytest", "benchmarks/test_collectives.py",
                 "-k", "test_all_reduce and 1MB", "-m", "not gpu and not slow", "-p", "no:cacheprovider",
                 "--dist-baseline-python=../base/.venv/bin/python", f"--dist-ab-max-time={args.max_time}",
                 "--benchmark-json=ab.json"],
                cwd=scratch / "head", env=env, capture_output=True, text=True)
            text = out.stdout + out.stderr
            engines = "same engine" if "both sides run the same engine" in text else (
                "different engines" if "DIFFERENT ddpbench engines" in text else "?")
            try:
                (case,) = json.loads((scratch / "head" / "ab.json").read_text())["benchmarks"]
                ab = case["extra_info"]["ab"]
                low, high = ab.get("ratio_ci") or (float("nan"), float("nan"))
                verdict = f"{ab['verdict']} {ab['ratio']:.3f} [{low:.3f}, {high:.3f}]"
            except (OSError, ValueError, KeyError) as exc:
                found = re.search(r"(refused|error)[^\n]*", text)
                verdict = f"no verdict ({type(exc).__name__}: {found.group(0)[:120] if found else '-'})"
            print(f"run {run}: {verdict}, exit {out.returncode}, header: {engines}", flush=True)
            (scratch / "head" / "ab.json").unlink(missing_ok=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
