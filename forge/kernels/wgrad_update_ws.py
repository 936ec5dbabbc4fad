"""The fused kernel on Hopper, warp-specialized: one tile's update runs while the next tile's GEMM does.

The Triton kernel (`forge.kernels.wgrad_update`) runs each tile's GEMM main loop and then its
update (the epilogue) in the same warps, so the update's memory traffic waits for the tensor cores
and the tensor cores wait for it: measured on the H200, its time is the GEMM's plus the update's
bytes at ~3.4 TB/s. Here one program per multiprocessor runs
three groups of warps at once (Gluon's `warp_specialize`), handing tiles along through shared
memory and mbarriers:

    loader    1 warp     TMA copies of dy and x tiles into a ring of `num_stages` slots
    MMA       4-8 warps  wgmma over the ring into a (BLOCK_N, BLOCK_K) fp32 accumulator in
                         registers, one warpgroup per 128 rows (a 256-row tile shares each x tile
                         between two; FP8: per 64 rows, below); the finished tile goes to a
                         staging buffer in shared memory
    epilogue  4-8 warps  the optimizer update of the staged tile, `epilogue_rows` rows at a time:
                         the same `update_tile` code as the Triton kernel (every rule, fp32, bf16
                         and int8 states, stochastic rounding, steps read from memory)

The gradient tile lives in registers, then in shared memory, and dies there: never in global
memory. The MMA warps start the next tile as soon as the staging buffer is free, i.e. while the
epilogue warps update the tile before.

FP8 operands (`forge.fp8`: e5m2 dy and e4m3 x, both contiguous along T, the layout FP8 wgmma
reads) take the same partitions with T-major tiles: the loader copies (BLOCK_N, BLOCK_T) and
(BLOCK_K, BLOCK_T) blocks of dy^T and x^T, and each MMA adds its BLOCK_T tokens' products into the
fp32 accumulator (`max_num_imprecise_acc`; Hopper's FP8 MMA keeps fewer bits in its own), as the
Triton kernel's T-major loop does. That takes a second accumulator, so one MMA warpgroup covers 64
rows instead of 128, and a 128-row tile takes two.

Where it runs: Hopper (sm_90: wgmma and TMA), bf16 or FP8 operands that TMA can read, any state dtype.
FORGE launches it unasked on grids of at least one tile per multiprocessor (four for fp32 states;
`forge.kernels.configs.WARP_SPECIALIZED_DEFAULTS`); `forge.kernels.wgrad_update` hands it the launch
and `launch` below runs it. Its epilogue warps bound it at small T: their code issues
~2.2x the instructions of a plain AdamW epilogue (IEEE sqrt and division, Philox, integer bf16
rounding), and `fast_epilogue`, the bf16 and int8 states' default, drops the first and the last of
those. int8 states quantize each group of 64 or 128 codes in a (rows, groups, group) view of the
slice; Gluon's layouts are explicit, so `update_tile` is asked (LAYOUTS) to convert the scales and
codes between that view's layout and the slice's. fp32 operands (exact fp32 products, which wgmma
does not offer) and other GPUs use the Triton kernel; the CPU interpreter cannot run Gluon.

Triton 3.6 (the GPU image) and 3.9 (CI) name two of the operations differently; the aliases below
take whichever exists. A worker partition receives its arguments as IR values, so the only
compile-time values it sees are those carried by the types of its shared-memory buffers (tile
shapes, ring depth) and module constants.
"""

import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from forge.kernels.launch import DirectLauncher
from forge.kernels.update_tile import finish_tile_at, load_step_values, load_tile_at, offsets_of
from forge.kernels.wgrad_tile import tile_origin

partition_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared

