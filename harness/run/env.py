"""What reproduces a record: GPU, driver, host CPU, CUDA and library versions, git commit.

GPU facts come from NVML, so the sweep's parent process can stamp them without creating a CUDA
context. The host's CPU model and core count go beside them: an eager step whose GPU work is short
runs at the pace of the host's Python, so its time says which host set it. The git commit is read
once by the parent at the start of a sweep, before any result is written (the results file is
tracked, so reading it later would always say "dirty").
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The libraries every point runs on; each method adds those it requires (`Method.requires`).
LIBRARIES = ("torch", "triton", "transformers", "numpy", "hydra-core")


STAMP_VARIABLE = "FORGE_BENCH_COMMIT_STAMP"  # set by scripts/device_setup.sh on the GPU machine


def git_info(repo: Path = REPO) -> dict[str, Any]:
    """Commit hash and whether tracked files differ from it (None outside a git checkout).

    On the GPU machine the stamp written by `scripts/stamp_commit.sh` wins: the copy of the tree
    sent there may hold a .git of another commit (seen: an older commit, marked dirty)."""
    if os.environ.get(STAMP_VARIABLE):
        return _stamped_commit(Path(os.environ[STAMP_VARIABLE]))

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return _stamped_commit(repo / ".device-commit")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _stamped_commit(stamp: Path) -> dict[str, Any]:
    """`scripts/stamp_commit.sh` writes the commit sent to the GPU machine (and whether tracked
    files differed from it) into .device-commit, carried with the run."""
    if not stamp.is_file():
        return {"git_commit": None, "git_dirty": None}
    commit, _, dirty = stamp.read_text().strip().partition(" ")
    return {
        "git_commit": commit or None,
        "git_dirty": dirty == "dirty",
        "git_commit_source": ".device-commit",
    }


def resolve_device(requested: str) -> str:
    """'auto' becomes 'cuda' when torch sees a GPU, else 'cpu'; any other device as given."""
    if requested == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def gpu_info() -> dict[str, Any]:
    """GPU name, count and driver from NVML; None values on a machine without NVIDIA GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if count else None
        driver = pynvml.nvmlSystemGetDriverVersion()
        decode = lambda s: s.decode() if isinstance(s, bytes) else s
        return {"gpu_name": decode(name), "gpu_count": count, "driver": decode(driver)}
    except Exception:
        return {"gpu_name": None, "gpu_count": 0, "driver": None}


def host_info() -> dict[str, Any]:
    """The host's CPU: its model (`cpu_model`, as /proc/cpuinfo names it, else the platform's
    processor string, None where neither says), its logical cores (`cpu_count`) and those this
    process may run on (`cpu_usable`: a container or taskset may hold fewer)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {"cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "cpu_usable": usable}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Processor", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def machine() -> dict[str, Any]:
    """What this machine can run a point on, read without creating a CUDA context: the first
    NVIDIA GPU's name and memory and their count (NVML, as `gpu_info`), and the host's RAM.
    Without NVML, a GPU that torch sees is counted, its name and memory unknown (None)."""
    here: dict[str, Any] = {"gpu_name": None, "gpu_count": 0, "gpu_memory_gib": None}
    try:
        import pynvml

        pynvml.nvmlInit()
        here["gpu_count"] = pynvml.nvmlDeviceGetCount()
        if here["gpu_count"]:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            here["gpu_name"] = name.decode() if isinstance(name, bytes) else name
            here["gpu_memory_gib"] = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
    except Exception:
        try:
            import torch

            here["gpu_count"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:
            pass
    try:
        here["host_memory_gib"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        here["host_memory_gib"] = None
    return here


def versions() -> dict[str, str | None]:
    """Installed versions of the libraries that shape the numbers (ours and the methods'), plus
    Python and CUDA."""
    from harness.run import methods

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in dict.fromkeys([*LIBRARIES, *methods.packages()]):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    try:
        import torch

        out["cuda"] = torch.version.cuda
    except ImportError:
        out["cuda"] = None
    return out


def collect(git: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `env` field of a record: GPU, driver, host CPU, versions, git (pass the sweep's git info)."""
    return {**gpu_info(), **host_info(), **versions(), **(git if git is not None else git_info())}
