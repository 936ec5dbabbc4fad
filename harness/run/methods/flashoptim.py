"""FlashOptim's FlashAdamW: int8 moments (one fp16 scale per 32), 24-bit master weights, Triton.

Defaults as its README: `FlashAdamW(model.parameters(), lr=...)` keeps bf16 weights plus 8
error-correction bits per weight in the optimizer state ("24-bit master weights"), so its master
precision is higher than plain bf16 AdamW's. With `gradient_release: true`,
`enable_gradient_release(model, opt)` steps each parameter from a hook during backward and frees
its gradient, like adamw_in_backward. Its default settings need CUDA. A branched fidelity run
starts it from torch AdamW's state through FlashOptim's own converters
(`harness.run.branches.load_flash_adamw`).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.run.methods.base import Method, largest_param_bytes, state_tensors_of
from harness.run.methods.footprint import Footprint, element_bytes, separate


@dataclass
class FlashOptimOptions:
    gradient_release: bool = False
    master_weight_bits: int | None = 24
    quantize: bool = True
    weight_decay: float = 0.01


class FlashOptimMethod(Method):
    name = "flashoptim"
    title = "FlashOptim"
    summary = "FlashOptim's FlashAdamW, optionally with enable_gradient_release (CUDA)"
    order = 4
    Options = FlashOptimOptions
    requires = ("flashoptim",)
    triton_kernels = True
    needs_cuda = "FlashOptim's quantized, fused, error-corrected defaults need a CUDA device"

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        """int8 states with an fp16 scale per 32, bf16 weights + 8-bit master correction (3 B)."""
        states = 2 * element_bytes("int8", block=32, scale_bytes=2.0)
        if options.get("gradient_release") or options.get("enable_gradient_release"):
            return Footprint(3.0, 0.0, states, 4.0 + 6.0 + 2 * states)
        return separate(3.0, 2.0, states)

    def setup(self) -> None:
        from flashoptim import FlashAdamW, enable_gradient_release

        o = self.options
        self.opt = FlashAdamW(
            self.params(),
            lr=self.lr,
            weight_decay=o.weight_decay,
            quantize=o.quantize,
            master_weight_bits=o.master_weight_bits,
        )
        self.release = enable_gradient_release(self.model, self.opt) if o.gradient_release else None

    def update(self) -> None:
        if self.release is None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def optimizer_state_tensors(self):
        return state_tensors_of(self.opt)

    def gradient_bytes(self) -> int:
        if self.release is not None:
            return largest_param_bytes(self.params())
        return super().gradient_bytes()

    def master_weights(self) -> str:
        bits = self.options.master_weight_bits
        base = super().master_weights()
        return base if bits is None else f"{base}+ecc ({bits}-bit)"
