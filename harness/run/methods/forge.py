"""FORGE: `forge.attach(model, rule, ...)`, the update fused into each linear layer's dW GEMM.

Each backward is the optimizer step: the weight gradient of an nn.Linear lives only in registers,
tile by tile, and never in memory; every other parameter (embeddings, norms) is updated from a
post-accumulate-grad hook, one gradient at a time. `opt.step()` and `zero_grad()` are no-ops, so
this method's `update()` is empty. Options pick the rule (any of `forge.RULES`), the state dtype
(`forge.STATE_DTYPES`: int8 with one absmax scale per `int8_group` of `forge.INT8_GROUPS`
elements) and stochastic rounding of bf16 weights; `hparams` go to the rule as torch.optim names
them (betas, eps, weight_decay...). Every choice is validated against forge's own lists, and the
memory model counts each rule's state tensors with `Rule.state_count` and their bytes with
`forge.state_bytes`, so a rule added to forge needs nothing here. On a CPU the kernels run in the
Triton interpreter: slow (its times mean nothing for speed), so keep CPU points tiny.

Under `method.cuda_graph` (harness.run.graphs) FORGE is attached `capturable=True`: its kernels
read each step's coefficients and seed from a row of device memory, and `before_replay` calls
`opt.prepare_replay()`, which advances the step of every parameter the graph updates and uploads
their rows, before each replay.

`max_grad_norm` (None: off) clips the global gradient norm as `clip_grad_norm_` would, exactly,
inside FORGE (`forge.clip`): the backward gathers the norms and keeps each layer's dy and x, the
updates run when it ends. The method `fused_adamw` takes the same option, with torch's own
`clip_grad_norm_` before its step: the pair forge_*_clip / fused_adamw_clip compares the two.

`master_weights="bf16+kahan"` keeps a bf16 residual beside each bf16 weight, read and written with
it in the same pass (2 bytes a parameter, counted with the optimizer states): the weights carry the
fp32 master value to about 16 significant bits, where stochastic rounding only keeps it in
expectation.

`fp8="tensorwise"` runs the forward, dX and fused dW GEMMs of every linear layer but lm_head in
FP8 with one dynamic scale per tensor (`forge.fp8`), as torchao's Float8Linear does; the method
`fused_adamw` takes the same option, with torchao's Float8Linear, for the side-by-side.

`data_parallel` (None: off): "ddp" or "fsdp2", with gpus > 1 (harness.run.data_parallel). FORGE
then fuses nothing: each gradient is reduced over the ranks first (FORGE's own bucketed all-reduce
under DDP, FSDP2's reduce-scatter), and the element-wise kernel applies the rule to the mean
(forge.data_parallel); only a bounded window of gradients is alive at once: under DDP every
parameter's gradient, the linear layers' too, goes through FORGE's reducer, whose window is
`forge.data_parallel.GradientReducer`'s bound, (MAX_IN_FLIGHT + 1) buckets and one bucket's
concatenated copy (`reducer_window_bytes`).

`debug_delay_us` (0: off) makes every fused update slower on purpose: the GPU spins that many
microseconds as each fused layer's backward starts (`harness.slowdown`, captured in a CUDA graph
like the update), 225 times a Llama-3.1-8B step. It exists to show that the regression check
catches a slowdown of a known size (`python -m harness regress` matches such a point with its twin
run without it); never use it for a figure meant to be quoted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

import forge
from harness.run.data_parallel import KINDS
from harness.run.methods.base import (
    Method,
    check_choice,
    check_max_grad_norm,
    largest_param_bytes,
    local_numel,
    state_tensors_of,
)
from harness.run.methods.footprint import IN_GEMM, Footprint


@dataclass
class ForgeOptions:
    rule: str = "adamw"
    state_dtype: str = "bf16"
    stochastic_rounding: bool = True
    int8_group: int = 64
    update_stream: bool = False  # fused updates on a second CUDA stream (forge.streams)
    hparams: dict[str, Any] = field(default_factory=dict)
    max_grad_norm: float | None = None  # global-norm clipping inside FORGE (forge.clip); None: off
    # "bf16+kahan": a bf16 residual beside each bf16 weight (compensated; forge.kernels.update_tile);
    # None: stochastic_rounding says how bf16 weights round
    master_weights: str | None = None
    # "tensorwise": every fused linear but lm_head with its GEMMs in FP8 (forge.fp8); None: bf16 GEMMs
    fp8: str | None = None
    debug_delay_us: float = 0.0  # a deliberate slowdown: the GPU spins this long after each update
    # "ddp" | "fsdp2": train under that wrapper with gpus > 1 (harness.run.data_parallel), every
    # gradient reduced before FORGE's update (forge.data_parallel); None: one GPU or the TP plan
    data_parallel: str | None = None
    bucket_cap_mb: float | None = None  # ddp: FORGE's bucket size in MiB (None: DDP's 25)

    def __post_init__(self) -> None:
        element_wise = tuple(name for name, rule in forge.RULES.items() if not rule.whole_matrix)
        if self.rule not in element_wise and self.rule in forge.RULES:  # Muon trains a split of the model
            raise ValueError(f"rule={self.rule!r} trains a split of the model: use method=forge_muon")
        check_choice("rule", self.rule, element_wise)
        check_choice("data_parallel", self.data_parallel, KINDS)
        if self.data_parallel is not None and (self.fp8 or self.update_stream):
            raise ValueError(
                f"data_parallel={self.data_parallel} reduces each gradient instead of fusing it, so fp8 and "
                "update_stream (options of the fused kernel) do not apply: leave them off"
            )
        if self.data_parallel == "fsdp2" and self.max_grad_norm is not None:
            raise ValueError(
                "max_grad_norm under fsdp2 is not supported by FORGE yet: clip under ddp or not at all"
            )
        if self.bucket_cap_mb is not None and (self.data_parallel != "ddp" or not self.bucket_cap_mb > 0):
            raise ValueError(
                f"bucket_cap_mb={self.bucket_cap_mb}: a positive size in MiB, with data_parallel=ddp"
            )
        check_choice("state_dtype", self.state_dtype, forge.STATE_DTYPES)
        check_choice("int8_group", self.int8_group, forge.INT8_GROUPS)
        check_max_grad_norm(self.max_grad_norm)
        check_choice("master_weights", self.master_weights, forge.MASTER_WEIGHTS)
        check_choice("fp8", self.fp8, (None, *forge.FP8_RECIPES))
        if self.fp8 is not None and self.max_grad_norm is not None:
            raise ValueError(
                "fp8 with max_grad_norm is not supported (FORGE clips from bf16 operands): set one of them"
            )
        if self.debug_delay_us < 0:
            raise ValueError(f"debug_delay_us={self.debug_delay_us} is not valid: a delay is >= 0")


class Forge(Method):
    name = "forge"
    title = "FORGE"
    summary = "forge.attach: the update fused into the weight-gradient GEMM"
    order = 9
    tensor_parallel = True
    graph_capturable = True
    triton_kernels = True
    Options = ForgeOptions

    @classmethod
    def torch_reference(cls, options: ForgeOptions) -> tuple[str, dict[str, Any]] | None:
        """torch.optim's twin of the rule (`forge.torch_optimizer`, the tests' oracle); none for a
        clipped step or one under a data-parallel wrapper, which the plain rule does not run."""
        if options.max_grad_norm is not None or options.data_parallel is not None:
            return None
        return "torch_rule", {"rule": options.rule, "hparams": dict(options.hparams)}

    @classmethod
    def footprint(cls, options: Mapping[str, Any], weights: float) -> Footprint | None:
        """No gradient; the rule's state tensors (`Rule.state_count` under the recorded hparams) at
        `forge.state_bytes` each; the update reads and writes weights and states once."""
        rule = forge.RULES.get(str(options.get("rule") or "adamw"))
        if rule is None:  # a rule this checkout's forge does not have (a record of another one)
            return None
        hparams = options.get("hparams")
        n_states = rule.state_count(dict(hparams) if isinstance(hparams, Mapping) else None)
        group = int(options.get("int8_group") or forge.INT8_GROUPS[0])
        states = n_states * forge.state_bytes(str(options.get("state_dtype") or "bf16"), group)
        return Footprint(weights, 0.0, states, 2 * weights + 2 * states, IN_GEMM)

    @classmethod
    def unavailable_reason(cls, device: str, options: Any = None) -> str | None:
        if options is not None and options.debug_delay_us and device != "cuda":
            return "debug_delay_us spins a CUDA GPU (torch.cuda._sleep); set it to 0 off the GPU"
        return super().unavailable_reason(device, options)

    def setup(self) -> None:
        self.fused_ids = fused_weight_ids(self.model)  # before attach swaps the modules
        o = self.options
        hparams = {k: tuple(v) if isinstance(v, list) else v for k, v in o.hparams.items()}
        self.opt = forge.attach(
            self.model,
            o.rule,
            lr=self.lr,
            state_dtype=o.state_dtype,
            stochastic_rounding=o.stochastic_rounding,
            int8_group=o.int8_group,
            capturable=self.cuda_graph,
            update_stream=o.update_stream,
            max_grad_norm=o.max_grad_norm,
            master_weights=o.master_weights,
            fp8=o.fp8,
            **({"bucket_cap_mb": o.bucket_cap_mb} if o.bucket_cap_mb is not None else {}),
            **hparams,
        )
        if o.fp8 is not None:
            fp8_layers = sum(isinstance(m, forge.ForgeLinear) and m.fp8 for m in self.model.modules())
            self.notes.append(f"fp8: {fp8_layers} fused linears with {o.fp8} FP8 GEMMs, lm_head in bf16")
        if o.debug_delay_us:
            self._slow_down(o.debug_delay_us)

    def _slow_down(self, us: float) -> None:
        """Spin the GPU `us` microseconds as each fused layer's backward starts, its update included
        (the `debug_delay_us` option): a backward pre-hook on every ForgeLinear (torch's module hooks)."""
        from harness.slowdown import Delay

        delay = Delay(us)

        def wait(module: torch.nn.Module, grad_output: tuple) -> None:
            delay()

        for module in self.model.modules():
            if isinstance(module, forge.ForgeLinear):
                module.register_full_backward_pre_hook(wait)
        self.notes.append(
            f"debug_delay_us: the GPU waited {us:g} us in each fused layer's backward, on purpose"
        )

    def before_replay(self) -> None:
        self.opt.prepare_replay()

    def optimizer_state_tensors(self):
        return state_tensors_of(self.opt)

    def gradient_bytes(self) -> int:
        hooked = [p for p in self.params() if id(p) not in self.fused_ids]
        if self.options.max_grad_norm is not None:  # kept until the backward ends, all of them
            return sum(local_numel(p) * p.element_size() for p in hooked)
        if self.options.data_parallel == "ddp":  # every gradient goes through FORGE's reducer
            return reducer_window_bytes(self.params(), self.opt.data_parallel.bucket_cap_mb)
        if self.options.data_parallel == "fsdp2":  # one layer's sharded gradients, FSDP2's reduce output
            return max(sum(local_numel(p) * p.element_size() for p in group) for group in _groups(self.model))
        return largest_param_bytes(hooked)

    def master_weights(self) -> str:
        base = super().master_weights()
        if base == "bf16" and self.options.master_weights is not None:
            return self.options.master_weights
        return f"{base}+sr" if base == "bf16" and self.options.stochastic_rounding else base


def reducer_window_bytes(params: list[torch.nn.Parameter], bucket_cap_mb: float) -> int:
    """The most gradient bytes FORGE's DDP reducer holds at once over `params` (every parameter
    under DDP: nothing is fused there): `forge.data_parallel.bound_bytes`, never more than every
    gradient and one bucket's concatenated copy."""
    from forge.data_parallel import bound_bytes

    cap = int(bucket_cap_mb * 2**20)
    bound = bound_bytes(params, cap)
    every = sum(local_numel(p) * p.element_size() for p in params)
    return min(bound, every + min(cap, every))


def _groups(model: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """The parameters FSDP2 reduce-scatters together: each decoder layer's, then the rest."""
    from harness.run.data_parallel import decoder_layers

    layers = [list(layer.parameters()) for layer in decoder_layers(model)]
    inside = {id(p) for layer in layers for p in layer}
    return [*layers, [p for p in model.parameters() if id(p) not in inside]]


def fused_weight_ids(model: torch.nn.Module) -> set[int]:
    """Ids of the weights whose gradient FORGE never materializes: nn.Linear weights not tied to
    an embedding (a tied weight also gets the embedding's gradient, through a hook)."""
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return linear - embedding
