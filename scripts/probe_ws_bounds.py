"""What bounds the warp-specialized fused kernel: its MMA warps, its epilogue warps, or the two together?

The shipped kernel (`forge.kernels.wgrad_update_ws`) runs a tile's update while the next tile's
GEMM runs. Were the two halves independent, its time would be the larger of theirs; measured on the
H200 it sits near their sum over a cuBLAS GEMM at every T. This probe times, on one GPU and the
same tensors, the shipped kernel's partitions alone and together:

    full           the shipped partitions (the same code as `wgrad_update_ws_kernel`; its loader
                   sits behind one branch on a runtime value, `_probe_loader`)
    mma_only       loader and MMA warps as shipped; the epilogue warps hand each staged tile back
                   at once (what the GEMM half costs, staging included)
    epilogue_only  the epilogue warps as shipped; the MMA warps stage a synthetic gradient (a
                   non-zero value that differs per tile) without loading dy or x; the loader idles
    mma_staging    loader and MMA warps as shipped; the epilogue warps read each staged tile
                   slice by slice as shipped and touch no global memory (what the staging
                   handoff costs the GEMM half: shared memory and barriers, not the update's bytes)
    mma_math       loader and MMA warps as shipped; the epilogue warps run the shipped update's
                   instructions on each staged tile with every load and store masked off (what
                   the update's arithmetic and issue cost the GEMM half, without its bytes)
    full_half_dy   the shipped partitions, but the loader refills a ring slot's dy tile on every
                   other fill only: the operand reads through L2 drop by a quarter, as a 2-CTA
                   cluster multicasting dy would make them (the MMA warps multiply the dy tile the
                   slot last held, so the update's values differ; its work and bytes do not)
    full_first_lap the shipped partitions, but the loader fills the ring once and never again: no
                   operand reads after the first few (what the full kernel costs without them)
    mma_first_lap  mma_only with that loader: the GEMM half with no operand traffic

beside cuBLAS's dW GEMM, the shipped launch (`ForgeOptimizer.update_linear`), a multi-tensor
pass over the same bytes as the update (W and both bf16 states read and written once,
`torch._foreach_mul_`) and the rate at which the multiprocessors read a 16 MB buffer that stays
in L2 (`l2_read_tb_s`, once per run). AdamW, bf16 weights and states, the bf16 states' shipped
config. Each timing also records the SM clock and power draw NVML reported while it ran
(`*_clocks`). On the H200 the MMA half alone runs power-capped at T >= 4096 (~1545 MHz on gate at
T = 16384) and the full kernel is not (~1965 MHz), yet takes longer: the halves stall each other,
they do not share power.

    python scripts/probe_ws_bounds.py          # on an H100/H200; JSONL to $OUT (or results/out)
    python scripts/probe_ws_bounds.py --no-stochastic-rounding   # W rounded to nearest: no Philox
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forge.kernels import wgrad_update_ws as ws  # noqa: E402
from harness.measure import ClockSampler  # noqa: E402

SHAPES = {"gate": (14336, 4096), "q": (4096, 4096)}
TOKENS = (256, 1024, 4096, 16384)


@gluon.jit
def _idle_epilogue(acc_smem, acc_ready, acc_empty, N, K):
    """Hand every staged tile back unread."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    done = 0
    for _ in range(gl.program_id(0), tiles, gl.num_programs(0)):
        mbarrier.wait(acc_ready, done & 1)
        ws._partition_barrier()
        mbarrier.arrive(acc_empty)
        done += 1


