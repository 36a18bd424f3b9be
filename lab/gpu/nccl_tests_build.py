"""Build NVIDIA nccl-tests' four ``*_perf`` binaries against the NCCL that torch ships.

torch's CUDA wheels bring NCCL as the ``nvidia-nccl-cu*`` wheel: ``nvidia/nccl/include/nccl.h`` and
``nvidia/nccl/lib/libnccl.so.2`` in site-packages (``nvidia.nccl`` is a namespace package: no
``__file__``, its folder is ``__path__``), or older builds keep ``libnccl.so*`` in ``torch/lib``.
The wheel has no unversioned ``libnccl.so`` for ``-lnccl`` to link against, so the build gets a
small NCCL_HOME of its own (``include`` and ``lib/libnccl.so`` linking to the wheel's files), and the
binaries run through ``build/run/<op>_perf`` scripts that put the wheel's lib folder first on their
own ``LD_LIBRARY_PATH``: the NCCL they load is torch's.

nvcc comes from the CUDA toolkit of the machine (``$CUDA_HOME/bin/nvcc``, ``nvcc`` on PATH, or
``/usr/local/cuda/bin/nvcc``); the GPU's compute capability picks the one ``-gencode`` to compile
(all of nccl-tests' defaults would take minutes).

    python3 lab/gpu/nccl_tests_build.py --source lab/gpu/nccl-tests --build lab/gpu/nccl-tests-build \\
        [--arch 90] [--jobs 8]

prints what it found and builds; exit 0 when the four binaries are there, 1 with the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def nccl_search_dirs() -> list[Path]:
    """Where this interpreter's torch install may keep NCCL, without importing torch: each folder of
    the ``nvidia.nccl`` package, then ``torch/lib``."""
    dirs: list[Path] = []
    for name, sub in (("nvidia.nccl", ""), ("torch", "lib")):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # no ``nvidia`` parent package at all
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(Path(location) / sub if sub else Path(location))
    return dirs


def find_nccl(search_dirs: list[Path]) -> dict:
    """The first folder holding both ``nccl.h`` (in ``include/`` or beside) and ``libnccl.so*`` (in
    ``lib/`` or beside) -> ``{"include": dir, "library": file, "version": "2.28.9"|None}``;
    ValueError naming the folders looked in when none does."""
    for folder in search_dirs:
        headers = [d for d in (folder / "include", folder) if (d / "nccl.h").is_file()]
        libraries = sorted(p for d in (folder / "lib", folder) if d.is_dir() for p in d.glob("libnccl.so*")
                           if re.fullmatch(r"libnccl\.so(\.\d+)*", p.name))
        if headers and libraries:
            return {"include": headers[0], "library": libraries[0],
                    "version": nccl_header_version((headers[0] / "nccl.h").read_text(errors="replace"))}
    raise ValueError("no NCCL headers and library found in " + (", ".join(str(d) for d in search_dirs) or
                     "(no nvidia.nccl package, no torch)") + ": nccl-tests needs nccl.h and libnccl.so "
                     "(a CUDA build of torch brings them as the nvidia-nccl-cu* wheel)")


def nccl_header_version(text: str) -> str | None:
    """``#define NCCL_MAJOR 2`` ... in nccl.h -> ``"2.32.3"`` (None when the defines are missing)."""
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        found = re.search(rf"^#define\s+NCCL_{name}\s+(\d+)", text, re.M)
        if not found:
            return None
        parts.append(found.group(1))
    return ".".join(parts)


def find_nvcc(environ=os.environ) -> Path | None:
    """nvcc of the machine's CUDA toolkit: $CUDA_HOME/bin/nvcc, nvcc on PATH, /usr/local/cuda."""
    candidates = []
    if environ.get("CUDA_HOME"):
        candidates.append(Path(environ["CUDA_HOME"]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc", path=environ.get("PATH"))
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def cuda_home_of(nvcc: Path) -> Path:
    """The toolkit folder of an nvcc. A wrapper script on PATH (``exec /usr/local/cuda-13.0/bin/nvcc
    "$@"``) is followed to the path it runs."""
    resolved = nvcc.resolve()
    if (resolved.parent.parent / "include" / "cuda_runtime.h").is_file():
        return resolved.parent.parent
    try:
        text = resolved.read_text(errors="replace")[:4000]
    except OSError:
        text = ""
    found = re.search(r"(/\S+)/bin/nvcc\b", text)
    return Path(found.group(1)) if found else resolved.parent.parent


def gencode(capability: str) -> str:
    """A compute capability, ``"9.0"`` or ``"90"``, -> ``-gencode=arch=compute_90,code=sm_90``."""
    digits = capability.replace(".", "")
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"{capability!r} is not a compute capability such as 9.0")
    return f"-gencode=arch=compute_{digits},code=sm_{digits}"


def make_nccl_home(nccl: dict, build: Path) -> Path:
    """``build/nccl-home`` with ``include`` -> the NCCL headers and ``lib/libnccl.so`` (and the
    library's own name) -> the NCCL library, for nccl-tests' ``NCCL_HOME``."""
    home = build / "nccl-home"
    (home / "lib").mkdir(parents=True, exist_ok=True)
    links = {home / "include": Path(nccl["include"]), home / "lib" / "libnccl.so": Path(nccl["library"]),
             home / "lib" / Path(nccl["library"]).name: Path(nccl["library"])}
    for link, target in links.items():
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == target.resolve():
                continue
            link.unlink()
        link.symlink_to(target.resolve())
    return home


def binaries(build: Path) -> dict[str, Path]:
    return {op: build / f"{op}_perf" for op in OPS}


def make_command(source: Path, build: Path, nccl_home: Path, cuda_home: Path, arch: str, jobs: int) -> list[str]:
    """make in nccl-tests' src/ for the four binaries only (MPI off, one -gencode)."""
    build = build.resolve()
    return ["make", "-C", str(source / "src"), f"-j{jobs}", "MPI=0", f"NCCL_HOME={nccl_home.resolve()}",
            f"CUDA_HOME={cuda_home}", f"NVCC_GENCODE={gencode(arch)}", f"BUILDDIR={build}",
            *[str(path) for path in binaries(build).values()]]


def write_runners(build: Path, dirs: list[str]) -> Path:
    """``build/run/<op>_perf``: one shell script per binary that runs it with ``dirs`` first on
    LD_LIBRARY_PATH, so only nccl-tests sees them (torch, run beside it, keeps its own libraries:
    a toolkit's libcudart first on its path could replace the one torch's wheels bring)."""
    folder = build / "run"
    folder.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(str(d) for d in dirs)
    for op, binary in binaries(build).items():
        runner = folder / f"{op}_perf"
        runner.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH="{path}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
                          f'exec "{binary.resolve()}" "$@"\n')
        runner.chmod(0o755)
    return folder


