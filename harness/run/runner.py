"""One sweep point, in this process: build, train a few steps, measure, check, make a record.

    record = run_point(cfg, point="fused_adamw/llama3.1-8b/b1/s1024/h200")

The procedure: resolve the device (and the memory cap of an emulated card), stamp the
environment, stop early with `unavailable` if the method cannot run here, build the model and the
method (and let it `prime`: one-time work, such as autotuning, outside what is measured), then
time `cfg.steps` whole steps from a fixed batch, with the allocator and NVML peaks around them.
A method that trains must have moved its parameters and lowered the loss; if not, the point is an
`error` however fast it was. With `measure.peak_pools`, one more step runs after
the timed ones with the CUDA allocator's history on, for the pools at its peak
(`harness.run.peak_pools`). OOM is a result (`oom`), a NaN or inf loss is
`diverged`, any other exception is `error` with its message. The worker subprocess
(`harness.run.worker`) wraps this so that nothing carries from one point to the next.

The record is `harness.results.Record`, started by `harness.run.record.for_point` (what the config
says) and filled here with what was measured (`Trained`: the record's fields, and what the verdict
and the throughput need beside them).
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from harness.results import Record
from harness.run import (
    architecture,
    chunked_loss,
    data_parallel,
    env,
    fidelity,
    gpus,
    measure,
    methods,
    models,
    peak_pools,
)
from harness.run import config as config_mod
from harness.run import record as point_record
from harness.run.measure import GIB, gib

SNAPSHOT_ELEMENTS = 4096  # per parameter, to check that it moved


class Unavailable(Exception):
    """The method cannot run on this machine (raised from setup; recorded as `unavailable`)."""


@dataclass
class Trained:
    """What training a point gave: the record's measured fields (`fields`, names of
    `harness.results.Record`), whether the method updates its weights at all (`trains`: the
    did-it-train check applies) and the model's training FLOPs a token (for mfu)."""

    fields: dict[str, Any]
    trains: bool
    flops_per_token: float


def peak_tflops(cfg: DictConfig, gpu_name: str | None) -> float | None:
    """The dense bf16 peak of all the GPUs a point uses (`gpus` of them under tensor parallelism):
    its card's `gpu.peak_tflops`, or, for an emulated card (a memory cap on a larger one), that of
    the card it runs on, recognized by its name among conf/gpu's kinds."""
    card = cfg.gpu if cfg.gpu.memory_cap_gib is None else gpus.recognize(gpu_name)
    one = None if card is None else card.peak_tflops
    return None if one is None else float(one) * cfg.gpus


def apply_memory_cap(cap_gib: float | None, device: str) -> str | None:
    """Cap this process's CUDA allocator to emulate a smaller card; returns a note if it cannot."""
    if cap_gib is None:
        return None
    if device != "cuda":
        return f"memory cap {cap_gib} GiB not enforced without CUDA"
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total))
    return None


def _head(p: torch.Tensor) -> torch.Tensor:
    """The first elements of this process's part of p (a tensor-parallel shard: its local shard)."""
    p = p.detach()
    p = p.to_local() if hasattr(p, "to_local") else p
    return p.reshape(-1)[:SNAPSHOT_ELEMENTS]


