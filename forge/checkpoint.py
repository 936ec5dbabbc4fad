"""Checkpoints of a FORGE run: model and optimizer, sharded, atomic, checked before anything loads.

    import forge.checkpoint
    forge.checkpoint.save("ckpt", model, opt, step=500, extra={"scheduler": sched.state_dict()})
    loaded = forge.checkpoint.load("ckpt", model, opt)   # the newest complete checkpoint in ckpt/
    sched.load_state_dict(loaded.extra["scheduler"]); start = loaded.step + 1

Every rank calls both (on one process, no process group is needed). The files are written by
`torch.distributed.checkpoint` (DCP): each rank writes its own shards (FSDP2 and tensor-parallel
DTensors, FORGE's states laid out like their weights), replicated tensors are written once, and a
checkpoint loads on the same or another number of ranks, sharded or not: DCP reads whatever part
of each saved tensor a rank now holds. What FORGE saves besides the weights: every state slot in
its storage dtype (fp32, bf16, int8 codes with their bf16 scales), the compensated weights' bf16
residuals, each parameter's step count, the param groups' hyperparameters, and the seed its
stochastic rounding draws from (each step's bits derive from seed, parameter and step), so a run
resumed at step k continues bit for bit as the run that never stopped did, on the same ranks.

Layout: `<directory>/step-00000500/` holds DCP's files and `forge.json`, a manifest of what was
saved (rule, state dtype, options, and every tensor's global shape and dtype). A checkpoint is
written as `step-00000500.partial` and renamed into place by one rank once every rank's files
and DCP's metadata are on disk; `load` only sees renamed ones. A process killed during a save
(even by SIGKILL) therefore leaves the previous checkpoint as the newest complete one, and the
next save clears the partial directory away; a write that fails (a full disk, on any rank) is
raised as CheckpointError, with the same guarantee.

`load` checks before it touches a tensor, on every rank together (one rank's refusal is every
rank's): that the checkpoint is FORGE's, of the same rule, state dtype, int8 group and weight
format; that every tensor the model and the optimizer hold is in it with the same global shape and
dtype, and nothing else is; and that every file DCP wrote has the size and the CRC-32 the manifest
records (the ranks share the reading; DCP keeps no checksums of its own, so a byte flipped inside a
shard would otherwise load as a wrong weight). Each refusal says what differs and what to do.

Then it reads the checkpoint into staging tensors laid out like the model's and the optimizer's
own, and only once every rank has read all of it are they copied in. Whatever fails on the way, a
file damaged after the check, an I/O error, DCP's own CheckpointException (a BaseException, which
`except Exception` would not catch) on any rank, leaves the model's parameters and buffers, the
optimizer's states, step counts, param groups and seed as they were, and raises CheckpointError
(an interrupt, KeyboardInterrupt or SystemExit, is raised as itself, with nothing changed either).
The price is memory: while it reads, `load` holds a second copy of the tensors it loads (on one GPU
and under DDP the weights and states again; under FSDP2 the rank's shards of them). On a GPU the
copy goes where it fits: on the device when it has room beside what it holds, else, for plain
tensors (one GPU, DDP), in host memory; sharded DTensors stage on their device only, and where
their copy does not fit the load is refused before it changes anything, saying so.

Under data-parallel replicas the manifest also keeps the reducer's bucket order, which a resumed
run needs to sum its gradients as the saved run did (`forge.data_parallel.GradientReducer`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from forge.distributed import is_dtensor, load_optimizer_state_dict, names_by_index, optimizer_state_dict

if TYPE_CHECKING:
    from forge.optim import ForgeOptimizer

FORMAT = 1
MANIFEST = "forge.json"
METADATA = ".metadata"  # DCP's
PARTIAL = ".partial"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_CHUNK = 16 * 2**20  # bytes read at a time for a checksum


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into this model and optimizer; nothing was changed."""


@dataclass
class Loaded:
    """What `load` restored: the checkpoint's directory, its step and the `extra` saved with it."""

    path: Path
    step: int
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- saving


