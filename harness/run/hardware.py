"""The hardware: refuse a sweep this machine cannot run, and keep each machine's records apart.

`check_hardware` runs before any point does. A sweep for a GPU this machine lacks (gpu=h200
without an H200, any GPU on a machine without CUDA, fewer GPUs than `gpus`), or whose model's
weights alone exceed the device's memory (or, on a CPU, the host's), is refused with a
ConfigError that says why, which conf/gpu entries this machine can run, and the command that
tries the same sweep here on the CPU on a tiny model (`tiny_cpu_overrides`, `tiny_cpu_point`).
A Slurm job makes the same check on its node (`hardware_problem`).

Every record says what it was measured on (`hardware_label`: "cpu", or the GPU's name), so a
results file that holds another machine's points is never appended to (`foreign_hardware`).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness import results
from harness.run import config as config_mod
from harness.run import gpus as gpu_kinds
from harness.run.config import CONF_DIR, ConfigError

CAP_SLACK = 0.95  # a card sold as N GB reports a little less than N GiB (an H100-80GB: 79.6 GiB)
WEIGHT_BYTES = {"bf16": 2, "fp32": 4}


def hardware_label(device: str, gpu_name: str | None) -> str:
    """What a record was measured on: "cpu", or the GPU's name as NVML gives it ("NVIDIA H200")."""
    return "cpu" if device == "cpu" else (gpu_name or "unnamed CUDA GPU")


def record_hardware(record: dict[str, Any]) -> str | None:
    """`hardware_label` of a record (its `device` and `gpu_name`); None when it says neither."""
    device = record.get("device")
    return None if device is None else hardware_label(device, record.get("gpu_name"))


def foreign_hardware(path: Path, hardware: str) -> list[str]:
    """The hardware, other than `hardware`, that the records of a results file were measured on."""
    found = {record_hardware(r) for r in results.iter_records(path)} - {hardware}
    return sorted(h or "unknown hardware" for h in found)


def device_here(device: str, here: dict[str, Any]) -> str:
    """The device a point runs on here: device=auto is CUDA when a GPU is visible."""
    if device == "auto":
        return "cuda" if here["gpu_count"] else "cpu"
    return device


def _card(gpu: Any) -> str:
    """What a conf/gpu entry stands for, in words."""
    if gpu.name == "cpu":
        return "the CPU"
    if gpu.memory_cap_gib is not None:
        return (
            f"an emulated {gpu.name.upper().replace('_', '-')} (gpu={gpu.name}: a CUDA GPU of at "
            f"least {gpu.memory_cap_gib:g} GiB, capped to {gpu.memory_cap_gib:g} GiB)"
        )
    return f"an NVIDIA {gpu_kinds.title(gpu)} (gpu={gpu.name})"


def _gpus_here(here: dict[str, Any]) -> str:
    if not here["gpu_count"]:
        return "this machine has no CUDA device"
    if here["gpu_name"] is None:
        return f"this machine has {here['gpu_count']} CUDA device(s) of unknown name"
    memory = f", {here['gpu_memory_gib']:.0f} GiB" if here["gpu_memory_gib"] else ""
    return f"this machine's GPU is an {here['gpu_name']}{memory}"


def hardware_problem(gpu: Any, device: str, gpus: int, here: dict[str, Any]) -> str | None:
    """Why a point for conf/gpu `gpu` on `device` (and `gpus` GPUs) cannot run here; None if it can.

    A real card (no memory cap) must be the GPU here: its `device_name` found in the GPU's name.
    An emulated card needs a GPU with at least its cap. The CPU needs device=cpu."""
    runs_on = device_here(device, here)
    if gpu.name == "cpu":
        if runs_on == "cuda":
            return (
                f"gpu=cpu, but device={device} runs the points on the GPU here "
                "(add device=cpu to measure the CPU, or name the GPU with gpu=NAME)"
            )
        return None
    if runs_on == "cpu" and here["gpu_count"]:
        return (
            f"gpu={gpu.name} is a GPU, but device=cpu runs the points on the CPU "
            "(drop device=cpu, or set gpu=cpu)"
        )
    if not here["gpu_count"]:
        return f"it is for {_card(gpu)}, and {_gpus_here(here)}"
    if gpus > here["gpu_count"]:
        return f"gpus={gpus}: its points need {gpus} GPUs, and this machine has {here['gpu_count']}"
    name, memory = here["gpu_name"], here["gpu_memory_gib"]
    if gpu.memory_cap_gib is None:
        if name is not None and not gpu_kinds.matches(gpu, name):
            return f"it is for {_card(gpu)}, and {_gpus_here(here)}"
    elif memory is not None and memory < CAP_SLACK * gpu.memory_cap_gib:
        return f"it is for {_card(gpu)}, and {_gpus_here(here)}"
    return None


