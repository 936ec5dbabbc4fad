"""Muon, the way LLM teams train hidden matrices with it: torch's after the backward, and FORGE's inside it.

Muon (`torch.optim.Muon`) keeps one momentum buffer per 2-D weight and steps the weight by the
Newton-Schulz orthogonalization of its Nesterov update. The usual recipe gives Muon the hidden
matrices and AdamW everything else (embeddings, the output head, norms, biases); both methods
here take that split from `forge.muon.hidden_matrices(model)`, so the baseline and FORGE cannot
train different parameters by different rules.

- `muon` (`TorchMuon`): `torch.optim.Muon` on the hidden matrices and `torch.optim.AdamW` on the
  rest (fused on CUDA, for-each on a CPU, `capturable` under a CUDA graph), both stepped after the
  backward with every gradient in memory.
- `forge_muon` (`ForgeMuon`): `forge.attach(model, "muon", ..., fallback="adamw")`. Each dW tile
  folds into the momentum in registers, and Newton-Schulz runs per layer right after the layer's
  fused kernel, inside the backward: the gradient never exists. The rest is trained by the
  fallback rule, as FORGE trains any rule's parameters (fused into lm_head's dW GEMM, from hooks
  for the embedding and the norms).

Options are Muon's hyperparameters as torch.optim.Muon names them (its learning rate is
`method.lr`) and `fallback_options`, the fallback AdamW's (its `lr` required: the recipe gives the
two rules different rates); FORGE adds `state_dtype` (Muon's momentum, and the fallback's states),
`fallback` (any rule of `forge.RULES`) and `newton_schulz` (the orthogonalization's variant,
`forge.newton_schulz`: torch's iteration by default; the Gram variants hold `GRAM_WORKSPACE`).
A convergence run schedules every param group from its own peak (`Method.optimizers`), so the
two learning rates keep their ratio.

Memory (`footprint`, `harness.run.methods.footprint`), bytes a parameter of w-byte weights. torch
holds weights w, every gradient w until its step, Muon's momentum in the weights' dtype (w) and
AdamW's two moments (2w) for the rest; during its step, one layer's Newton-Schulz workspace beside
all of them (`torch/optim/_muon.py`): the Nesterov update (w bytes an element, alive through the
iteration as the function's argument; without Nesterov torch orthogonalizes the momentum buffer
itself), the current bf16 iterate (2: the update's normalized bf16 copy, or the last iterate) and
the new one (2), and the Gram matrix A and its polynomial B (2 + 2 bytes an element of
min(N, K)^2): 6 N K + 4 m^2 bytes in bf16, 8 N K + 4 m^2 in fp32. FORGE holds
weights w and its states, no gradient, and while a layer's update runs one layer's workspace
(`forge.muon.orthogonalize`): the bf16 scratch the fused kernel writes (2 N K), its normalized
copy X (2), the new X (2) and A and B: 6 N K + 4 m^2, inside the backward, beside the activations
still alive. So before activations FORGE's peak sits the gradient's P w bytes below torch's, less
its own workspace plus torch's (the two are equal in bf16); with activations,
`harness.report.token_model` places each workspace where it falls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

import forge
import forge.muon
import forge.newton_schulz
from harness.run.methods.base import (
    AdamWOptions,
    Method,
    check_choice,
    largest_param_bytes,
    state_tensors_of,
)
from harness.run.methods.footprint import IN_GEMM, Footprint, separate
from harness.run.methods.forge import fused_weight_ids

RULE = "muon"  # the forge rule of `forge_muon` (forge.RULES["muon"])
GRAM_BYTES = 2.0 + 2.0  # Newton-Schulz's Gram matrix A and its polynomial B, bf16, per min(N, K)^2
ITERATE_BYTES = 2.0  # one bf16 iterate of Newton-Schulz, per element of the weight


@dataclass
class MuonOptions:
    """torch.optim.Muon's hyperparameters (the learning rate is `method.lr`), and the options of the
    fallback AdamW that trains every parameter Muon does not take."""

    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: list[float] = field(default_factory=lambda: list(forge.muon.NS_COEFFICIENTS))
    eps: float = 1e-7
    weight_decay: float = 0.1
    adjust_lr_fn: str | None = None
    fallback_options: dict[str, Any] = field(
        default_factory=lambda: {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.01}
    )

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum={self.momentum} is not valid: 0 <= momentum < 1")
        steps = self.ns_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 < steps < 100:
            raise ValueError(f"ns_steps={steps!r} is not valid: a whole number of iterations, 1 to 99")
        if len(self.ns_coefficients) != 3:
            raise ValueError(
                f"ns_coefficients={list(self.ns_coefficients)} is not valid: give Newton-Schulz's three "
                f"coefficients (a, b, c), e.g. {list(forge.muon.NS_COEFFICIENTS)}"
            )
        if not self.eps > 0:
            raise ValueError(f"eps={self.eps} is not valid: a positive number")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay={self.weight_decay} is not valid: 0 or more")
        check_choice("adjust_lr_fn", self.adjust_lr_fn, forge.muon.ADJUST_LR_FNS)
        self.check_fallback_options(self.fallback_keys())

    def fallback_keys(self) -> tuple[str, ...]:
        """The keys `fallback_options` may hold: the learning rate and AdamW's hyperparameters."""
        return ("lr", *(f.name for f in fields(AdamWOptions)))

    def check_fallback_options(self, valid: tuple[str, ...]) -> None:
        """`fallback_options` holds only `valid` keys, and the fallback's learning rate."""
        unknown = sorted(set(self.fallback_options) - set(valid))
        if unknown:
            raise ValueError(
                f"fallback_options has unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(valid)}"
            )
        if "lr" not in self.fallback_options:
            raise ValueError(
                "fallback_options needs lr: the learning rate of the parameters Muon does not train "
                "(embeddings, the output head, norms), e.g. fallback_options.lr=3e-4"
            )

    def muon_hparams(self) -> dict[str, Any]:
        """Muon's hyperparameters as torch.optim.Muon and forge.attach take them (but lr)."""
        return dict(
            momentum=self.momentum,
            nesterov=self.nesterov,
            ns_steps=self.ns_steps,
            ns_coefficients=tuple(self.ns_coefficients),
            eps=self.eps,
            weight_decay=self.weight_decay,
            adjust_lr_fn=self.adjust_lr_fn,
        )

    def as_torch_muon(self) -> tuple[str, dict[str, Any]]:
        """torch.optim.Muon and its AdamW with these hyperparameters, as the `muon` method runs them."""
        names = [f.name for f in fields(MuonOptions)]
        return "muon", {name: getattr(self, name) for name in names}

    def fallback_hparams(self) -> dict[str, Any]:
        """`fallback_options` with lists as tuples (betas), as optimizers take them."""
        return {k: tuple(v) if isinstance(v, list | tuple) else v for k, v in self.fallback_options.items()}


