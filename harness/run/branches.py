"""Branched fidelity runs: each method stepped from the fp32-master reference's own state.

    python -m harness sweep +exp=convergence_branched          # an H200: the 88M Llama, every method
    python -m harness sweep +exp=convergence_branched_smoke    # the same on a CPU, tiny

A convergence run (`harness.run.convergence`) trains every method on its own trajectory, and two
fp32 implementations that differ only in rounding part ways after ~50 steps: the held-out losses
then differ by trajectory noise (+-0.04 nats over 500 steps of the 88M Llama) far larger than the
bias a low-precision method adds. Here the method never leaves the reference for long:

- The reference, torch AdamW on fp32 weights and states (fused on a GPU), trains through the same
  phases, batches and learning-rate schedule as a convergence run. It is trained once per seed and
  configuration, by the first point that needs it, and its state at each branch start is kept on
  disk for the other methods' points (`harness.run.branch_reference`).
- Every `convergence.branch_every` steps of a phase (from its `branch_from` step on, while k =
  `convergence.branch_steps` steps remain) the method under test is loaded with the reference's
  state at that step: its weights from the fp32 ones (bf16 rounded to nearest, compensated bf16
  with the rounding's loss as the residual: `ForgeOptimizer.load_master_weights`), its optimizer
  state converted from torch AdamW's (`ForgeOptimizer.load_state_dict(..., convert=True)`,
  FlashOptim's own converters for FlashAdamW: `load_flash_adamw`, or torch's own loader for torch
  optimizers, which casts to the parameter's dtype). The method then trains k steps on the
  batches and learning rates the reference trains on, and its held-out loss is taken; so is the
  reference's, k steps on.
- A branch's deviation d is the method's held-out loss minus the reference's. Branches that start
  together stay together within what k steps move them apart: on the 88M Llama at lr 1e-3 (an
  H200), torch's for-each AdamW ends 50 steps within 2.8e-3 nats of the fused reference (standard
  deviation 1.2e-3 over 21 branches), where two whole runs part by several hundredths. The mean of
  d over the branch points (and seeds) measures what the method's arithmetic costs per k steps.

A method needs a loader for torch AdamW's state: FORGE (every state dtype and weight format),
FlashOptim's FlashAdamW (int8 moments, bf16 weights with error-correction bits) and torch's own
optimizers (pure-bf16 fused AdamW, fused AdamW on fp32 weights under autocast, torch AdamW);
others (the 8-bit optimizers) are reported unavailable, with the reason. Graphed methods are
refused, as in every convergence run (`harness.run.config`).

The record's fields: `branches` (one dict per branch: phase, step, heldout, reference_heldout,
deviation, losses), `branch_steps` (k), `losses` (the method's training losses over all branches,
in order), the reference's own `reference_losses`, and `reference` (its trajectory's cache key).
`harness.report.branch_fidelity_table` judges them.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from omegaconf import DictConfig

from harness.run import branch_reference, convergence, measure
from harness.run.branch_reference import Reference

HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")  # what a branch takes from the reference's groups


class Unloadable(Exception):
    """The method cannot start from torch AdamW's state (no loader for its formats)."""


def state_for(target_opt: torch.optim.Optimizer, target_model: torch.nn.Module, reference: Reference) -> dict:
    """The reference's optimizer state as a state dict of `target_opt`'s parameters (matched by
    name, in the target's groups and order), each group with the reference's hyperparameters and
    its own implementation (fused, foreach: a control keeps its own rounding)."""
    ref_params = dict(reference.model.named_parameters())
    ref_state = {n: reference.opt.state[p] for n, p in ref_params.items() if p in reference.opt.state}
    settings = {k: reference.opt.param_groups[0][k] for k in HYPERPARAMETERS}
    names = {id(p): n for n, p in target_model.named_parameters()}
    state, groups, index = {}, [], 0
    for group in target_opt.param_groups:
        ids = []
        for p in group["params"]:
            name = names.get(id(p))
            if name not in ref_params:
                raise Unloadable(
                    f"parameter {name or tuple(p.shape)} has no counterpart in the reference model"
                )
            if name in ref_state:  # none before the reference's first step: the method's is fresh too
                state[index] = {
                    k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in ref_state[name].items()
                }
            ids.append(index)
            index += 1
        groups.append(dict({k: v for k, v in group.items() if k != "params"}, **settings, params=ids))
    return {"state": state, "param_groups": groups}


