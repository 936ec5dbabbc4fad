"""The fused kernel on Hopper's ping-pong schedule: two MMA warpgroups that update from their own registers.

In the warp-specialized kernel (`forge.kernels.wgrad_update_ws`) the MMA warps hand every finished
fp32 gradient tile to the epilogue warps through a 66 KiB staging buffer in shared memory, which
leaves room for only 4 stages of dy and x beside it, and the two halves (GEMM, update) measured
not to overlap (docs/performance.md, "Where the time goes"). Here, as in CUTLASS's
`KernelTmaWarpSpecializedPingpong` and FlashAttention-3's inter-warpgroup ping-pong, one program
per multiprocessor runs three partitions (Gluon's `warp_specialize`):

    loader       1 warp    TMA copies of dy and x tiles into a ring of `num_stages` slots, tile
                           after tile in the program's order (`wgrad_update_ws.load_tiles`)
    consumer 0   4 warps   the program's tiles 0, 2, 4, ...: for each, the wgmma main loop into
    consumer 1   4 warps   its tiles 1, 3, 5, ...            a (128, BLOCK_K) fp32 accumulator in
                           its own registers, then the optimizer update of that tile straight
                           from them

The two consumers take turns at the tensor cores: a pair of mbarriers (`turn`, CUTLASS's
`OrderedSequenceBarrier`) lets consumer 1 start tile 1's main loop only when consumer 0 has
finished tile 0's, and consumer 0 start tile 2's only when consumer 1 has finished tile 1's. So
one consumer's update runs while the other's main loop does, and the ring is consumed strictly in
the loader's order (each consumer's ring positions are those of its tiles: tile j's stage i is
fill j * stages + i).

The accumulator never goes through a staging buffer: it is cut in registers (reshape, permute,
split: no data moves) into 16 pieces of 32 rows by 32 columns (int8 states: 8 of 32 by 64, whole
groups; the wgmma layout keeps the row halves 64 apart, the row octets 8 apart and the column
blocks in each thread's own registers), and each piece is converted to the epilogue's blocked
layout (8 elements a thread along K; through a shared-memory scratch per consumer, which the
compiler allocates: 2 KiB for 32-column pieces, 4 KiB for int8's 64-column ones) and updated by `update_tile.finish_tile_at`, the shipped epilogue's code, on
the rows and columns the piece holds. Every element's update is the same arithmetic on the same
values as in the warp-specialized kernel, and the main loop sums the same wgmma steps in the same
order: a step equals that kernel's to the bit. With OVERLAP_SLICES each piece's W and states are
loaded before the piece before is updated, as there.

Registers: each consumer holds its 128-register accumulator through its update, so both take 240
of the multiprocessor's 64 Ki per thread (`CONSUMER_REGS`; the loader gives back to 24). Shared
memory holds only the ring, the barriers and the two scratches: 6 stages of 64 tokens (192 KiB)
fit where the warp-specialized kernel holds 4 beside its staging buffer (196.1 KiB in all, int8
states 200.1 KiB, of the 227 KiB a Hopper program may take: `python -m harness.kernels.build`,
triton 3.9).

Where it runs: the warp-specialized kernel's (Hopper, bf16 dy and x that TMA reads), 128-row tiles
of 128 or 64 columns, every rule, fp32, bf16 and int8 states, compensated weights, clipping, steps
read from memory (int8 groups of 128 take pieces 128 columns wide, which spill 232 bytes). FP8 operands are refused by name (`forge.kernels.configs`): their 64-row MMA
warpgroups keep a second accumulator, which two consumers' registers do not hold beside the
update. FORGE launches it where it measured faster than the warp-specialized kernel
(`configs.pingpong_wins`: bf16 states from 4,096 tokens); elsewhere it is an option
(`KernelConfig.pingpong`, `configs.PINGPONG_CONFIGS`). Measured (docs/performance.md): where one
consumer's update outlasts the other's main loop, a tile costs (MMA + update) / 2, and one
consumer's 4 warps update a tile 2.6x slower than the warp-specialized kernel's 8 update warps.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from forge.kernels import wgrad_update_ws as ws
from forge.kernels.launch import DirectLauncher
from forge.kernels.update_tile import finish_tile_at, load_step_values, load_tile_at, offsets_of
from forge.kernels.wgrad_tile import tile_origin

# Registers per thread of consumer 1 (a worker partition); Triton gives consumer 0, the default
# partition, as many (the loader, one warp, gives back to 24).
CONSUMER_REGS = gl.constexpr(240)
CONSUMER_WARPS = gl.constexpr(4)  # one warpgroup: 128 rows of wgmma
PIECE_ROWS = gl.constexpr(32)  # rows of a piece: the 4 warps' 8 rows each, one row half, one row octet


@gluon.jit
def loader_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K):
    """Fill the ring with every tile's dy and x, in the program's order (both consumers' tiles)."""
    ws.load_tiles(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K, gl.program_id(0), gl.num_programs(0))


@gluon.jit
def consumer_partition(
    dy_bufs, x_bufs, ready, empty, turn,
    params, N, K, NUM_GROUPS, T, step, step_ptr, scale_ptr, UPDATE,  # as the kernel and `update_tile` take them
    GRAD_SCALE: gl.constexpr, STEPS_IN_MEMORY: gl.constexpr, FAST_EPILOGUE: gl.constexpr,
    OVERLAP_SLICES: gl.constexpr, PIECE_COLS: gl.constexpr, WHICH: gl.constexpr,
):
    """Consumer WHICH (0 or 1): the program's tiles WHICH, WHICH + 2, ...; each one's main loop in
    its turn at the tensor cores, then its update from the accumulator's registers."""
    BLOCK_T: gl.constexpr = dy_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
    if STEPS_IN_MEMORY:
        step = load_step_values(step_ptr)
    grad_scale = 1.0
    if GRAD_SCALE:
        grad_scale = gl.load(scale_ptr)
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    stages = gl.cdiv(T, BLOCK_T)  # ring fills per tile
    programs = gl.num_programs(0)
    turns = 0  # tiles of this consumer so far
    for tile in range(gl.program_id(0) + WHICH * programs, tiles, 2 * programs):
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, ws.GROUP_N)
        # consumer 0's first turn passes at once; every later one waits for the other's main loop
        mbarrier.wait(turn.index(WHICH), (turns & 1) ^ (1 - WHICH))
        acc = accumulate(dy_bufs, x_bufs, ready, empty, (2 * turns + WHICH) * stages, T)
        mbarrier.arrive(turn.index(1 - WHICH))  # the tensor cores are the other consumer's
        update_from_registers(acc, n0, k0, params, N, K, NUM_GROUPS, step, UPDATE, FAST_EPILOGUE, OVERLAP_SLICES,
                              PIECE_COLS, grad_scale, GRAD_SCALE)
        turns += 1