def save(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: ForgeOptimizer,
    step: int,
    *,
    extra: dict[str, Any] | None = None,
    keep: int | None = None,
) -> Path:
    """Save `model` and FORGE's `optimizer` as `<directory>/step-<step>` (see the module); every rank
    calls it. `extra`: picklable objects to keep beside them (a scheduler's state_dict, the data
    position), the same on every rank. `keep`: then delete all but the newest `keep` checkpoints.
    Returns the checkpoint's path."""

    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r}: give the training step as a non-negative int")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep={keep!r}: give how many checkpoints to keep (>= 1), or None for all")
    directory = Path(directory)
    final = directory / f"step-{step:08d}"
    partial = final.with_name(final.name + PARTIAL)
    if _rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # what a killed save of this step left
    _barrier()
    state = _state(model, optimizer, extra or {})
    _write(partial, state)
    files = _checksums(partial)
    if _rank() == 0:
        manifest = {**_manifest(model, optimizer, state, step), "files": files}
        _write_file(partial / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        _publish(partial, final)
        if keep is not None:
            for old in complete_checkpoints(directory)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def _write(partial: Path, state: dict[str, Any]) -> None:
    """DCP's save of `state` into `partial`; any failure of the write, on any rank, as
    CheckpointError (an interrupt as itself), the checkpoints saved before untouched."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _single_process_quiet():
            dcp.save(state, checkpoint_id=str(partial), no_dist=not _distributed())
    except CheckpointException as e:
        rank, first = _first_failure(e)
        raise _unwritable(partial, f"{type(first).__name__} on rank {rank}: {first}") from e
    except Exception as e:
        raise _unwritable(partial, f"{type(e).__name__}: {e}") from e


def _first_failure(e) -> tuple[int, BaseException]:
    """(rank, failure) of a CheckpointException (a BaseException: every rank's failures, gathered
    by DCP): an interrupt on any rank is raised as itself, else the lowest failing rank's."""
    failures = [failure for failure, _ in e.failures.values()]
    interrupt = next((f for f in failures if isinstance(f, KeyboardInterrupt | SystemExit)), None)
    if interrupt is not None:
        raise interrupt from e
    rank, (first, _) = min(e.failures.items(), key=lambda item: item[0])
    return rank, first


def _unwritable(partial: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{partial} could not be written ({why}; its cause is chained to this error). The checkpoints "
        "saved before are untouched and the newest complete one is still the latest; free space or fix "
        "the directory, then save again (the next save clears this partial one away)."
    )


def _state(model: nn.Module, optimizer: ForgeOptimizer, extra: dict[str, Any]) -> dict[str, Any]:
    """What DCP saves and loads in place: the model's and optimizer's tensors by name, and `extra`
    pickled as one item (DCP keeps a byte stream as it is)."""
    return {
        "model": _model_state(model),
        "optimizer": optimizer_state_dict(optimizer),
        "extra": io.BytesIO(pickle.dumps(dict(extra))),
    }


def _model_state(model: nn.Module) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(_unwrapped(model))


def _unwrapped(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _manifest(
    model: nn.Module, optimizer: ForgeOptimizer, state: dict[str, Any], step: int
) -> dict[str, Any]:
    world = dist.get_world_size() if _distributed() else 1
    return {
        "format": FORMAT,
        "step": step,
        "world_size": world,
        "options": options_of(optimizer),
        "seed": optimizer.seed,
        "tensors": tensor_specs(state),
        "bucket_order": _bucket_order(optimizer),
    }


def _bucket_order(optimizer: ForgeOptimizer) -> list[str] | None:
    """The data-parallel reducer's learned bucket order by parameter name (None: no reducer, or none
    learned yet): the same on every rank, since every rank buckets as rank 0 does."""
    order = optimizer.state_dict().get("bucket_order")
    if order is None:
        return None
    names = names_by_index(optimizer)
    return [names[i] for i in order]


def _checksums(checkpoint: Path) -> dict[str, dict[str, int]] | None:
    """{file name: {bytes, crc32}} of every file DCP wrote into `checkpoint`, for rank 0's manifest
    (None elsewhere); the ranks share the reading, each a strided part of rank 0's list."""
    names = sorted(p.name for p in checkpoint.iterdir() if p.is_file()) if _rank() == 0 else None
    if not _distributed():
        return {name: _file_sum(checkpoint / name) for name in names}
    shared = [names]
    dist.broadcast_object_list(shared, src=0)
    mine = {name: _file_sum(checkpoint / name) for name in shared[0][_rank() :: dist.get_world_size()]}
    gathered = [None] * dist.get_world_size() if _rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return None if gathered is None else {k: v for part in gathered for k, v in part.items()}


def _file_sum(path: Path) -> dict[str, int]:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return {"bytes": size, "crc32": crc}


def options_of(optimizer: ForgeOptimizer) -> dict[str, Any]:
    """What a checkpoint's states only make sense under: a different value refuses the load."""
    return optimizer.storage_options()


def tensor_specs(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{dotted name: {shape, dtype}} of every tensor in `state` (DTensors by their global shape)."""
    specs = {}
    for name, value in _flatten(state):
        if isinstance(value, torch.Tensor):
            specs[name] = {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    return specs


def _flatten(value: Any, prefix: str = ""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}{key}.")
    elif isinstance(value, list | tuple) and any(isinstance(v, dict | torch.Tensor) for v in value):
        for i, item in enumerate(value):
            yield from _flatten(item, f"{prefix}{i}.")
    else:
        yield prefix[:-1], value


def _publish(partial: Path, final: Path) -> None:
    """Put the finished `partial` in place as `final` by renames (atomic on one file system); a
    checkpoint of the same step already there is replaced only once the new one is complete."""
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(partial, final)
    _sync_directory(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _write_file(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------- loading


def complete_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The complete checkpoints in `directory`, oldest step first (partial ones are not listed)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / MANIFEST).is_file() and (path / METADATA).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in `directory`, or None."""
    found = complete_checkpoints(directory)
    return found[-1] if found else None


def load(path: str | os.PathLike, model: nn.Module, optimizer: ForgeOptimizer) -> Loaded:
    """Load a checkpoint into `model` and FORGE's `optimizer`; every rank calls it. `path`: a
    checkpoint (`.../step-00000500`) or a directory of them (its newest complete one). Raises
    CheckpointError, with nothing changed, when the checkpoint does not fit or cannot be read
    whole (see the module): it is checked, read into staging tensors, and only then copied in."""
    checkpoint = _resolve(Path(path))
    state = _state(model, optimizer, {})
    manifest = _agree(lambda: _check(checkpoint, model, optimizer, state))
    staged = _staging(state, _stage_on_host(checkpoint, state))
    extra = _agree(lambda: _read(checkpoint, staged))
    optimizer_state = {**staged["optimizer"], "bucket_order": manifest.get("bucket_order")}
    try:  # its own checks run before it changes anything, and before the model is touched
        load_optimizer_state_dict(optimizer, optimizer_state)
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(
            f"{checkpoint}: the optimizer's saved state does not fit this optimizer ({e}); nothing was "
            "loaded. Attach FORGE with the same parameter groups as the run that saved it."
        ) from e
    _set_model_state(model, staged["model"])
    optimizer.seed = int(manifest["seed"])  # stochastic rounding draws from it: the saved run's bits
    return Loaded(checkpoint, int(manifest["step"]), extra)


STAGING_MARGIN = 2**30  # device bytes left free beside the staging copy, for DCP's own buffers


def _device_bytes(value: Any) -> tuple[int, int]:
    """(bytes of plain tensors, bytes of DTensors' local shards) on a GPU in the state dict `value`."""
    if isinstance(value, torch.Tensor):
        local = value.to_local() if is_dtensor(value) else value
        size = local.numel() * local.element_size() if local.is_cuda else 0
        return (0, size) if is_dtensor(value) else (size, 0)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    sizes = [_device_bytes(item) for item in items]
    return sum(s[0] for s in sizes), sum(s[1] for s in sizes)


def _stage_on_host(checkpoint: Path, state: dict[str, Any]) -> bool:
    """Whether the staging copy of a GPU rank's plain tensors goes to host memory: where the device
    has not room for all of it beside what it holds. DTensors (FSDP2, tensor parallelism) stage on
    their mesh's device only; where their shards do not fit, the load is refused before anything
    changes, with what to do."""
    plain, sharded = _device_bytes(state)
    if plain + sharded == 0:
        return False
    free = torch.cuda.mem_get_info()[0] - STAGING_MARGIN
    if plain + sharded <= free:
        return False
    if sharded > free:
        raise CheckpointError(
            f"{checkpoint}: loading reads the checkpoint into a staging copy first, so that a failed read "
            f"changes nothing; this rank's shards need {sharded / 2**30:.1f} GiB of cuda:"
            f"{torch.cuda.current_device()} and {max(free, 0) / 2**30:.1f} GiB are free beside what it "
            "holds. "
            "Nothing was loaded: load before building what else the device holds (activations, caches; "
            "torch.cuda.empty_cache() returns the allocator's unused blocks), or on more ranks."
        )
    return True


def _staging(value: Any, host: bool = False) -> Any:
    """A copy of the state dict `value` for DCP to load into: every tensor a fresh one of the same
    layout (a DTensor: the same mesh, placements and global shape), every container a new one, so
    that nothing DCP writes reaches the model or the optimizer. `host`: plain tensors in host memory
    (`_stage_on_host`), copied to their device when swapped in."""
    if isinstance(value, torch.Tensor):
        if is_dtensor(value):
            from torch.distributed.tensor import DTensor

            local = torch.empty_like(value.to_local())
            return DTensor.from_local(
                local, value.device_mesh, value.placements, run_check=False, shape=value.shape,
                stride=value.stride(),
            )  # fmt: skip
        return torch.empty_like(value, device="cpu" if host else value.device)
    if isinstance(value, dict):
        return {key: _staging(item, host) for key, item in value.items()}
    if isinstance(value, list):
        return [_staging(item, host) for item in value]
    if isinstance(value, tuple):
        return tuple(_staging(item, host) for item in value)
    if isinstance(value, io.BytesIO):
        return io.BytesIO(value.getvalue())
    return value


def _read(checkpoint: Path, staged: dict[str, Any]) -> dict[str, Any]:
    """DCP's load of `checkpoint` into `staged`, and the `extra` saved with it; any failure of the
    read, on any rank, as CheckpointError (an interrupt as itself)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _single_process_quiet():
            dcp.load(staged, checkpoint_id=str(checkpoint), no_dist=not _distributed())
        extra = staged["extra"]
        return pickle.loads(extra.getvalue()) if isinstance(extra, io.BytesIO) else extra
    except CheckpointException as e:
        rank, first = _first_failure(e)
        raise _unreadable(checkpoint, f"{type(first).__name__} on rank {rank}") from e
    except Exception as e:
        raise _unreadable(checkpoint, type(e).__name__) from e


def _unreadable(checkpoint: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{checkpoint} could not be read ({why}; its cause is chained to this error). Nothing was "
        "loaded: the model and optimizer are as they were. The checkpoint is damaged, or its files "
        "changed while they were read; load an earlier one "
        f"(forge.checkpoint.complete_checkpoints({str(checkpoint.parent)!r}))."
    )


def _resolve(path: Path) -> Path:
    if (path / MANIFEST).is_file():
        return path
    found = latest(path)
    if found is None:
        what = "does not exist" if not path.exists() else "holds no complete FORGE checkpoint"
        raise FileNotFoundError(
            f"{path} {what}: give a checkpoint directory (step-NNNNNNNN, with forge.json and .metadata) or "
            "the directory forge.checkpoint.save wrote them into"
        )
    return found


def _check(
    checkpoint: Path, model: nn.Module, optimizer: ForgeOptimizer, state: dict[str, Any]
) -> dict[str, Any]:
    """The checkpoint's manifest, once it fits this model and optimizer; else CheckpointError."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{checkpoint / MANIFEST} cannot be read ({e}): the checkpoint is damaged"
        ) from e
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{checkpoint} is in checkpoint format {manifest.get('format')!r}; this FORGE reads {FORMAT}"
        )
    _check_options(checkpoint, manifest["options"], options_of(optimizer))
    _check_tensors(checkpoint, manifest["tensors"], tensor_specs(state))
    _check_bucket_order(checkpoint, manifest.get("bucket_order"), optimizer)
    files = manifest.get("files")  # None in checkpoints written before checksums were kept
    if files is not None:  # DCP's metadata, on every rank: each reads it next
        _check_checksums(checkpoint, files, [METADATA])
    _check_files(checkpoint)
    if files is not None:  # the data files, shared between the ranks
        world, rank = (dist.get_world_size(), dist.get_rank()) if _distributed() else (1, 0)
        _check_checksums(checkpoint, files, sorted(set(files) - {METADATA})[rank::world])
    return manifest


def _check_bucket_order(checkpoint: Path, order: list[str] | None, optimizer: ForgeOptimizer) -> None:
    if order is not None and sorted(order) != sorted(names_by_index(optimizer).values()):
        raise CheckpointError(
            f"{checkpoint}/{MANIFEST} records a bucket order that does not list this optimizer's "
            "parameters, each once: the manifest is damaged. Load an earlier checkpoint "
            f"(forge.checkpoint.complete_checkpoints({str(checkpoint.parent)!r}))."
        )


def _check_checksums(checkpoint: Path, files: dict[str, dict[str, int]], names: list[str]) -> None:
    """Each of `names` of the size and CRC-32 the manifest records for it in `files`."""
    for name in names:
        file, saved = checkpoint / name, files.get(name)
        try:
            found = _file_sum(file)
        except OSError as e:
            found = {"error": f"cannot be read ({type(e).__name__})"}
        if found != saved:
            if saved is None:
                what = f"is not among the files {MANIFEST} records"
            elif "error" in found:
                what = found["error"]
            elif found["bytes"] != saved["bytes"]:
                what = f"has {found['bytes']} bytes, not the {saved['bytes']} it was saved with"
            else:
                what = "has its saved size but not its saved CRC-32 (bytes changed inside it)"
            raise CheckpointError(
                f"{file} {what}: the checkpoint is damaged. Nothing was loaded; load an earlier checkpoint "
                f"(forge.checkpoint.complete_checkpoints({str(checkpoint.parent)!r}))."
            )


def _check_options(checkpoint: Path, saved: dict[str, Any], ours: dict[str, Any]) -> None:
    differ = {key: (saved.get(key), value) for key, value in ours.items() if saved.get(key) != value}
    if differ:
        listed = ", ".join(f"{key}={a!r} (this optimizer: {b!r})" for key, (a, b) in differ.items())
        raise CheckpointError(
            f"{checkpoint} was saved by FORGE with {listed}. Attach with the checkpoint's options "
            "(forge.attach(model, rule, state_dtype=..., int8_group=..., master_weights=...)) to resume it."
        )


def _check_tensors(checkpoint: Path, saved: dict[str, Any], ours: dict[str, Any]) -> None:
    missing = sorted(set(ours) - set(saved))
    unknown = sorted(set(saved) - set(ours))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"lacks {len(missing)} tensor(s) this run holds, e.g. {missing[0]}")
        if unknown:
            parts.append(f"holds {len(unknown)} tensor(s) this run does not, e.g. {unknown[0]}")
        raise CheckpointError(
            f"{checkpoint} {' and '.join(parts)}: it was saved from another model or another choice of "
            "trained parameters. Build the same model and attach FORGE to the same parameters."
        )
    for name in sorted(ours):
        if saved[name] != ours[name]:
            a, b = saved[name], ours[name]
            raise CheckpointError(
                f"{checkpoint}: {name} was saved as {a['dtype']} {tuple(a['shape'])}, this run holds "
                f"{b['dtype']} {tuple(b['shape'])}. Build the model with the checkpoint's sizes and dtype."
            )