GROUP_N = gl.constexpr(8)  # tiles of N walked together, for L2 reuse of x (`wgrad_tile.tile_origin`)
# Registers per thread of the MMA warps: a 128 x 128 fp32 accumulator takes 128 and the loop a few
# more; 184 builds without spills (triton 3.6 and 3.9) and leaves 152 to each of 8 epilogue warps
# (232, the first choice, left them 128, where the exact epilogue with the grouped stochastic
# rounding of `forge.kernels.rounding` spilled 8-88 bytes under triton 3.9).
MMA_REGS = gl.constexpr(184)
# A 256-row tile takes two MMA warpgroups (8 warps, 128 accumulator registers each, as above) and
# leaves 4 epilogue warps: 160 for the MMA warps leaves those 168. So does a 128-row tile of FP8
# operands: two warpgroups of 64 rows, each with its accumulator and the MMA's partial one (64
# registers each).
WIDE_MMA_REGS = gl.constexpr(160)
# One warpgroup of 64 FP8 rows holding its accumulator and two partial tiles (64 registers each,
# `_promoting_mma_partition`); with 8 epilogue warps those keep 144 (at 208 or more they keep 136,
# where fp32 and int8 states spill: triton 3.6 and 3.9).
PROMOTING_MMA_REGS = gl.constexpr(200)
LOADER_REGS = gl.constexpr(24)


@gluon.jit
def load_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K):
    """Fill the ring: for every tile of this program, the dy and x tiles of each BLOCK_T tokens."""
    load_tiles(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K, gl.program_id(0), gl.num_programs(0))


@gluon.jit
def load_tiles(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K, first, stride):
    """The loader's loop over tiles first, first + stride, ... (`load_partition`)."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    T_MAJOR: gl.constexpr = dy_bufs.dtype.primitive_bitwidth == 8  # FP8: (BLOCK_N | BLOCK_K, BLOCK_T) tiles
    BLOCK_T: gl.constexpr = dy_bufs.type.shape[2] if T_MAJOR else dy_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[1] if T_MAJOR else dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[1] if T_MAJOR else x_bufs.type.shape[2]
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    count = 0  # ring slots filled so far, over all tiles
    for tile in range(first, tiles, stride):
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, GROUP_N)
        for t0 in range(0, T, BLOCK_T):
            slot = count % STAGES
            mbarrier.wait(empty.index(slot), ((count // STAGES) & 1) ^ 1)  # passes at once on the first lap
            mbarrier.expect(ready.index(slot), dy_desc.block_type.nbytes + x_desc.block_type.nbytes)
            if T_MAJOR:  # blocks of dy^T and x^T; columns past T read as 0
                tma_load(dy_desc, [n0, t0], ready.index(slot), dy_bufs.index(slot))
                tma_load(x_desc, [k0, t0], ready.index(slot), x_bufs.index(slot))
            else:  # rows past T read as 0
                tma_load(dy_desc, [t0, n0], ready.index(slot), dy_bufs.index(slot))
                tma_load(x_desc, [t0, k0], ready.index(slot), x_bufs.index(slot))
            count += 1


@gluon.jit
def mma_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K):
    """dW tile = dy_tile^T x_tile summed over the ring, then handed to the epilogue's staging buffer."""
    mma_tiles(dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, gl.program_id(0),
              gl.num_programs(0))


