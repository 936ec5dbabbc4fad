"""bitsandbytes AdamW8bit: block-wise (256) dynamic 8-bit quantized moments, a standard step().

Called as its README says: `bnb.optim.AdamW8bit(model.parameters(), lr=...)`. Gradients all exist
at once before `step()`, like fused AdamW; only the states shrink (2 bytes per parameter plus
scales instead of 4). Its step synchronizes the GPU after every parameter (0.44+). Since 0.45 it
also runs on a CPU (the smoke sweep runs it there).
"""

from __future__ import annotations

from harness.run.methods.base import AdamWOptions, StepOptimizerMethod
from harness.run.methods.footprint import Footprint, element_bytes, separate


class BnbAdamW8bit(StepOptimizerMethod):
    name = "adamw8bit_bnb"
    title = "bnb AdamW8bit"
    summary = "bitsandbytes' AdamW8bit: block-wise 8-bit moments"
    order = 5
    Options = AdamWOptions
    requires = ("bitsandbytes",)

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        return separate(weights, 2.0, 2 * element_bytes("int8", 256))  # an fp32 absmax per 256

    def setup(self) -> None:
        import bitsandbytes as bnb

        o = self.options
        self.opt = bnb.optim.AdamW8bit(
            self.params(), lr=self.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