_n_params: dict[tuple[str, str | None], int | None] = {}


def _memory_problem(cfg: DictConfig, here: dict[str, Any]) -> str | None:
    """Why the point's model cannot fit here: its weights alone exceed the memory it would use
    (the GPU's, or its cap; the host's on a CPU). Every method holds at least the weights."""
    from harness.run.architecture import n_params_of  # transformers: only when a model is sized

    key = (cfg.model.name, cfg.model.path)
    if key not in _n_params:
        _n_params[key] = n_params_of(cfg.model)
    n = _n_params[key]
    if n is None:  # a checkpoint: its size would have to be read
        return None
    dtype = config_mod.weight_dtype(cfg)
    weights = n * WEIGHT_BYTES[dtype] / cfg.gpus / 2**30
    if device_here(cfg.device, here) == "cpu":
        limit, where = here["host_memory_gib"], "this machine's host memory"
    else:
        limits = [(here["gpu_memory_gib"], f"the {here['gpu_name'] or 'GPU'}'s memory")]
        if cfg.gpu.memory_cap_gib is not None:
            limits.append((cfg.gpu.memory_cap_gib, f"gpu={cfg.gpu.name}'s memory cap"))
        limits = [(v, w) for v, w in limits if v is not None]
        limit, where = min(limits, default=(None, ""))
    if limit is None or weights <= limit:
        return None
    per_gpu = " per GPU" if cfg.gpus > 1 else ""
    return (
        f"model={cfg.model.name} has {n / 1e9:.1f}B parameters: its {dtype} weights alone take "
        f"{weights:.1f} GiB{per_gpu}, more than the {limit:.1f} GiB of {where}"
    )


def _experiment(overrides: list[str]) -> str | None:
    return next((o.split("=", 1)[1] for o in overrides if re.match(r"^\+?exp=", o)), None)


TINY_CPU = [
    "gpu=cpu",
    "device=cpu",
    "sweep.models=[tiny-llama]",
    "sweep.seq_lens=[32]",
    "sweep.batch_sizes=[1]",
    "steps=3",
    "warmup_steps=1",
    "method.lr=1e-3",  # three steps on a tiny model: a step large enough that "the loss fell" is plain
    "results_dir=results/smoke",
    "sweep.scratch=true",
]


def tiny_cpu_overrides(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """The same sweep on the CPU, on the tiny Llama, in a few steps, into the scratch results."""
    mine = {o.split("=", 1)[0] for o in TINY_CPU} | {"gpus", "model", "seq_len", "batch_size"}
    if cfg.sweep.mode == "capacity":
        mine.add("sweep.max_batch_size")
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in mine]
    labels = list(cfg.sweep.methods) or [cfg.method.label]
    # data-parallel methods need two ranks (gloo processes on the CPU); tensor parallelism runs on one
    extra = [f"gpus={2 if any(map(_data_parallel, labels)) else 1}"] if cfg.gpus > 1 else []
    extra += ["sweep.max_batch_size=2"] if cfg.sweep.mode == "capacity" else []
    return [*kept, *TINY_CPU, *extra]


# One point (`python -m harness run`) the same way: the tiny Llama on the CPU, in a few steps.
TINY_CPU_POINT = [
    "gpu=cpu",
    "device=cpu",
    "model=tiny-llama",
    "seq_len=32",
    "batch_size=1",
    "steps=3",
    "warmup_steps=1",
    "method.lr=1e-3",
]