def _check_files(checkpoint: Path) -> None:
    """Every data file at least as long as DCP's metadata says its items reach."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(checkpoint)).read_metadata()
    except Exception as e:  # a truncated or damaged .metadata raises whatever unpickling raises
        raise CheckpointError(f"{checkpoint}/.metadata cannot be read ({type(e).__name__}): damaged") from e
    reach: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        reach[info.relative_path] = max(reach.get(info.relative_path, 0), info.offset + info.length)
    for name, needed in sorted(reach.items()):
        file = checkpoint / name
        size = file.stat().st_size if file.is_file() else None
        if size is None or size < needed:
            have = "is missing" if size is None else f"has {size} bytes of the {needed} its metadata records"
            raise CheckpointError(
                f"{file} {have}: the checkpoint is incomplete (a truncated copy?). Load an earlier "
                f"checkpoint (forge.checkpoint.complete_checkpoints({str(checkpoint.parent)!r}))."
            )


def _set_model_state(model: nn.Module, model_state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(_unwrapped(model), model_state)


def _agree(check):
    """Run `check` on every rank; if any rank raises, every rank raises (rank order's first
    message), so that no rank goes on into DCP's collectives alone."""
    try:
        result, error = check(), None
    except (CheckpointError, FileNotFoundError) as e:
        result, error = None, e
    if not _distributed():
        if error is not None:
            raise error
        return result
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, None if error is None else (type(error).__name__, str(error)))
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        if error is not None:
            raise error
        kind = FileNotFoundError if first[0] == "FileNotFoundError" else CheckpointError
        raise kind(f"another rank refused the checkpoint: {first[1]}")
    return result


# ---------------------------------------------------------------------------------- process group


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns that it assumes one process when no process group exists: here that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def _barrier() -> None:
    if _distributed():
        dist.barrier()
