"""Forward and backward with every gradient dropped as soon as it is accumulated: the floor.

No update happens, so this is the least time and memory any method that needs a backward can
take: FORGE's goal is to come close to it. Its loss does not fall, by design (`trains = False`).
"""

from __future__ import annotations

import torch

from harness.run.methods.base import Method, largest_param_bytes
from harness.run.methods.footprint import NONE, Footprint


class NoOptimizer(Method):
    name = "no_optimizer"
    title = "no optimizer"
    summary = "forward + backward, gradients dropped as they appear: the floor"
    order = 8
    tensor_parallel = True
    graph_capturable = True
    trains = False

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        return Footprint(weights, 0.0, 0.0, 2.0, NONE)  # the dW GEMM writes each gradient once

    def setup(self) -> None:
        self.hooks = [p.register_post_accumulate_grad_hook(self._drop) for p in self.params()]

    @staticmethod
    def _drop(p: torch.Tensor) -> None:
        p.grad = None

    def gradient_bytes(self) -> int:
        return largest_param_bytes(self.params())

    def master_weights(self) -> str:
        return "none (no update)"