def tiny_cpu_point(overrides: list[str]) -> list[str]:
    mine = {o.split("=", 1)[0] for o in TINY_CPU_POINT} | {"gpus", "results_dir", "sweep.scratch"}
    method = next((o.split("=", 1)[1] for o in overrides if o.startswith("method=")), None)
    ranks = ["gpus=2"] if method is not None and _data_parallel(method) else []
    return [*(o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in mine), *TINY_CPU_POINT, *ranks]


def _data_parallel(label: str) -> bool:
    """Whether conf/method/LABEL trains under a data-parallel wrapper (it needs two ranks at least)."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "method" / f"{label}.yaml"
    return path.is_file() and OmegaConf.load(path).get("options", {}).get("data_parallel") is not None


def _command(overrides: list[str], verb: str = "sweep") -> str:
    return " ".join([f"python -m harness {verb}", *map(shlex.quote, overrides)])


def _runnable_gpus(here: dict[str, Any], overrides: list[str]) -> list[str]:
    """The conf/gpu choices whose hardware this machine has (for the device it would use)."""
    names = []
    for name, gpu in gpu_kinds.kinds(overrides).items():
        device = "cpu" if name == "cpu" else "auto"
        if hardware_problem(gpu, device, 1, here) is None:
            names.append(name)
    return names


def check_hardware(
    cfgs: list[DictConfig],
    overrides: list[str],
    here: dict[str, Any],
    models: bool = True,
    verb: str = "sweep",
) -> None:
    """Refuse, before any point runs, a sweep whose GPU or model this machine cannot hold.
    `here` is `env.machine()`; `models=False` checks the GPU only (the sweep's own config is
    enough for that: gpu, device and gpus are not axes of its grid). Raises ConfigError saying
    why and where it can run; `verb="run"` words it for one point (`python -m harness run`)."""
    if not cfgs:
        return
    cfg = cfgs[0]
    hardware = hardware_problem(cfg.gpu, cfg.device, cfg.gpus, here)
    problems = [hardware] if hardware else []
    if not problems and models:
        problems += list(dict.fromkeys(filter(None, (_memory_problem(c, here) for c in cfgs))))
    if not problems:
        return
    exp = _experiment(overrides)
    what = f"+exp={exp}" if exp else ("this point" if verb == "run" else f"sweep {cfg.sweep.name!r}")
    lines = [f"{what} cannot run on this machine (nothing was run):", *(f"  - {p}" for p in problems)]
    if hardware:
        where = (
            f"a CUDA GPU of at least {cfg.gpu.memory_cap_gib:g} GiB"
            if cfg.gpu.memory_cap_gib
            else _card(cfg.gpu)
        )
        lines.append(
            f"Run it on a machine with {where}" + (f" ({cfg.gpus} of them)." if cfg.gpus > 1 else ".")
        )
        runnable = _runnable_gpus(here, overrides)
        if runnable:
            lines.append("This machine has the hardware of: " + ", ".join(f"gpu={g}" for g in runnable) + ".")
    else:
        lines.append(
            "Run it on a machine with more memory, or choose smaller models "
            "(sweep.models=[...]; `python -m harness list model` lists them)."
        )
    if verb == "run":
        lines.append("To try it here on the CPU, on a tiny model:")
        lines.append("  " + _command(tiny_cpu_point(overrides), "run"))
    elif cfg.convergence.enabled:
        smoke = "convergence_branched_smoke" if cfg.convergence.branch_every else "convergence_smoke"
        lines.append(f"On a CPU, its run in miniature is: python -m harness sweep +exp={smoke}")
    else:
        lines.append("To try it here on the CPU, on a tiny model:")
        lines.append("  " + _command(tiny_cpu_overrides(cfg, overrides)))
        lines.append("or run every CPU method on tiny models: python -m harness sweep +exp=smoke")
    raise ConfigError("\n".join(lines))
