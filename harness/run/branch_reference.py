"""The fp32 reference of a branched run, trained once per configuration and shared by every method.

A branched point (`harness.run.branches`) starts its method from the reference's state at every
branch start and compares the two held-out losses k steps on. The reference, torch AdamW on fp32
weights and states with fp32 arithmetic, is the same for every method of a seed and costs more
than any of them (its GEMMs are fp32). So the first point of a configuration trains it and leaves
its trajectory on disk, under `convergence.reference_cache`, and every other point reads it:

    <reference_cache>/<key>/
        pretrain-0.pt, pretrain-100.pt, ...   weights and AdamW state at each branch start
        trajectory.json                       the losses and the held-out loss k steps after each start

The key hashes everything the trajectory depends on: the model's config, the seed, batch and
sequence length, learning rate and AdamW settings, the phases and branch schedule, the corpora's
SHA-256, the torch version and the device. Points that run at once take a file lock on the key, so
one trains and the rest wait for it. trajectory.json is written last: a folder without it (a run
cut off) is trained again. A start holds 12 bytes a parameter (19 GiB for three seeds of the
88M Llama's 7 starts); delete the folder to reclaim it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from harness.run import convergence, data
from harness.run.methods.base import AdamWOptions

FORMAT = 1  # bump when what a trajectory folder holds changes


class Reference:
    """torch AdamW on fp32 weights and states (fused on CUDA, for-each elsewhere), with the
    attributes `convergence.evaluate` reads."""

    name = "fused_adamw_fp32"

    def __init__(self, cfg: DictConfig, device: str) -> None:
        from harness.run import models

        self.model = models.build(cfg.model, "fp32", device, cfg.activation_checkpointing, cfg.seed)
        hp = AdamWOptions()
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.method.lr,
            betas=tuple(hp.betas),
            eps=hp.eps,
            weight_decay=hp.weight_decay,
            fused=device == "cuda",
        )
        self.device = device

    def autocast_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # fp32 throughout

    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        loss = self.model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


@dataclass
class Phase:
    """One phase's schedule: the learning rate and the batch of every step."""

    name: str
    lrs: list[float]
    batch: Callable[[int], torch.Tensor]
    heldout: torch.Tensor
    starts: list[int]


def branch_starts(steps: int, every: int, k: int, first: int = 0) -> list[int]:
    """The steps of a phase at which a branch starts: first, first + every, ... while k steps remain."""
    return list(range(first, steps - k + 1, every))


def phases(cfg: DictConfig, corpora: dict[str, data.Corpus], device: str) -> Iterator[Phase]:
    """Every phase's learning rates and batches, as a convergence run of the same seed has them."""
    conv = cfg.convergence
    ev = convergence.Evaluator(corpora, cfg)
    for i, phase in enumerate(conv.phases):
        tokens = convergence.token_ids(corpora[phase.corpus].train)
        offsets = convergence.batch_offsets(
            tokens.numel(), cfg.batch_size, cfg.seq_len, phase.steps, cfg.seed * 1000 + i
        )
        peak = cfg.method.lr * phase.lr_scale
        lrs = [
            convergence.lr_at(s, phase.steps, peak, phase.warmup_steps, conv.min_lr_ratio)
            for s in range(phase.steps)
        ]

        def batch(s: int, tokens=tokens, offsets=offsets) -> torch.Tensor:
            return convergence.windows(tokens, offsets[s], cfg.seq_len).to(device)

        starts = branch_starts(phase.steps, conv.branch_every, conv.branch_steps, phase.branch_from)
        yield Phase(phase.name, lrs, batch, ev.inputs[phase.corpus], starts)


class Trajectory:
    """The reference's trajectory on disk: its losses, its state at each branch start, and its
    held-out loss k steps after each start."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        summary = json.loads((folder / "trajectory.json").read_text())
        self.losses: list[float] = summary["losses"]
        self._heldout = {(p, int(s)): v for p, s, v in summary["heldout"]}

    def heldout(self, phase: str, start: int) -> float:
        """The reference's held-out loss k steps after `start`."""
        return self._heldout[(phase, start)]

    def restore(self, reference: Reference, phase: str, start: int) -> None:
        """Put the reference's weights and AdamW state at `start` of `phase` into `reference`."""
        saved = torch.load(_snapshot(self.folder, phase, start), map_location=reference.device)
        reference.model.load_state_dict(saved["model"])
        reference.opt.load_state_dict(saved["opt"])


def trajectory(cfg: DictConfig, corpora: dict[str, data.Corpus], device: str) -> Trajectory:
    """The reference's trajectory for this configuration: read from the cache, or trained and
    written there first (under a lock, so concurrent points train it once)."""
    root = Path(cfg.convergence.reference_cache)
    root = root if root.is_absolute() else data.REPO / root
    folder = root / key(cfg, corpora, device)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / "trajectory.json").exists():
            _train(cfg, corpora, device, folder)
    return Trajectory(folder)


def key(cfg: DictConfig, corpora: dict[str, data.Corpus], device: str) -> str:
    """A hash of everything the reference's trajectory depends on."""
    conv = cfg.convergence
    material = {
        "format": FORMAT,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "lr": cfg.method.lr,
        "adamw": asdict(AdamWOptions()),
        "activation_checkpointing": cfg.activation_checkpointing,
        "phases": OmegaConf.to_container(conv.phases, resolve=True),
        "schedule": [conv.branch_every, conv.branch_steps, conv.eval_batches, conv.min_lr_ratio],
        "data": {name: c.manifest["files"] for name, c in corpora.items()},
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _snapshot(folder: Path, phase: str, start: int) -> Path:
    return folder / f"{phase}-{start}.pt"


def _train(cfg: DictConfig, corpora: dict[str, data.Corpus], device: str, folder: Path) -> None:
    """Train the reference through every phase, saving its state at each branch start and its
    held-out loss k steps after; trajectory.json last."""
    k = cfg.convergence.branch_steps
    reference = Reference(cfg, device)
    losses: list[float] = []
    heldout: list[list[Any]] = []
    for phase in phases(cfg, corpora, device):
        steps = len(phase.lrs)
        for s in range(steps + 1):
            if s - k in phase.starts:
                loss = convergence.evaluate(reference, phase.heldout, cfg.batch_size)
                heldout.append([phase.name, s - k, loss])
            if s in phase.starts:
                saved = {"model": reference.model.state_dict(), "opt": reference.opt.state_dict()}
                torch.save(saved, _snapshot(folder, phase.name, s))
            if s == steps:
                break
            convergence.set_lr(reference.opt, phase.lrs[s])
            losses.append(float(reference.step(phase.batch(s))))
            if not math.isfinite(losses[-1]):
                raise RuntimeError(f"the fp32 reference's loss became {losses[-1]} at {phase.name} step {s}")
    tmp = folder / "trajectory.json.tmp"
    tmp.write_text(json.dumps({"losses": losses, "heldout": heldout}))
    os.replace(tmp, folder / "trajectory.json")
