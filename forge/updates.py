"""When each FORGE update runs: at once, on a second stream, after the clip norm, or after the
data-parallel reduction.

Two kinds of update reach an optimizer during backward, and `Updates` routes both:

    update_linear(weight, dy, x)     a ForgeLinear's backward: the weight's gradient is dy^T x,
                                     never stored
    update_elementwise(p, grad)      a post-accumulate-grad hook: any other parameter's gradient

in this order of precedence:

1. data-parallel replicas (`forge.data_parallel.GradientReducer`): every gradient is averaged over
   the ranks first, a fused layer's too (dy^T x is materialized for it), and applied by the
   element-wise kernel once its bucket's all-reduce completes (`apply_gradient`);
2. global-norm clipping (`forge.clip.GlobalNormClip`): the norm now, the step when the backward
   ends, scaled by the clip coefficient;
3. the update stream (`forge.streams.UpdateStream`): a fused step on a second CUDA stream;
4. a vector (a norm weight, a bias: `forge.vectors.VectorBatch`): gathered, and launched with the
   backward's other vectors when it ends;
5. otherwise the launch at once (`forge.functional.Launcher`).

`row_block_updater` serves `forge.head`, whose lm_head gradient comes a block of rows at a time;
it refuses what cannot be done that way (`check_row_blocks`) before any step is counted.

`check_options` refuses, before an optimizer is built, the combinations these paths cannot run.
"""

from __future__ import annotations

import torch

from forge.clip import GlobalNormClip, check_clip_options
from forge.data_parallel import REPLICAS, SHARDS, DataParallel, GradientReducer
from forge.distributed import is_dtensor, local
from forge.functional import Launcher, RowBlockUpdate
from forge.guards import BackwardCheck
from forge.streams import UpdateStream
from forge.vectors import VectorBatch