@gluon.jit
def accumulate(dy_bufs, x_bufs, ready, empty, count, T):
    """One tile's dW = dy^T x over all T from ring fill `count` on, as `wgrad_update_ws.mma_tiles`
    sums it (the same wgmma steps in the same order), each slot handed back once read."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    BLOCK_T: gl.constexpr = dy_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BLOCK_N // 32, 1],
                                                     instr_shape=[16, BLOCK_K, 16])
    acc = gl.zeros((BLOCK_N, BLOCK_K), gl.float32, layout)
    for t0 in range(0, T, BLOCK_T):
        slot = count % STAGES
        mbarrier.wait(ready.index(slot), (count // STAGES) & 1)
        acc = warpgroup_mma(dy_bufs.index(slot).permute((1, 0)), x_bufs.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        # the MMA before this one has finished reading its slot: the loader may refill it
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=t0 > 0)
        count += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
    return acc


@gluon.jit
def pieces_of(acc, PARTS: gl.constexpr):
    """The (128, BLOCK_K) accumulator cut in its registers into 4 * PARTS pieces of (4, 8, BLOCK_K
    / PARTS): row r = 64 * rep + 16 * warp + 8 * octet + lane_row and column c = part * BLOCK_K /
    PARTS + col, where rep, octet and part are bits of each thread's registers (the wgmma layout), so
    the cut moves no data. Piece index i = 4 * part + 2 * octet + rep (PARTS: 1, 2 or 4)."""
    BLOCK_K: gl.constexpr = acc.type.shape[1]
    COLS: gl.constexpr = BLOCK_K // PARTS
    if PARTS == 4:
        a = gl.reshape(acc, (2, 4, 2, 8, 2, 2, COLS))  # rep, warp, octet, lane row, part // 2, part % 2, column
        a = gl.permute(a, (1, 3, 6, 0, 2, 5, 4))  # warp, lane row, column, rep, octet, part % 2, part // 2
        low, high = gl.split(a)  # `split` takes the last dimension apart
        p0, p1 = gl.split(low)
        p2, p3 = gl.split(high)
        pieces = _quarters(p0) + _quarters(p1) + _quarters(p2) + _quarters(p3)
    elif PARTS == 2:
        a = gl.reshape(acc, (2, 4, 2, 8, 2, COLS))  # rep, warp, octet, lane row, part, column
        a = gl.permute(a, (1, 3, 5, 0, 2, 4))  # warp, lane row, column, rep, octet, part
        left, right = gl.split(a)
        pieces = _quarters(left) + _quarters(right)
    else:
        a = gl.reshape(acc, (2, 4, 2, 8, COLS))  # rep, warp, octet, lane row, column
        pieces = _quarters(gl.permute(a, (1, 3, 4, 0, 2)))  # warp, lane row, column, rep, octet
    return pieces


@gluon.jit
def _quarters(a):
    """The four (4, 8, COLS) pieces of a (4, 8, COLS, rep, octet) tensor, in the order (octet, rep)."""
    low, high = gl.split(a)
    p0, p1 = gl.split(low)
    p2, p3 = gl.split(high)
    return p0, p1, p2, p3


@gluon.jit
def update_from_registers(
    acc, n0, k0,
    params, N, K, NUM_GROUPS, step, UPDATE,  # as `update_tile` takes them
    FAST_EPILOGUE: gl.constexpr, OVERLAP_SLICES: gl.constexpr, PIECE_COLS: gl.constexpr,
    grad_scale=1.0, GRAD_SCALE: gl.constexpr = False,
):
    """The update of the tile at (n0, k0) from its accumulator, piece by piece (`pieces_of`): each
    piece of 32 rows and PIECE_COLS columns (int8 states: at least a group) in the epilogue's
    blocked layout (8 elements a thread along K), then `finish_tile_at`.
    With OVERLAP_SLICES each piece's W and states are loaded before the piece before is updated."""
    BLOCK_K: gl.constexpr = acc.type.shape[1]
    QGROUP: gl.constexpr = UPDATE[10]
    COLS: gl.constexpr = QGROUP if UPDATE[9] == "int8" and QGROUP > PIECE_COLS else PIECE_COLS  # whole groups
    PARTS: gl.constexpr = BLOCK_K // COLS
    THREADS_K: gl.constexpr = COLS // 8
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // THREADS_K, THREADS_K], [gl.num_warps(), 1], [1, 0])
    pieces = pieces_of(acc, PARTS)
    offsets = _offsets(n0, k0, 0, COLS, N, K, NUM_GROUPS, QGROUP, layout)
    loaded = load_tile_at(offsets, params, UPDATE)
    for i in gl.static_range(4 * PARTS):
        if i > 0 and not OVERLAP_SLICES:
            offsets = _offsets(n0, k0, i, COLS, N, K, NUM_GROUPS, QGROUP, layout)
            loaded = load_tile_at(offsets, params, UPDATE)
        if OVERLAP_SLICES and i + 1 < 4 * PARTS:
            next_offsets = _offsets(n0, k0, i + 1, COLS, N, K, NUM_GROUPS, QGROUP, layout)
            next_loaded = load_tile_at(next_offsets, params, UPDATE)
        g = gl.convert_layout(gl.reshape(pieces[i], (PIECE_ROWS, COLS)), layout)
        if GRAD_SCALE:
            g = g * grad_scale
        finish_tile_at(g, offsets, loaded, params, step, UPDATE, PIECE_ROWS, COLS, FAST_EPILOGUE, True)
        if OVERLAP_SLICES and i + 1 < 4 * PARTS:
            offsets, loaded = next_offsets, next_loaded