@gluon.jit
def mma_tiles(dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, first, stride):
    """The MMA warps' loop over tiles first, first + stride, ... (`mma_partition`)."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    T_MAJOR: gl.constexpr = dy_bufs.dtype.primitive_bitwidth == 8  # as in load_partition
    BLOCK_T: gl.constexpr = dy_bufs.type.shape[2] if T_MAJOR else dy_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[1] if T_MAJOR else dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[1] if T_MAJOR else x_bufs.type.shape[2]
    # one warpgroup per 128 rows of the tile, per 64 with FP8 operands (`mma_warps`); the MMA's
    # depth is 32 bytes of operand: 16 bf16 or 32 FP8 tokens
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[BLOCK_N // (16 if T_MAJOR else 32), 1],
        instr_shape=[16, BLOCK_K, 32 if T_MAJOR else 16])
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    count = 0  # ring slots consumed so far, over all tiles
    done = 0  # tiles handed over
    for _ in range(first, tiles, stride):
        acc = gl.zeros((BLOCK_N, BLOCK_K), gl.float32, layout)
        for t0 in range(0, T, BLOCK_T):
            slot = count % STAGES
            mbarrier.wait(ready.index(slot), (count // STAGES) & 1)
            if T_MAJOR:  # each BLOCK_T tokens' products added into the fp32 accumulator
                acc = warpgroup_mma(dy_bufs.index(slot), x_bufs.index(slot).permute((1, 0)), acc, is_async=True,
                                    max_num_imprecise_acc=BLOCK_T)
            else:
                acc = warpgroup_mma(dy_bufs.index(slot).permute((1, 0)), x_bufs.index(slot), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # the MMA before this one has finished reading its slot: the loader may refill it
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=t0 > 0)
            count += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        hand_over(acc, acc_smem, acc_ready, acc_empty, done)
        done += 1


@gluon.jit
def _promoting_mma_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty,
                             T, N, K):
    """FP8 operands, the promotion overlapped: each stage's MMAs sum its BLOCK_T tokens from zero
    into a partial tile (the FP8 MMA's own accumulation, as `max_num_imprecise_acc` has it) while
    the stage before's partial tile is added into the fp32 accumulator, so the tensor cores do not
    wait for the add. Three tiles live in registers (the accumulator and two partials): one
    warpgroup of 64 rows at PROMOTING_MMA_REGS. The stages go in pairs, so that each partial keeps
    its registers from its MMA to its add (a copy of a tile still being written would make the
    assembler serialize every MMA). The sums are `mma_partition`'s, added in the same order."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    BLOCK_T: gl.constexpr = dy_bufs.type.shape[2]
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[1]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BLOCK_N // 16, 1],
                                                     instr_shape=[16, BLOCK_K, 32])
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    stages = gl.cdiv(T, BLOCK_T)  # per tile
    count = 0
    done = 0
    for _ in range(gl.program_id(0), tiles, gl.num_programs(0)):
        acc = gl.zeros((BLOCK_N, BLOCK_K), gl.float32, layout)
        odd = gl.zeros((BLOCK_N, BLOCK_K), gl.float32, layout)  # the stage before's partial (none yet: 0)
        for i in range(0, stages - 1, 2):
            acc, even = _promoting_stage(dy_bufs, x_bufs, ready, empty, count, i, acc, odd, layout)
            acc, odd = _promoting_stage(dy_bufs, x_bufs, ready, empty, count + 1, i + 1, acc, even, layout)
            count += 2
        if stages % 2 == 1:
            acc, even = _promoting_stage(dy_bufs, x_bufs, ready, empty, count, stages - 1, acc, odd, layout)
            count += 1
            even = warpgroup_mma_wait(num_outstanding=0, deps=(even,))
            acc = acc + even
        else:
            odd = warpgroup_mma_wait(num_outstanding=0, deps=(odd,))
            acc = acc + odd
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        hand_over(acc, acc_smem, acc_ready, acc_empty, done)
        done += 1


@gluon.jit
def _promoting_stage(dy_bufs, x_bufs, ready, empty, count, stage, acc, issued, layout: gl.constexpr):
    """Ring slot `count`'s MMAs into a fresh partial tile (returned in flight), then `issued`, the
    stage before's partial, added into acc once its MMAs are done; their slot goes back to the
    loader (stage: this one's index in the tile, 0 for the first)."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[1]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[1]
    slot = count % STAGES
    mbarrier.wait(ready.index(slot), (count // STAGES) & 1)
    fresh = warpgroup_mma(dy_bufs.index(slot), x_bufs.index(slot).permute((1, 0)),
                          gl.zeros((BLOCK_N, BLOCK_K), gl.float32, layout), use_acc=False, is_async=True)
    fresh, issued = warpgroup_mma_wait(num_outstanding=1, deps=(fresh, issued))  # all but `fresh` done
    acc = acc + issued
    mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=stage > 0)
    return acc, fresh


@gluon.jit
def hand_over(acc, acc_smem, acc_ready, acc_empty, done):
    """Stage a finished gradient tile for the epilogue, once it has read the tile before."""
    mbarrier.wait(acc_empty, (done & 1) ^ 1)
    acc_smem.store(acc)
    partition_barrier()
    mbarrier.arrive(acc_ready)


@gluon.jit
def epilogue_partition(
    acc_smem, acc_ready, acc_empty,
    params, N, K, NUM_GROUPS, step, step_ptr, scale_ptr, UPDATE,  # as the kernel and `update_tile` take them
    GRAD_SCALE: gl.constexpr, STEPS_IN_MEMORY: gl.constexpr,
    ROWS: gl.constexpr, FAST_EPILOGUE: gl.constexpr, OVERLAP_SLICES: gl.constexpr,
):
    """The optimizer update of each staged tile (`update_staged_tile`)."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    if STEPS_IN_MEMORY:
        step = load_step_values(step_ptr)
    grad_scale = 1.0
    if GRAD_SCALE:
        grad_scale = gl.load(scale_ptr)
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    done = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, GROUP_N)
        update_staged_tile(acc_smem, acc_ready, acc_empty, done, n0, k0, N, params, K, NUM_GROUPS, step, UPDATE,
                           ROWS, FAST_EPILOGUE, OVERLAP_SLICES, grad_scale, GRAD_SCALE)
        done += 1


