"""torchao's AdamW8bit: 8-bit moments as tensor subclasses (256-element blocks), step compiled.

Called as its README says: `from torchao.optim import AdamW8bit; AdamW8bit(model.parameters(),
lr=...)`. It compiles one step function per parameter shape with torch.compile (the first steps
are slow: warm-up covers them). States are tensor subclasses: `measure.nbytes` counts their
inner codes and scales.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.methods.base import Method, state_tensors_of


@dataclass
class TorchaoOptions:
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01


class TorchaoAdamW8bit(Method):
    name = "adamw8bit_torchao"
    Options = TorchaoOptions
    requires = ("torchao",)
    needs_cuda = "torchao's AdamW8bit is compared on CUDA only (it compiles a CUDA step per parameter)"

    def setup(self) -> None:
        from torchao.optim import AdamW8bit

        o = self.options
        self.opt = AdamW8bit(
            self.params(), lr=self.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )

    def update(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def optimizer_state_tensors(self):
        return state_tensors_of(self.opt)
