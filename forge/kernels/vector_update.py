"""The optimizer update of many vector parameters (norm weights, biases) in one launch.

A transformer has a few vectors per layer (RMSNorm weights, q/k norms, biases): Llama-3.1-8B 65,
Qwen3-0.6B 113. Each gets its gradient from autograd and, updated one at a time, one launch of the
element-wise kernel (`forge.kernels.elementwise_update`) whose host cost (20 us on the H200
machine, `harness.kernels.launch_breakdown`'s `elementwise_update, norm`) dwarfs its few kilobytes
of traffic. Here one launch updates a list of them, as torch's `_foreach` and fused optimizers do:
each program takes one (1, BLOCK) tile of one vector, reads where that vector, its gradient, its
states and its step's scalars live from tables the host filled, and hands the tile to
`update_tile`, the epilogue every update kernel ends in.

Exactness: each element meets the arithmetic of the element-wise kernel (the same `update_tile`,
the coefficients as fp32 bits and the seed read from a step row as a captured launch reads them,
`update_tile.load_step_values`), and the stochastic rounding keys an element by its column within
its own vector (`rounding.noise_index`), so the bits do not depend on the block or on which other
vectors share the launch.

Tables, built by `update_vectors` (shapes: P vectors, G programs):
    table    (P, 7) int64   the addresses of the weight, its gradient, its three state slots (the
                            weight's where the rule has no such slot: never read), the weight's
                            bf16 residual (compensated weights; else the weight's), and its length
    programs (G, 2) int64   each program's vector and tile
    steps    (P, STEP_ROW) int32   each vector's coefficients (fp32 bits) and seed
On a GPU the three go to the device in one copy from pinned memory.

Vectors only: a vector keeps bf16 states under int8 (`forge.states`), so no block scales are read;
the launch takes vectors of one weight dtype, one gradient dtype and one state storage.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from forge.kernels.launch import DirectLauncher, tensor_facts
from forge.kernels.quant import GROUP
from forge.kernels.update_tile import STEP_ROW, epilogue_constexprs, load_step_values, update_tile

_COLUMNS = 7  # the table's: weight, gradient, three slots, residual, length
# Elements of a vector per program: four warps, eight elements a thread on a GPU, and few programs
# on the interpreter, whose cost is per program.
BLOCK = 1024


@triton.jit
def vector_update_kernel(
    table_ptr,  # (P, 7) int64: per vector, its tensors' addresses and its length (module docstring)
    programs_ptr,  # (G, 2) int64: each program's vector and tile
    steps_ptr,  # (P, STEP_ROW) int32: each vector's coefficients (fp32 bits) and seed
    UPDATE: tl.constexpr,  # the update: rule, state slots, storage (`update_tile.epilogue_constexprs`)
    W_DTYPE: tl.constexpr,  # the weights' element type (fp32 | bf16)
    G_DTYPE: tl.constexpr,  # the gradients' element type
    S_DTYPE: tl.constexpr,  # the states' element type (fp32 | bf16)
    BLOCK: tl.constexpr,  # elements of a vector per program, a multiple of QGROUP
    ROW: tl.constexpr,  # int32 words in a step row (`update_tile.STEP_ROW`)
    COLUMNS: tl.constexpr,  # int64 words in a row of the table (7)
):
    """One program per (1, BLOCK) tile of one vector: load its gradient, update it."""
    QGROUP: tl.constexpr = UPDATE[10]
    vector = tl.load(programs_ptr + 2 * tl.program_id(0))
    tile = tl.load(programs_ptr + 2 * tl.program_id(0) + 1)
    row = table_ptr + vector * COLUMNS
    w_ptr = tl.load(row).to(tl.pointer_type(W_DTYPE))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(G_DTYPE))
    s1_ptr = tl.load(row + 2).to(tl.pointer_type(S_DTYPE))
    s2_ptr = tl.load(row + 3).to(tl.pointer_type(S_DTYPE))
    s3_ptr = tl.load(row + 4).to(tl.pointer_type(S_DTYPE))
    r_ptr = tl.load(row + 5).to(tl.pointer_type(tl.bfloat16))
    C = tl.load(row + 6)
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, w_ptr, w_ptr, w_ptr, r_ptr)  # as `update_tile` takes them; no scales
    step = load_step_values(steps_ptr + vector * ROW)
    c_start = tile * BLOCK
    offs = c_start + tl.arange(0, BLOCK)
    g = tl.load(g_ptr + offs[None, :], mask=offs[None, :] < C, other=0.0).to(tl.float32)
    update_tile(g, 0, c_start, params, 1, C, (C + QGROUP - 1) // QGROUP, step, UPDATE, 1, BLOCK)


_launch = DirectLauncher(vector_update_kernel)

_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def update_vectors(
    params: list[torch.Tensor], grads: list[torch.Tensor], states: list[tuple], residuals: list,
    step_rows: np.ndarray, signed: tuple,
    *, rule: str, flags: dict, state_dtype: str, stochastic_rounding: bool,
) -> None:  # fmt: skip
    """One optimizer step of each vector in `params` (1-D, contiguous, one dtype, on one device)
    from its gradient in `grads` (contiguous, one dtype), in one launch. `states`: each vector's
    three state slots (None where the rule has none; one storage, fp32 or bf16); `residuals`: each
    one's bf16 residual (compensated weights) or None; `step_rows`: (P, STEP_ROW) int32, each
    vector's coefficients and seed (`forge.steps`' step-row layout); `signed`, `rule`, `flags`,
    `state_dtype`, `stochastic_rounding`: as the element-wise kernel takes them, alike for all."""
    if not params:
        return
    first = params[0]
    kahan = residuals[0] is not None
    block = BLOCK
    addresses = []
    for p, g, (s1, s2, s3), r in zip(params, grads, states, residuals):
        w = p.data_ptr()
        addresses += (
            w, g.data_ptr(), w if s1 is None else s1.data_ptr(), w if s2 is None else s2.data_ptr(),
            w if s3 is None else s3.data_ptr(), w if r is None else r.data_ptr(), p.numel(),
        )  # fmt: skip
    table = np.array(addresses, np.int64).reshape(len(params), _COLUMNS)
    tiles = -(-table[:, 6] // block)
    vector = np.repeat(np.arange(len(params)), tiles)
    first_program = np.cumsum(tiles) - tiles  # each vector's first program
    programs = np.stack((vector, np.arange(len(vector)) - first_program[vector]), 1)
    table_t, programs_t, steps_t = _to_device(first.device, table, programs, step_rows)
    s_dtype = next((s.dtype for slots in states for s in slots if s is not None), first.dtype)
    constexprs = dict(
        UPDATE=epilogue_constexprs(states[0], signed, rule=rule, flags=flags, state_dtype=state_dtype,
                                   stochastic_rounding=stochastic_rounding, int8_group=GROUP, kahan=kahan)["UPDATE"],
        W_DTYPE=_TRITON_DTYPES[first.dtype], G_DTYPE=_TRITON_DTYPES[grads[0].dtype], S_DTYPE=_TRITON_DTYPES[s_dtype],
        BLOCK=block, ROW=STEP_ROW, COLUMNS=_COLUMNS,
    )  # fmt: skip
    key = (first.get_device(), first.dtype, grads[0].dtype, s_dtype, constexprs["UPDATE"], block,
           tensor_facts(table_t, programs_t, steps_t))
    _launch(key, (len(vector),), (table_t, programs_t, steps_t), constexprs, dict(num_warps=4))


def _to_device(device: torch.device, *arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
    """The host tables on `device`: on a GPU in one copy from pinned memory (the caching host
    allocator keeps the pinned block until the copy that reads it has run), as views of one buffer."""
    flat = [np.ascontiguousarray(a).view(np.uint8).reshape(-1) for a in arrays]
    sizes = [f.size for f in flat]
    padded = [-(-s // 16) * 16 for s in sizes]  # each table 16-byte aligned
    host = np.zeros(sum(padded), np.uint8)
    at = 0
    for f, size in zip(flat, padded):
        host[at : at + f.size] = f
        at += size
    buffer = torch.from_numpy(host)
    if device.type == "cuda":
        buffer = buffer.pin_memory().to(device, non_blocking=True)
    views, at = [], 0
    for a, size in zip(arrays, padded):
        views.append(buffer[at : at + a.nbytes].view(_TORCH_OF[a.dtype]).view(a.shape))
        at += size
    return tuple(views)


_TORCH_OF = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32}
