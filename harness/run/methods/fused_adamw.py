"""torch.optim.AdamW with fused=True: the usual way to train, and the baseline of every ratio.

All gradients exist at once between backward and `step()`, so its peak holds weights, gradients
and both moments together. On a machine without CUDA the fused kernel is not what we compare, so
the point runs the plain (for-each) AdamW and says so in its notes. Under `method.cuda_graph` it is
built `capturable=True` (step counts on the device), and `step()` and `zero_grad()` are captured
with the forward and backward (harness.run.graphs).

`max_grad_norm` (None: off): `torch.nn.utils.clip_grad_norm_` over every parameter before each
step, as training recipes do; it reads the gradients once more and syncs nothing with the host, so
it is captured in the graph too. FORGE's `max_grad_norm` is compared against this.

`fp8` (None: off): torchao's float8 training, as its README converts a model:
`torchao.float8.convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(fp8))`
with the "tensorwise" or "rowwise" recipe, every nn.Linear but lm_head (and any whose dimensions
are not multiples of 16) becoming a Float8Linear, whose forward, dX and dW GEMMs run in FP8 and
whose dW is written in the weight's dtype for the optimizer. FORGE's `fp8` is compared against it.

`data_parallel` (None: off): "ddp" or "fsdp2", with gpus > 1 (harness.run.data_parallel): the same
AdamW under DistributedDataParallel (its gradients in DDP's buckets only) or on FSDP2's shards,
beside FORGE under the same wrapper.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from harness.run.data_parallel import KINDS
from harness.run.methods.base import AdamWOptions, StepOptimizerMethod, check_choice, check_max_grad_norm
from harness.run.methods.footprint import Footprint, separate, weight_state_bytes
from harness.run.tensor_parallel import layout_groups

FP8_RECIPES = (None, "tensorwise", "rowwise")  # torchao's Float8LinearRecipeName values
FP8_SKIP = "lm_head"  # kept in bf16, as FORGE's fp8 keeps it (forge.attach's fp8_skip)


@dataclass
class FusedAdamWOptions(AdamWOptions):
    max_grad_norm: float | None = None  # clip_grad_norm_ before each step; None: no clipping
    fp8: str | None = None  # torchao's float8 training recipe for the linears; None: bf16 GEMMs
    # "ddp" | "fsdp2": train under that wrapper with gpus > 1 (harness.run.data_parallel); None: one
    # GPU or the TP plan
    data_parallel: str | None = None

    def __post_init__(self) -> None:
        check_max_grad_norm(self.max_grad_norm)
        check_choice("fp8", self.fp8, FP8_RECIPES)
        check_choice("data_parallel", self.data_parallel, KINDS)
        if self.data_parallel is not None and self.fp8 is not None:
            raise ValueError("fp8 with data_parallel is not measured here: leave one of them unset")


class FusedAdamW(StepOptimizerMethod):
    name = "fused_adamw"
    title = "fused AdamW"
    summary = "torch.optim.AdamW(fused=True): the reference every ratio is taken against"
    order = 0
    tensor_parallel = True
    graph_capturable = True
    Options = FusedAdamWOptions

    @classmethod
    def unavailable_reason(cls, device: str, options=None) -> str | None:
        if options is not None and options.fp8 is not None and importlib.util.find_spec("torchao") is None:
            return "fp8 needs torchao's float8 training (pip install 'forge-bench[baselines]')"
        return super().unavailable_reason(device, options)

    @classmethod
    def ran_as(cls, options, device: str) -> str | None:
        """Without CUDA `setup` builds the plain for-each AdamW (its notes say so)."""
        if device == "cuda":
            return None
        fp8 = options.get("fp8")
        return "AdamW (foreach; no CUDA)" + (f" over torchao's Float8Linear ({fp8})" if fp8 else "")

    @classmethod
    def torch_reference(cls, options):
        """torch.optim.AdamW itself; none for a clipped step or one under a data-parallel wrapper,
        which the plain rule does not run."""
        if options.max_grad_norm is not None or options.data_parallel is not None:
            return None
        return options.as_torch_rule()

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        return separate(weights, weights, 2 * weight_state_bytes(options, weights))

    def setup(self) -> None:
        if self.options.fp8 is not None:
            self._convert_to_float8(self.options.fp8)
        fused = self.device == "cuda"
        if not fused:
            self.notes.append("no CUDA: plain torch.optim.AdamW (foreach) instead of fused=True")
        o = self.options
        self.opt = torch.optim.AdamW(
            layout_groups(self.params()),
            lr=self.lr,
            betas=tuple(o.betas),
            eps=o.eps,
            weight_decay=o.weight_decay,
            fused=fused,
            foreach=None if fused else True,  # the multi-tensor path on a CPU too, as the note says
            capturable=self.cuda_graph,
        )

    def _convert_to_float8(self, recipe: str) -> None:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        from forge.fp8 import eligible  # the same layers as FORGE's fp8 (dimensions multiples of 16)

        def converted(module: torch.nn.Module, fqn: str) -> bool:
            return fqn.split(".")[-1] != FP8_SKIP and eligible(module.weight)

        convert_to_float8_training(
            self.model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=converted
        )
        count = sum(type(m).__name__ == "Float8Linear" for m in self.model.modules())
        self.notes.append(f"fp8: torchao Float8Linear ({recipe}) on {count} linears, lm_head in bf16")

    def update(self) -> None:
        if self.options.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params(), self.options.max_grad_norm, foreach=True)
        super().update()
