"""Convergence runs: train on real text, phase after phase, and record every step's loss.

    python -m harness sweep +exp=convergence         # pretraining, then continued pretraining
    python -m harness sweep +exp=convergence_smoke   # the same on a CPU, tiny, in about a minute

The step-time runner (`harness.run.runner`) repeats one random batch, which tells whether a method
trains at all but not whether it trains *the same* as the reference. Here a point trains its
method through `convergence.phases` (e.g. pretraining on Python's standard-library code, then
continued pretraining on Python's documentation; `harness.run.data` says where the text comes from):

- Same seed, same data order for every method: the model is built from `cfg.seed`, and the batches
  of phase i are windows of `seq_len` tokens at offsets drawn from a generator seeded with
  (seed, i), so two methods see the same tokens at the same step and their curves compare step by
  step. With fp32 weights and states FORGE should equal torch.optim to the GEMM's summation order.
- Learning rate: each phase warms up linearly to `method.lr * lr_scale`, then decays by a cosine
  to `min_lr_ratio` of that. It is written into the optimizer's param groups before the forward,
  because FORGE applies the update during backward. A param group built with another learning
  rate than `method.lr` (Muon's recipe: AdamW's rate for the embeddings and the head) follows the
  same schedule from its own peak, scaled by its rate over `method.lr`; every group of every
  optimizer the method has (`Method.optimizers`) is scheduled. The optimizers (and their state)
  carry over from one phase to the next, as when a pretraining run is resumed on new data.
- Held-out loss: on fixed, evenly spaced windows of each phase corpus's held-out split, every
  `eval_every` steps and at each phase's start and end, without gradients.

A point's record gets `losses` (every step, all phases in order), `heldout_losses` and
`heldout_steps` (the current phase's corpus), `heldout_by_corpus` (every corpus at every
evaluation: forgetting shows there), `phases` (where each starts) and `data` (the tokenizer's and
corpora's SHA-256, from the cache manifest). `harness.report.convergence_table` compares the curves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from harness.run import data, measure


def lr_at(step: int, steps: int, peak: float, warmup_steps: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup_steps`, then cosine from `peak` down to `min_ratio * peak`."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def scheduled_groups(method: Any) -> list[tuple[dict, float]]:
    """(param group, its rate over `method.lr`) for every group of the method's optimizers, read
    once before training: 1.0 for a group at `method.lr`, so its scheduled rate is the schedule's."""
    optimizers = method.optimizers()
    if not optimizers:
        raise ValueError(f"{method.name}: a convergence run needs a method with a torch optimizer in .opt")
    return [
        (group, group["lr"] / method.lr if method.lr else 1.0)
        for opt in optimizers
        for group in opt.param_groups
    ]


def set_scaled_lr(groups: list[tuple[dict, float]], lr: float) -> None:
    """The schedule's `lr` into every group, times its own scale."""
    for group, scale in groups:
        group["lr"] = lr * scale


def batch_offsets(n_tokens: int, batch_size: int, seq_len: int, steps: int, seed: int) -> torch.Tensor:
    """[steps, batch_size] window starts, the same on every machine for the same seed."""
    if n_tokens <= seq_len:
        raise ValueError(f"a corpus of {n_tokens} tokens cannot give windows of seq_len={seq_len}")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - seq_len, (steps, batch_size), generator=g)


