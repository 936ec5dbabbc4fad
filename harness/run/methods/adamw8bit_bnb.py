"""bitsandbytes AdamW8bit: block-wise (256) dynamic 8-bit quantized moments, a standard step().

Called as its README says: `bnb.optim.AdamW8bit(model.parameters(), lr=...)`. Gradients all exist
at once before `step()`, like fused AdamW; only the states shrink (2 bytes per parameter plus
scales instead of 4). Its step synchronizes the GPU after every parameter (0.44+). Since 0.45 it
also runs on a CPU (the smoke sweep runs it there).
"""

from __future__ import annotations

from harness.run.methods.base import AdamWOptions, StepOptimizerMethod


class BnbAdamW8bit(StepOptimizerMethod):
    name = "adamw8bit_bnb"
    Options = AdamWOptions
    requires = ("bitsandbytes",)

    def setup(self) -> None:
        import bitsandbytes as bnb

        o = self.options
        self.opt = bnb.optim.AdamW8bit(
            self.params(), lr=self.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