@dataclass
class ForgeMuonOptions(MuonOptions):
    state_dtype: str = "fp32"  # Muon's momentum, and the fallback rule's states
    fallback: str = "adamw"  # the rule of every parameter Muon does not take (one of forge.RULES)
    newton_schulz: str = "torch"  # the orthogonalization (forge.newton_schulz.CHOICES)

    def __post_init__(self) -> None:
        check_choice("state_dtype", self.state_dtype, forge.STATE_DTYPES)
        check_choice("fallback", self.fallback, tuple(forge.RULES))
        check_choice("newton_schulz", self.newton_schulz, forge.newton_schulz.CHOICES)
        super().__post_init__()

    def fallback_keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(("lr", *forge.rules.get_rule(self.fallback).defaults)))


def torch_workspace(weights: float, nesterov: bool = True) -> tuple[float, float]:
    """torch.optim.Muon's step, one layer: the Nesterov update in the weights' dtype, alive through
    the iteration (without Nesterov the momentum buffer itself is orthogonalized: a state, no new
    tensor); the current bf16 iterate (the update's normalized copy, then each iterate) and the new
    one; A and B."""
    return ((weights if nesterov else 0.0) + 2 * ITERATE_BYTES, GRAM_BYTES)


FORGE_WORKSPACE = (3 * ITERATE_BYTES, GRAM_BYTES)  # the bf16 scratch, X normalized, the new X; A and B
# The Gram iteration (forge.newton_schulz, "gram", "gram_symmetric"; "auto" may pick it): the
# scratch and two half-precision copies of X (normalized, and Q X at a restart or the end), and up
# to six n x n half-precision matrices at once (R, Z, Q, R Z, the next R, and a mirrored product's
# triangle).
GRAM_WORKSPACE = (3 * ITERATE_BYTES, 6 * 2.0)
GRAM_VARIANTS = ("gram", "gram_symmetric", "auto")


def forge_workspace(options: Mapping[str, Any]) -> tuple[float, float]:
    """FORGE's Newton-Schulz workspace under the options' variant: (bytes per weight element, per
    min(N, K)^2)."""
    return GRAM_WORKSPACE if options.get("newton_schulz") in GRAM_VARIANTS else FORGE_WORKSPACE