class Updates:
    """How the updates of one optimizer run (see the module): `launcher` launches them, `check`
    runs before each backward's first one; `max_grad_norm` (of `norm_type`) clips them, and
    `update_stream` runs fused ones on a second stream. `reduce_over` adds data-parallel replicas
    once the parameters are known."""

    def __init__(
        self,
        launcher: Launcher,
        check: BackwardCheck,
        max_grad_norm: float | None = None,
        norm_type: float = 2.0,
        update_stream: bool = False,
    ):
        self.launcher = launcher
        self.check = check
        self.clip: GlobalNormClip | None = None
        if max_grad_norm is not None:  # the updates deferred to the end of backward
            self.clip = GlobalNormClip(launcher, *check_clip_options(max_grad_norm, norm_type))
        self.stream = UpdateStream() if update_stream else None
        self.reducer: GradientReducer | None = None
        self.vectors = VectorBatch(launcher)

    def reduce_over(self, parallel: DataParallel, params: list[torch.Tensor]) -> None:
        """Average every gradient of `params` over the replicas' group before its step."""
        self.reducer = GradientReducer(params, parallel.group, parallel.bucket_cap_mb, self.apply_gradient)

    # ------------------------------------------------------------------ the two kinds of update

    def update_linear(
        self,
        weight: torch.Tensor,
        dy: torch.Tensor,
        x: torch.Tensor,
        *,
        config=None,
        into: tuple | None = None,
        grad_scale: torch.Tensor | None = None,
    ) -> None:
        """One step of `weight` (N, K) from the gradient dy^T x (dy: (T, N), x: (T, K)), fused where
        it can be (see the module). `config`: a `forge.kernels.KernelConfig` to launch under
        (benchmarks, the offline tuner); by default the shipped table's choice. `into`: (w, slots),
        the tensors to write the step into instead of `weight`'s own (torch.compile's custom op is
        handed functional copies: `forge.ops`); `weight` still names the parameter whose step count,
        hyperparameters and seed apply. With max_grad_norm `into` is not used: the step runs when the
        backward ends, after the compiled graph has written its copies back. `grad_scale`: a
        one-element fp32 tensor the product dy^T x is multiplied by (FP8 operands, T-contiguous, and
        their dequantization scale: `forge.fp8`).

        No torch.no_grad() here: nothing below is a torch op that autograd could record (the
        kernel writes through raw pointers), and the context manager cost each of the 225 calls of
        a Llama-3.1-8B step a few microseconds of host."""
        if self.reducer is not None:  # replicas: dW itself must be averaged over the ranks first
            if grad_scale is not None:
                raise ValueError("FORGE's data-parallel reducer takes bf16 or fp32 operands, not FP8 ones")
            self.update_elementwise(weight, (dy.t() @ x).to(local(weight).dtype))
        elif self.clip is not None:  # the norm now, the update when the backward ends (forge.clip)
            if grad_scale is not None:
                raise ValueError("FORGE's clipping takes bf16 or fp32 operands, not FP8 ones (forge.fp8)")
            self.check.once()
            self.clip.add_linear(weight, dy, x, config)
        elif self.stream is not None and dy.is_cuda:
            reads = (dy, x) if grad_scale is None else (dy, x, grad_scale)  # FP8: its scale too
            with self.stream.fork(*reads):
                self.launcher.fused(weight, dy, x, config, grad_scale, into=into)
        else:
            self.launcher.fused(weight, dy, x, config, grad_scale, into=into)

    def update_elementwise(self, p: torch.Tensor, grad: torch.Tensor, *, into: tuple | None = None) -> None:
        """One step of any parameter from its materialized gradient (see the module). `into`: as
        for `update_linear`. Under no_grad: a hook inside backward is there already, so only a
        direct call with grad mode on enters it (the context manager costs every hook's host time)."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self.update_elementwise(p, grad, into=into)
        if self.reducer is None:
            self.apply_gradient(p, grad, into=into)
            return
        if into is not None:
            raise NotImplementedError(
                "FORGE under data parallelism updates each parameter when its gradient's all-reduce "
                "completes, outside any compiled graph: train the data-parallel model without "
                "torch.compile's FORGE ops (or compile only its forward)"
            )
        self.check.once()
        self.reducer.add(p, grad)

    def apply_gradient(self, p: torch.Tensor, grad: torch.Tensor, *, into: tuple | None = None) -> None:
        """The step of p from its complete gradient (reduced over the ranks where that applies)."""
        if self.clip is not None:
            self.check.once()
            self.clip.add_elementwise(p, grad)
        elif into is not None or self.reducer is not None or not self.vectors.add(p, grad):
            self.launcher.elementwise(p, grad, into=into)

    # ------------------------------------------------------------------ a block of rows at a time

    def row_block_updater(self, weight: torch.Tensor) -> RowBlockUpdate:
        """Counts one step of `weight` now and returns `update(block, start, dy, x)` for each block of
        its rows (`forge.functional.Launcher.row_blocks`), on the update stream where there is one.
        Refused, before anything is counted, where `check_row_blocks` refuses."""
        self.check_row_blocks(weight)
        return self.launcher.row_blocks(weight, None if self.stream is None else self.stream.fork)

    def check_row_blocks(self, weight: torch.Tensor) -> None:
        """Refuses what `row_block_updater` cannot do for `weight`, saying what to do instead."""
        if self.clip is not None:
            raise ValueError(
                "FORGE: a weight updated a block of rows at a time (forge.head) cannot be clipped by the "
                "global norm, which needs every gradient before any update. Drop max_grad_norm, or compute "
                "the loss from the logits (the head as an ordinary ForgeLinear)."
            )
        if self.reducer is not None:
            raise ValueError(
                "FORGE: under data parallelism a weight's gradient is reduced whole before its update, "
                "so forge.head cannot update lm_head a block of rows at a time: compute the loss from the "
                "logits (the head as an ordinary ForgeLinear)."
            )
        if is_dtensor(weight):
            raise ValueError(
                "FORGE: forge.head takes a whole lm_head weight, not a sharded (DTensor) one: leave "
                "lm_head out of the tensor-parallel plan, or compute the loss from the logits."
            )

    # ------------------------------------------------------------------ the reducer's saved order

    def bucket_order(self, index_of) -> list[int] | None:
        """The reducer's learned bucket order as parameter indices (`index_of(p)`); None without a
        reducer or before it has learned one (`forge.data_parallel`)."""
        order = None if self.reducer is None else self.reducer.bucket_order()
        return None if order is None else [index_of(p) for p in order]

    def saved_bucket_order(self, saved: list[int] | None, param_of: dict) -> list | None:
        """A saved bucket order as parameters (`param_of`: saved index -> parameter), checked before
        anything loads; None where there is nothing to restore (learned again in the next backward)."""
        if self.reducer is None or saved is None:
            return None
        order = [param_of.get(i) for i in saved]
        self.reducer.check_bucket_order(order)
        return order

    def restore_bucket_order(self, order: list | None) -> None:
        """Bucket as `saved_bucket_order` returned (None: the static order)."""
        if self.reducer is not None:
            self.reducer.restore_bucket_order(order)


def check_options(
    data_parallel: DataParallel | None, capturable: bool, update_stream: bool, max_grad_norm: float | None
) -> None:
    """Refuse the options FORGE does not run together, saying what to do instead."""
    if data_parallel is not None:
        _check_data_parallel_options(data_parallel, capturable, update_stream, max_grad_norm)
    if update_stream and max_grad_norm is not None:
        raise ValueError(
            "update_stream=True overlaps each fused update with the dX GEMMs below it, but with "
            "max_grad_norm every update waits for the end of backward: there is nothing to overlap. "
            "Leave update_stream off with clipping."
        )


def _check_data_parallel_options(
    data_parallel: DataParallel, capturable: bool, update_stream: bool, max_grad_norm: float | None
) -> None:
    how = "data-parallel replicas" if data_parallel.kind == REPLICAS else "FSDP2"
    if capturable:
        raise ValueError(
            f"capturable=True under {how}: the updates wait for collectives issued from the host as the "
            "backward goes, which a captured CUDA graph would replay without their host side. Train "
            "eagerly (capturable=False)."
        )
    if update_stream:
        raise ValueError(
            f"update_stream=True under {how}: it overlaps the fused dW kernel, which data parallelism "
            "does not run (each gradient is reduced first). Leave update_stream off."
        )
    if max_grad_norm is not None and data_parallel.kind == SHARDS:
        raise NotImplementedError(
            "max_grad_norm under FSDP2: the global norm needs every rank's shard norms summed before any "
            "update, which FORGE does not yet do. Train FSDP2 without max_grad_norm, or clip under DDP "
            "(forge.attach(DDP(model), ..., max_grad_norm=...)), where it is exact."
        )