@gluon.jit
def _staging_reader(acc_smem, acc_ready, acc_empty, w_ptr, N, K, ROWS: gl.constexpr):
    """Read every staged tile ROWS rows at a time in the shipped epilogue's layout, then hand it
    back; the sum is stored only where it is NaN (never), so that the reads stay."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    THREADS_K: gl.constexpr = BLOCK_K // 8
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // THREADS_K, THREADS_K], [gl.num_warps(), 1], [1, 0])
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    total = gl.zeros((ROWS, BLOCK_K), gl.float32, layout)
    done = 0
    for _ in range(gl.program_id(0), tiles, gl.num_programs(0)):
        mbarrier.wait(acc_ready, done & 1)
        for r in gl.static_range(BLOCK_N // ROWS):
            total += acc_smem.slice(r * ROWS, ROWS, dim=0).load(layout)
        ws._partition_barrier()
        mbarrier.arrive(acc_empty)
        done += 1
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    offsets = gl.expand_dims(rows, 1) * K + gl.expand_dims(cols, 0)
    gl.store(w_ptr + offsets, total.to(gl.bfloat16), mask=total != total)


@gluon.jit
def _masked_epilogue(
    acc_smem, acc_ready, acc_empty, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
    N, K, NUM_GROUPS, row_limit, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
    RULE: gl.constexpr, HAS_MOMENTUM: gl.constexpr, CENTERED: gl.constexpr,
    HAS_S1: gl.constexpr, HAS_S2: gl.constexpr, HAS_S3: gl.constexpr,
    S1_SIGNED: gl.constexpr, S2_SIGNED: gl.constexpr, S3_SIGNED: gl.constexpr,
    STATE_DTYPE: gl.constexpr, QGROUP: gl.constexpr, STOCHASTIC_ROUNDING: gl.constexpr,
    ROWS: gl.constexpr, FAST_EPILOGUE: gl.constexpr, OVERLAP_SLICES: gl.constexpr,
):
    """The shipped epilogue (`update_staged_tile`) with rows from `row_limit` on masked off: the
    host passes 0, a runtime value, so the loads and stores are issued but predicated off."""
    BLOCK_N: gl.constexpr = acc_smem.type.shape[0]
    BLOCK_K: gl.constexpr = acc_smem.type.shape[1]
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    done = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        n0, k0 = ws._tile_origin(tile, N, K, BLOCK_N, BLOCK_K)
        ws.update_staged_tile(acc_smem, acc_ready, acc_empty, done, n0, k0, row_limit,
                              w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
                              K, NUM_GROUPS, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed,
                              RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED, S3_SIGNED,
                              STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, ROWS, FAST_EPILOGUE, OVERLAP_SLICES)
        done += 1


@gluon.jit
def _synthetic_mma(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K):
    """Stage a gradient tile of (tile index + 1) * 1e-3 for each tile, reading no operands."""
    BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_K, 16])
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    done = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        acc = gl.full((BLOCK_N, BLOCK_K), 1e-3, gl.float32, layout) * (tile + 1).to(gl.float32)
        mbarrier.wait(acc_empty, (done & 1) ^ 1)
        acc_smem.store(acc)
        ws._partition_barrier()
        mbarrier.arrive(acc_ready)
        done += 1


@gluon.jit
def _idle_loader(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K):
    pass


ALL_OPERANDS, HALF_DY, FIRST_LAP = 0, 1, 2  # what `_probe_loader` refills


@gluon.jit
def _probe_loader(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, operands):
    """The shipped loader with `operands` ALL_OPERANDS. With HALF_DY a slot's dy tile is refilled
    on every other fill only; with FIRST_LAP neither operand is refilled after the ring's first lap.
    Every slot is filled on that lap, so the tiles the MMA warps reuse are finite."""
    if operands == 0:  # ALL_OPERANDS
        ws._load_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K)
    else:
        STAGES: gl.constexpr = dy_bufs.type.shape[0]
        BLOCK_T: gl.constexpr = dy_bufs.type.shape[1]
        BLOCK_N: gl.constexpr = dy_bufs.type.shape[2]
        BLOCK_K: gl.constexpr = x_bufs.type.shape[2]
        tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
        count = 0
        for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
            n0, k0 = ws._tile_origin(tile, N, K, BLOCK_N, BLOCK_K)
            for t0 in range(0, T, BLOCK_T):
                slot = count % STAGES
                mbarrier.wait(empty.index(slot), ((count // STAGES) & 1) ^ 1)
                # literals: a jitted function reads no plain module globals (1 is HALF_DY)
                if (count < STAGES) | ((operands == 1) & (count % 2 == 0)):
                    mbarrier.expect(ready.index(slot), dy_desc.block_type.nbytes + x_desc.block_type.nbytes)
                    ws._tma_load(dy_desc, [t0, n0], ready.index(slot), dy_bufs.index(slot))
                    ws._tma_load(x_desc, [t0, k0], ready.index(slot), x_bufs.index(slot))
                elif operands == 1:
                    mbarrier.expect(ready.index(slot), x_desc.block_type.nbytes)
                    ws._tma_load(x_desc, [t0, k0], ready.index(slot), x_bufs.index(slot))
                else:
                    mbarrier.arrive(ready.index(slot))
                count += 1


@triton.jit
def _l2_read_kernel(src_ptr, out_ptr, n_chunks, ITERS: tl.constexpr, CHUNK: tl.constexpr):
    """Each program sums ITERS chunks of src, hopping over it, loads cached in L2 only (.cg)."""
    pid = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    total = tl.zeros((CHUNK,), tl.float32)
    for i in range(ITERS):
        chunk = (pid * 7 + i * 13) % n_chunks
        total += tl.load(src_ptr + chunk * CHUNK + offs, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + pid * CHUNK + offs, total)


def l2_read_rate() -> float:
    """TB/s at which the multiprocessors read a 16 MB bf16 buffer that stays in L2 (the H200 has
    60 MB): 8 programs a multiprocessor, 64 chunks of 16 KiB each."""
    from triton.testing import do_bench

    CHUNK, ITERS = 8192, 64
    src = torch.randn(8 * 1024 * 1024, device="cuda", dtype=torch.bfloat16)
    programs = 8 * torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(programs * CHUNK, device="cuda", dtype=torch.float32)
    n_chunks = src.numel() // CHUNK
    ms = do_bench(lambda: _l2_read_kernel[(programs,)](src, out, n_chunks, ITERS=ITERS, CHUNK=CHUNK, num_warps=8),
                  return_mode="median")
    return programs * ITERS * CHUNK * src.element_size() / (ms * 1e-3) / 1e12


# mode: (what the epilogue warps run, which operands the loader refills)
MODES = {
    "full": ("shipped", ALL_OPERANDS),
    "mma_only": ("idle", ALL_OPERANDS),
    "mma_staging": ("staging", ALL_OPERANDS),
    "mma_math": ("masked", ALL_OPERANDS),
    "epilogue_only": ("synthetic", ALL_OPERANDS),  # no loader: the MMA warps stage a synthetic gradient
    "full_half_dy": ("shipped", HALF_DY),
    "full_first_lap": ("shipped", FIRST_LAP),
    "mma_first_lap": ("idle", FIRST_LAP),
}


@gluon.jit(do_not_specialize=["seed", "row_limit", "operands"])
def bounds_kernel(
    w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr, dy_desc, x_desc, T, N, K, NUM_GROUPS, row_limit, operands,
    h0, h1, h2, h3, h4, h5, h6, h7, h8, seed, step_ptr,
    RULE: gl.constexpr, HAS_MOMENTUM: gl.constexpr, CENTERED: gl.constexpr,
    HAS_S1: gl.constexpr, HAS_S2: gl.constexpr, HAS_S3: gl.constexpr,
    S1_SIGNED: gl.constexpr, S2_SIGNED: gl.constexpr, S3_SIGNED: gl.constexpr,
    STATE_DTYPE: gl.constexpr, QGROUP: gl.constexpr, STOCHASTIC_ROUNDING: gl.constexpr,
    STEPS_IN_MEMORY: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr, FAST_EPILOGUE: gl.constexpr,
    OVERLAP_SLICES: gl.constexpr, EPILOGUE: gl.constexpr,
):
    """`wgrad_update_ws_kernel`'s buffers, with EPILOGUE and `operands` choosing the partitions (MODES)."""
    dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty = ws.allocate_buffers(dy_desc, x_desc, STAGES)
    workers = (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K)
    loader = (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K, operands)
    if EPILOGUE == "idle":
        gl.warp_specialize([(_idle_epilogue, (acc_smem, acc_ready, acc_empty, N, K)),
                            (ws._mma_partition, workers), (_probe_loader, loader)],
                           [4, 1], [ws.MMA_REGS, ws.LOADER_REGS])
    elif EPILOGUE == "masked":
        gl.warp_specialize([(_masked_epilogue, (acc_smem, acc_ready, acc_empty, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr,
                                                q3_ptr, N, K, NUM_GROUPS, row_limit, h0, h1, h2, h3, h4, h5, h6, h7, h8,
                                                seed, RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED,
                                                S2_SIGNED, S3_SIGNED, STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, ROWS,
                                                FAST_EPILOGUE, OVERLAP_SLICES)),
                            (ws._mma_partition, workers), (_probe_loader, loader)],
                           [4, 1], [ws.MMA_REGS, ws.LOADER_REGS])
    elif EPILOGUE == "staging":
        gl.warp_specialize([(_staging_reader, (acc_smem, acc_ready, acc_empty, w_ptr, N, K, ROWS)),
                            (ws._mma_partition, workers), (_probe_loader, loader)],
                           [4, 1], [ws.MMA_REGS, ws.LOADER_REGS])
    elif EPILOGUE == "synthetic":
        gl.warp_specialize([(ws._epilogue_partition, (acc_smem, acc_ready, acc_empty, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
                                N, K, NUM_GROUPS, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed, step_ptr,
                                RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED,
                                S3_SIGNED, STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, STEPS_IN_MEMORY, ROWS,
                                FAST_EPILOGUE, OVERLAP_SLICES)),
                            (_synthetic_mma, workers), (_idle_loader, workers)],
                           [4, 1], [ws.MMA_REGS, ws.LOADER_REGS])
    else:
        gl.warp_specialize([(ws._epilogue_partition, (acc_smem, acc_ready, acc_empty, w_ptr, s1_ptr, s2_ptr, s3_ptr, q1_ptr, q2_ptr, q3_ptr,
                                N, K, NUM_GROUPS, h0, h1, h2, h3, h4, h5, h6, h7, h8, seed, step_ptr,
                                RULE, HAS_MOMENTUM, CENTERED, HAS_S1, HAS_S2, HAS_S3, S1_SIGNED, S2_SIGNED,
                                S3_SIGNED, STATE_DTYPE, QGROUP, STOCHASTIC_ROUNDING, STEPS_IN_MEMORY, ROWS,
                                FAST_EPILOGUE, OVERLAP_SLICES)),
                            (ws._mma_partition, workers), (_probe_loader, loader)],
                           [4, 1], [ws.MMA_REGS, ws.LOADER_REGS])