class TorchMuon(Method):
    name = "muon"
    title = "torch Muon"
    summary = "torch.optim.Muon on the hidden matrices, AdamW on the rest, stepped after backward"
    order = 11
    graph_capturable = True
    Options = MuonOptions

    @classmethod
    def footprint(cls, options: Mapping[str, Any], weights: float) -> Footprint:
        """Every gradient; Muon's momentum in the weights' dtype, AdamW's two moments for the rest;
        the update also writes and reads the orthogonalization's input (2 w a hidden parameter)."""
        hidden = separate(weights, weights, weights)
        return replace(
            hidden,
            update_traffic=hidden.update_traffic + 2 * weights,
            rest=separate(weights, weights, 2 * weights),
            workspace=torch_workspace(weights, bool(options.get("nesterov", True))),
        )

    @classmethod
    def ran_as(cls, options: Mapping[str, Any], device: str) -> str | None:
        """Without CUDA the AdamW beside Muon is the plain for-each one (its notes say so)."""
        return None if device == "cuda" else "torch Muon + AdamW (foreach; no CUDA)"

    @classmethod
    def torch_reference(cls, options: MuonOptions) -> tuple[str, dict[str, Any]]:
        return options.as_torch_muon()

    def setup(self) -> None:
        hidden, rest = forge.muon.hidden_matrices(self.model)
        o = self.options
        self.muon = torch.optim.Muon(hidden, lr=self.lr, **o.muon_hparams())
        fused = self.device == "cuda"
        if not fused:
            self.notes.append("no CUDA: the fallback is plain torch.optim.AdamW (foreach), not fused=True")
        self.adamw = torch.optim.AdamW(
            rest,
            **o.fallback_hparams(),
            fused=fused,
            foreach=None if fused else True,
            capturable=self.cuda_graph,
        )
        self.notes.append(
            f"muon: {len(hidden)} hidden matrices by torch.optim.Muon, {len(rest)} other parameters by AdamW"
        )

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.muon, self.adamw]

    def update(self) -> None:
        for opt in self.optimizers():
            opt.step()
        for opt in self.optimizers():
            opt.zero_grad(set_to_none=True)

    def optimizer_state_tensors(self):
        return (t for opt in self.optimizers() for t in state_tensors_of(opt))


class ForgeMuon(Method):
    name = "forge_muon"
    title = "FORGE Muon"
    summary = "forge.attach(model, 'muon'): Muon's momentum in the dW GEMM, Newton-Schulz in the backward"
    order = 12
    graph_capturable = True
    triton_kernels = True
    Options = ForgeMuonOptions

    @classmethod
    def footprint(cls, options: Mapping[str, Any], weights: float) -> Footprint | None:
        """No gradient; Muon's momentum (`Rule.state_count`) and the fallback rule's states, each at
        `forge.state_bytes` of the state dtype; weights and states read and written once, and the
        bf16 scratch written by the fused kernel and read by Newton-Schulz."""
        muon, fallback = forge.RULES.get(RULE), forge.RULES.get(str(options.get("fallback") or "adamw"))
        if muon is None or fallback is None:  # a rule this checkout's forge does not have
            return None
        state = forge.state_bytes(str(options.get("state_dtype") or "fp32"))
        fallback_options = options.get("fallback_options")
        hparams = dict(fallback_options) if isinstance(fallback_options, Mapping) else None
        rest_states = fallback.state_count(hparams) * state
        states = muon.state_count() * state
        return Footprint(
            weights, 0.0, states, 2 * weights + 2 * states + 2 * ITERATE_BYTES, IN_GEMM,
            rest=Footprint(weights, 0.0, rest_states, 2 * weights + 2 * rest_states, IN_GEMM),
            workspace=forge_workspace(options),
        )  # fmt: skip

    @classmethod
    def torch_reference(cls, options: ForgeMuonOptions) -> tuple[str, dict[str, Any]] | None:
        """torch.optim.Muon with AdamW on the rest: only where FORGE's fallback is AdamW too."""
        return options.as_torch_muon() if options.fallback == "adamw" else None

    def setup(self) -> None:
        self.fused_ids = fused_weight_ids(self.model)  # before attach swaps the modules
        o = self.options
        self.opt = forge.attach(
            self.model,
            RULE,
            lr=self.lr,
            **o.muon_hparams(),
            state_dtype=o.state_dtype,
            fallback=o.fallback,
            fallback_options=o.fallback_hparams(),
            newton_schulz=o.newton_schulz,
            capturable=self.cuda_graph,
        )
        groups = {group.get("rule", RULE): len(group["params"]) for group in self.opt.param_groups}
        self.notes.append(
            "forge_muon: " + ", ".join(f"{n} parameters by {rule}" for rule, n in groups.items())
        )

    def before_replay(self) -> None:
        self.opt.prepare_replay()

    def optimizer_state_tensors(self):
        return state_tensors_of(self.opt)

    def gradient_bytes(self) -> int:
        """One hooked parameter's gradient at a time (the embedding's, the norms'): the linear
        layers' never exist."""
        return largest_param_bytes(p for p in self.params() if id(p) not in self.fused_ids)
