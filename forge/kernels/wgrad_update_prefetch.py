"""The warp-specialized kernel with its update fed by the copy engine: W and the states through shared memory.

In the warp-specialized kernel (`forge.kernels.wgrad_update_ws`) the epilogue warps load each
slice of W and its states with plain global loads into registers: at most two slices are in flight
(`KernelConfig.overlap_slices`), and each load holds its registers until its bytes arrive. On the
H200 that update half alone moves its bytes at about 1.2x the copy rate's time, and Nsight Compute
finds the kernel latency-bound, with no unit saturated and half an eligible warp per scheduler
(docs/performance.md, "Where the time goes").

Here the copy engine brings them. A fourth partition, one copy warp, asks it for each slice's
blocks of W and of every state the rule has, by bulk tensor copies (TMA) into a ring of
`update_stages` slots in shared memory, as far ahead of the epilogue as the ring allows and across
tile boundaries (a tile's first slices load while the tile before is updated). Each slot has two
barriers, `landed` and `freed`:

    copy warp (1)           for each slice q of this program's tiles, in order:
                                wait until slot q % S is freed, ask for slice q into it (`landed`)
    epilogue warps (8)      for each slice q:
                                wait until slot q % S has landed
                                read the slice, and the gradient rows from the staging buffer
                                barrier of the epilogue warps, then free the slot
                                the rule in registers; W and the states stored to global memory

No register waits on a load, the bytes in flight are `update_stages` slices whatever the registers
allow, and the epilogue issues no copy itself (one issued from its 8 warps costs a barrier of all
of them per copy). The update's arithmetic is `update_tile.finish_tile_at`'s on the same values (what
lies past the weight's edge, the copy engine's zeros or a slot's old bytes, is never stored: the
stores are masked as before), and the loader and MMA warps are the warp-specialized kernel's: a
step equals that kernel's to the bit.

Shared memory holds the dy and x ring and the staging buffer of the warp-specialized kernel, plus
`update_stages` x epilogue_rows x BLOCK_K elements of W and of each state (`shared_bytes`);
`forge.kernels.configs` refuses a config that does not fit a Hopper multiprocessor.

Where it runs: the warp-specialized kernel's (Hopper, bf16 dy and x), fp32 or bf16 states, plain
weights (int8 states' scales and compensated weights' residuals are read by the shipped kernel only),
rows of W and the states 16-byte aligned, as the copy engine reads them. It is an option
(`KernelConfig.update_stages`), never FORGE's own choice until it is measured to win.
"""

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from forge.kernels import wgrad_update_ws as ws
from forge.kernels.launch import DirectLauncher
from forge.kernels.update_tile import finish_tile_at, load_step_values, offsets_of
from forge.kernels.wgrad_tile import tile_origin

SHARED_BYTES = 227 * 1024  # a Hopper multiprocessor's shared memory, as one program may take it


