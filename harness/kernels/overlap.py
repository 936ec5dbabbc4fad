"""How well the fused kernel hides its update under the dW GEMM, and the designs that try to do better.

    python -m harness.kernels.overlap                          # Llama-3.1-8B gate, q, down at T = 1k, 4k, 16k
    python -m harness.kernels.overlap --shapes gate --tokens 1024 --designs fed --build-first

For each linear shape and token count T, on one GPU, side by side, fresh random inputs, AdamW with
bf16 weights and states (the bf16 states' shipped config), median of `do_bench`:

    roofline           max(cuBLAS's dW GEMM, the update's bytes at the measured copy rate): the
                       time of a kernel that hid the whole update under the GEMM
    cublas_gemm        torch.mm(dy.t(), x), bf16 out
    foreach_update     a multi-tensor pass over the update's bytes (W, m, v read and written once)
    shipped            the fused launch as FORGE runs it (`ForgeOptimizer.update_linear`)
    warp_specialized   the warp-specialized kernel's launch (`WARP_SPECIALIZED_DEFAULTS`), which the
                       shipped one is but where the ping-pong kernel won (timed with that design)
    ws                 the warp-specialized kernel (`forge.kernels.wgrad_update_ws`) through the
                       probe kernel below, all partitions as shipped
    ws_mma_only        its loader and MMA warps, the epilogue handing each staged tile back unread:
                       the GEMM half
    ws_epilogue_only   its epilogue warps on a synthetic gradient, no operand reads: the update half
    ws_half_dy         the shipped partitions, the loader refilling dy on every other fill only: the
                       operand reads through L2 a quarter lower, as a 2-CTA cluster multicasting dy
                       would make them (the values differ; the work and the bytes of the update do
                       not): an upper bound on what that cluster buys
    ws_first_lap       the shipped partitions, no operand reads after the ring's first lap: the
                       bound of any cut in operand traffic
    pingpong_s<S>      the ping-pong kernel (`forge.kernels.wgrad_update_pingpong`): two MMA
                       warpgroups taking turns, each updating its tile from its own registers, with
                       S stages of dy and x, in pieces of 32 columns (_c64: of 64)
    fed_s<S>_u<U>_c<C> the ping-pong kernel whose update is fed by bulk copies
                       (`forge.kernels.wgrad_update_pingpong_fed`): S stages of dy and x, U slots of
                       64 x C pieces of W and the states (the bf16 candidates of
                       `harness.kernels.build.candidate_groups()["pingpong_fed"]`); _slot: updated
                       in their slots and stored by bulk copies (`KernelConfig.update_in_slot`)
    ..._mma_only       its consumers' main loops in turn, no update (the piece loader idle): its
                       GEMM half
    ..._update_only    its consumers updating a synthetic gradient from the piece ring, no operand
                       reads and no turns: its update half

`--designs` names the design candidates to time (default: pingpong and fed) and `--probe-modes`
the shipped kernel's probe modes (default: all). Each timing records the SM clock and power NVML
read while it ran. Every ping-pong and fed config is also checked
against the warp-specialized kernel: the same step from the same state, W and both states equal to
the bit (both sum the same tiles in the same order and run the same epilogue arithmetic).

Records (JSONL, one per point, with the run's metadata) go to --out; the last lines printed are a
table of each time over the roofline.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import time
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

import forge.kernels.wgrad_update_pingpong_fed as fed
from forge.kernels import WARP_SPECIALIZED_DEFAULTS
from forge.kernels import wgrad_update_ws as ws
from forge.kernels.wgrad_tile import tile_origin
from forge.kernels.wgrad_update_pingpong import CONSUMER_REGS, CONSUMER_WARPS, accumulate
from harness import sources

SHAPES = {"gate": (14336, 4096), "q": (4096, 4096), "down": (4096, 14336)}  # Llama-3.1-8B (N, K)
TOKENS = (1024, 4096, 16384)
ALL_OPERANDS, HALF_DY, FIRST_LAP = 0, 1, 2  # what the probe's loader refills
# probe mode: (the epilogue warps' part, the loader's refills)
PROBE_MODES = {
    "ws": ("shipped", ALL_OPERANDS),
    "ws_mma_only": ("idle", ALL_OPERANDS),
    "ws_epilogue_only": ("synthetic", ALL_OPERANDS),
    "ws_half_dy": ("shipped", HALF_DY),
    "ws_first_lap": ("shipped", FIRST_LAP),
}


@gluon.jit
def idle_epilogue(acc_smem, acc_ready, acc_empty, N, K):
    """Hand every staged tile back unread."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    done = 0
    for _ in range(gl.program_id(0), tiles, gl.num_programs(0)):
        mbarrier.wait(acc_ready, done & 1)
        ws.partition_barrier()
        mbarrier.arrive(acc_empty)
        done += 1


