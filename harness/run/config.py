"""Typed configs: the dataclass schema behind conf/, composition, and validation before any work.

`conf/config.yaml` starts from `base_config`, the `Config` dataclass registered in Hydra's
ConfigStore, and fills its groups from `conf/model/`, `conf/method/`, `conf/gpu/`, `conf/launcher/`
(and `conf/exp/` when asked with `+exp=NAME`). Because the schema is a dataclass, OmegaConf rejects a
key that is not in it and a value of the wrong type while composing. `validate` then checks what
types cannot say (choices, ranges, method options against each method's own `Options`
dataclass). Every error is a `ConfigError` that names the bad key or value and the valid choices,
raised before any model is built or any GPU time spent.

We use Hydra's compose API rather than `@hydra.main`: the CLI has subcommands, runs no Hydra
multirun, and writes no `outputs/` directory. A point's resolved config travels to its worker
subprocess as plain JSON (`to_dict`) and is re-validated there (`from_dict`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.run.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

DTYPES = ("bf16", "fp32")
AUTOCAST_DTYPES = ("bf16",)
DEVICES = ("auto", "cuda", "cpu")
FAMILIES = ("llama", "qwen3")
SWEEP_MODES = ("grid", "capacity")
LAUNCHERS = ("local", "slurm")
EXECUTORS = ("slurm", "local", "debug")


@dataclass
class ModelConfig:
    """A transformers decoder built from its architecture numbers (random init, no download)."""

    name: str = MISSING
    family: str = MISSING  # one of FAMILIES
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_hidden_layers: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    vocab_size: int = MISSING
    head_dim: int | None = None
    max_position_embeddings: int = 8192
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    path: str | None = None  # a local checkpoint directory: load its weights instead of random init
    # true: the causal-LM loss in chunks of tokens, never the whole logits in fp32
    # (harness.run.chunked_loss); the same for every method
    chunked_loss: bool = False
    # true: lm_head and the loss a chunk of the vocabulary at a time (forge.head.install):
    # neither the logits nor their gradient ever whole
    chunked_head: bool = False


@dataclass
class MethodConfig:
    """One training method: `name` picks the implementation, `options` are its own settings."""

    name: str = MISSING  # a method of harness.run.methods.registry(), or "package.module:Class"
    label: str = MISSING  # unique within a sweep; by convention the conf/method file name
    title: str | None = None  # how the docs' tables name this configuration; None: its label
    lr: float = 1e-4
    options: dict[str, Any] = field(default_factory=dict)
    dtype: str | None = None  # weight dtype for this method (one of DTYPES); None: the top-level dtype
    # "bf16": forward and loss under torch.autocast to bf16 (mixed precision over the method's
    # weights, normally fp32: the usual fp32-master-weights recipe); None: plain, in the weight dtype
    autocast: str | None = None
    # true: capture the whole step (forward, backward, update) once in a CUDA graph and replay it
    # every step, so Python launches nothing per step (harness.run.graphs); one GPU, capturable methods
    cuda_graph: bool = False
    # true: the model's forward (and with it the backward) compiled by torch.compile (Inductor); the
    # optimizer step as the method takes it. FORGE's fused update is a custom op in the graph (forge.ops)
    compile: bool = False


@dataclass
class GpuConfig:
    """A kind of card a point is measured as: the real one, or a smaller one emulated by a memory
    cap. conf/gpu/NAME.yaml owns the kind's facts (harness.run.gpus reads them for the runner, the
    hardware check and the report); a record keeps them in its `config.gpu`."""

    name: str = MISSING
    memory_cap_gib: float | None = None  # cap via torch.cuda.set_per_process_memory_fraction
    # PYTORCH_CUDA_ALLOC_CONF of each point's process, e.g. "expandable_segments:True" (segments
    # that grow in place instead of new blocks: less fragmentation under a cap); None: torch's default
    allocator: str | None = None
    # how the card names itself (torch.cuda.get_device_name(), NVML): a regular expression searched
    # in that name, case ignored; a real card (no memory cap) must have one, the CPU has none
    device_name: str | None = None
    memory_gib: float | None = None  # the memory the card gives a process, GiB (where a record lacks it)
    peak_tflops: float | None = None  # one card's dense bf16 tensor-core peak, TFLOP/s: what MFU is of
    # ceilings measured on the card, the rates the report's step floors are drawn at:
    matmul_tflops: float | None = None  # bf16 matmul, TFLOP/s
    copy_tbps: float | None = None  # device-to-device copy, TB/s (bytes read + written)


@dataclass
class SweepConfig:
    """Which points a sweep runs. Empty lists mean "just the value composed at the top level"."""

    name: str = "adhoc"
    mode: str = "grid"  # grid: every combination; capacity: largest batch that fits, by bisection
    methods: list[str] = field(default_factory=list)  # conf/method names
    models: list[str] = field(default_factory=list)  # conf/model names
    batch_sizes: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    activation_checkpointing: list[bool] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)  # fnmatch patterns on point ids to leave out
    max_batch_size: int = 64  # capacity mode: stop doubling here
    scratch: bool = False  # results_dir is throwaway: the harness puts a .gitignore in it
    rerun: bool = False  # run points already recorded again (new records appended) instead of skipping them
    # Points run at once on one GPU. Sharing the GPU falsifies step times and the device's memory
    # peak, so more than 1 is allowed only for convergence sweeps, which claim losses, not speed.
    concurrent_points: int = 1


@dataclass
class LauncherConfig:
    """Where a sweep's points run: `local`, each in a fresh subprocess here, or `slurm`, each as
    one Slurm job through submitit (harness.run.slurm). The other fields are Slurm's."""

    name: str = "local"  # one of LAUNCHERS
    # slurm: sbatch; local and debug: submitit's LocalExecutor and DebugExecutor, which run the
    # jobs on this machine the way Slurm would, for tests and for debugging a launch without a cluster
    executor: str = "slurm"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: int | None = None  # minutes per job; None: the point's timeout_s plus 10 minutes
    gpus_per_node: int | None = None  # None: the point's `gpus` (0 for a CPU point)
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    constraint: str | None = None  # sbatch --constraint, e.g. a GPU feature of the cluster ("h200")
    array_parallelism: int = 256  # jobs of the sweep's array running at once
    setup: list[str] = field(default_factory=list)  # shell lines run before each job (module load ...)
    folder: str = ".cache/submitit"  # submitit's job files and logs, on a shared disk (relative: to the repo)


