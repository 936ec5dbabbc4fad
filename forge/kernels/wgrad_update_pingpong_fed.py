"""The ping-pong kernel with its update fed by the copy engine: W and the states come through shared memory.

In the ping-pong kernel (`forge.kernels.wgrad_update_pingpong`) each consumer warpgroup updates its
tile from its accumulator registers, loading W and the states with plain global loads: its 128
threads hold at most two pieces' loads in flight, each load holds its registers until its bytes
arrive, and one consumer took 25-36 us to update a 128 x 128 tile on an H100 where its main loop
took 6 us at 1,024 tokens (docs/performance.md). The update waits on its loads, not on arithmetic.

Here a fourth partition asks the copy engine for those bytes ahead of time, as CUTLASS's Hopper
epilogue loads its source operand (`sm90_epilogue_tma_warpspecialized`: a producer warp fills a
ring of epilogue sub-tiles while the consumer is still in its main loop):

    loader          1 warp    TMA copies of dy and x tiles into the operand ring (`num_stages` slots)
    piece loader    1 warp    TMA copies of each piece of W and of every state the rule has into
      0, 1          each      consumer c's piece ring (`update_stages` slots), in the order it
                              updates them, as far ahead as the ring allows and across its tiles
    consumer 0, 1   4 warps   as in the ping-pong kernel: every other tile's main loop in turn at
                    each      the tensor cores, then its update, piece by piece, W and the states
                              read from its piece ring, W and the states stored to global memory

A piece is 64 rows (one of the accumulator's two row halves: the warpgroup's 4 warps x 16 rows,
contiguous in W) by `pingpong_cols` columns, cut from the accumulator in its registers
(`pieces_of_halves`: no data moves), converted to the epilogue's blocked layout and updated by
`update_tile.finish_tile_at`, the shipped arithmetic on the same values. Each piece slot has two
barriers: `landed` (the copy engine wrote it) and `freed` (the consumer's 4 warps have read it).
Each consumer has a ring and a piece loader of its own: the two consumers' updates overlap (at few
tokens a tile's update outlasts the other's main loop), and a ring shared by two readers that do
not take turns would let one wait on a slot two laps ahead of what landed there, which a barrier's
phase parity cannot tell from one lap. The main loops are the ping-pong kernel's (the same wgmma
steps in the same order) and every element's update is the same arithmetic on the same values: a
step equals the warp-specialized and ping-pong kernels' to the bit.

With `KernelConfig.update_in_slot` (IN_SLOT) a consumer never leaves the accumulator's layout:
each thread reads W and the states of its own elements of the piece from the slot (ldmatrix, the
wgmma layout's own access), writes the new values back over them, and one thread asks the copy
engine to store the slot (`update_in_slots`): no fp32 gradient through a scratch buffer, no store
per thread, rows and columns past the weight's edge left out by the copy engine. Only the
stochastic rounding's noise still changes layout: drawn where a thread holds 8 columns (one Philox
call per group, as everywhere), moved as 16-bit words (`piece_noise`), since in the wgmma layout
each group of 8 columns spans 4 threads and each would draw the group's whole call (seven times
the Philox instructions, `python -m harness.kernels.build`). The same arithmetic on the same values.

Shared memory: the operand ring (32 KiB a stage of 64 tokens), the two piece rings (64 x cols x
(W's and the states' bytes) a slot: 12 KiB for bf16 W, m and v in 32 columns), the consumers'
layout scratch and the barriers; `shared_bytes` counts them and `forge.kernels.configs` refuses a config
over the 227 KiB a Hopper program may take.

Where it runs: the ping-pong kernel's (Hopper, bf16 dy and x that TMA reads, 128-row tiles), fp32
and bf16 states, plain weights, W and states whose rows the copy engine reads (contiguous, rows of
a multiple of 16 bytes, 16-byte aligned). int8 states (their scales) and compensated weights (their
residual) are read by the ping-pong and warp-specialized kernels only, and refused here by name.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from forge.kernels import wgrad_update_ws as ws
from forge.kernels.launch import DirectLauncher
from forge.kernels.rounding import noise_index, round_to_bf16_nearest, round_to_bf16_with, stochastic_noise, to_float
from forge.kernels.rules import apply_rule
from forge.kernels.update_tile import finish_tile_at, load_step_values, offsets_of
from forge.kernels.wgrad_tile import tile_origin

# max_registers: the ping-pong kernel's cap, 12 warps (two consumers; the three loaders in a group of four)
from forge.kernels.wgrad_update_pingpong import CONSUMER_REGS, CONSUMER_WARPS, accumulate, max_registers  # noqa: F401

tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global

PIECE_ROWS = 64  # a piece: one row half of the accumulator, the warpgroup's 4 warps x 16 rows
SHARED_BYTES = 227 * 1024  # a Hopper multiprocessor's shared memory, as one program may take it


@gluon.jit
def allocate_piece_ring(w_desc, s1_desc, s2_desc, s3_desc, SLOTS: gl.constexpr, UPDATE):
    """The ring of SLOTS slots of one piece of W and of each state the rule has (the descriptors'
    block shape and layout), with two barriers a slot, `landed` and `freed`, initialised. A slot the
    rule lacks gets a placeholder of a few int8 bytes, never written or read: its 8-bit type is how
    the piece loader, which sees no compile-time argument but its buffers' types, knows it is absent."""
    ROWS: gl.constexpr = w_desc.block_type.shape[0]
    COLS: gl.constexpr = w_desc.block_type.shape[1]
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [SLOTS, ROWS, COLS], w_desc.layout)
    absent = gl.allocate_shared_memory(gl.int8, [1, 1, 16], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    s1_bufs = absent
    s2_bufs = absent
    s3_bufs = absent
    if UPDATE[3]:
        s1_bufs = gl.allocate_shared_memory(s1_desc.dtype, [SLOTS, ROWS, COLS], s1_desc.layout)
    if UPDATE[4]:
        s2_bufs = gl.allocate_shared_memory(s2_desc.dtype, [SLOTS, ROWS, COLS], s2_desc.layout)
    if UPDATE[5]:
        s3_bufs = gl.allocate_shared_memory(s3_desc.dtype, [SLOTS, ROWS, COLS], s3_desc.layout)
    landed = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    freed = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(SLOTS):
        mbarrier.init(landed.index(i), count=1)
        mbarrier.init(freed.index(i), count=1)
    fence_async_shared()  # the barriers initialised before the copy engine signals them
    return (w_bufs, s1_bufs, s2_bufs, s3_bufs), landed, freed


@gluon.jit
def loader_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K):
    """Fill the operand ring with every tile's dy and x, in the program's order (both consumers')."""
    ws.load_tiles(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K, gl.program_id(0), gl.num_programs(0))