def _point(name: str, N: int, K: int, T: int, stochastic_rounding: bool) -> dict:
    from triton.testing import do_bench

    import forge
    from forge.kernels import wgrad_update as wu
    from forge.kernels.update_tile import slot_arguments, step_arguments

    dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16) / T**0.5
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    layer = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(layer.weight, std=0.02)
    opt = forge.attach(layer, "adamw", state_dtype="bf16", lr=1e-4, weight_decay=0.01,
                       stochastic_rounding=stochastic_rounding)
    w = layer.weight
    opt.update_linear(w, dy, x)  # the states exist (and are non-zero) from here on
    group = opt.param_groups[0]
    states, scales, signed = opt._slot_tensors(w, group)
    coeffs = opt.rule.coefficients(group, 10, dict(opt.state[w]))
    kw = opt._kernel_options(group)
    cfg = wu._HOPPER_WS_DEFAULTS["bf16"]
    plan = wu._plan(w, states, signed, dy, x, config=cfg, steps_in_memory=False, **kw)
    dy_desc = ws.descriptor(dy, (cfg.block_t, cfg.block_n))
    x_desc = ws.descriptor(x, (cfg.block_t, cfg.block_k))
    row_limit = 0  # mma_math masks every row off; the other modes do not read it
    head = (w, *slot_arguments(w, states, scales), dy_desc, x_desc, T, N, K, plan.num_groups, row_limit)
    step = step_arguments(w, coeffs, 1, None)

    def launch(mode):
        epilogue, operands = MODES[mode]
        return lambda: bounds_kernel[plan.grid](*head, operands, *step, **plan.constexprs, EPILOGUE=epilogue,
                                                **plan.options)

    def timed(key, fn):
        """The median time of fn as row[key + "_ms"], the SM clock and power draw while it ran as
        row[key + "_clocks"] (a GEMM near the power cap runs at lower clocks)."""
        clocks = ClockSampler(torch.cuda.current_device(), period_s=0.005).start()
        row[f"{key}_ms"] = do_bench(fn, return_mode="median")
        clocks.stop()
        row[f"{key}_clocks"] = clocks.summary()

    row = dict(shape_name=name, T=T, N=N, K=K, config=str(cfg), stochastic_rounding=stochastic_rounding)
    for mode in MODES:
        timed(mode, launch(mode))
    timed("shipped", lambda: opt.update_linear(w, dy, x))
    timed("cublas_gemm", lambda: torch.mm(dy.t(), x))
    tensors = [t.detach() for t in (w, *states) if t is not None]
    row["foreach_same_bytes_ms"] = do_bench(lambda: torch._foreach_mul_(tensors, 1.0), return_mode="median")
    row["update_bytes"] = sum(2 * t.numel() * t.element_size() for t in tensors)
    assert torch.isfinite(w).all(), "weights became non-finite during timing"
    return row