@gluon.jit
def allocate_update_ring(w_desc, s1_desc, s2_desc, s3_desc, STAGES: gl.constexpr, UPDATE):
    """The ring of STAGES slots of one slice of W and of each state the rule has (the descriptors'
    block shape and layout), with two barriers a slot: `landed` (the copy engine has written it)
    and `freed` (the epilogue has read it), initialised. A slot the rule lacks gets a placeholder
    of a few int8 bytes, never written or read: its 8-bit type is how the copy warp, which sees no
    compile-time argument but its buffers' types, knows the slot is absent."""
    ROWS: gl.constexpr = w_desc.block_type.shape[0]
    COLS: gl.constexpr = w_desc.block_type.shape[1]
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, ROWS, COLS], w_desc.layout)
    absent = gl.allocate_shared_memory(gl.int8, [STAGES, 1, 16], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    s1_bufs = absent
    s2_bufs = absent
    s3_bufs = absent
    if UPDATE[3]:
        s1_bufs = gl.allocate_shared_memory(s1_desc.dtype, [STAGES, ROWS, COLS], s1_desc.layout)
    if UPDATE[4]:
        s2_bufs = gl.allocate_shared_memory(s2_desc.dtype, [STAGES, ROWS, COLS], s2_desc.layout)
    if UPDATE[5]:
        s3_bufs = gl.allocate_shared_memory(s3_desc.dtype, [STAGES, ROWS, COLS], s3_desc.layout)
    landed = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    freed = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(landed.index(i), count=1)
        mbarrier.init(freed.index(i), count=1)
    fence_async_shared()  # the barriers initialised before the copy engine signals them
    return (w_bufs, s1_bufs, s2_bufs, s3_bufs), landed, freed


@gluon.jit
def copy_partition(w_desc, s1_desc, s2_desc, s3_desc, w_bufs, s1_bufs, s2_bufs, s3_bufs, landed, freed, acc_smem,
                   N, K):
    """The update's copy warp: for each slice of this program's tiles, in the epilogue's order, wait
    for its slot to be freed, then ask the copy engine for the slice of W and of each state (rows
    and columns past the weight's edge arrive as zeros, and count as bytes). A slice wholly past the
    last row is not copied: its slot is marked landed as it is, since the epilogue stores none of
    its rows."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    ROWS: gl.constexpr = w_bufs.type.shape[1]
    HAS_S1: gl.constexpr = s1_bufs.dtype.primitive_bitwidth > 8  # else the placeholder (`allocate_update_ring`)
    HAS_S2: gl.constexpr = s2_bufs.dtype.primitive_bitwidth > 8
    HAS_S3: gl.constexpr = s3_bufs.dtype.primitive_bitwidth > 8
    BYTES: gl.constexpr = (w_desc.block_type.nbytes + s1_desc.block_type.nbytes * HAS_S1
                           + s2_desc.block_type.nbytes * HAS_S2 + s3_desc.block_type.nbytes * HAS_S3)
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    q = 0  # slices requested so far
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, ws.GROUP_N)
        for r in gl.static_range(BLOCK_N // ROWS):
            slot = q % STAGES
            mbarrier.wait(freed.index(slot), ((q // STAGES) & 1) ^ 1)  # passes at once on the first lap
            bar = landed.index(slot)
            row = n0 + r * ROWS
            if row < N:
                mbarrier.expect(bar, BYTES)
                ws.tma_load(w_desc, [row, k0], bar, w_bufs.index(slot))
                if HAS_S1:
                    ws.tma_load(s1_desc, [row, k0], bar, s1_bufs.index(slot))
                if HAS_S2:
                    ws.tma_load(s2_desc, [row, k0], bar, s2_bufs.index(slot))
                if HAS_S3:
                    ws.tma_load(s3_desc, [row, k0], bar, s3_bufs.index(slot))
            else:  # the slice lies below the weight's last row: no copy, and none of its rows is stored
                mbarrier.arrive(bar)
            q += 1


@gluon.jit
def read_slice(bufs, slot, layout: gl.constexpr, UPDATE):
    """A slot's slice in `layout`, as `update_tile.load_tile_at` returns a slice: (w, s1, q1, s2,
    q2, s3, q3), the scales being the values again (no int8 here) and a slot the rule lacks W."""
    w_bufs, s1_bufs, s2_bufs, s3_bufs = bufs
    w = w_bufs.index(slot).load(layout)
    s1 = w
    s2 = w
    s3 = w
    if UPDATE[3]:
        s1 = s1_bufs.index(slot).load(layout)
    if UPDATE[4]:
        s2 = s2_bufs.index(slot).load(layout)
    if UPDATE[5]:
        s3 = s3_bufs.index(slot).load(layout)
    return w, s1, s1, s2, s2, s3, s3


@gluon.jit
def prefetching_epilogue(
    acc_smem, acc_ready, acc_empty, bufs, landed, freed,
    params, N, K, NUM_GROUPS, step, step_ptr, scale_ptr, UPDATE,  # as the kernel and `update_tile` take them
    GRAD_SCALE: gl.constexpr, STEPS_IN_MEMORY: gl.constexpr, FAST_EPILOGUE: gl.constexpr,
):
    """The optimizer update of each staged tile, slice by slice, W and the states from the ring
    (module docstring)."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    STAGES: gl.constexpr = bufs[0].type.shape[0]
    ROWS: gl.constexpr = bufs[0].type.shape[1]
    SLICES: gl.constexpr = BLOCK_N // ROWS
    QGROUP: gl.constexpr = UPDATE[10]
    THREADS_K: gl.constexpr = BLOCK_K // 8  # 8 elements per thread along K, as `ws.update_staged_tile`
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // THREADS_K, THREADS_K], [gl.num_warps(), 1], [1, 0])
    if STEPS_IN_MEMORY:
        step = load_step_values(step_ptr)
    grad_scale = 1.0
    if GRAD_SCALE:
        grad_scale = gl.load(scale_ptr)
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    q = 0
    done = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, ws.GROUP_N)
        offs_k = k0 + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
        groups = k0 // QGROUP + gl.arange(0, BLOCK_K // QGROUP, layout=gl.SliceLayout(0, layout))
        mbarrier.wait(acc_ready, done & 1)
        for r in gl.static_range(SLICES):
            slot = q % STAGES
            mbarrier.wait(landed.index(slot), (q // STAGES) & 1)
            loaded = read_slice(bufs, slot, layout, UPDATE)
            g = acc_smem.slice(r * ROWS, ROWS, dim=0).load(layout)
            ws.partition_barrier()  # every warp has read the slot and the gradient rows
            fence_async_shared()  # those reads before the copy engine's next writes to the slot
            mbarrier.arrive(freed.index(slot))
            if r == SLICES - 1:  # the whole tile is read: the MMA warps may stage the next
                mbarrier.arrive(acc_empty)
            if GRAD_SCALE:
                g = g * grad_scale
            offsets = offsets_of(n0 + r * ROWS + rows, offs_k, groups, N, K, NUM_GROUPS)
            finish_tile_at(g, offsets, loaded, params, step, UPDATE, ROWS, BLOCK_K, FAST_EPILOGUE, True)
            q += 1
        done += 1


@gluon.jit(do_not_specialize=["seed"])
def wgrad_update_prefetch_kernel(
    w_ptr,  # (N, K) fp32 | bf16, updated in place
    s1_ptr, s2_ptr, s3_ptr,  # (N, K) state slots: fp32 | bf16, updated in place
    q1_ptr, q2_ptr, q3_ptr,  # unread (int8 scales: not here), as `update_tile` takes them
    r_ptr,  # unread (compensated weights: not here)
    w_desc,  # W: a Gluon TMA descriptor of (ROWS, BLOCK_K) blocks, ROWS the epilogue's slice
    s1_desc, s2_desc, s3_desc,  # each state slot likewise; a slot the rule lacks: w_desc, unread
    dy_desc,  # (T, N) bf16: a Gluon TMA descriptor of (BLOCK_T, BLOCK_N) blocks
    x_desc,  # (T, K) bf16: a Gluon TMA descriptor of (BLOCK_T, BLOCK_K) blocks
    T, N, K, NUM_GROUPS,
    h0, h1, h2, h3, h4, h5, h6, h7, h8,  # fp32 rule coefficients for this step (forge.rules)
    seed,  # int32 stochastic-rounding seed for this step and tensor
    step_ptr,  # STEPS_IN_MEMORY: an int32 row holding this step's h0..h8 and seed; else unread
    scale_ptr,  # GRAD_SCALE: one fp32 the gradient is multiplied by (the clip coefficient); else unread
    UPDATE: gl.constexpr,  # the update: rule, state slots, storage (`update_tile.epilogue_constexprs`)
    GRAD_SCALE: gl.constexpr,  # scale the gradient by *scale_ptr (global-norm clipping)
    STEPS_IN_MEMORY: gl.constexpr,
    STAGES: gl.constexpr,  # ring slots of dy and x tiles
    UPDATE_STAGES: gl.constexpr,  # ring slots of W and state slices
    FAST_EPILOGUE: gl.constexpr,  # approximate sqrt and division, the hardware's bf16 rounding
):
    BLOCK_N: gl.constexpr = dy_desc.block_type.shape[1]
    dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty = ws.allocate_buffers(dy_desc, x_desc, STAGES)
    bufs, landed, freed = allocate_update_ring(w_desc, s1_desc, s2_desc, s3_desc, UPDATE_STAGES, UPDATE)
    workers = (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K)
    w_bufs, s1_bufs, s2_bufs, s3_bufs = bufs
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)  # as `update_tile` takes them
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    gl.warp_specialize([
        (prefetching_epilogue, (acc_smem, acc_ready, acc_empty, bufs, landed, freed, params, N, K, NUM_GROUPS, step,
                                step_ptr, scale_ptr, UPDATE, GRAD_SCALE, STEPS_IN_MEMORY, FAST_EPILOGUE)),
        (ws.mma_partition, workers),
        (ws.load_partition, workers),
        (copy_partition, (w_desc, s1_desc, s2_desc, s3_desc, w_bufs, s1_bufs, s2_bufs, s3_bufs, landed, freed,
                          acc_smem, N, K)),
    ], [BLOCK_N // 32, 1, 1], [ws.MMA_REGS if BLOCK_N == 128 else ws.WIDE_MMA_REGS, ws.LOADER_REGS, ws.LOADER_REGS])


_GLUON_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}


@functools.cache
def _shared_layout(rows: int, cols: int, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], _GLUON_DTYPES[dtype])


def slice_descriptor(t: torch.Tensor, rows: int, cols: int):
    """A Gluon TMA descriptor of the (N, K) fp32 or bf16 tensor `t` in (rows, cols) blocks."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor.from_tensor(t, [rows, cols], _shared_layout(rows, cols, t.dtype))


def shared_bytes(cfg, weight_bytes: int, state_bytes: tuple) -> int:
    """Shared memory of one program under `cfg` (bf16 operands): the dy and x ring, the staging
    buffer (rows padded by 4 words, `ws.allocate_buffers`), and `update_stages` slices of W (elements of
    `weight_bytes`) and of each state the rule has (`state_bytes`), and 1 KiB for the barriers and
    the buffers' alignment (the builds take under 400 bytes of it)."""
    ring = cfg.num_stages * cfg.block_t * (cfg.block_n + cfg.block_k) * 2
    staging = cfg.block_n * (cfg.block_k + 4) * 4
    update = cfg.update_stages * cfg.epilogue_rows * cfg.block_k * (weight_bytes + sum(state_bytes))
    return ring + staging + update + 1024


_launch = DirectLauncher(wgrad_update_prefetch_kernel)


def arguments(plan, weight, slots, dy, x, step: tuple) -> tuple:
    """The kernel's arguments for `plan` (a "prefetch" `forge.kernels.configs.Plan`): `slots` as
    `update_tile.slot_arguments`, `step` as `update_tile.step_arguments` return them. W and each
    state get descriptors of (epilogue_rows, block_k) blocks, dy and x of the plan's blocks, built
    on every launch (they hold the tensors' addresses)."""
    cfg = plan.config
    T, N = dy.shape
    K = x.shape[1]
    rows, cols = cfg.epilogue_rows, cfg.block_k
    w_desc = slice_descriptor(weight, rows, cols)
    state_descs = [w_desc if s is weight else slice_descriptor(s, rows, cols) for s in slots[:3]]
    dy_desc = ws.descriptor(dy, (cfg.block_t, cfg.block_n))
    x_desc = ws.descriptor(x, (cfg.block_t, cfg.block_k))
    return (weight, *slots, w_desc, *state_descs, dy_desc, x_desc, T, N, K, plan.num_groups, *step)


def launch(key, plan, weight, slots, dy, x, step: tuple) -> None:
    """Run `plan` for the problem `key` (`arguments` says what the others are)."""
    _launch(key, plan.grid, arguments(plan, weight, slots, dy, x, step), plan.constexprs, plan.options)