@gluon.jit
def piece_loader_partition(w_desc, s1_desc, s2_desc, s3_desc, w_bufs, s1_bufs, s2_bufs, s3_bufs, landed, freed,
                           dy_bufs, x_bufs, N, K, WHICH: gl.constexpr):
    """For each piece of consumer WHICH's tiles (the program's tiles WHICH, WHICH + 2, ...), in its
    order (`piece_origin`), wait until its slot is freed, then ask the copy engine for the piece of
    W and of each state (rows and columns past the weight's edge arrive as zeros, and count as
    bytes). A piece wholly below the last row is not copied: its slot is marked landed as it is,
    since none of its rows is stored."""
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
    SLOTS: gl.constexpr = w_bufs.type.shape[0]
    ROWS: gl.constexpr = w_bufs.type.shape[1]
    COLS: gl.constexpr = w_bufs.type.shape[2]
    PIECES: gl.constexpr = (BLOCK_N // ROWS) * (BLOCK_K // COLS)
    HAS_S1: gl.constexpr = s1_bufs.dtype.primitive_bitwidth > 8  # else the placeholder (`allocate_piece_ring`)
    HAS_S2: gl.constexpr = s2_bufs.dtype.primitive_bitwidth > 8
    HAS_S3: gl.constexpr = s3_bufs.dtype.primitive_bitwidth > 8
    BYTES: gl.constexpr = (w_desc.block_type.nbytes + s1_desc.block_type.nbytes * HAS_S1
                           + s2_desc.block_type.nbytes * HAS_S2 + s3_desc.block_type.nbytes * HAS_S3)
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    programs = gl.num_programs(0)
    q = 0  # pieces requested so far
    for tile in range(gl.program_id(0) + WHICH * programs, tiles, 2 * programs):
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, ws.GROUP_N)
        for i in gl.static_range(PIECES):
            slot = q % SLOTS
            mbarrier.wait(freed.index(slot), ((q // SLOTS) & 1) ^ 1)  # passes at once on the first lap
            bar = landed.index(slot)
            row, col = piece_origin(n0, k0, i, ROWS, COLS)
            if row < N:
                mbarrier.expect(bar, BYTES)
                ws.tma_load(w_desc, [row, col], bar, w_bufs.index(slot))
                if HAS_S1:
                    ws.tma_load(s1_desc, [row, col], bar, s1_bufs.index(slot))
                if HAS_S2:
                    ws.tma_load(s2_desc, [row, col], bar, s2_bufs.index(slot))
                if HAS_S3:
                    ws.tma_load(s3_desc, [row, col], bar, s3_bufs.index(slot))
            else:
                mbarrier.arrive(bar)
            q += 1


@gluon.jit
def piece_origin(n0, k0, PIECE: gl.constexpr, ROWS: gl.constexpr, COLS: gl.constexpr):
    """First row and column of piece PIECE of the tile at (n0, k0): PIECE = 2 * part + half, the
    row half fastest (`pieces_of_halves`)."""
    return n0 + (PIECE % 2) * ROWS, k0 + (PIECE // 2) * COLS


@gluon.jit
def pieces_of_halves(acc, PARTS: gl.constexpr):
    """The (128, BLOCK_K) accumulator cut in its registers into 2 * PARTS pieces of (4, 2, 8,
    BLOCK_K / PARTS): row r = 64 * half + 16 * warp + 8 * octet + lane_row and column c = part *
    BLOCK_K / PARTS + col. In the wgmma layout the half, the octet and the part are bits of each
    thread's registers, so the cut moves no data; a piece's 64 rows are contiguous in W. Piece
    index i = 2 * part + half (PARTS: 1, 2, 4 or 8)."""
    BLOCK_K: gl.constexpr = acc.type.shape[1]
    COLS: gl.constexpr = BLOCK_K // PARTS
    if PARTS == 8:
        a = gl.reshape(acc, (2, 4, 2, 8, 2, 2, 2, COLS))  # half, warp, octet, lane row, part bits 2, 1, 0, column
        a = gl.permute(a, (1, 2, 3, 7, 0, 6, 5, 4))  # warp, octet, lane row, column, half, part bits 0, 1, 2
        low, high = gl.split(a)
        pieces = _by_part_bits(low, 2) + _by_part_bits(high, 2)
    elif PARTS == 4:
        a = gl.reshape(acc, (2, 4, 2, 8, 2, 2, COLS))  # half, warp, octet, lane row, part bits 1, 0, column
        a = gl.permute(a, (1, 2, 3, 6, 0, 5, 4))  # warp, octet, lane row, column, half, part bits 0, 1
        low, high = gl.split(a)
        pieces = _by_part_bits(low, 1) + _by_part_bits(high, 1)
    elif PARTS == 2:
        a = gl.reshape(acc, (2, 4, 2, 8, 2, COLS))  # half, warp, octet, lane row, part, column
        a = gl.permute(a, (1, 2, 3, 5, 0, 4))  # warp, octet, lane row, column, half, part
        low, high = gl.split(a)
        pieces = _by_part_bits(low, 0) + _by_part_bits(high, 0)
    else:
        a = gl.reshape(acc, (2, 4, 2, 8, COLS))  # half, warp, octet, lane row, column
        pieces = _by_part_bits(gl.permute(a, (1, 2, 3, 4, 0)), 0)
    return pieces


@gluon.jit
def _by_part_bits(a, BITS: gl.constexpr):
    """The pieces of a (4, 2, 8, COLS, half, [part bits]) tensor whose last BITS dimensions are the
    remaining part bits (the most significant last), in the order (part, half)."""
    if BITS == 0:
        lo, hi = gl.split(a)
        pieces = (lo, hi)
    else:
        low, high = gl.split(a)
        pieces = _by_part_bits(low, BITS - 1) + _by_part_bits(high, BITS - 1)
    return pieces


@gluon.jit
def read_piece(bufs, slot, layout: gl.constexpr, UPDATE):
    """A slot's piece in `layout`, as `update_tile.load_tile_at` returns one: (w, s1, q1, s2, q2,
    s3, q3), the scales being the values again (no int8 here) and a slot the rule lacks W."""
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
def update_from_ring(
    acc, n0, k0, first, bufs, landed, freed,
    params, N, K, NUM_GROUPS, step, UPDATE,  # as `update_tile` takes them
    FAST_EPILOGUE: gl.constexpr, grad_scale=1.0, GRAD_SCALE: gl.constexpr = False,
):
    """The update of the tile at (n0, k0) from its accumulator, piece by piece (`pieces_of_halves`),
    W and the states of piece i from ring position `first` + i: wait until it has landed, read it,
    free the slot (after all 4 warps read it), then the rule (`finish_tile_at`) and the stores."""
    BLOCK_K: gl.constexpr = acc.type.shape[1]
    SLOTS: gl.constexpr = bufs[0].type.shape[0]
    ROWS: gl.constexpr = bufs[0].type.shape[1]
    COLS: gl.constexpr = bufs[0].type.shape[2]
    PARTS: gl.constexpr = BLOCK_K // COLS
    QGROUP: gl.constexpr = UPDATE[10]
    THREADS_K: gl.constexpr = COLS // 8  # 8 elements a thread along K
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // THREADS_K, THREADS_K], [gl.num_warps(), 1], [1, 0])
    pieces = pieces_of_halves(acc, PARTS)
    for i in gl.static_range(2 * PARTS):
        q = first + i
        slot = q % SLOTS
        mbarrier.wait(landed.index(slot), (q // SLOTS) & 1)
        loaded = read_piece(bufs, slot, layout, UPDATE)
        ws.partition_barrier()  # every warp of this consumer has read the slot
        fence_async_shared()  # those reads before the copy engine's next writes to it
        mbarrier.arrive(freed.index(slot))
        g = gl.convert_layout(gl.reshape(pieces[i], (ROWS, COLS)), layout)
        if GRAD_SCALE:
            g = g * grad_scale
        row, col = piece_origin(n0, k0, i, ROWS, COLS)
        rows = row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        offs_k = col + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        groups = col // QGROUP + gl.arange(0, 1, layout=gl.SliceLayout(0, layout))  # scales: unread here
        offsets = offsets_of(rows, offs_k, groups, N, K, NUM_GROUPS)
        finish_tile_at(g, offsets, loaded, params, step, UPDATE, ROWS, COLS, FAST_EPILOGUE, True)


@gluon.jit
def update_in_slots(
    acc, n0, k0, first, bufs, descs, landed, freed,
    N, K, step, UPDATE,  # as `update_tile` takes them
    FAST_EPILOGUE: gl.constexpr, grad_scale=1.0, GRAD_SCALE: gl.constexpr = False,
):
    """`update_from_ring` without leaving the accumulator's layout: each thread reads W and the
    states of its own elements of piece i from the slot (the piece's register layout is the
    wgmma accumulator's, cut by `pieces_of_halves`), writes the new values back over them, and the
    copy engine stores the slot to W and the states (`descs`; rows and columns past the weight's
    edge are not written). No gradient goes through a scratch buffer and no store is issued per
    thread. A slot is freed once its stores have read it: the thread that issued them waits for
    that at the next piece (`tma.store_wait`), one barrier later every warp has written that next
    piece, and the slot before is given back."""
    BLOCK_K: gl.constexpr = acc.type.shape[1]
    SLOTS: gl.constexpr = bufs[0].type.shape[0]
    ROWS: gl.constexpr = bufs[0].type.shape[1]
    COLS: gl.constexpr = bufs[0].type.shape[2]
    PARTS: gl.constexpr = BLOCK_K // COLS
    pieces = pieces_of_halves(acc, PARTS)
    for i in gl.static_range(2 * PARTS):
        q = first + i
        slot = q % SLOTS
        g = gl.reshape(pieces[i], (ROWS, COLS))
        if GRAD_SCALE:
            g = g * grad_scale
        row, col = piece_origin(n0, k0, i, ROWS, COLS)
        mbarrier.wait(landed.index(slot), (q // SLOTS) & 1)
        update_slot(g, row, col, K, bufs, slot, step, UPDATE, FAST_EPILOGUE)
        fence_async_shared()  # this thread's writes before the copy engine reads the slot
        tma.store_wait(0)  # the issuing thread: the piece before's stores have read their slot
        ws.partition_barrier()  # every warp wrote this piece
        if i > 0:
            mbarrier.arrive(freed.index((q - 1) % SLOTS))
        if row < N:
            store_slot(descs, bufs, slot, row, col, UPDATE)
    tma.store_wait(0)
    ws.partition_barrier()
    mbarrier.arrive(freed.index((first + 2 * PARTS - 1) % SLOTS))


@gluon.jit
def update_slot(g, row, col, K, bufs, slot, step, UPDATE, FAST: gl.constexpr):
    """The rule on one piece in g's register layout: W and the states read from `slot`, the new
    values written back over them in their storage types (bf16 W rounded as `rounding.store_weight`
    rounds it, keyed by each element's row and column; bf16 states to nearest)."""
    RULE: gl.constexpr = UPDATE[0]
    HAS_MOMENTUM: gl.constexpr = UPDATE[1]
    CENTERED: gl.constexpr = UPDATE[2]
    STOCHASTIC_ROUNDING: gl.constexpr = UPDATE[11]
    ROWS: gl.constexpr = g.type.shape[0]
    COLS: gl.constexpr = g.type.shape[1]
    layout: gl.constexpr = g.type.layout
    h0, h1, h2, h3, h4, h5, h6, h7, h8, seed = step
    w_bufs, s1_bufs, s2_bufs, s3_bufs = bufs
    w_raw, s1_raw, _, s2_raw, _, s3_raw, _ = read_piece(bufs, slot, layout, UPDATE)
    w = to_float(w_raw, FAST)
    s1 = g
    s2 = g
    s3 = g
    if UPDATE[3]:
        s1 = to_float(s1_raw, FAST)
    if UPDATE[4]:
        s2 = to_float(s2_raw, FAST)
    if UPDATE[5]:
        s3 = to_float(s3_raw, FAST)
    w, s1, s2, s3 = apply_rule(w, g, s1, s2, s3, h0, h1, h2, h3, h4, h5, h6, h7, h8, RULE, HAS_MOMENTUM, CENTERED, FAST)
    if UPDATE[3]:
        s1_bufs.index(slot).store(_stored(s1, s1_bufs.dtype, FAST))
    if UPDATE[4]:
        s2_bufs.index(slot).store(_stored(s2, s2_bufs.dtype, FAST))
    if UPDATE[5]:
        s3_bufs.index(slot).store(_stored(s3, s3_bufs.dtype, FAST))
    if w_bufs.dtype == gl.bfloat16 and STOCHASTIC_ROUNDING:
        w_bufs.index(slot).store(round_to_bf16_with(w, piece_noise(row, col, K, seed, ROWS, COLS, layout)))
    else:
        w_bufs.index(slot).store(_stored(w, w_bufs.dtype, FAST))


@gluon.jit
def piece_noise(row, col, K, seed, ROWS: gl.constexpr, COLS: gl.constexpr, layout: gl.constexpr):
    """The stochastic rounding's noise of the (ROWS, COLS) piece at (row, col), in `layout`. Drawn
    where a thread holds 8 aligned columns, one Philox call per thread and group as the other
    kernels draw it, then moved to `layout` (a 16-bit word an element through shared memory): in
    the accumulator's layout each group of 8 columns spans 4 threads, and each would make the
    group's whole call."""
    THREADS_K: gl.constexpr = COLS // 8
    drawn: gl.constexpr = gl.BlockedLayout([1, 8], [32 // THREADS_K, THREADS_K], [gl.num_warps(), 1], [1, 0])
    rows = row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, drawn))
    cols = col + gl.arange(0, COLS, layout=gl.SliceLayout(0, drawn))
    noise = stochastic_noise(seed, noise_index(rows, cols, K)).to(gl.uint16)
    return gl.convert_layout(noise, layout).to(gl.uint32)


@gluon.jit
def _stored(x, dtype: gl.constexpr, FAST: gl.constexpr):
    """fp32 values in a slot's type: fp32 as they are, bf16 to nearest (the hardware's conversion
    where FAST, the same bits)."""
    if dtype == gl.bfloat16:
        if FAST:
            y = x.to(gl.bfloat16)
        else:
            y = round_to_bf16_nearest(x)
    else:
        y = x
    return y


@gluon.jit
def store_slot(descs, bufs, slot, row, col, UPDATE):
    """Ask the copy engine to store a slot's W and states at (row, col)."""
    w_desc, s1_desc, s2_desc, s3_desc = descs
    w_bufs, s1_bufs, s2_bufs, s3_bufs = bufs
    tma_store(w_desc, [row, col], w_bufs.index(slot))
    if UPDATE[3]:
        tma_store(s1_desc, [row, col], s1_bufs.index(slot))
    if UPDATE[4]:
        tma_store(s2_desc, [row, col], s2_bufs.index(slot))
    if UPDATE[5]:
        tma_store(s3_desc, [row, col], s3_bufs.index(slot))


@gluon.jit
def consumer_partition(
    dy_bufs, x_bufs, ready, empty, turn, bufs, descs, landed, freed,
    params, N, K, NUM_GROUPS, T, step, step_ptr, scale_ptr, UPDATE,  # as the kernel and `update_tile` take them
    GRAD_SCALE: gl.constexpr, STEPS_IN_MEMORY: gl.constexpr, FAST_EPILOGUE: gl.constexpr, IN_SLOT: gl.constexpr,
    WHICH: gl.constexpr,
):
    """Consumer WHICH (0 or 1): the program's tiles WHICH, WHICH + 2, ...; each one's main loop in
    its turn at the tensor cores (`wgrad_update_pingpong.accumulate`), then its update from the
    accumulator's registers and its piece ring (`bufs`, `landed`, `freed`)."""
    BLOCK_T: gl.constexpr = dy_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
    ROWS: gl.constexpr = bufs[0].type.shape[1]
    COLS: gl.constexpr = bufs[0].type.shape[2]
    PIECES: gl.constexpr = (BLOCK_N // ROWS) * (BLOCK_K // COLS)
    if STEPS_IN_MEMORY:
        step = load_step_values(step_ptr)
    grad_scale = 1.0
    if GRAD_SCALE:
        grad_scale = gl.load(scale_ptr)
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    stages = gl.cdiv(T, BLOCK_T)  # operand ring fills per tile
    programs = gl.num_programs(0)
    turns = 0  # tiles of this consumer so far
    for tile in range(gl.program_id(0) + WHICH * programs, tiles, 2 * programs):
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, ws.GROUP_N)
        j = 2 * turns + WHICH  # the tile's place in the program's order
        # consumer 0's first turn passes at once; every later one waits for the other's main loop
        mbarrier.wait(turn.index(WHICH), (turns & 1) ^ (1 - WHICH))
        acc = accumulate(dy_bufs, x_bufs, ready, empty, j * stages, T)
        mbarrier.arrive(turn.index(1 - WHICH))  # the tensor cores are the other consumer's
        if IN_SLOT:
            update_in_slots(acc, n0, k0, turns * PIECES, bufs, descs, landed, freed, N, K, step, UPDATE,
                            FAST_EPILOGUE, grad_scale, GRAD_SCALE)
        else:
            update_from_ring(acc, n0, k0, turns * PIECES, bufs, landed, freed, params, N, K, NUM_GROUPS, step,
                             UPDATE, FAST_EPILOGUE, grad_scale, GRAD_SCALE)
        turns += 1


@gluon.jit(do_not_specialize=["seed"])
def wgrad_update_pingpong_fed_kernel(
    w_ptr,  # (N, K) fp32 | bf16, updated in place
    s1_ptr, s2_ptr, s3_ptr,  # (N, K) state slots: fp32 | bf16, updated in place
    q1_ptr, q2_ptr, q3_ptr,  # unread (int8 scales: not here), as `update_tile` takes them
    r_ptr,  # unread (compensated weights: not here)
    w_desc,  # W: a Gluon TMA descriptor of (PIECE_ROWS, pingpong_cols) blocks
    s1_desc, s2_desc, s3_desc,  # each state slot likewise; a slot the rule lacks: w_desc, unread
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
    STAGES: gl.constexpr,  # operand ring slots of dy and x tiles
    UPDATE_STAGES: gl.constexpr,  # slots of each consumer's piece ring of W and the states
    FAST_EPILOGUE: gl.constexpr,  # approximate sqrt and division, the hardware's bf16 rounding
    IN_SLOT: gl.constexpr = False,  # update in the slots, stored by bulk copies (`update_in_slots`)
):
    dy_bufs, x_bufs, ready, empty = ws.allocate_ring(dy_desc, x_desc, STAGES)
    bufs0, landed0, freed0 = allocate_piece_ring(w_desc, s1_desc, s2_desc, s3_desc, UPDATE_STAGES, UPDATE)
    bufs1, landed1, freed1 = allocate_piece_ring(w_desc, s1_desc, s2_desc, s3_desc, UPDATE_STAGES, UPDATE)
    w0, s10, s20, s30 = bufs0
    w1, s11, s21, s31 = bufs1
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # consumer c's turn at the MMAs
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)  # as `update_tile` takes them
    descs = (w_desc, s1_desc, s2_desc, s3_desc)
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    gl.warp_specialize([
        (consumer_partition, (dy_bufs, x_bufs, ready, empty, turn, bufs0, descs, landed0, freed0, params, N, K,
                              NUM_GROUPS, T, step, step_ptr, scale_ptr, UPDATE, GRAD_SCALE, STEPS_IN_MEMORY,
                              FAST_EPILOGUE, IN_SLOT, 0)),
        (consumer_partition, (dy_bufs, x_bufs, ready, empty, turn, bufs1, descs, landed1, freed1, params, N, K,
                              NUM_GROUPS, T, step, step_ptr, scale_ptr, UPDATE, GRAD_SCALE, STEPS_IN_MEMORY,
                              FAST_EPILOGUE, IN_SLOT, 1)),
        (loader_partition, (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K)),
        (piece_loader_partition, (w_desc, s1_desc, s2_desc, s3_desc, w0, s10, s20, s30, landed0, freed0, dy_bufs,
                                  x_bufs, N, K, 0)),
        (piece_loader_partition, (w_desc, s1_desc, s2_desc, s3_desc, w1, s11, s21, s31, landed1, freed1, dy_bufs,
                                  x_bufs, N, K, 1)),
    ], [CONSUMER_WARPS, 1, 1, 1], [CONSUMER_REGS, ws.LOADER_REGS, ws.LOADER_REGS, ws.LOADER_REGS])


def shared_bytes(cfg, weight_bytes: int, state_bytes: tuple) -> int:
    """Shared memory of one program under `cfg` (bf16 operands): the operand ring, each consumer's
    `update_stages` pieces of W (elements of `weight_bytes`) and of each state the rule has
    (`state_bytes`), the
    layout scratch the compiler allocates for the consumers' conversion of a piece's fp32 gradient
    to the blocked layout, or of its 16-bit noise to the accumulator's with `update_in_slot` (one
    piece's fp32 bytes either way, as the builds of `python -m harness.kernels.build`
    find under triton 3.6 and 3.9), and 1 KiB for the barriers and the buffers' alignment (the
    builds take under 200 bytes of it)."""
    ring = cfg.num_stages * cfg.block_t * (cfg.block_n + cfg.block_k) * 2
    pieces = 2 * cfg.update_stages * PIECE_ROWS * cfg.pingpong_cols * (weight_bytes + sum(state_bytes))
    scratch = PIECE_ROWS * cfg.pingpong_cols * 4
    return ring + pieces + scratch + 1024


_launch = DirectLauncher(wgrad_update_pingpong_fed_kernel)


def arguments(plan, weight, slots, dy, x, step: tuple) -> tuple:
    """The kernel's arguments for `plan` (a "pingpong_fed" `forge.kernels.configs.Plan`): `slots` as
    `update_tile.slot_arguments`, `step` as `update_tile.step_arguments` return them. W and each
    state get descriptors of (PIECE_ROWS, pingpong_cols) blocks, dy and x of the plan's blocks, built
    on every launch (they hold the tensors' addresses)."""
    cfg = plan.config
    T, N = dy.shape
    K = x.shape[1]
    piece = (PIECE_ROWS, cfg.pingpong_cols)
    w_desc = ws.descriptor(weight, piece)
    state_descs = [w_desc if s is weight else ws.descriptor(s, piece) for s in slots[:3]]
    dy_desc = ws.descriptor(dy, (cfg.block_t, cfg.block_n))
    x_desc = ws.descriptor(x, (cfg.block_t, cfg.block_k))
    return (weight, *slots, w_desc, *state_descs, dy_desc, x_desc, T, N, K, plan.num_groups, *step)


def launch(key, plan, weight, slots, dy, x, step: tuple) -> None:
    """Run `plan` for the problem `key` (`arguments` says what the others are)."""
    _launch(key, plan.grid, arguments(plan, weight, slots, dy, x, step), plan.constexprs, plan.options)
