"""What this machine has for the suite: CPU cores, CUDA devices (and whether a CUDA install that
should see GPUs is broken), and the description of its GPUs stored with each saved run. Each is
asked once per process."""

from __future__ import annotations

import functools
import glob
import os
import re
import warnings


def _nvidia_gpus_present() -> list[str]:
    """The NVIDIA device files of this machine (no CUDA call): /dev/nvidia0, ..."""
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


@functools.lru_cache(maxsize=None)
def cuda_probe() -> tuple[int, str | None]:
    """(CUDA devices visible to this process, why CUDA is broken here or None), asked once.

    No GPU is not broken. Broken is a machine whose NVIDIA GPUs torch cannot use: a CPU-only
    torch build, or a CUDA build whose initialisation fails (a driver too old for it, a missing
    library). CUDA_VISIBLE_DEVICES set empty hides the GPUs on purpose: that is no GPU."""
    gpus = _nvidia_gpus_present()
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1")
    try:
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CUDA initialization: ..." says it again below
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # noqa: BLE001 - an install broken in any way
        return 0, f"torch's CUDA check raised {type(exc).__name__}: {exc}"
    if count or not gpus or hidden:
        return count, None
    if torch.version.cuda is None:
        return 0, (f"this machine has NVIDIA GPUs ({', '.join(gpus)}) but torch {torch.__version__} is a "
                   f"CPU-only build; install the CUDA build (on Linux, PyPI's torch wheel)")
    try:
        torch.cuda.init()
        reason = "torch sees no CUDA device"
    except Exception as exc:  # noqa: BLE001
        reason = f"{type(exc).__name__}: {exc}".strip()
    return 0, (f"this machine has NVIDIA GPUs ({', '.join(gpus)}) but torch {torch.__version__} (CUDA "
               f"{torch.version.cuda}) cannot use them: {reason}")


def cuda_device_count() -> int:
    """CUDA devices visible to this process (every test function's parametrization and every
    item's GPU-skip check need it)."""
    return cuda_probe()[0]


_GPU_MARK = re.compile(r"(\bnot\s+)?\b(multi_gpu|gpu)\b")


def gpu_cases_requested(config) -> bool:
    """Whether the run asks for GPU cases by name: -m selecting gpu / multi_gpu (not negated) or
    --dist-backend=nccl."""
    if config.getoption("dist_backend", None) == "nccl":
        return True
    expression = config.getoption("markexpr", "") or ""
    return any(not negated for negated, _ in _GPU_MARK.findall(expression))


GPU_INFO_KEY = "ddpbench_gpus"


@functools.lru_cache(maxsize=None)
def gpu_description() -> dict | None:
    """The visible GPUs and the CUDA / NCCL versions torch was built with (None without CUDA),
    stored in each saved run's machine_info under :data:`GPU_INFO_KEY`."""
    if not cuda_device_count():
        return None
    import torch

    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a build without NCCL
        nccl = None
    return {"devices": [torch.cuda.get_device_name(i) for i in range(cuda_device_count())],
            "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl}


def cpu_count() -> int:
    from .pool.pinning import cores_available  # not at import: the plugin loads this module in every session

    return len(cores_available()) or os.cpu_count() or 1