def _snapshot(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [_head(p).clone() for p in params]


def _moved_fraction(before: list[torch.Tensor], params: list[torch.Tensor]) -> float:
    moved = [not torch.equal(b, _head(p)) for b, p in zip(before, params)]
    return sum(moved) / max(1, len(moved))


def build_method(cfg: DictConfig, device: str) -> tuple[torch.nn.Module, methods.Method]:
    """The point's model (from its seed, in its weight dtype) and its method, set up."""
    options = methods.make_options(cfg.method.name, config_mod.to_dict(cfg.method.options))
    parallel = data_parallel.kind_of(options)
    model = models.build(
        cfg.model,
        config_mod.weight_dtype(cfg),
        device,
        cfg.activation_checkpointing,
        cfg.seed,
        tensor_parallel=parallel is None,
    )
    method = methods.get(cfg.method.name)(model, cfg.method.lr, options, device)
    if parallel is not None:  # the method trains the wrapper; the runner measures the model inside
        method.model = data_parallel.wrap(model, parallel)
    method.autocast = cfg.method.autocast
    method.cuda_graph = cfg.method.cuda_graph
    method.compile = cfg.method.compile
    try:
        method.setup()
    except ImportError as e:
        raise Unavailable(f"{cfg.method.name} cannot be imported here: {type(e).__name__}: {e}") from e
    return model, method


def train_and_measure(cfg: DictConfig, device: str, sampler: measure.NvmlSampler) -> Trained:
    """Build, time the steps, collect memory: the measured fields of the record."""
    seed = data_parallel.batch_seed(cfg.seed, data_parallel.kind_of(cfg.method.options))
    batch = models.random_batch(cfg.model.vocab_size, cfg.batch_size, cfg.seq_len, device, seed)
    model, method = build_method(cfg, device)
    method.prime(batch)
    params = method.params()
    before = _snapshot(params)
    initial = fidelity.snapshot(model) if cfg.measure.fidelity else None
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    sampler.start()
    compiles: list[int] = []
    with measure.ForwardEndMemory(model, device) as forward_end:
        losses, times = measure.timed_steps(lambda: method.step(batch), cfg.steps, device, compiles)
    nvml_peak = sampler.stop()
    late = {i: c for i, c in enumerate(compiles) if c and i >= cfg.warmup_steps}
    if late:
        method.notes.append(
            f"Triton compiled {sum(late.values())} kernel(s) during timed steps "
            f"{sorted(late)} (0-based, warm-up included): those steps' times include compiling"
        )
    peaks = measure.cuda_peaks(device)
    weights = measure.nbytes(params)
    out = {
        "n_params": architecture.n_params(model),
        "master_weights": method.master_weights(),
        "losses": losses,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "step_times_ms": times[cfg.warmup_steps :],
        "params_moved_frac": _moved_fraction(before, params),
        "peak_alloc_gib": gib(peaks["peak_alloc"]),
        "peak_reserved_gib": gib(peaks["peak_reserved"]),
        "peak_nvml_gib": gib(nvml_peak),
        "forward_end_alloc_gib": gib(forward_end.bytes),
        "notes": list(method.notes),
    }
    if cfg.model.chunked_loss:
        out["notes"].append(chunked_loss.memory_note(cfg.model.vocab_size, cfg.batch_size * cfg.seq_len))
    if cfg.model.chunked_head:
        out["notes"].append(chunked_loss.head_note(cfg.model.vocab_size, cfg.batch_size * cfg.seq_len))
    out.update(measure.time_stats(out["step_times_ms"]))
    out.update(
        measure.breakdown(
            weights,
            method.gradient_bytes(),
            measure.nbytes(method.optimizer_state_tensors()),
            peaks["peak_alloc"],
        )
    )
    if cfg.measure.peak_pools:  # one more step, recorded: after every figure above is taken
        pools, note = peak_pools.measure(method, model, batch, device)
        out.update(pools)
        out["notes"] += [note] if note else []
    if initial is not None:  # after every figure above is taken: the reference trains in fp32
        out["fidelity"] = fidelity.measure(cfg, model, initial, batch, device)
    return Trained(out, method.trains, models.flops_per_token(model, cfg.model, cfg.seq_len))


def train_on_text(cfg: DictConfig, device: str, sampler: measure.NvmlSampler) -> Trained:
    """A convergence point (harness.run.convergence): real text, every step's loss, held-out losses."""
    from harness.run import convergence

    model, method = build_method(cfg, device)
    params = method.params()
    before = _snapshot(params)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if cfg.convergence.branch_every:
        from harness.run import branches

        try:
            out = branches.train(cfg, method, device)
        except branches.Unloadable as e:
            raise Unavailable(f"{cfg.method.label}: {e}") from e
    else:
        out = convergence.train(cfg, method)
    peaks = measure.cuda_peaks(device)
    out.update(
        n_params=architecture.n_params(model),
        master_weights=method.master_weights(),
        params_moved_frac=_moved_fraction(before, params),
        peak_alloc_gib=gib(peaks["peak_alloc"]),
        peak_reserved_gib=gib(peaks["peak_reserved"]),
        notes=list(method.notes),
    )
    out.update(measure.time_stats(out["step_times_ms"]))
    return Trained(out, method.trains, models.flops_per_token(model, cfg.model, cfg.seq_len))


def throughput(record: Record, flops_per_token: float) -> None:
    """tokens_per_s and mfu from the median step time (mfu only where the GPU's peak is known);
    under data parallelism a step trains every rank's batch."""
    median = record.step_time_ms_median
    if not median:
        return
    ranks = data_parallel.ranks_of_tokens((record.method_options or {}).get("data_parallel"))
    record.tokens_per_s = ranks * record.batch_size * record.seq_len * 1e3 / median
    if record.peak_tflops:
        record.mfu = flops_per_token * record.tokens_per_s / (record.peak_tflops * 1e12)


def verdict(
    losses: list[float], params_moved_frac: float, trains: bool, check_training: bool
) -> tuple[str, str | None]:
    """ok, or diverged / error with the reason, from the losses and the parameter check."""
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if bad is not None:
        return "diverged", f"loss became {losses[bad]} at step {bad + 1}"
    if not (trains and check_training):
        return "ok", None
    if params_moved_frac < 0.5:
        return "error", f"did not train: only {params_moved_frac:.0%} of parameter tensors changed"
    if len(losses) > 1 and not losses[-1] < losses[0]:
        return "error", f"did not train: loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})"
    return "ok", None


def _failure(e: BaseException) -> tuple[str, str]:
    if isinstance(e, torch.OutOfMemoryError):
        return "oom", str(e).strip().splitlines()[0][:500] if str(e).strip() else "out of memory"
    tail = "".join(traceback.format_exception(e)[-3:]).strip()
    return "error", f"{type(e).__name__}: {e}"[:1000] + f"\n{tail[-1500:]}"


def run_point(cfg: DictConfig, point: str = "adhoc", git: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one point in this process and return its record, as its results line holds it (never
    raises for a point's failure)."""
    return measure_point(cfg, point, git).to_json()


def measure_point(cfg: DictConfig, point: str = "adhoc", git: dict[str, Any] | None = None) -> Record:
    """Run one point in this process: its record (`run_point`'s, typed)."""
    device = env.resolve_device(cfg.device)
    sampler = measure.NvmlSampler()  # before CUDA is touched: its baseline excludes our context
    record = point_record.stamp_env(point_record.for_point(cfg, point, device), device, git)
    record.nvml_baseline_gib = gib(sampler.baseline_bytes) if device == "cuda" else None
    record.peak_tflops = peak_tflops(cfg, record.gpu_name)
    reason = methods.unavailable_reason(
        cfg.method.name, config_mod.to_dict(cfg.method.options), device, cfg.method.cuda_graph
    )
    if reason is None and cfg.device == "cuda" and not torch.cuda.is_available():
        reason = "device=cuda but no CUDA device is visible"
    if reason:
        return record.set(status="unavailable", error=reason)
    try:
        note = apply_memory_cap(cfg.gpu.memory_cap_gib, device)
        trained = (train_on_text if cfg.convergence.enabled else train_and_measure)(cfg, device, sampler)
    except Unavailable as e:
        sampler.stop()
        return record.set(status="unavailable", error=str(e))
    except Exception as e:
        sampler.stop()
        status, error = _failure(e)
        # the tables size models by n_params, whatever the status
        return record.set(status=status, error=error, n_params=architecture.n_params_of(cfg.model))
    record.set(**trained.fields)
    record.notes += [note] if note else []
    throughput(record, trained.flops_per_token)
    record.status, record.error = verdict(
        record.losses, record.params_moved_frac, trained.trains, cfg.check_training
    )
    return record
