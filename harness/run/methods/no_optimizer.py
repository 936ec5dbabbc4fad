"""Forward and backward with every gradient dropped as soon as it is accumulated: the floor.

No update happens, so this is the least time and memory any method that needs a backward can
take: FORGE's goal is to come close to it. Its loss does not fall, by design (`trains = False`).
"""

from __future__ import annotations

import torch

from harness.run.methods.base import Method, largest_param_bytes


class NoOptimizer(Method):
    name = "no_optimizer"
    tensor_parallel = True
    graph_capturable = True
    trains = False

    def setup(self) -> None:
        self.hooks = [p.register_post_accumulate_grad_hook(self._drop) for p in self.params()]

    @staticmethod
    def _drop(p: torch.Tensor) -> None:
        p.grad = None

    def gradient_bytes(self) -> int:
        return largest_param_bytes(self.params())

    def master_weights(self) -> str:
        return "none (no update)"
