"""Fused updates on a second CUDA stream, beside the rest of the backward pass.

In a linear layer's backward FORGE first computes dX (a cuBLAS GEMM the layers below wait for),
then launches the fused dW GEMM + update, whose result nothing in this backward reads: only the
next forward uses the new weight. On one stream the update still sits on the critical path, and
at small token counts its epilogue is memory-bound (docs/performance.md): the tensor cores idle
while it streams the weight and states. On a second stream the update of layer i can run while
the dX GEMMs of the layers below it do, the way FSDP overlaps its post-backward work.

The rules, as FSDP keeps them: the side stream waits for the main stream before each update (dy
and x are ready), the tensors it reads are marked as used by it (`record_stream`: the allocator
does not reuse their memory before it is done), and once the backward ends the main stream waits
for the side stream (a callback queued on the autograd engine), so the next forward reads updated
weights. Both are CUDA events, so a CUDA-graph capture records the fork and the join too.

One more rule protects what the side stream reads from the main stream's writes, not only from
reuse. Where a tensor feeds two consumers, as the residual stream does, autograd sums its two
gradients into the first one's buffer in place when nothing else holds that buffer. `o_proj` and
`down_proj` get their dy from a residual add, the same tensor as the residual's first gradient,
so once their backward returns, the main stream could add the norm's gradient into the dy an
update still reads. The fork therefore keeps its tensors referenced until the side stream is
past them, and autograd then sums into a new buffer. It keeps the tensors a view was taken of
too: a reference to a view, such as the (T, N) reshape of dy the kernel reads, does not stop the
sum. Outside a capture the references go once an event recorded after the update has completed
(checked without waiting, at the next fork) or at the join; inside a capture, at the join.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator

import torch

from forge.guards import at_backward_end, backward_task


class UpdateStream:
    """One side stream per device for the fused updates, joined back at the end of each backward."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._pending: dict[torch.device, torch.cuda.Stream] = {}  # main streams still to join
        self._joined_task = -1  # the autograd graph task whose end already has a join queued
        # tensors an update on a side stream may still read, with the event that marks its end
        # (None inside a capture: kept until the join)
        self._in_flight: deque[tuple[torch.cuda.Event | None, tuple[torch.Tensor, ...]]] = deque()

    @contextlib.contextmanager
    def fork(self, *reads: torch.Tensor) -> Iterator[None]:
        """Run the body on the side stream of `reads[0]`'s device, after all the main stream's
        work so far; the tensors in `reads` stay allocated, and unwritten by autograd, until the
        side stream is done with them."""
        device = reads[0].device
        self._release_finished()
        main = torch.cuda.current_stream(device)
        side = self._streams.get(device)
        if side is None:
            side = self._streams[device] = torch.cuda.Stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            yield
            done = None if torch.cuda.is_current_stream_capturing() else side.record_event()
        for t in reads:
            t.record_stream(side)
        bases = tuple(t._base for t in reads if t._base is not None)  # a view does not stop the sum
        self._in_flight.append((done, reads + bases))
        self._pending.setdefault(device, main)
        task = backward_task()  # -1 outside a backward: join at once
        if task == -1:
            self._join()
        elif task != self._joined_task:  # once per backward, even after one that raised
            self._joined_task = task
            at_backward_end(self._join)

    def _release_finished(self) -> None:
        """Drop the references of the updates that have completed (in launch order, no waiting)."""
        while self._in_flight and self._in_flight[0][0] is not None and self._in_flight[0][0].query():
            self._in_flight.popleft()

    def _join(self) -> None:
        """End of backward: each main stream waits for the updates launched beside it, after which
        nothing the main stream does can overtake them."""
        for device, main in self._pending.items():
            main.wait_stream(self._streams[device])
        self._pending.clear()
        self._in_flight.clear()