@torch.no_grad()
def load_from_reference(method: Any, reference: Reference) -> None:
    """Set the method's weights and optimizer state from the reference's (module docstring)."""
    import forge

    opt = convergence.optimizer_of(method)
    masters = dict(reference.model.named_parameters())
    state = state_for(opt, method.model, reference)
    if isinstance(opt, forge.ForgeOptimizer):
        names = {id(p): n for n, p in method.model.named_parameters()}
        ordered = [masters[names[id(p)]] for group in opt.param_groups for p in group["params"]]
        opt.load_state_dict(state, convert=True)
        opt.load_master_weights(ordered)
        return
    flashoptim = sys.modules.get("flashoptim")  # optional: imported wherever one of its optimizers exists
    if flashoptim is not None and isinstance(opt, flashoptim.FlashAdamW):
        load_flash_adamw(opt, method.model, masters, state)
        return
    if type(opt).__name__ not in ("AdamW", "Adam"):
        raise Unloadable(
            f"{method.name} keeps {type(opt).__name__}'s state, which has no loader from torch "
            "AdamW's: a branched run needs FORGE, FlashAdamW or a torch optimizer"
        )
    for name, p in method.model.named_parameters():
        p.copy_(masters[name])
    opt.load_state_dict(state)  # torch casts each state to its parameter's dtype


def load_flash_adamw(opt: Any, model: torch.nn.Module, masters: dict, state: dict) -> None:
    """FlashOptim's FlashAdamW from torch AdamW's state (`state_for`), through its own converters.

    - Moments: `FlashAdamW.load_state_dict` quantizes fp32 ones itself with flashoptim's `quantize`,
      the arithmetic its step's kernel stores them with: exp_avg through softsign to int8, the square
      root of exp_avg_sq to uint8, each run of 32 with a fresh fp16 absmax scale. With quantize=False
      it keeps them in the parameter's dtype, as its step does.
    - Missing state is made as FlashAdamW's first step makes it (`_ensure_state_initialized`): the
      error-correction bits, and fresh moments where the reference has not stepped yet.
    - The step count in its own format, an int64 on the CPU (torch AdamW's is a float tensor).
    - Weights: `set_fp32_model_state_dict` rounds each fp32 master to the nearest bf16 and encodes
      the remainder in the error-correction bits (for 24-bit masters an int8 count of 127ths of half
      a bf16 ulp), so bf16 + bits decode to the master within 1/254 of half an ulp, about 2^-16 of
      the weight: the nearest value the format holds.
    """
    opt.load_state_dict(state)
    for group in opt.param_groups:
        for p in group["params"]:
            opt._ensure_state_initialized(p, hparams=group)
            opt.state[p]["step"] = torch.tensor(int(opt.state[p]["step"]), dtype=torch.int64)
    opt.set_fp32_model_state_dict(model, masters)
    opt.recompute_param_stats()  # the weights' maxabs its numerics check reads


def train(cfg: DictConfig, method: Any, device: str) -> dict[str, Any]:
    """The method branched from the reference at every branch start (the module docstring)."""
    corpora = convergence.load_corpora(cfg)
    trajectory = branch_reference.trajectory(cfg, corpora, device)
    reference = Reference(cfg, device)  # holds each start's state in turn
    branches: list[dict[str, Any]] = []
    starts = [(phase, s) for phase in branch_reference.phases(cfg, corpora, device) for s in phase.starts]
    for phase, start in starts:
        trajectory.restore(reference, phase.name, start)
        branch = _branch(method, reference, phase, start, cfg)
        branches.append(branch)
        if not math.isfinite(branch["heldout"]):
            break  # the method diverged
        branch["reference_heldout"] = trajectory.heldout(phase.name, start)
        branch["deviation"] = branch["heldout"] - branch["reference_heldout"]
    return _fields(cfg, corpora, branches, trajectory)


def _branch(method: Any, reference: Reference, phase: branch_reference.Phase, start: int, cfg) -> dict:
    """k steps of the method from the reference's state at `start`, and its held-out loss then."""
    load_from_reference(method, reference)
    opt = convergence.optimizer_of(method)
    losses = []
    for s in range(start, start + cfg.convergence.branch_steps):
        convergence.set_lr(opt, phase.lrs[s])
        step_losses, _ = measure.timed_steps(lambda s=s: method.step(phase.batch(s)), 1, method.device)
        losses += step_losses
        if not math.isfinite(losses[-1]):
            return dict(phase=phase.name, step=start, losses=losses, heldout=float("nan"))
    heldout = convergence.evaluate(method, phase.heldout, cfg.batch_size)
    return dict(phase=phase.name, step=start, losses=losses, heldout=heldout)


def _fields(cfg, corpora, branches, trajectory: branch_reference.Trajectory) -> dict[str, Any]:
    manifest = next(iter(corpora.values())).manifest
    method_losses = [loss for branch in branches for loss in branch["losses"]]
    return {
        "branches": branches,
        "branch_steps": cfg.convergence.branch_steps,
        "losses": method_losses,
        "loss_first": method_losses[0] if method_losses else None,
        "loss_last": method_losses[-1] if method_losses else None,
        "reference_losses": trajectory.losses,
        "reference": trajectory.folder.name,
        "steps": len(trajectory.losses),
        "step_times_ms": [],
        "data": {k: manifest[k] for k in ("python", "vocab_size", "files")},
    }