def _clock(summary: dict | None) -> str:
    return f"{summary['sm_clock_mhz']['median']:.0f}" if summary else "-"


def main() -> int:
    if not torch.cuda.is_available():
        print("probe_ws_bounds times a Hopper GPU kernel: run it on an H100/H200")
        return 2
    from harness import env

    out_dir = Path(os.environ.get("OUT", "results/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"ws_bounds-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    meta = dict(env=env.collect(env.git_info()), gpu_name=torch.cuda.get_device_name(),
                time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    stochastic_rounding = "--no-stochastic-rounding" not in sys.argv[1:]
    torch.manual_seed(0)
    meta["l2_read_tb_s"] = l2_read_rate()
    print(f"L2 read rate (16 MB resident buffer): {meta['l2_read_tb_s']:.2f} TB/s", flush=True)
    for name, (N, K) in SHAPES.items():
        for T in TOKENS:
            row = dict(meta, **_point(name, N, K, T, stochastic_rounding))
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            tb = row["update_bytes"] / 1e9
            print(f"{name:5s} T={T:5d} full {row['full_ms']:.4f} shipped {row['shipped_ms']:.4f} | "
                  f"mma_only {row['mma_only_ms']:.4f} mma_staging {row['mma_staging_ms']:.4f} "
                  f"mma_math {row['mma_math_ms']:.4f} cublas {row['cublas_gemm_ms']:.4f} | "
                  f"full_half_dy {row['full_half_dy_ms']:.4f} full_first_lap {row['full_first_lap_ms']:.4f} "
                  f"mma_first_lap {row['mma_first_lap_ms']:.4f} | "
                  f"epilogue_only {row['epilogue_only_ms']:.4f} ({tb / row['epilogue_only_ms']:.2f} TB/s) "
                  f"foreach {row['foreach_same_bytes_ms']:.4f} ({tb / row['foreach_same_bytes_ms']:.2f} TB/s) | "
                  f"SM MHz full {_clock(row['full_clocks'])} mma_only {_clock(row['mma_only_clocks'])} "
                  f"cublas {_clock(row['cublas_gemm_clocks'])}",
                  flush=True)
            gc.collect()
            torch.cuda.empty_cache()
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
