"""Whole-step CUDA graphs: capture one training step once, replay it every step after.

At batch 1 an 8B model's step is host-bound: Python launches every kernel of the forward, the
backward and the update (under FORGE, one autograd Function call for each of Llama-3.1-8B's 225
linear layers), and the GPU waits between them. A CUDA graph records the kernels of one step once;
a replay launches them all with one call, so a replayed step costs the GPU's time and almost no
host time (torch's "CUDA Graphs" notes, whole-network capture). `Method.step` uses it when
`method.cuda_graph` is on:

    captured = CapturedStep(method.eager_step, method.params(), input_ids, method.before_replay)
    loss = captured.replay(input_ids)  # every step, the first one included

What is static. A replay runs the same kernels on the same addresses with the same scalar
arguments. The batch is a tensor the graph owns (`static_input`, a clone of the first batch):
each replay first copies the new batch into it. The loss is the tensor the captured step
returned (`static_loss`), overwritten by the next replay: read it before stepping again.
Weights and optimizer states are updated in place, at fixed addresses. A Python number read
during capture (a step count, a learning rate) is frozen into the graph, so what changes from
step to step must live in device memory: torch's AdamW is built `capturable=True` (its step
count on the device), and FORGE uploads each step's coefficients and seeds in `before_replay`,
which runs before every replay and never before an eager step.

Construction, in the order of torch's recipe:
1. `warmup` eager steps on a side stream. The first steps do the one-time work that must not
   happen inside a capture (optimizer states allocated, Triton kernels compiled, cuBLAS handles
   and workspaces made); capture itself runs on a non-default stream, and the current stream
   waits for the side stream before it starts. These steps update the weights: the first
   `replay` is the optimizer's `warmup + 1`-th step (the method notes it).
2. Every gradient set to None, so that the captured backward allocates its gradients from the
   graph's private memory pool rather than accumulating into tensors outside it.
3. One `eager_step` captured: its kernels are recorded, not run.

Memory. Tensors allocated during the capture come from the graph's private pool; memory freed
inside the capture returns to that pool and is reused only by later allocations of the same
capture, never by eager code, and the pool stays reserved for as long as the graph lives (a step's
activations and gradients stay reserved between steps). Replays allocate nothing. So, over a
graphed point's timed steps: `peak_alloc` (torch.cuda.max_memory_allocated) is the most memory
tensors held at once during the warm-up steps or the capture, and no replay can raise it. It is
somewhat above the eager step's: cuBLAS keeps a workspace per stream, and the warm-up's side
stream and the capture's stream each get their own, alive for the rest of the point (on
Llama-3.1-8B at 4,096 tokens the capture's peak is 0.09 GiB above an eager step's,
`python -m harness.kernels.graph_peak`). `peak_reserved` is the larger
of the warm-up's cache and what the graph keeps (its pool and the tensors alive outside it;
`torch.cuda.graph` empties the cache before capturing). The harness's forward hook
(`measure.ForwardEndMemory`) is Python, so it sees the warm-up steps and the capture, never a replay.

Attention under capture. transformers gives SDPA no mask for a batch of whole sequences (flash
attention, grouped-query heads) only after reading the position ids on the device to rule out
packing, which a capture cannot do: captured steps built the full mask and repeated keys and
values. The harness's models skip it themselves (`harness.run.models.whole_sequence_sdpa_mask`),
so a captured step runs the eager step's attention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

WARMUP_STEPS = 3  # eager steps before the capture, as in torch's whole-network example


class CapturedStep:
    """One training step captured in a CUDA graph at construction, then replayed by `replay`."""

    def __init__(
        self,
        eager_step: Callable[[torch.Tensor], torch.Tensor],
        params: Iterable[torch.Tensor],
        first_batch: torch.Tensor,
        before_replay: Callable[[], None] = lambda: None,
        warmup: int = WARMUP_STEPS,
    ) -> None:
        self.warmup = warmup
        self.before_replay = before_replay
        self.static_input = first_batch.clone()
        self._warm_up(eager_step)
        for p in params:
            p.grad = None  # the captured backward allocates them from the graph's pool
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_loss = eager_step(self.static_input)

    def _warm_up(self, eager_step: Callable[[torch.Tensor], torch.Tensor]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                eager_step(self.static_input)
        torch.cuda.current_stream().wait_stream(side)

    def replay(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the captured step on `input_ids`; returns the loss (overwritten by the next replay)."""
        if input_ids.shape != self.static_input.shape:
            raise ValueError(
                f"the captured step takes batches of shape {tuple(self.static_input.shape)}, got "
                f"{tuple(input_ids.shape)}: a CUDA graph replays fixed shapes; capture another step"
            )
        self.static_input.copy_(input_ids)
        self.before_replay()
        self.graph.replay()
        return self.static_loss