@gluon.jit
def synthetic_mma(
    dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, operands
):
    """Stage a gradient of (tile index + 1) * 1e-3 for each tile, reading no operands."""
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[BLOCK_N // 32, 1], instr_shape=[16, BLOCK_K, 16]
    )
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    done = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        acc = gl.full((BLOCK_N, BLOCK_K), 1e-3, gl.float32, layout) * (tile + 1).to(gl.float32)
        ws.hand_over(acc, acc_smem, acc_ready, acc_empty, done)
        done += 1


@gluon.jit
def mma(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, operands):
    ws.mma_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K)


@gluon.jit
def idle_loader(
    dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, operands
):
    """Load nothing (beside `synthetic_mma`, which consumes nothing)."""
    pass


@gluon.jit
def loader(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, operands):
    """The shipped loader (operands 0). 1: a slot's dy tile is refilled on every other fill only;
    2: neither operand is refilled after the ring's first lap (every slot filled once, so the
    tiles the MMA warps reuse are finite)."""
    if operands == 0:
        ws.load_partition(
            dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K
        )
    else:
        STAGES: gl.constexpr = dy_bufs.type.shape[0]
        BLOCK_T: gl.constexpr = dy_bufs.type.shape[1]
        BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
        BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
        tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
        count = 0
        for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
            n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, ws.GROUP_N)
            for t0 in range(0, T, BLOCK_T):
                slot = count % STAGES
                mbarrier.wait(empty.index(slot), ((count // STAGES) & 1) ^ 1)
                if (count < STAGES) | ((operands == 1) & (count % 2 == 0)):
                    mbarrier.expect(ready.index(slot), dy_desc.block_type.nbytes + x_desc.block_type.nbytes)
                    ws.tma_load(dy_desc, [t0, n0], ready.index(slot), dy_bufs.index(slot))
                    ws.tma_load(x_desc, [t0, k0], ready.index(slot), x_bufs.index(slot))
                elif operands == 1:
                    mbarrier.expect(ready.index(slot), x_desc.block_type.nbytes)
                    ws.tma_load(x_desc, [t0, k0], ready.index(slot), x_bufs.index(slot))
                else:
                    mbarrier.arrive(ready.index(slot))
                count += 1


@gluon.jit(do_not_specialize=["seed", "operands"])
def halves_kernel(
    w_ptr,
    s1_ptr,
    s2_ptr,
    s3_ptr,
    q1_ptr,
    q2_ptr,
    q3_ptr,
    r_ptr,
    dy_desc,
    x_desc,
    T,
    N,
    K,
    NUM_GROUPS,
    operands,
    h0,
    h1,
    h2,
    h3,
    h4,
    h5,
    h6,
    h7,
    h8,
    seed,
    step_ptr,
    scale_ptr,
    UPDATE: gl.constexpr,
    GRAD_SCALE: gl.constexpr,
    STEPS_IN_MEMORY: gl.constexpr,
    STAGES: gl.constexpr,
    ROWS: gl.constexpr,
    FAST_EPILOGUE: gl.constexpr,
    OVERLAP_SLICES: gl.constexpr,
    EPILOGUE: gl.constexpr,
):
    """`wgrad_update_ws_kernel`'s buffers and partitions, EPILOGUE and `operands` choosing which
    (PROBE_MODES)."""
    dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty = ws.allocate_buffers(
        dy_desc, x_desc, STAGES
    )
    workers = (
        dy_desc,
        x_desc,
        dy_bufs,
        x_bufs,
        ready,
        empty,
        acc_smem,
        acc_ready,
        acc_empty,
        T,
        N,
        K,
        operands,
    )
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    if EPILOGUE == "idle":
        gl.warp_specialize(
            [(idle_epilogue, (acc_smem, acc_ready, acc_empty, N, K)), (mma, workers), (loader, workers)],
            [4, 1],
            [ws.MMA_REGS, ws.LOADER_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (
                    ws.epilogue_partition,
                    (
                        acc_smem,
                        acc_ready,
                        acc_empty,
                        params,
                        N,
                        K,
                        NUM_GROUPS,
                        step,
                        step_ptr,
                        scale_ptr,
                        UPDATE,
                        GRAD_SCALE,
                        STEPS_IN_MEMORY,
                        ROWS,
                        FAST_EPILOGUE,
                        OVERLAP_SLICES,
                    ),
                ),
                (synthetic_mma if EPILOGUE == "synthetic" else mma, workers),
                (idle_loader if EPILOGUE == "synthetic" else loader, workers),
            ],
            [4, 1],
            [ws.MMA_REGS, ws.LOADER_REGS],
        )


MMA_ONLY, UPDATE_ONLY = 1, 2  # the fed ping-pong kernel's halves (`fed_halves_kernel`)


@gluon.jit
def fed_half_consumer(
    dy_bufs, x_bufs, ready, empty, turn, bufs, descs, landed, freed,
    params, N, K, NUM_GROUPS, T, step, UPDATE,
    FAST_EPILOGUE: gl.constexpr, IN_SLOT: gl.constexpr, WHICH: gl.constexpr, HALF: gl.constexpr,
):
    """`wgrad_update_pingpong_fed.consumer_partition` with one half: its main loops in turn and no
    update (MMA_ONLY), or its update from the piece ring of a synthetic gradient, (tile index + 1) *
    1e-3, with no operands and no turns (UPDATE_ONLY)."""
    BLOCK_T: gl.constexpr = dy_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
    ROWS: gl.constexpr = bufs[0].type.shape[1]
    COLS: gl.constexpr = bufs[0].type.shape[2]
    PIECES: gl.constexpr = (BLOCK_N // ROWS) * (BLOCK_K // COLS)
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[BLOCK_N // 32, 1], instr_shape=[16, BLOCK_K, 16]
    )
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    stages = gl.cdiv(T, BLOCK_T)
    programs = gl.num_programs(0)
    kept = gl.zeros((BLOCK_N,), gl.float32, gl.SliceLayout(1, layout))  # the main loops' sums, kept alive
    turns = 0
    for tile in range(gl.program_id(0) + WHICH * programs, tiles, 2 * programs):
        n0, k0 = tile_origin(tile, N, K, BLOCK_N, BLOCK_K, ws.GROUP_N)
        j = 2 * turns + WHICH
        if HALF == 1:
            mbarrier.wait(turn.index(WHICH), (turns & 1) ^ (1 - WHICH))
            acc = accumulate(dy_bufs, x_bufs, ready, empty, j * stages, T)
            mbarrier.arrive(turn.index(1 - WHICH))
            kept += gl.sum(acc, axis=1)  # in-thread adds and a quad's shuffles: no tile is dead code
        else:
            acc = gl.full((BLOCK_N, BLOCK_K), 1e-3, gl.float32, layout) * (tile + 1).to(gl.float32)
            if IN_SLOT:
                fed.update_in_slots(acc, n0, k0, turns * PIECES, bufs, descs, landed, freed, N, K, step, UPDATE,
                                    FAST_EPILOGUE)
            else:
                fed.update_from_ring(acc, n0, k0, turns * PIECES, bufs, landed, freed, params, N, K, NUM_GROUPS,
                                     step, UPDATE, FAST_EPILOGUE)
        turns += 1
    if HALF == 1 and N < 0:  # never: a store the compiler cannot prove dead
        w_ptr = params[0]
        rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        gl.store(w_ptr + rows, kept.to(w_ptr.dtype.element_ty))


@gluon.jit
def fed_half_loader(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K, HALF: gl.constexpr):
    """The operand loader for MMA_ONLY; none for UPDATE_ONLY."""
    if HALF == 1:
        fed.loader_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K)


@gluon.jit
def fed_half_piece_loader(w_desc, s1_desc, s2_desc, s3_desc, w_bufs, s1_bufs, s2_bufs, s3_bufs, landed, freed,
                          dy_bufs, x_bufs, N, K, WHICH: gl.constexpr, HALF: gl.constexpr):
    """Consumer WHICH's piece loader for UPDATE_ONLY; none for MMA_ONLY."""
    if HALF == 2:
        fed.piece_loader_partition(
            w_desc, s1_desc, s2_desc, s3_desc, w_bufs, s1_bufs, s2_bufs, s3_bufs,
            landed, freed, dy_bufs, x_bufs, N, K, WHICH,
        )


@gluon.jit(do_not_specialize=["seed"])
def fed_halves_kernel(
    w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr,
    w_desc, s1_desc, s2_desc, s3_desc, dy_desc, x_desc,
    T, N, K, NUM_GROUPS,
    h0, h1, h2, h3, h4, h5, h6, h7, h8, seed, step_ptr, scale_ptr,
    UPDATE: gl.constexpr, GRAD_SCALE: gl.constexpr, STEPS_IN_MEMORY: gl.constexpr,
    STAGES: gl.constexpr, UPDATE_STAGES: gl.constexpr, FAST_EPILOGUE: gl.constexpr, IN_SLOT: gl.constexpr,
    HALF: gl.constexpr,
):
    """`wgrad_update_pingpong_fed_kernel`'s buffers and partitions with one half (`fed_half_consumer`):
    the same arguments as that kernel, and HALF (MMA_ONLY or UPDATE_ONLY)."""
    dy_bufs, x_bufs, ready, empty = ws.allocate_ring(dy_desc, x_desc, STAGES)
    bufs0, landed0, freed0 = fed.allocate_piece_ring(w_desc, s1_desc, s2_desc, s3_desc, UPDATE_STAGES, UPDATE)
    bufs1, landed1, freed1 = fed.allocate_piece_ring(w_desc, s1_desc, s2_desc, s3_desc, UPDATE_STAGES, UPDATE)
    w0, s10, s20, s30 = bufs0
    w1, s11, s21, s31 = bufs1
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    params = (w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, r_ptr)
    descs = (w_desc, s1_desc, s2_desc, s3_desc)
    step = (h0, h1, h2, h3, h4, h5, h6, h7, h8, seed)
    gl.warp_specialize(
        [
            (
                fed_half_consumer,
                (dy_bufs, x_bufs, ready, empty, turn, bufs0, descs, landed0, freed0, params, N, K, NUM_GROUPS, T,
                 step, UPDATE, FAST_EPILOGUE, IN_SLOT, 0, HALF),
            ),
            (
                fed_half_consumer,
                (dy_bufs, x_bufs, ready, empty, turn, bufs1, descs, landed1, freed1, params, N, K, NUM_GROUPS, T,
                 step, UPDATE, FAST_EPILOGUE, IN_SLOT, 1, HALF),
            ),
            (fed_half_loader, (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, T, N, K, HALF)),
            (
                fed_half_piece_loader,
                (w_desc, s1_desc, s2_desc, s3_desc, w0, s10, s20, s30, landed0, freed0, dy_bufs, x_bufs, N, K,
                 0, HALF),
            ),
            (
                fed_half_piece_loader,
                (w_desc, s1_desc, s2_desc, s3_desc, w1, s11, s21, s31, landed1, freed1, dy_bufs, x_bufs, N, K,
                 1, HALF),
            ),
        ],
        [CONSUMER_WARPS, 1, 1, 1],
        [CONSUMER_REGS, ws.LOADER_REGS, ws.LOADER_REGS, ws.LOADER_REGS],
    )


def fed_configs() -> dict:
    """The fed ping-pong kernel's candidates for bf16 states (the fast epilogue), by probe name."""
    from forge.kernels import KernelConfig
    from harness.kernels.build import candidate_groups

    configs = {}
    for fields in candidate_groups()["pingpong_fed"]:
        c = KernelConfig(**fields)
        if c.fast_epilogue and fed.shared_bytes(c, 2, (2, 2)) <= fed.SHARED_BYTES:
            configs[f"fed_s{c.num_stages}_u{c.update_stages}_c{c.pingpong_cols}{'_slot' if c.update_in_slot else ''}"] = c
    return configs


class Point:
    """One layer's weight with FORGE attached (AdamW, bf16 states), its operands and launches."""

    def __init__(self, N: int, K: int, T: int) -> None:
        from harness.kernels.layers import forge_layer

        self.dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16) / math.sqrt(T)
        self.x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
        self.layer, self.opt = forge_layer(N, K, "adamw", "bf16")
        self.w = self.layer.weight
        self.opt.update_linear(self.w, self.dy, self.x)  # the states exist, non-zero, from here on

    def tensors(self) -> list[torch.Tensor]:
        """W and its states, as the update reads and writes them."""
        slots = self.opt.slots_of(self.w)
        return [self.w.detach(), *(s for s in slots.states if s is not None)]

    def step(self, config) -> None:
        self.opt.update_linear(self.w, self.dy, self.x, config=config)

    def step_scalars(self) -> tuple[tuple, int]:
        """The rule's coefficients of the weight's next step (`forge.rules`) and a fixed seed, for a
        probe's own launch; no step is counted."""
        state = self.opt.state[self.w]
        return self.opt.rule.coefficients(self.opt.param_groups[0], state["step"] + 1, dict(state)), 0

    def plan(self, cfg):
        """`forge.kernels.configs.plan` of this point's launch under `cfg`."""
        from forge.kernels import configs

        slots, options = self.opt.slots_of(self.w), self.opt.options_of(self.w)
        return configs.plan(
            self.w,
            slots.states,
            slots.signed,
            self.dy,
            self.x,
            rule=options.rule,
            flags=options.flags,
            state_dtype=options.state_dtype,
            stochastic_rounding=options.stochastic_rounding,
            int8_group=options.int8_group,
            config=cfg,
            steps_in_memory=False,
        )

    def probe(self, mode: str):
        """A launch of the probe kernel in `mode` (PROBE_MODES) on this point's tensors."""
        from forge.kernels import WARP_SPECIALIZED_DEFAULTS
        from forge.kernels.update_tile import slot_arguments, step_arguments

        epilogue, operands = PROBE_MODES[mode]
        cfg = WARP_SPECIALIZED_DEFAULTS["bf16"]
        slots = self.opt.slots_of(self.w)
        plan = self.plan(cfg)
        coefficients, seed = self.step_scalars()
        T, N = self.dy.shape
        K = self.x.shape[1]
        head = (
            self.w,
            *slot_arguments(self.w, slots.states, slots.scales),
            ws.descriptor(self.dy, (cfg.block_t, cfg.block_n)),
            ws.descriptor(self.x, (cfg.block_t, cfg.block_k)),
            T,
            N,
            K,
            plan.num_groups,
            operands,
        )
        step = step_arguments(self.w, coefficients, seed, None)
        constexprs = {k: v for k, v in plan.constexprs.items() if k != "OVERLAP_PROMOTION"}
        return lambda: halves_kernel[plan.grid](*head, *step, **constexprs, EPILOGUE=epilogue, **plan.options)

    def fed_half(self, cfg, half: int):
        """A launch of `fed_halves_kernel` under the fed ping-pong config `cfg`, one half."""
        from forge.kernels.update_tile import slot_arguments, step_arguments

        plan = self.plan(cfg)
        slots = self.opt.slots_of(self.w)
        coefficients, seed = self.step_scalars()
        step = step_arguments(self.w, coefficients, seed, None)
        args = fed.arguments(
            plan, self.w, slot_arguments(self.w, slots.states, slots.scales), self.dy, self.x, step
        )
        return lambda: fed_halves_kernel[plan.grid](*args, **plan.constexprs, HALF=half, **plan.options)


def matches_ws(N: int, K: int, T: int, config) -> dict:
    """One step under `config` (a ping-pong or fed one) and one of the warp-specialized kernel
    from the same state: how many elements of W and of each state differ (0 everywhere: equal to
    the bit)."""
    from forge.kernels import WARP_SPECIALIZED_DEFAULTS

    a = Point(N, K, T)
    b = Point(N, K, T)
    with torch.no_grad():
        b.w.copy_(a.w)
    b.opt.load_state_dict(a.opt.state_dict())
    b.dy, b.x = a.dy, a.x
    a.step(WARP_SPECIALIZED_DEFAULTS["bf16"])
    b.step(config)
    torch.cuda.synchronize()
    diffs = [
        int((p.view(torch.int16) != q.view(torch.int16)).sum()) for p, q in zip(a.tensors(), b.tensors())
    ]
    return {"w": diffs[0], "states": diffs[1:]}


def pingpong_configs() -> dict:
    """The ping-pong kernel's bf16-state config and its twin in pieces of 64 columns, by probe name."""
    from forge.kernels import PINGPONG_CONFIGS

    config = PINGPONG_CONFIGS["bf16"]
    name = f"pingpong_s{config.num_stages}"
    return {name: config, f"{name}_c64": dataclasses.replace(config, pingpong_cols=64)}


DESIGNS = ("pingpong", "fed")


def time_point(
    name: str,
    N: int,
    K: int,
    T: int,
    copy_tbps: float,
    designs=DESIGNS,
    probe_modes=tuple(PROBE_MODES),
) -> dict:
    """Every timing of one point (module docstring), with the clocks each ran at: the shipped
    kernel's `probe_modes` and the candidates of `designs`."""
    from triton.testing import do_bench

    from harness.run.measure import ClockSampler

    point = Point(N, K, T)
    row: dict = dict(shape_name=name, N=N, K=K, T=T)

    def timed(key: str, fn) -> None:
        print(f"  {name} T={T} {key} ...", end="", flush=True)  # a launch that never returns names itself
        clocks = ClockSampler(torch.cuda.current_device(), period_s=0.005).start()
        try:
            row[f"{key}_ms"] = do_bench(fn, return_mode="median")
        except Exception as e:  # a mode that does not build or run is a result; the point goes on
            row[f"{key}_ms"] = None
            row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        clocks.stop()
        row[f"{key}_clocks"] = clocks.summary()
        print(f" {row[f'{key}_ms']}", flush=True)

    timed("cublas_gemm", lambda: torch.mm(point.dy.t(), point.x))
    tensors = point.tensors()
    row["update_bytes"] = sum(2 * t.numel() * t.element_size() for t in tensors)
    timed("foreach_update", lambda: torch._foreach_mul_(tensors, 1.0))
    timed("shipped", lambda: point.step(None))
    for mode in probe_modes:
        timed(mode, point.probe(mode))
    if designs:  # the shipped launch takes a design's kernel itself where it won
        timed("warp_specialized", lambda: point.step(WARP_SPECIALIZED_DEFAULTS["bf16"]))
    for name, cfg in pingpong_configs().items() if "pingpong" in designs else ():
        timed(name, lambda cfg=cfg: point.step(cfg))
        row[f"{name}_differs"] = matches_ws(N, K, T, cfg)
    for name, cfg in fed_configs().items() if "fed" in designs else ():
        timed(name, lambda cfg=cfg: point.step(cfg))
        timed(f"{name}_mma_only", point.fed_half(cfg, MMA_ONLY))
        timed(f"{name}_update_only", point.fed_half(cfg, UPDATE_ONLY))
        row[f"{name}_differs"] = matches_ws(N, K, T, cfg)
    row["roofline_ms"] = max(row["cublas_gemm_ms"], row["update_bytes"] / (copy_tbps * 1e9))
    assert torch.isfinite(point.w).all(), "weights became non-finite during timing"
    return row


def _build_one(job: tuple[str, str]) -> str:
    """Launch one kernel of the timing loop once on a small problem (its compiled form lands in
    Triton's cache, which the timing loop's launches then find): `job` is (kind, name)."""
    kind, name = job
    point = Point(256, 256, 128)  # every size a multiple of 16: the timed points' specialization
    if kind == "probe":
        point.probe(name)()
    elif kind == "pingpong":
        point.step(pingpong_configs()[name])
    elif kind == "fed":
        cfg = fed_configs()[name]
        point.step(cfg)
        point.fed_half(cfg, MMA_ONLY)()
        point.fed_half(cfg, UPDATE_ONLY)()
    else:
        point.step(WARP_SPECIALIZED_DEFAULTS["bf16"])
    torch.cuda.synchronize()
    return f"{kind} {name}"


def build_first(designs, probe_modes, processes: int = 8) -> None:
    """Build the kernels of the probe modes and of the ping-pong and fed designs in `processes`
    processes at once before the timing loop, which otherwise compiles each on first use, one after
    another (each Gluon kernel takes seconds to build)."""
    import concurrent.futures
    import multiprocessing

    jobs = [("ws", "warp_specialized")] + [("probe", mode) for mode in probe_modes]
    jobs += [("pingpong", name) for name in pingpong_configs()] if "pingpong" in designs else []
    jobs += [("fed", name) for name in fed_configs()] if "fed" in designs else []
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
        for done in pool.map(_build_one, jobs):
            print(f"  built: {done}", flush=True)
    print(f"built {len(jobs)} kernels' variants in {time.perf_counter() - started:.0f} s", flush=True)


def _ratio(row: dict, key: str) -> str:
    ms = row.get(f"{key}_ms")
    return f"{ms / row['roofline_ms']:.3f}" if ms else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.kernels.overlap", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tokens", nargs="*", type=int, default=list(TOKENS))
    parser.add_argument("--designs", nargs="*", default=list(DESIGNS), choices=list(DESIGNS))
    parser.add_argument("--probe-modes", nargs="*", default=list(PROBE_MODES), choices=list(PROBE_MODES))
    parser.add_argument(
        "--out", type=Path, default=Path(sources.DEVICE_LOGS), help="folder for the JSONL records"
    )
    parser.add_argument(
        "--build-first",
        action="store_true",
        help="build the probe modes' and the ping-pong and fed designs' kernels in parallel processes first",
    )
    parser.add_argument(
        "--launch-once",
        action="store_true",
        help="launch the shipped kernel and the designs' candidates once a point, untimed (for a profiler)",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print(
            "python -m harness.kernels.overlap times Hopper kernels (wgmma, TMA): run it on an H100 or H200"
        )
        return 2
    if args.launch_once:
        for name in args.shapes:
            for T in args.tokens:
                point = Point(*SHAPES[name], T)
                point.step(None)
                for cfg in (*pingpong_configs().values(), *fed_configs().values()):
                    point.step(cfg)
                torch.cuda.synchronize()
        return 0
    if args.build_first:
        build_first(args.designs, args.probe_modes)
    from harness import results
    from harness.kernels.bench import measure_ceilings
    from harness.run import env

    git = env.git_info()
    meta = dict(
        sweep="kernel_overlap",
        env=env.collect(git),
        gpu_name=torch.cuda.get_device_name(),
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    meta["ceilings"] = measure_ceilings()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"overlap-{time.strftime('%Y%m%d')}-{(git.get('git_commit') or 'nogit')[:7]}.jsonl"
    print(f"ceilings: {meta['ceilings']}", flush=True)
    rows = []
    for name in args.shapes:
        N, K = SHAPES[name]
        for T in args.tokens:
            point = time_point(
                name,
                N,
                K,
                T,
                meta["ceilings"]["copy_tbps"],
                args.designs,
                args.probe_modes,
            )
            row = results.kernel_record(meta, point)
            rows.append(row)
            results.append(out, row)
            print("  ".join(f"{k} {v}" for k, v in row.items() if k.endswith(("_ms", "differs"))), flush=True)
            gc.collect()
            torch.cuda.empty_cache()
    keys = [
        "shipped",
        *args.probe_modes,
        *(pingpong_configs() if "pingpong" in args.designs else ()),
        *(
            f"{name}{part}"
            for name in fed_configs()
            if "fed" in args.designs
            for part in ("", "_mma_only", "_update_only")
        ),
        "foreach_update",
        "cublas_gemm",
    ]
    print("\ntime over the roofline, max(cuBLAS dW GEMM, update bytes / copy rate):")
    print("| shape | T | roofline ms | " + " | ".join(keys) + " |")
    print("|---|---:|---:|" + "---:|" * len(keys))
    for r in rows:
        cells = " | ".join(_ratio(r, k) for k in keys)
        print(f"| {r['shape_name']} | {r['T']} | {r['roofline_ms']:.4f} | {cells} |")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
