"""torchao's AdamW8bit: 8-bit moments as tensor subclasses (256-element blocks), step compiled.

Called as its README says: `from torchao.optim import AdamW8bit; AdamW8bit(model.parameters(),
lr=...)`. It compiles one step function per parameter shape with torch.compile (the first steps
are slow: warm-up covers them). States are tensor subclasses: `measure.nbytes` counts their
inner codes and scales.
"""

from __future__ import annotations

from harness.run.methods.base import AdamWOptions, StepOptimizerMethod
from harness.run.methods.footprint import Footprint, element_bytes, separate


class TorchaoAdamW8bit(StepOptimizerMethod):
    name = "adamw8bit_torchao"
    title = "torchao AdamW8bit"
    summary = "torchao.optim.AdamW8bit: 8-bit moments as tensor subclasses (CUDA)"
    order = 6
    Options = AdamWOptions
    requires = ("torchao",)
    needs_cuda = (
        "torchao's AdamW8bit is compared on CUDA only: it compiles one step per parameter shape with "
        "torch.compile, which takes minutes on a CPU even for a tiny model"
    )

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        return separate(weights, 2.0, 2 * element_bytes("int8", 256))  # an fp32 scale per 256

    def setup(self) -> None:
        from torchao.optim import AdamW8bit

        o = self.options
        self.opt = AdamW8bit(
            self.params(), lr=self.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