@dataclass
class PhaseConfig:
    """One phase of a convergence run: `steps` steps on one corpus (harness.run.data.CORPORA)."""

    name: str = MISSING  # e.g. "pretrain", "cpt"
    corpus: str = MISSING  # a key of harness.run.data.CORPORA
    steps: int = MISSING
    lr_scale: float = 1.0  # peak lr of this phase = method.lr * lr_scale
    warmup_steps: int = 0  # linear warm-up, then cosine decay to min_lr_ratio * peak
    # branched runs: the first step of this phase a branch starts at (then every branch_every);
    # e.g. past the warm-up, where a branch from the random initialisation scatters the most
    branch_from: int = 0


@dataclass
class ConvergenceConfig:
    """Train on real text and record every step's loss (harness.run.convergence).

    Off by default: a point then measures step time on a fixed random batch (harness.run.runner)."""

    enabled: bool = False
    phases: list[PhaseConfig] = field(default_factory=list)
    eval_every: int = 100  # held-out loss every N steps (and at each phase's start and end)
    eval_batches: int = 4  # held-out batches of batch_size x seq_len tokens
    min_lr_ratio: float = 0.1
    reference: str | None = None  # method label whose curve the others are compared with
    # Branched fidelity (harness.run.branches): > 0 starts the method from the fp32 reference's
    # state every `branch_every` steps of each phase, for `branch_steps` steps; 0 (off): each
    # method trains its own trajectory
    branch_every: int = 0
    branch_steps: int = 50
    # where a branched run's fp32 reference trajectory is kept, shared by every method of a seed
    # (harness.run.branch_reference; relative: to the repo)
    reference_cache: str = ".cache/branch_references"
    data_dir: str = ".cache/convergence"  # prepared corpora and tokenizers (relative: to the repo)


