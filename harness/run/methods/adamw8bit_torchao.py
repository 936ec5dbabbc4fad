"""torchao's AdamW8bit: 8-bit moments as tensor subclasses (256-element blocks), step compiled.

Called as its README says: `from torchao.optim import AdamW8bit; AdamW8bit(model.parameters(),
lr=...)`. It compiles one step function per parameter shape with torch.compile (the first steps
are slow: warm-up covers them). States are tensor subclasses: `measure.nbytes` counts their
inner codes and scales.
"""

from __future__ import annotations

from harness.run.methods.base import AdamWOptions, StepOptimizerMethod


class TorchaoAdamW8bit(StepOptimizerMethod):
    name = "adamw8bit_torchao"
    Options = AdamWOptions
    requires = ("torchao",)
    needs_cuda = (
        "torchao's AdamW8bit is compared on CUDA only: it compiles one step per parameter shape with "
        "torch.compile, which takes minutes on a CPU even for a tiny model"
    )

    def setup(self) -> None:
        from torchao.optim import AdamW8bit

        o = self.options
        self.opt = AdamW8bit(
            self.params(), lr=self.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
