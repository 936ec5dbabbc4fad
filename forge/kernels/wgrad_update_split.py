"""The fused kernel on Hopper with its multiprocessors specialized: GEMM programs and update programs.

The warp-specialized kernel (`forge.kernels.wgrad_update_ws`) runs a tile's GEMM and the update of
the tile before on the same multiprocessor, in two groups of warps. Measured on the H200, the MMA
warps take ~38% more cycles beside the update's warps than alone, and the update's warps, two a
scheduler, issue ~0.4 instructions a cycle. This kernel puts the two halves on different
multiprocessors instead, in one persistent launch of one program per multiprocessor:

    GEMM programs    the first `mma_programs`: the warp-specialized kernel's loader and MMA warps,
                     as shipped, over tiles pid, pid + mma_programs, ...; their default warps copy
                     each finished fp32 tile from the staging buffer to a slot of the hand-off ring
                     and publish it (a release store of the slot's lap)
    update programs  the rest: their default warps take tiles in the same order, wait for each
                     tile's slot to be published (acquire), read the gradient from the ring (through
                     L2, never L1) and run the same update as the warp-specialized epilogue, then
                     give the slot back

The ring is `ring_tiles` slots of one (BLOCK_N, BLOCK_K) fp32 tile each, a few MB that stay in L2:
the gradient of the whole layer never exists, only the tiles between their GEMM and their update.
Each slot has two counters in global memory: `published[slot]`, the laps written into it, and
`consumed[slot]`, the laps read out. A writer waits for its lap to be consumed before it
overwrites the slot; a reader waits for its lap to be published. The program that reads a slot's
last tile resets both counters to zero, so every launch starts and ends with a zeroed ring.

Deadlock freedom: every tile waits only for tiles of smaller index (its slot's previous lap), the
GEMM programs are the lowest program ids and the grid is at most one program per multiprocessor
(each takes ~194 KiB of shared memory, so no two share one): all programs are resident at once.

What it costs: the ring's 8 bytes a weight (4 written, 4 read) through L2, and the multiprocessors
given to the update do no GEMM. The choice of `update_programs` trades one against the other;
`python -m harness.kernels.split_sms` times it (docs/performance.md has what it measured).

Exactness: the GEMM programs sum each tile in the warp-specialized kernel's order and the update
programs apply its epilogue's code to the same fp32 gradient, so a step equals the warp-specialized
kernel's to the bit.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from forge.kernels import wgrad_update_ws as ws
from forge.kernels.launch import DirectLauncher
from forge.kernels.update_tile import finish_tile_at, load_step_values, load_tile_at, offsets_of
from forge.kernels.wgrad_tile import tile_origin


@gluon.jit
def _gemm_loader(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K,
                    mma_programs):
    """A GEMM program's loader (`wgrad_update_ws.load_tiles`); an update program's loader idles."""
    if gl.program_id(0) < mma_programs:
        ws.load_tiles(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K, gl.program_id(0), mma_programs)


@gluon.jit
def _gemm_mma(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K,
                   mma_programs):
    """A GEMM program's MMA warps (`wgrad_update_ws.mma_tiles`); an update program's idle."""
    if gl.program_id(0) < mma_programs:
        ws.mma_tiles(dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, gl.program_id(0),
                     mma_programs)


@gluon.jit
def _default_partition(
    acc_smem, acc_ready, acc_empty, ring_ptr, published, consumed, ring_tiles, mma_programs,
    params, N, K, NUM_GROUPS, step, step_ptr, scale_ptr, UPDATE,  # as the kernel and `update_tile` take them
    GRAD_SCALE: gl.constexpr, STEPS_IN_MEMORY: gl.constexpr,
    ROWS: gl.constexpr, FAST_EPILOGUE: gl.constexpr, OVERLAP_SLICES: gl.constexpr,
):
    """A GEMM program's ring writer, or an update program's updater."""
    pid = gl.program_id(0)
    if pid < mma_programs:
        _write_ring(acc_smem, acc_ready, acc_empty, ring_ptr, published, consumed, ring_tiles, mma_programs, N, K,
                    ROWS)
    else:
        if STEPS_IN_MEMORY:
            step = load_step_values(step_ptr)
        grad_scale = 1.0
        if GRAD_SCALE:
            grad_scale = gl.load(scale_ptr)
        _update_from_ring(acc_smem, ring_ptr, published, consumed, ring_tiles, pid - mma_programs,
                          gl.num_programs(0) - mma_programs, params, N, K, NUM_GROUPS, step, UPDATE, ROWS,
                          FAST_EPILOGUE, OVERLAP_SLICES, grad_scale, GRAD_SCALE)


@gluon.jit
def _spin_until_at_least(counter_ptr, target):
    """Wait until the counter reaches `target` (acquire: what was written before it was published
    is visible after)."""
    seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")


@gluon.jit
def _write_ring(acc_smem, acc_ready, acc_empty, ring_ptr, published, consumed, ring_tiles, mma_programs, N, K,
                ROWS: gl.constexpr):
    """Copy each staged tile of this GEMM program to its ring slot, ROWS rows at a time, and publish it."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    # the epilogue's layout, 8 elements a thread along K (`wgrad_update_ws.update_staged_tile`)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_K // 8), BLOCK_K // 8], [gl.num_warps(), 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    within = gl.expand_dims(rows, 1) * BLOCK_K + gl.expand_dims(cols, 0)
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    done = 0
    for tile in range(gl.program_id(0), tiles, mma_programs):
        slot = tile % ring_tiles
        lap = tile // ring_tiles
        _spin_until_at_least(consumed + slot, lap)  # the slot's previous lap has been read
        ws.partition_barrier()
        mbarrier.wait(acc_ready, done & 1)
        base = ring_ptr + slot.to(gl.int64) * (BLOCK_N * BLOCK_K)
        for r in gl.static_range(BLOCK_N // ROWS):
            g = acc_smem.slice(r * ROWS, ROWS, dim=0).load(layout)
            gl.store(base + r * ROWS * BLOCK_K + within, g, eviction_policy="evict_last")
        ws.partition_barrier()  # every warp's stores issued, the staged tile read
        mbarrier.arrive(acc_empty)
        gl.atomic_xchg(published + slot, lap + 1, sem="release", scope="gpu")
        done += 1


@gluon.jit
def _update_from_ring(
    acc_smem,  # unread here: its type carries the tile's shape
    ring_ptr, published, consumed, ring_tiles, first, stride,
    params, N, K, NUM_GROUPS, step, UPDATE,  # as `update_tile` takes them
    ROWS: gl.constexpr, FAST_EPILOGUE: gl.constexpr, OVERLAP_SLICES: gl.constexpr,
    grad_scale, GRAD_SCALE: gl.constexpr,
):
    """The update of tiles first, first + stride, ... from their ring slots, ROWS rows at a time, as
    `wgrad_update_ws.update_staged_tile` updates a staged tile; then the slot goes back."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    QGROUP: gl.constexpr = UPDATE[10]
    # the epilogue's layout, 8 elements a thread along K (`wgrad_update_ws.update_staged_tile`)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_K // 8), BLOCK_K // 8], [gl.num_warps(), 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    within = gl.expand_dims(rows, 1) * BLOCK_K + gl.expand_dims(cols, 0)
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    for tile in range(first, tiles, stride):
        slot = tile % ring_tiles
        lap = tile // ring_tiles
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, ws.GROUP_N)
        offs_k = k0 + cols
        groups = k0 // QGROUP + gl.arange(0, BLOCK_K // QGROUP, layout=gl.SliceLayout(0, layout))
        if OVERLAP_SLICES:  # the first slice's W and states do not wait for the gradient
            offsets = offsets_of(n0 + rows, offs_k, groups, N, K, NUM_GROUPS)
            loaded = load_tile_at(offsets, params, UPDATE)
        _spin_until_at_least(published + slot, lap + 1)
        ws.partition_barrier()
        base = ring_ptr + slot.to(gl.int64) * (BLOCK_N * BLOCK_K)
        for r in gl.static_range(BLOCK_N // ROWS):
            # through L2 (".cg"): this multiprocessor's L1 may hold the slot's previous lap
            g = gl.load(base + r * ROWS * BLOCK_K + within, cache_modifier=".cg")
            if GRAD_SCALE:
                g = g * grad_scale
            if not OVERLAP_SLICES:
                offsets = offsets_of(n0 + r * ROWS + rows, offs_k, groups, N, K, NUM_GROUPS)
                loaded = load_tile_at(offsets, params, UPDATE)
            elif r + 1 < BLOCK_N // ROWS:
                next_offsets = offsets_of(n0 + (r + 1) * ROWS + rows, offs_k, groups, N, K, NUM_GROUPS)
                next_loaded = load_tile_at(next_offsets, params, UPDATE)
            finish_tile_at(g, offsets, loaded, params, step, UPDATE, ROWS, BLOCK_K, FAST_EPILOGUE, True)
            if OVERLAP_SLICES and r + 1 < BLOCK_N // ROWS:
                offsets, loaded = next_offsets, next_loaded
        ws.partition_barrier()  # every warp has read the slot
        if tile + ring_tiles < tiles:
            gl.atomic_xchg(consumed + slot, lap + 1, sem="release", scope="gpu")
        else:  # the slot's last lap: leave it zeroed for the next launch
            gl.atomic_xchg(published + slot, 0, sem="relaxed", scope="gpu")
            gl.atomic_xchg(consumed + slot, 0, sem="relaxed", scope="gpu")


@gluon.jit(do_not_specialize=["seed", "mma_programs", "ring_tiles"])
def wgrad_update_split_kernel(
    w_ptr,  # (N, K) fp32 | bf16, updated in place
    s1_ptr, s2_ptr, s3_ptr,  # (N, K) state slots: fp32 | bf16 | int8/uint8 codes, updated in place
    q1_ptr, q2_ptr, q3_ptr,  # (N, NUM_GROUPS) bf16 int8 block scales, updated in place (else unread)
    r_ptr,  # KAHAN: (N, K) bf16 residual of the weight, updated in place; else unread
    dy_desc,  # (T, N) bf16: a Gluon TMA descriptor of (BLOCK_T, BLOCK_N) blocks
    x_desc,  # (T, K) bf16: a Gluon TMA descriptor of (BLOCK_T, BLOCK_K) blocks
    ring_ptr,  # (ring_tiles, BLOCK_N, BLOCK_K) fp32: the hand-off ring
    published, consumed,  # (ring_tiles,) int32 lap counters, zero between launches
    T, N, K, NUM_GROUPS,
    mma_programs,  # programs 0 .. mma_programs - 1 run the GEMM, the rest the update
    ring_tiles,  # slots of the ring
    h0, h1, h2, h3, h4, h5, h6, h7, h8,  # fp32 rule coefficients for this step (forge.rules)
    seed,  # int32 stochastic-rounding seed for this step and tensor
    step_ptr,  # STEPS_IN_MEMORY: an int32 row holding this step's h0..h8 and seed; else unread
    scale_ptr,  # GRAD_SCALE: one fp32 the gradient is multiplied by (the clip coefficient); else unread
    UPDATE: gl.constexpr,  # the update: rule, state slots, storage (`update_tile.epilogue_constexprs`)
    GRAD_SCALE: gl.constexpr,  # scale the gradient by *scale_ptr (global-norm clipping)
    STEPS_IN_MEMORY: gl.constexpr,
    STAGES: gl.constexpr,  # ring slots of dy and x tiles in shared memory
    ROWS: gl.constexpr,  # rows of a tile the update (and the ring copy) handles at once
    FAST_EPILOGUE: gl.constexpr,  # approximate sqrt and division, the hardware's bf16 rounding
    OVERLAP_SLICES: gl.constexpr,  # load a slice's W and states before the slice above is updated
):
    dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty = ws.allocate_buffers(dy_desc, x_desc, STAGES)
    workers = (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, mma_programs)
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)  # as `update_tile` takes them
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    gl.warp_specialize([
        (_default_partition, (acc_smem, acc_ready, acc_empty, ring_ptr, published, consumed, ring_tiles,
                              mma_programs, params, N, K, NUM_GROUPS, step, step_ptr, scale_ptr, UPDATE, GRAD_SCALE,
                              STEPS_IN_MEMORY, ROWS, FAST_EPILOGUE, OVERLAP_SLICES)),
        (_gemm_mma, workers),
        (_gemm_loader, workers),
    ], [4, 1], [ws.MMA_REGS, ws.LOADER_REGS])


_rings: dict = {}  # (device, slots) -> (ring, published, consumed)


def hand_off_ring(device: torch.device, slots: int, tile_elements: int) -> tuple:
    """The ring of `slots` fp32 tiles and its two zeroed lap counters on `device`, made once and
    kept: every launch leaves the counters zeroed (module docstring). Two launches must not run at
    once on one ring: FORGE's fused launches of a device run on one stream, in order."""
    key = (device, slots, tile_elements)
    ring = _rings.get(key)
    if ring is None:
        ring = _rings[key] = (
            torch.empty(slots * tile_elements, device=device, dtype=torch.float32),
            torch.zeros(slots, device=device, dtype=torch.int32),
            torch.zeros(slots, device=device, dtype=torch.int32),
        )
    return ring


_launch = DirectLauncher(wgrad_update_split_kernel)


def launch(key, plan, weight, slots, dy, x, step: tuple) -> None:
    """Run `plan` (a "split" `forge.kernels.configs.Plan`) for the problem `key`: `slots` as
    `update_tile.slot_arguments`, `step` as `update_tile.step_arguments` return them."""
    cfg = plan.config
    T, N = dy.shape
    K = x.shape[1]
    dy_desc = ws.descriptor(dy, (cfg.block_t, cfg.block_n))
    x_desc = ws.descriptor(x, (cfg.block_t, cfg.block_k))
    programs = plan.grid[0]
    mma_programs = programs - cfg.update_programs
    ring_tiles = cfg.ring_tiles or 2 * mma_programs
    ring, published, consumed = hand_off_ring(dy.device, ring_tiles, cfg.block_n * cfg.block_k)
    args = (weight, *slots, dy_desc, x_desc, ring, published, consumed, T, N, K, plan.num_groups, mma_programs,
            ring_tiles, *step)
    _launch(key, plan.grid, args, plan.constexprs, plan.options)