def windows(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Token windows [len(starts), seq_len] starting at `starts`."""
    return tokens[starts[:, None] + torch.arange(seq_len)]


def heldout_windows(tokens: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    """Up to `n` non-overlapping windows, evenly spaced over the held-out split."""
    fit = max(1, (tokens.numel() - 1) // seq_len)
    starts = torch.linspace(0, (fit - 1) * seq_len, min(n, fit)).long()
    return windows(tokens, starts, seq_len)


@torch.no_grad()
def evaluate(method: Any, inputs: torch.Tensor, batch_size: int) -> float:
    """Mean causal-LM loss over `inputs`, batch by batch, in the precision the method trains in."""
    with method.autocast_context():
        losses = [
            method.model(input_ids=chunk.to(method.device), labels=chunk.to(method.device))
            .loss.float()
            .item()
            for chunk in inputs.split(batch_size)
        ]
    return sum(losses) / len(losses)


@dataclass
class Curves:
    """What a run records as it goes."""

    losses: list[float] = field(default_factory=list)
    times_ms: list[float] = field(default_factory=list)
    heldout_steps: list[int] = field(default_factory=list)
    heldout_losses: list[float] = field(default_factory=list)
    by_corpus: dict[str, dict[str, list]] = field(default_factory=dict)
    phases: list[dict[str, Any]] = field(default_factory=list)


class Evaluator:
    """Held-out losses of every corpus, each evaluated at most once per step."""

    def __init__(self, corpora: dict[str, data.Corpus], cfg: DictConfig) -> None:
        n = cfg.convergence.eval_batches * cfg.batch_size
        self.inputs = {
            name: heldout_windows(token_ids(c.heldout), cfg.seq_len, n) for name, c in corpora.items()
        }
        self.batch_size = cfg.batch_size
        self.last_step: int | None = None

    def __call__(self, method: Any, step: int, current: str, curves: Curves) -> None:
        if self.last_step != step:
            for name, inputs in self.inputs.items():
                entry = curves.by_corpus.setdefault(name, {"steps": [], "losses": []})
                entry["steps"].append(step)
                entry["losses"].append(evaluate(method, inputs, self.batch_size))
            self.last_step = step
        curves.heldout_steps.append(step)
        curves.heldout_losses.append(curves.by_corpus[current]["losses"][-1])


def token_ids(array: np.ndarray) -> torch.Tensor:
    """A corpus's token array (`harness.run.data`) as the int64 ids a model takes."""
    return torch.from_numpy(array.astype(np.int64))


def optimizer_of(method: Any) -> torch.optim.Optimizer:
    """The method's optimizer (its param groups carry the learning rate we schedule)."""
    opt = getattr(method, "opt", None)
    if not isinstance(opt, torch.optim.Optimizer):
        raise ValueError(f"{method.name}: a convergence run needs a method with a torch optimizer in .opt")
    return opt


def load_corpora(cfg: DictConfig) -> dict[str, data.Corpus]:
    """Every corpus the phases name, tokenized with the model's vocabulary size."""
    names = dict.fromkeys(phase.corpus for phase in cfg.convergence.phases)
    return {n: data.load(n, cfg.model.vocab_size, cfg.convergence.data_dir) for n in names}


def run_phase(
    i: int,
    cfg: DictConfig,
    method: Any,
    corpus: data.Corpus,
    ev: Evaluator,
    curves: Curves,
    groups: list[tuple[dict, float]],
) -> bool:
    """Train phase `i`, scheduling `groups` (`scheduled_groups`); False if the loss stopped being
    finite (the run is over)."""
    phase, conv = cfg.convergence.phases[i], cfg.convergence
    first = len(curves.losses)
    peak = method.lr * phase.lr_scale
    tokens = token_ids(corpus.train)
    offsets = batch_offsets(tokens.numel(), cfg.batch_size, cfg.seq_len, phase.steps, cfg.seed * 1000 + i)
    curves.phases.append(
        dict(
            name=phase.name,
            corpus=phase.corpus,
            first_step=first,
            steps=phase.steps,
            peak_lr=peak,
            warmup_steps=phase.warmup_steps,
        )
    )
    ev(method, first, phase.corpus, curves)
    device = method.device
    for step in range(phase.steps):
        set_scaled_lr(groups, lr_at(step, phase.steps, peak, phase.warmup_steps, conv.min_lr_ratio))
        batch = windows(tokens, offsets[step], cfg.seq_len).to(device)
        losses, times = measure.timed_steps(lambda batch=batch: method.step(batch), 1, device)
        curves.losses += losses
        curves.times_ms += times
        if not math.isfinite(losses[-1]):
            return False
        done = len(curves.losses)
        if (done - first) % conv.eval_every == 0 or step == phase.steps - 1:
            ev(method, done, phase.corpus, curves)
    return True


def train(cfg: DictConfig, method: Any) -> dict[str, Any]:
    """Run every phase; return the record's measured fields (see the module docstring)."""
    corpora = load_corpora(cfg)
    ev = Evaluator(corpora, cfg)
    curves = Curves()
    groups = scheduled_groups(method)
    for i, phase in enumerate(cfg.convergence.phases):
        if not run_phase(i, cfg, method, corpora[phase.corpus], ev, curves, groups):
            break
    manifest = next(iter(corpora.values())).manifest
    return {
        "losses": curves.losses,
        "loss_first": curves.losses[0] if curves.losses else None,
        "loss_last": curves.losses[-1] if curves.losses else None,
        "heldout_steps": curves.heldout_steps,
        "heldout_losses": curves.heldout_losses,
        "heldout_by_corpus": curves.by_corpus,
        "phases": curves.phases,
        "steps": len(curves.losses),
        "tokens_trained": len(curves.losses) * cfg.batch_size * cfg.seq_len,
        "step_times_ms": curves.times_ms[cfg.warmup_steps :],
        "data": {k: manifest[k] for k in ("python", "vocab_size", "files")},
    }
