"""What a method holds at its peak and moves in its update, in bytes per parameter.

Each method declares its own model (`Method.footprint(options, weights)`), so the report's
expectations (`harness.report.expectations`) and its token model (`harness.report.token_model`)
know a new method from its class alone. A footprint is four figures and two facts about when the
update runs:

    weights          bytes of the weights the update is applied to (2 in bf16, 4 in fp32)
    grads            bytes of gradient alive at the peak (0 where at most one parameter's is)
    states           bytes of optimizer state (master weights and residuals count here)
    update_traffic   bytes the update reads and writes
    update           when it runs: AFTER_BACKWARD (a separate optimizer: every gradient in
                     memory, nothing overlaps it), IN_BACKWARD (hooks, one gradient at a time),
                     IN_GEMM (inside the weight-gradient GEMM: FORGE) or NONE (the floor)
    grads_persist    gradient buffers alive through the whole step (the fp32 main_grad buffers),
                     so they add to the activations instead of replacing them at the peak

A separate optimizer moves `2 x gradient + 2 x weights + 2 x states` bytes a parameter
(`separate`): the gradient written by backward and read back, weights and states read and written.

Two more facts for a method that trains the hidden matrices by one rule and the other parameters by
another (Muon's recipe, `harness.run.methods.muon`):

    rest             the footprint of the parameters outside the hidden matrices (embeddings, the
                     output head, norms), trained by the fallback rule; the four figures above are
                     then the hidden matrices', and `mixed` averages the two over a model's split
    workspace        one hidden layer's transient bytes while its update runs, as (bytes per
                     element of its (N, K) weight, bytes per element of a min(N, K)^2 Gram matrix):
                     Newton-Schulz's input, its iterates and its Gram matrices. One layer's is
                     alive at a time, so the largest layer's (`workspace_bytes`) adds to the peak
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

AFTER_BACKWARD, IN_BACKWARD, IN_GEMM, NONE = "after backward", "in backward", "in the dW GEMM", "none"

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "int8": 1.0}


@dataclass(frozen=True)
class Footprint:
    """Bytes per parameter held at the step's peak, and moved by the optimizer update."""

    weights: float
    grads: float
    states: float
    update_traffic: float
    update: str = IN_BACKWARD
    grads_persist: bool = False
    rest: Footprint | None = None  # the parameters outside the hidden matrices, under another rule
    workspace: tuple[float, float] = (0.0, 0.0)  # one layer's: bytes per N K, bytes per min(N, K)^2

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.states

    def mixed(self, hidden_fraction: float) -> Footprint:
        """Bytes per parameter averaged over a model whose hidden matrices hold `hidden_fraction` of
        its parameters (`rest` holds the others); itself where every parameter is alike."""
        if self.rest is None:
            return self
        rest, f = self.rest, min(max(hidden_fraction, 0.0), 1.0)

        def mix(hidden: float, other: float) -> float:
            return f * hidden + (1.0 - f) * other

        return replace(
            self,
            weights=mix(self.weights, rest.weights),
            grads=mix(self.grads, rest.grads),
            states=mix(self.states, rest.states),
            update_traffic=mix(self.update_traffic, rest.update_traffic),
            rest=None,
        )

    def workspace_bytes(self, shapes: Iterable[tuple[int, int]]) -> float:
        """The largest transient workspace over layers of these (N, K) shapes (0 without one)."""
        per_weight, per_gram = self.workspace
        return max((per_weight * n * k + per_gram * min(n, k) ** 2 for n, k in shapes), default=0.0)


def separate(weights: float, grads: float, states: float, grads_persist: bool = False) -> Footprint:
    """A method whose optimizer runs after backward and reads a gradient the backward wrote."""
    traffic = 2 * grads + 2 * weights + 2 * states
    return Footprint(weights, grads, states, traffic, AFTER_BACKWARD, grads_persist)


def element_bytes(dtype: str, block: int | None = None, scale_bytes: float = 4.0) -> float:
    """Bytes per element of one state tensor in `dtype`, with its share of a per-`block` scale of
    `scale_bytes` where quantized to int8 (an unknown dtype counts as 2 bytes)."""
    base = DTYPE_BYTES.get(dtype, 2.0)
    return base + scale_bytes / block if dtype == "int8" and block else base


def weight_state_bytes(options: dict, weights: float) -> float:
    """One AdamW moment of torch's kind: in the options' `state_dtype`, else in the weights' dtype."""
    return element_bytes(str(options.get("state_dtype") or ("fp32" if weights == 4.0 else "bf16")))