@gluon.jit
def update_staged_tile(
    acc_smem, acc_ready, acc_empty, done, n0, k0, ROW_LIMIT,
    params, K, NUM_GROUPS, step, UPDATE,  # as `update_tile` takes them
    ROWS: gl.constexpr, FAST_EPILOGUE: gl.constexpr, OVERLAP_SLICES: gl.constexpr,
    grad_scale=1.0, GRAD_SCALE: gl.constexpr = False,
):
    """The update of the tile at (n0, k0), the `done`-th this program stages, ROWS rows at a time
    (`update_tile`'s code); rows from ROW_LIMIT on are masked off (N: the weight's edge); with
    GRAD_SCALE each gradient slice is multiplied by `grad_scale` first (clipping). With
    OVERLAP_SLICES each slice's W and states are loaded before the slice above it is updated, and
    the tile's first slice before its gradient is ready: they do not depend on it."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    QGROUP: gl.constexpr = UPDATE[10]
    # 8 elements (16 bytes of bf16) per thread along K: full-width loads and stores
    THREADS_K: gl.constexpr = BLOCK_K // 8
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // THREADS_K, THREADS_K], [gl.num_warps(), 1], [1, 0])
    offs_k = k0 + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    groups = k0 // QGROUP + gl.arange(0, BLOCK_K // QGROUP, layout=gl.SliceLayout(0, layout))
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    if OVERLAP_SLICES:
        offsets = offsets_of(n0 + rows, offs_k, groups, ROW_LIMIT, K, NUM_GROUPS)
        loaded = load_tile_at(offsets, params, UPDATE)
    mbarrier.wait(acc_ready, done & 1)
    for r in gl.static_range(BLOCK_N // ROWS):
        g = acc_smem.slice(r * ROWS, ROWS, dim=0).load(layout)
        if GRAD_SCALE:
            g = g * grad_scale
        if r == BLOCK_N // ROWS - 1:  # the whole tile is read: the MMA warps may stage the next
            partition_barrier()
            mbarrier.arrive(acc_empty)
        if not OVERLAP_SLICES:
            offsets = offsets_of(n0 + r * ROWS + rows, offs_k, groups, ROW_LIMIT, K, NUM_GROUPS)
            loaded = load_tile_at(offsets, params, UPDATE)
        elif r + 1 < BLOCK_N // ROWS:
            next_offsets = offsets_of(n0 + (r + 1) * ROWS + rows, offs_k, groups, ROW_LIMIT, K, NUM_GROUPS)
            next_loaded = load_tile_at(next_offsets, params, UPDATE)
        finish_tile_at(g, offsets, loaded, params, step, UPDATE, ROWS, BLOCK_K, FAST_EPILOGUE, True)
        if OVERLAP_SLICES and r + 1 < BLOCK_N // ROWS:
            offsets, loaded = next_offsets, next_loaded


@gluon.jit
def allocate_ring(dy_desc, x_desc, STAGES: gl.constexpr):
    """The ring of STAGES dy and x tiles in the descriptors' block shapes, with its ready and empty
    barriers initialised (`allocate_buffers`)."""
    DY_ROWS: gl.constexpr = dy_desc.block_type.shape[0]
    DY_COLS: gl.constexpr = dy_desc.block_type.shape[1]
    X_ROWS: gl.constexpr = x_desc.block_type.shape[0]
    X_COLS: gl.constexpr = x_desc.block_type.shape[1]
    dy_bufs = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, DY_ROWS, DY_COLS], dy_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, X_ROWS, X_COLS], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return dy_bufs, x_bufs, ready, empty


@gluon.jit
def allocate_buffers(dy_desc, x_desc, STAGES: gl.constexpr):
    """The shared memory the partitions hand tiles through, barriers initialised: the ring of
    STAGES dy and x tiles with its ready and empty barriers, and the staging buffer of one
    finished fp32 gradient tile with its own. The ring's slots take the descriptors' block shapes:
    (BLOCK_T, BLOCK_N) and (BLOCK_T, BLOCK_K) for bf16, (BLOCK_N, BLOCK_T) and (BLOCK_K, BLOCK_T)
    for FP8."""
    T_MAJOR: gl.constexpr = dy_desc.dtype.primitive_bitwidth == 8
    BLOCK_N: gl.constexpr = dy_desc.block_type.shape[0] if T_MAJOR else dy_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[0] if T_MAJOR else x_desc.block_type.shape[1]
    dy_bufs, x_bufs, ready, empty = allocate_ring(dy_desc, x_desc, STAGES)
    # each row padded by 4 words so that the MMA layout's stores spread over the banks
    staged: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[BLOCK_K, 4]], [BLOCK_N, BLOCK_K], [1, 0])
    acc_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_K], staged)
    acc_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    acc_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(acc_ready, count=1)
    mbarrier.init(acc_empty, count=1)
    return dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty


@gluon.jit(do_not_specialize=["seed"])
def wgrad_update_ws_kernel(
    w_ptr,  # (N, K) fp32 | bf16, updated in place
    s1_ptr, s2_ptr, s3_ptr,  # (N, K) state slots: fp32 | bf16 | int8/uint8 codes, updated in place
    q1_ptr, q2_ptr, q3_ptr,  # (N, NUM_GROUPS) bf16 int8 block scales, updated in place (else unread)
    r_ptr,  # KAHAN: (N, K) bf16 residual of the weight, updated in place; else unread
    dy_desc,  # (T, N) bf16: a Gluon TMA descriptor of (BLOCK_T, BLOCK_N) blocks; FP8 (e5m2): of dy^T,
              # in (BLOCK_N, BLOCK_T) blocks
    x_desc,  # (T, K) bf16: a Gluon TMA descriptor of (BLOCK_T, BLOCK_K) blocks; FP8 (e4m3): of x^T,
             # in (BLOCK_K, BLOCK_T) blocks
    T, N, K, NUM_GROUPS,
    h0, h1, h2, h3, h4, h5, h6, h7, h8,  # fp32 rule coefficients for this step (forge.rules)
    seed,  # int32 stochastic-rounding seed for this step and tensor
    step_ptr,  # STEPS_IN_MEMORY: an int32 row holding this step's h0..h8 and seed; else unread
    scale_ptr,  # GRAD_SCALE: one fp32 the gradient is multiplied by (the clip coefficient); else unread
    UPDATE: gl.constexpr,  # the update: rule, state slots, storage (`update_tile.epilogue_constexprs`)
    GRAD_SCALE: gl.constexpr,  # scale the gradient by *scale_ptr (global-norm clipping)
    STEPS_IN_MEMORY: gl.constexpr,
    STAGES: gl.constexpr,  # ring slots of dy and x tiles
    ROWS: gl.constexpr,  # rows of a tile the epilogue updates at once
    FAST_EPILOGUE: gl.constexpr,  # approximate sqrt and division, the hardware's bf16 rounding
    OVERLAP_SLICES: gl.constexpr,  # load a slice's W and states before the slice above is updated
    OVERLAP_PROMOTION: gl.constexpr = False,  # FP8, 64-row tiles: `_promoting_mma_partition`
):
    T_MAJOR: gl.constexpr = dy_desc.dtype.primitive_bitwidth == 8
    BLOCK_N: gl.constexpr = dy_desc.block_type.shape[0] if T_MAJOR else dy_desc.block_type.shape[1]
    # one MMA warpgroup per 128 rows (128 or 256), per 64 with FP8 operands (128 rows: two)
    MMA_WARPS: gl.constexpr = BLOCK_N // 16 if T_MAJOR else BLOCK_N // 32
    dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty = allocate_buffers(dy_desc, x_desc, STAGES)
    workers = (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K)
    # FP8 on 64-row tiles with OVERLAP_PROMOTION: one warpgroup holding three tiles
    mma_regs: gl.constexpr = PROMOTING_MMA_REGS if OVERLAP_PROMOTION else (MMA_REGS if MMA_WARPS == 4 else WIDE_MMA_REGS)
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)  # as `update_tile` takes them
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    gl.warp_specialize([
        (epilogue_partition, (acc_smem, acc_ready, acc_empty, params, N, K, NUM_GROUPS, step, step_ptr, scale_ptr,
                               UPDATE, GRAD_SCALE, STEPS_IN_MEMORY, ROWS, FAST_EPILOGUE, OVERLAP_SLICES)),
        (_promoting_mma_partition if OVERLAP_PROMOTION else mma_partition, workers),
        (load_partition, workers),
    ], [MMA_WARPS, 1], [mma_regs, LOADER_REGS])


_GLUON_DTYPES = {"torch.bfloat16": gl.bfloat16, "torch.float32": gl.float32, "torch.float8_e4m3fn": gl.float8e4nv, "torch.float8_e5m2": gl.float8e5}


@functools.cache
def _shared_layout(rows: int, cols: int, dtype: str):
    """wgmma's shared-memory layout of a (rows, cols) block of `dtype` (asked once per block shape:
    the descriptors below are built on every launch)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], _GLUON_DTYPES[dtype])