def library_dirs(found: dict) -> list[str]:
    """What :func:`write_runners` needs of a :func:`plan`: the NCCL library's folder, then the CUDA
    toolkit's lib64 / lib (libcudart)."""
    dirs = [str(Path(found["nccl"]["library"]).parent)]
    if found.get("cuda_home"):
        dirs += [str(Path(found["cuda_home"]) / sub) for sub in ("lib64", "lib")
                 if (Path(found["cuda_home"]) / sub).is_dir()]
    return dirs


def plan(source: Path, build: Path, arch: str | None, jobs: int, search_dirs=None, environ=os.environ) -> dict:
    """What the build needs, found or not: ``{"ok": bool, "reason": str|None, "nvcc", "make",
    "commit", "nccl", "command"}``, asked in that order: the machine's tools (nvcc, make) first, so a
    machine that cannot build says so whatever was carried; then the source, then torch's NCCL.
    ``arch`` None: the build is planned but not runnable (no GPU to ask)."""
    out: dict = {"ok": False, "reason": None, "commit": None, "nccl": None, "nvcc": None, "make": None,
                 "cuda_home": None, "command": None}
    nvcc = find_nvcc(environ)
    out["nvcc"] = str(nvcc) if nvcc else None
    make = shutil.which("make", path=environ.get("PATH"))
    out["make"] = make
    if nvcc is None:
        out["reason"] = ("no nvcc (CUDA toolkit) on this machine: $CUDA_HOME/bin/nvcc, nvcc on PATH and "
                         "/usr/local/cuda/bin/nvcc are all missing; nccl-tests cannot be built here")
        return out
    if make is None:
        out["reason"] = "no make on this machine's PATH: nccl-tests cannot be built here"
        return out
    if not (source / "src" / "Makefile").is_file():
        out["reason"] = (f"no nccl-tests source at {source} (no src/Makefile): run "
                         f"lab/gpu/fetch_nccl_tests.sh, then carry lab/gpu/nccl-tests with the device call")
        return out
    commit_file = source / "COMMIT"
    out["commit"] = commit_file.read_text().strip() if commit_file.is_file() else None
    try:
        nccl = find_nccl(nccl_search_dirs() if search_dirs is None else search_dirs)
    except ValueError as exc:
        out["reason"] = str(exc)
        return out
    out["nccl"] = {k: str(v) if v is not None else None for k, v in nccl.items()}
    if arch is None:
        out["reason"] = "no GPU to take the compute capability from"
        return out
    cuda_home = cuda_home_of(nvcc)
    out["cuda_home"] = str(cuda_home)
    out["command"] = make_command(source, build, build / "nccl-home", cuda_home, arch, jobs)
    out["ok"] = True
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=Path("lab/gpu/nccl-tests"))
    parser.add_argument("--build", type=Path, default=Path("lab/gpu/nccl-tests-build"))
    parser.add_argument("--arch", default=None, help="compute capability, e.g. 9.0 (default: GPU 0's, from torch)")
    parser.add_argument("--jobs", type=int, default=8)
    args = parser.parse_args(argv)
    arch = args.arch
    if arch is None:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: give --arch to build without one", file=sys.stderr)
            return 1
        arch = "%d.%d" % torch.cuda.get_device_capability(0)
    found = plan(args.source, args.build, arch, args.jobs)
    print(f"nvcc {found['nvcc']}; make {found['make']}; nccl-tests commit {found['commit']}; NCCL {found['nccl']}",
          flush=True)
    if not found["ok"]:
        print(found["reason"], file=sys.stderr)
        return 1
    nccl = {"include": Path(found["nccl"]["include"]), "library": Path(found["nccl"]["library"])}
    make_nccl_home(nccl, args.build)
    print("$ " + " ".join(found["command"]), flush=True)
    done = subprocess.run(found["command"])
    missing = [str(p) for p in binaries(args.build).values() if not p.is_file()]
    if done.returncode or missing:
        print(f"make exited {done.returncode}; missing: {', '.join(missing) or 'none'}", file=sys.stderr)
        return 1
    runners = write_runners(args.build, library_dirs(found))
    print(f"built: {', '.join(str(p) for p in binaries(args.build).values())}; run them through {runners}/ "
          f"(LD_LIBRARY_PATH={os.pathsep.join(library_dirs(found))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