@gluon.jit
def _offsets(n0, k0, PIECE: gl.constexpr, COLS: gl.constexpr, N, K, NUM_GROUPS, QGROUP: gl.constexpr,
             layout: gl.constexpr):
    """`offsets_of` the rows and columns piece PIECE holds (`pieces_of`: PIECE = 4 * part + 2 *
    octet + rep), in `layout`; rows past N and columns past K masked off."""
    rep: gl.constexpr = PIECE % 2
    octet: gl.constexpr = (PIECE // 2) % 2
    part: gl.constexpr = PIECE // 4
    p = gl.arange(0, PIECE_ROWS, layout=gl.SliceLayout(1, layout))  # 8 * warp + lane row
    rows = n0 + 64 * rep + 8 * octet + 16 * (p // 8) + p % 8
    first = k0 + part * COLS
    offs_k = first + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    GROUPS: gl.constexpr = COLS // QGROUP if COLS >= QGROUP else 1  # int8 scales (other states: unread)
    groups = first // QGROUP + gl.arange(0, GROUPS, layout=gl.SliceLayout(0, layout))
    return offsets_of(rows, offs_k, groups, N, K, NUM_GROUPS)


@gluon.jit(do_not_specialize=["seed"])
def wgrad_update_pingpong_kernel(
    w_ptr,  # (N, K) fp32 | bf16, updated in place
    s1_ptr, s2_ptr, s3_ptr,  # (N, K) state slots: fp32 | bf16 | int8/uint8 codes, updated in place
    q1_ptr, q2_ptr, q3_ptr,  # (N, NUM_GROUPS) bf16 int8 block scales, updated in place (else unread)
    r_ptr,  # KAHAN: (N, K) bf16 residual of the weight, updated in place; else unread
    dy_desc,  # (T, N) bf16: a Gluon TMA descriptor of (BLOCK_T, 128) blocks
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
    FAST_EPILOGUE: gl.constexpr,  # approximate sqrt and division, the hardware's bf16 rounding
    OVERLAP_SLICES: gl.constexpr,  # load a piece's W and states before the piece before is updated
    PIECE_COLS: gl.constexpr = 32,  # columns of a piece a consumer updates at once (32 or 64)
):
    dy_bufs, x_bufs, ready, empty = ws.allocate_ring(dy_desc, x_desc, STAGES)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # consumer c's turn at the MMAs
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)  # as `update_tile` takes them
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    gl.warp_specialize([
        (consumer_partition, (dy_bufs, x_bufs, ready, empty, turn, params, N, K, NUM_GROUPS, T, step, step_ptr,
                              scale_ptr, UPDATE, GRAD_SCALE, STEPS_IN_MEMORY, FAST_EPILOGUE, OVERLAP_SLICES, PIECE_COLS, 0)),
        (consumer_partition, (dy_bufs, x_bufs, ready, empty, turn, params, N, K, NUM_GROUPS, T, step, step_ptr,
                              scale_ptr, UPDATE, GRAD_SCALE, STEPS_IN_MEMORY, FAST_EPILOGUE, OVERLAP_SLICES, PIECE_COLS, 1)),
        (loader_partition, (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K)),
    ], [CONSUMER_WARPS, 1], [CONSUMER_REGS, ws.LOADER_REGS])


def max_registers() -> int:
    """The kernel-wide register cap: 12 warps (two consumers, the loader's group of four) within
    the multiprocessor's 64 Ki registers; the partitions then move registers between them."""
    return 65536 // (3 * CONSUMER_WARPS.value * 32) // 8 * 8


_launch = DirectLauncher(wgrad_update_pingpong_kernel)


def launch(key, plan, weight, slots, dy, x, step: tuple) -> None:
    """Run `plan` (a "pingpong" `forge.kernels.configs.Plan`) for the problem `key`, as
    `wgrad_update_ws.launch` runs its own (bf16 dy and x only)."""
    cfg = plan.config
    T, N = dy.shape
    K = x.shape[1]
    dy_desc = ws.descriptor(dy, (cfg.block_t, cfg.block_n))
    x_desc = ws.descriptor(x, (cfg.block_t, cfg.block_k))
    args = (weight, *slots, dy_desc, x_desc, T, N, K, plan.num_groups, *step)
    _launch(key, plan.grid, args, plan.constexprs, plan.options)