def descriptor(t, block_shape):
    """A Gluon TMA descriptor of a 2-D bf16, FP8 or fp32 tensor in `block_shape` blocks (wgmma's shared
    layout; fp32: W and the states of the fed ping-pong kernel's pieces)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows, cols = block_shape
    return TensorDescriptor.from_tensor(t, [rows, cols], _shared_layout(rows, cols, str(t.dtype)))


def mma_warps(block_n: int, fp8: bool = False) -> int:
    """MMA warps of a tile of `block_n` rows: one warpgroup per 128 rows (128 or 256), per 64 with
    FP8 operands."""
    return block_n // 16 if fp8 else block_n // 32


def max_registers(epilogue_warps: int, block_n: int = 128, fp8: bool = False) -> int:
    """The kernel-wide register cap: warps are allocated by groups of four (epilogue, MMA, loader:
    12 to 16 warps in all) and all of them must fit the multiprocessor's 64 Ki registers; the
    loader then gives back to 24, the MMA warps take MMA_REGS (WIDE_MMA_REGS for two warpgroups)
    and the epilogue what is left."""
    warps = epilogue_warps + mma_warps(block_n, fp8) + 4
    return min(255, 65536 // (warps * 32)) // 8 * 8


_launch = DirectLauncher(wgrad_update_ws_kernel)


def launch(key, plan, weight, slots, dy, x, step: tuple) -> None:
    """Run `plan` (a "gluon" `forge.kernels.configs.Plan`) for the problem `key`: `slots` as
    `update_tile.slot_arguments`, `step` as `update_tile.step_arguments` return them. dy and x get
    descriptors of the plan's block shapes (built on every launch: they hold the tensors' addresses);
    FP8 dy and x, contiguous along T, get descriptors of their transposes."""
    cfg = plan.config
    T, N = dy.shape
    K = x.shape[1]
    if dy.element_size() == 1:
        dy_desc = descriptor(dy.t(), (cfg.block_n, cfg.block_t))
        x_desc = descriptor(x.t(), (cfg.block_k, cfg.block_t))
    else:
        dy_desc = descriptor(dy, (cfg.block_t, cfg.block_n))
        x_desc = descriptor(x, (cfg.block_t, cfg.block_k))
    args = (weight, *slots, dy_desc, x_desc, T, N, K, plan.num_groups, *step)
    _launch(key, plan.grid, args, plan.constexprs, plan.options)