@dataclass
class MeasureConfig:
    """Optional measurements beyond step time and the memory peaks, each off by default: it costs
    time or perturbs the process, so only the experiments that report it turn it on."""

    # true: after the timed steps, one more eager step under the CUDA allocator's history
    # (torch.cuda.memory._record_memory_history), and the memory at its peak split into weights,
    # optimizer states, gradients, activations and the rest from the allocator's own record
    # (harness.run.peak_pools); CUDA, one GPU, eager steps
    peak_pools: bool = False
    # true: after the timed steps, train the method's torch.optim reference in fp32 from the same
    # initial weights on the same batch, and record how far the point ended from it
    # (harness.run.fidelity); it holds an fp32 copy of the weights: for the small models a CPU trains
    fidelity: bool = False


@dataclass
class Config:
    """One point (and, through `sweep`, the grid it belongs to)."""

    model: ModelConfig = MISSING
    method: MethodConfig = MISSING
    gpu: GpuConfig = MISSING
    sweep: SweepConfig = field(default_factory=SweepConfig)
    batch_size: int = 1
    seq_len: int = 1024
    steps: int = 20  # warm-up included
    warmup_steps: int = 5
    activation_checkpointing: bool = False
    dtype: str = "bf16"  # weight dtype, one of DTYPES
    device: str = "auto"  # one of DEVICES
    seed: int = 0
    gpus: int = 1  # >1: tensor parallel over this many GPUs, one torchrun process each (harness.run.launch)
    timeout_s: float = 1800.0  # per point, then status=error
    check_training: bool = True  # require that parameters moved and the loss fell
    results_dir: str = "results"
    convergence: ConvergenceConfig = field(default_factory=ConvergenceConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


ConfigStore.instance().store(name="base_config", node=Config)


SEARCH_PATH_OVERRIDE = "hydra.searchpath="


def conf_dirs(overrides: Sequence[str] = ()) -> list[Path]:
    """Where configs are found: conf/, then each folder a `hydra.searchpath=[file://DIR,...]`
    override adds (Hydra composes from the same folders, in the same order)."""
    dirs = [CONF_DIR]
    for override in overrides:
        if override.startswith(SEARCH_PATH_OVERRIDE):
            entries = override[len(SEARCH_PATH_OVERRIDE) :].strip("[]").split(",")
            dirs += [Path(e.strip().strip("'\"").removeprefix("file://")) for e in entries if e.strip()]
    return dirs


def config_file(group: str, name: str, overrides: Sequence[str] = ()) -> Path | None:
    """conf/GROUP/NAME.yaml in the first folder of `conf_dirs` that has it, or None."""
    return next((p for d in conf_dirs(overrides) if (p := d / group / f"{name}.yaml").is_file()), None)


def group_choices(group: str, overrides: Sequence[str] = ()) -> list[str]:
    """The names available in one config group, e.g. group_choices("method")."""
    return sorted({p.stem for d in conf_dirs(overrides) for p in (d / group).glob("*.yaml")})


def describe_choice(group: str, name: str, overrides: Sequence[str] = ()) -> str:
    """What conf/GROUP/NAME.yaml is, in one line: the first line of its leading comment."""
    path = config_file(group, name, overrides)
    if path is None:
        raise ConfigError(
            f"{group}={name!r} is not valid; choose one of: {', '.join(group_choices(group, overrides))}"
        )
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text and not text.startswith("@package"):
            return text
    return "(no description: start the file with a one-line comment)"


def _valid_keys_hint(message: str) -> str:
    """For "Key 'x' not in ..." errors, list the keys valid at that level of the schema."""
    match = re.search(r"full_key: ([\w.]+)", message)
    if not match or "not in" not in message:
        return ""
    *parents, key = match.group(1).split(".")
    schema: Any = Config
    for part in parents:
        schema = typing.get_type_hints(schema).get(part) if dataclasses.is_dataclass(schema) else None
    if not dataclasses.is_dataclass(schema):
        return ""
    keys = [f.name for f in dataclasses.fields(schema)]
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f"\nValid keys here: {', '.join(keys)}"
    return hint + (f" (did you mean '{close[0]}'?)" if close else "")


def _chain(e: BaseException) -> str:
    """The message of an exception and of its causes (Hydra keeps the useful part in the cause)."""
    parts = []
    while e is not None:
        if str(e) and str(e) not in parts:
            parts.append(str(e))
        e = e.__cause__ or e.__context__
    return "\n".join(parts)


GROUP_NAMES = {
    "exp": "experiment",
    "method": "method",
    "model": "model",
    "gpu": "GPU kind",
    "launcher": "launcher",
}


def closest(name: str, choices: Sequence[str], n: int = 3) -> list[str]:
    """The `n` choices most like `name`: by difflib's ratio, those holding its letters whole
    (`adamw9` -> `fused_adamw`) counted as close; none below 0.6."""
    stem = name.rstrip("0123456789_-")

    def score(choice: str) -> tuple[float, float]:
        ratio = difflib.SequenceMatcher(None, name, choice).ratio()
        return (max(ratio, 0.9 if len(stem) >= 3 and stem in choice else 0.0), ratio)

    ranked = sorted(choices, key=lambda c: (score(c), -len(c)), reverse=True)
    return [c for c in ranked[:n] if score(c)[0] >= 0.6]


def unknown_choice(overrides: Sequence[str]) -> str | None:
    """For the first override that picks a config file that no folder has (`+exp=llama8b_h20`,
    `method=forge_bf17`), what to say: the closest names, not Hydra's search path; else None."""
    for override in overrides:
        key, sep, name = override.partition("=")
        group = key.lstrip("+~")
        if not sep or group not in GROUP_NAMES or "," in name or config_file(group, name, overrides):
            continue
        close = closest(name, group_choices(group, overrides))
        hint = f"did you mean {' or '.join(close)}?" if close else "none is close"
        what = f"{override}: no {GROUP_NAMES[group]} named {name!r}"
        return f"{what}; {hint} (`python -m harness list` names them all)"
    return None


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose conf/config.yaml with Hydra overrides, then validate. Raises ConfigError."""
    overrides = list(overrides or [])
    typo = unknown_choice(overrides)
    if typo is not None:
        raise ConfigError(typo)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        message = _chain(e)
        raise ConfigError(message + _valid_keys_hint(message)) from None
    _check_schema(cfg)
    validate(cfg)
    return cfg


def _check_schema(cfg: DictConfig) -> None:
    """Refuse keys the schema lacks: Hydra's `+key=value` opens the config to append one, and the
    worker's `from_dict` would refuse it only when each point starts. Only keys can be wrong here
    (Hydra typed every value it set against the schema)."""
    unknown = _unknown_keys(cfg, Config)
    if unknown:
        full_key, schema = unknown[0]
        message = f"Key '{full_key.split('.')[-1]}' not in '{schema.__name__}'\n    full_key: {full_key}"
        raise ConfigError(message + _valid_keys_hint(message))


def _unknown_keys(node: Any, schema: Any, prefix: str = "") -> list[tuple[str, type]]:
    """(full key, the dataclass it is not a field of) for every key of `node` below a dataclass of
    the schema that names no field (free-form dicts, such as a method's options, are not walked)."""
    if not isinstance(node, DictConfig) or not dataclasses.is_dataclass(schema):
        return []
    hints = typing.get_type_hints(schema)
    found = []
    for key, value in node.items_ex(resolve=False):
        if key not in hints:
            found.append((f"{prefix}{key}", schema))
            continue
        hint = hints[key]
        inner = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]  # Optional[Dataclass]
        found += _unknown_keys(value, inner[0] if inner else hint, f"{prefix}{key}.")
    return found


def _choice(key: str, value: Any, choices: tuple[str, ...] | list[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def _positive(key: str, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{key}={value} must be positive")


def _validate_sweep(sweep: Any, convergence: bool) -> None:
    _choice("sweep.mode", sweep.mode, SWEEP_MODES)  # method and model names: Hydra checks them
    _positive("sweep.concurrent_points", sweep.concurrent_points)
    if sweep.concurrent_points > 1 and not convergence:
        raise ConfigError(
            f"sweep.concurrent_points={sweep.concurrent_points}: points that share a GPU time and "
            "measure memory wrongly; run more than one at a time only with convergence.enabled=true"
        )
    for b in sweep.batch_sizes:
        _positive("sweep.batch_sizes entry", b)
    for s in sweep.seq_lens:
        _positive("sweep.seq_lens entry", s)


def _validate_convergence(conv: Any) -> None:
    from harness.run.data import CORPORA  # light: no tokenizer or torch import

    if not conv.enabled:
        return
    if not conv.phases:
        raise ConfigError("convergence.enabled=true needs at least one entry in convergence.phases")
    for i, phase in enumerate(conv.phases):
        _choice(f"convergence.phases[{i}].corpus", phase.corpus, sorted(CORPORA))
        _positive(f"convergence.phases[{i}].steps", phase.steps)
        _positive(f"convergence.phases[{i}].lr_scale", phase.lr_scale)
    for key in ("eval_every", "eval_batches"):
        _positive(f"convergence.{key}", conv[key])
    if conv.branch_every < 0:
        raise ConfigError(
            f"convergence.branch_every={conv.branch_every} is not valid: 0 (off) or a number of steps"
        )
    if conv.branch_every:
        _positive("convergence.branch_steps", conv.branch_steps)
        short = [p.name for p in conv.phases if p.steps < conv.branch_steps]
        if short:
            raise ConfigError(
                f"convergence.branch_steps={conv.branch_steps} is longer than phase(s) {short}: a branch "
                "runs within one phase; lower branch_steps or lengthen the phase"
            )
        for i, phase in enumerate(conv.phases):
            last = phase.steps - conv.branch_steps  # the last step a branch can start at
            if not 0 <= phase.branch_from <= last:
                raise ConfigError(
                    f"convergence.phases[{i}].branch_from={phase.branch_from} leaves phase "
                    f"{phase.name!r} no branch: a branch of {conv.branch_steps} steps starts at step 0 to "
                    f"{last} of its {phase.steps}; lower branch_from or branch_steps"
                )


def _validate_launcher(cfg: DictConfig) -> None:
    """The Slurm options, before any job is submitted (sbatch would only say "invalid" later)."""
    launcher = cfg.launcher
    _choice("launcher.name", launcher.name, LAUNCHERS)
    if launcher.name == "local":
        defaults = OmegaConf.structured(LauncherConfig)
        given = [k for k in defaults if k != "name" and launcher[k] != defaults[k]]
        if given:
            raise ConfigError(
                f"launcher.{given[0]} is a Slurm option, and the points run locally; add launcher=slurm "
                "to run them as Slurm jobs, or drop it"
            )
        return
    _choice("launcher.executor", launcher.executor, EXECUTORS)
    if launcher.time is not None and launcher.time <= 0:
        raise ConfigError(
            f"launcher.time={launcher.time} must be a positive number of minutes "
            "(or null: the point's timeout_s plus 10 minutes)"
        )
    for key in ("cpus_per_task", "mem_gb", "array_parallelism"):
        if launcher[key] is not None and launcher[key] <= 0:
            raise ConfigError(f"launcher.{key}={launcher[key]} must be positive (or null: Slurm's default)")
    if launcher.gpus_per_node is not None and launcher.gpus_per_node < 0:
        raise ConfigError(f"launcher.gpus_per_node={launcher.gpus_per_node} must be >= 0 (or null)")
    needed = 0 if "cpu" in (cfg.device, cfg.gpu.name) else cfg.gpus
    if launcher.gpus_per_node is not None and launcher.gpus_per_node < needed:
        raise ConfigError(
            f"launcher.gpus_per_node={launcher.gpus_per_node}, but each point needs {needed} GPU(s) "
            f"(gpus={cfg.gpus}, gpu={cfg.gpu.name}); set launcher.gpus_per_node={needed}, or leave it "
            "null to request the point's gpus"
        )
    if cfg.sweep.concurrent_points > 1:
        raise ConfigError(
            f"sweep.concurrent_points={cfg.sweep.concurrent_points} shares one GPU between points; "
            "with launcher=slurm every point is a job of its own: leave sweep.concurrent_points at 1"
        )


def _validate_gpu(gpu: Any) -> None:
    """A conf/gpu kind's facts: positive numbers, a name pattern that compiles, and one for a real card."""
    for key in ("memory_cap_gib", "memory_gib", "peak_tflops", "matmul_tflops", "copy_tbps"):
        _positive(f"gpu.{key}", gpu[key])
    if gpu.device_name is not None:
        try:
            re.compile(gpu.device_name)
        except re.error as e:
            raise ConfigError(
                f"gpu.device_name={gpu.device_name!r} is not a regular expression: {e}"
            ) from None
    elif gpu.name != "cpu" and gpu.memory_cap_gib is None:
        raise ConfigError(
            f"gpu={gpu.name} is a real card (no memory_cap_gib), so its conf/gpu file must say how the card "
            "names itself: add device_name, a regular expression found in torch.cuda.get_device_name() "
            "(e.g. device_name: H200)"
        )


def _validate_cuda_graph(cfg: DictConfig) -> None:
    """What a captured step cannot do here (a method or device that cannot capture is a record:
    `unavailable`, from `methods.unavailable_reason`)."""
    if cfg.method.compile and cfg.method.cuda_graph:
        raise ConfigError(
            "method.compile=true with method.cuda_graph=true: measure one at a time (torch.compile's own "
            "CUDA graphs are its mode='reduce-overhead'); set one of them to false"
        )
    if not cfg.method.cuda_graph:
        return
    if cfg.gpus > 1:
        raise ConfigError(
            f"method.cuda_graph=true with gpus={cfg.gpus}: CUDA graphs are single-GPU here (tensor "
            "parallelism's collectives are not captured); set gpus=1 or method.cuda_graph=false"
        )
    if cfg.convergence.enabled:
        raise ConfigError(
            "method.cuda_graph=true with convergence.enabled=true: a convergence run changes the "
            "learning rate every step, which fused AdamW's captured step would freeze (a float lr "
            "is baked into its graph); set method.cuda_graph=false"
        )


def _validate_measure(cfg: DictConfig) -> None:
    """What the optional measurements need (a CPU point records them as null, with a note)."""
    if cfg.measure.fidelity and (cfg.gpus > 1 or cfg.convergence.enabled or cfg.method.cuda_graph):
        raise ConfigError(
            "measure.fidelity=true trains the method's reference beside an eager one-GPU (or CPU) "
            "step-time point; set gpus=1, convergence.enabled=false and method.cuda_graph=false, or "
            "measure.fidelity=false"
        )
    if not cfg.measure.peak_pools:
        return
    if cfg.method.cuda_graph:
        raise ConfigError(
            "measure.peak_pools=true with method.cuda_graph=true: a replayed CUDA graph allocates "
            "nothing, so the allocator's record holds no peak to split; measure the pools on eager "
            "steps (method.cuda_graph=false) or set measure.peak_pools=false"
        )
    if cfg.gpus > 1:
        raise ConfigError(
            f"measure.peak_pools=true with gpus={cfg.gpus}: the pools are read from one GPU's "
            "allocator; set gpus=1 or measure.peak_pools=false"
        )
    if cfg.convergence.enabled:
        raise ConfigError(
            "measure.peak_pools=true with convergence.enabled=true: the pools are measured on a "
            "step-time point's fixed batch; set measure.peak_pools=false"
        )


def validate(cfg: DictConfig) -> None:
    """Check what the types cannot: choices, ranges, the method and its options. Raises ConfigError."""
    from harness.run import methods

    _choice("dtype", cfg.dtype, DTYPES)
    _choice("device", cfg.device, DEVICES)
    _choice("model.family", cfg.model.family, FAMILIES)
    for key in ("batch_size", "seq_len", "steps", "timeout_s", "gpus"):
        _positive(key, cfg[key])
    _validate_gpu(cfg.gpu)
    allocator = cfg.gpu.allocator
    if allocator is not None and not re.fullmatch(r"\w+:[\w.]+(,\w+:[\w.]+)*", str(allocator)):
        raise ConfigError(
            f"gpu.allocator={allocator!r} is not a PYTORCH_CUDA_ALLOC_CONF value; "
            "write option:value pairs separated by commas, e.g. gpu.allocator=expandable_segments:True"
        )
    if not 0 <= cfg.warmup_steps < cfg.steps:
        raise ConfigError(f"warmup_steps={cfg.warmup_steps} must be >= 0 and < steps={cfg.steps}")
    if cfg.method.dtype is not None:
        _choice("method.dtype", cfg.method.dtype, DTYPES)
    if cfg.method.autocast is not None:
        _choice("method.autocast", cfg.method.autocast, AUTOCAST_DTYPES)
    _validate_sweep(cfg.sweep, cfg.convergence.enabled)
    _validate_convergence(cfg.convergence)
    methods.validate(cfg.method.name, OmegaConf.to_container(cfg.method.options, resolve=True))
    _validate_cuda_graph(cfg)
    _validate_measure(cfg)
    _validate_launcher(cfg)
    if cfg.gpus > 1 and not methods.get(cfg.method.name).tensor_parallel:
        raise ConfigError(
            f"method {cfg.method.label!r} does not run tensor-parallel (gpus={cfg.gpus}); methods that do: "
            + ", ".join(n for n, c in methods.registry().items() if c.tensor_parallel)
        )
    _validate_data_parallel(cfg)
    _validate_chunked_head(cfg)


def _validate_chunked_head(cfg: DictConfig) -> None:
    """What `model.chunked_head` does not run with, refused before anything is built."""
    from harness.run import methods

    if not cfg.model.chunked_head:
        return
    if cfg.model.chunked_loss:
        raise ConfigError(
            "model.chunked_head=true already computes the loss in chunks (of the vocabulary); "
            "set model.chunked_loss=false, or pick one of the two"
        )
    refused = None
    if cfg.gpus > 1:
        refused = f"gpus={cfg.gpus} (lm_head is applied whole on one process)"
    elif cfg.method.compile:
        refused = "method.compile=true (the head's loss runs eagerly)"
    elif cfg.method.options.get("max_grad_norm") is not None:
        refused = "method.options.max_grad_norm (clipping needs every gradient before any update)"
    elif (why := methods.get(cfg.method.name).refuses_chunked_head) is not None:
        refused = f"method {cfg.method.label!r} ({why})"
    if refused:
        raise ConfigError(
            f"model.chunked_head=true does not run with {refused}; set model.chunked_head=false"
        )


def _validate_data_parallel(cfg: DictConfig) -> None:
    """A data-parallel method (`method.options.data_parallel`) needs several ranks to share out."""
    wrapper = cfg.method.options.get("data_parallel")
    if wrapper is not None and cfg.gpus < 2:
        raise ConfigError(
            f"method {cfg.method.label!r} trains under {wrapper} (method.options.data_parallel), which needs "
            f"several GPUs, one process each: set gpus=2 or more (gpus={cfg.gpus}), or pick the method "
            "without the wrapper for one GPU"
        )


def weight_dtype(cfg: DictConfig) -> str:
    """The dtype the point's weights are built in: the method's own, else the top-level one."""
    return cfg.method.dtype or cfg.dtype


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain JSON-able data (what a record stores and a worker receives)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def from_dict(data: dict[str, Any]) -> DictConfig:
    """Rebuild and re-validate a config from `to_dict`'s output (in the worker subprocess)."""
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), data)
    except OmegaConfBaseException as e:
        raise ConfigError(str(e)) from None
    validate(cfg)  # type: ignore[arg-type]
    return cfg  # type: ignore[return-value]
