"""A warp-specialized fused dW + AdamW kernel for Hopper, written in Gluon: does the epilogue hide?

`scripts/probe_epilogue_bytes.py` found the shipped kernel's update running after its GEMM, not
under it: time = GEMM + bytes at ~3.4 TB/s. This probe splits one program per multiprocessor into
three partitions that run at once:

    loader    (1 warp)   TMA copies of dy and x tiles into a ring of STAGES shared-memory slots
    MMA       (4 warps)  wgmma over the ring into a 128 x 128 fp32 accumulator (registers), then
                         the finished tile into a shared-memory staging buffer
    epilogue  (4 warps)  the AdamW update of the staged tile, ROWS rows at a time, from and to
                         global memory (bf16 weight and states, round to nearest)

so that the epilogue of tile i runs while the MMA warps accumulate tile i + 1. The gradient tile
lives in registers and then in shared memory, never in global memory, as in the shipped kernel.
A probe, not the shipped path: AdamW with bf16 weight and states only, shapes that tile exactly,
no stochastic rounding (the shipped kernel is timed beside it with and without it).

    python scripts/probe_ws_kernel.py --build    # compile for sm_90 here, no GPU: registers, shared memory
    python scripts/probe_ws_kernel.py            # on an H100/H200: check against fp32 AdamW, then time
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forge.kernels import wgrad_update_ws as ws  # noqa: E402  (the shipped kernel's shared-memory setup)

# Names that moved between Triton 3.6 (the GPU image's) and 3.9: a barrier among the warps of one
# partition, and a TMA copy from global into shared memory.
_partition_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared

# The probe's configuration. Module constants, not kernel arguments: Gluon 3.6 hands a worker
# partition its arguments as IR values, so a constexpr passed to a worker arrives as an int32. The
# epilogue's shape is chosen per process (PROBE_EPI_WARPS, PROBE_ROWS) to compare a few in one run.
BLOCK_N = gl.constexpr(128)  # rows of W per tile (the MMA's M)
BLOCK_K = gl.constexpr(128)  # columns of W per tile (the MMA's N)
BLOCK_T = gl.constexpr(64)  # tokens per ring slot (the MMA's K)
GROUP_N = gl.constexpr(8)  # tiles of N walked together, for L2 reuse of x
STAGES = gl.constexpr(4)  # ring slots of dy and x tiles
EPI_WARPS = gl.constexpr(int(os.environ.get("PROBE_EPI_WARPS", "4")))  # 4 or 8
ROWS = gl.constexpr(int(os.environ.get("PROBE_ROWS", "16")))  # rows the epilogue updates at once
# Registers: the warps are allocated by groups of four (MMA, epilogue, loader: 12 or 16 warps); the
# kernel starts every thread at MAXNREG, then the loader drops to 24, the epilogue moves to
# EPI_REGS and the MMA group takes the rest (up to 256).
EPI_REGS = gl.constexpr(192 if EPI_WARPS.value == 4 else 120)
MAXNREG = 168 if EPI_WARPS.value == 4 else 128  # x 32 threads x 12 or 16 warps <= 64 Ki registers


@gluon.jit
def _tile_origin(tile, N, K):
    """(n0, k0) of a tile in grouped order: GROUP_N consecutive tiles share x's column in L2."""
    tiles_n = gl.cdiv(N, BLOCK_N)
    tiles_k = gl.cdiv(K, BLOCK_K)
    per_group = GROUP_N * tiles_k
    first_n = (tile // per_group) * GROUP_N
    group_rows = gl.minimum(tiles_n - first_n, GROUP_N)
    pid_n = first_n + (tile % per_group) % group_rows
    pid_k = (tile % per_group) // group_rows
    return pid_n * BLOCK_N, pid_k * BLOCK_K


@gluon.jit
def _mma_partition(dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K):
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BLOCK_K, 16])
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    count = 0  # ring steps consumed so far, over all tiles
    done = 0  # tiles handed to the epilogue
    for _ in range(gl.program_id(0), tiles, gl.num_programs(0)):
        acc = gl.zeros((BLOCK_N, BLOCK_K), gl.float32, layout)
        for t0 in range(0, T, BLOCK_T):
            slot = count % STAGES
            mbarrier.wait(ready.index(slot), (count // STAGES) & 1)
            acc = warpgroup_mma(dy_bufs.index(slot).permute((1, 0)), x_bufs.index(slot), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # the MMA of the step before has finished reading its slot: give it back to the loader
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=t0 > 0)
            count += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        mbarrier.wait(acc_empty, (done & 1) ^ 1)  # the epilogue has read the tile before
        acc_smem.store(acc)
        _partition_barrier()
        mbarrier.arrive(acc_ready)
        done += 1


@gluon.jit
def _load_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty,
                    w_ptr, m_ptr, v_ptr, T, N, K, decay, step, beta1, beta2, inv_sqrt_bc2, eps):
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    count = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        n0, k0 = _tile_origin(tile, N, K)
        for t0 in range(0, T, BLOCK_T):
            slot = count % STAGES
            mbarrier.wait(empty.index(slot), ((count // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(slot), dy_desc.block_type.nbytes + x_desc.block_type.nbytes)
            _tma_load(dy_desc, [t0, n0], ready.index(slot), dy_bufs.index(slot))
            _tma_load(x_desc, [t0, k0], ready.index(slot), x_bufs.index(slot))
            count += 1


@gluon.jit
def _epilogue_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty,
                        w_ptr, m_ptr, v_ptr, T, N, K, decay, step, beta1, beta2, inv_sqrt_bc2, eps):
    # 8 bf16 (16 bytes) per thread along K: full-width loads and stores of W and the states
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [EPI_WARPS, 1], [1, 0])
    tiles = gl.cdiv(N, BLOCK_N) * gl.cdiv(K, BLOCK_K)
    done = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        n0, k0 = _tile_origin(tile, N, K)
        mbarrier.wait(acc_ready, done & 1)
        cols = k0 + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
        for r in gl.static_range(BLOCK_N // ROWS):
            g = acc_smem.slice(r * ROWS, ROWS, dim=0).load(layout)
            if r == BLOCK_N // ROWS - 1:  # the whole tile is read: the MMA warps may stage the next
                _partition_barrier()
                mbarrier.arrive(acc_empty)
            rows = n0 + r * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
            offs = rows.to(gl.int64)[:, None] * K + cols[None, :]
            w = gl.load(w_ptr + offs).to(gl.float32)
            m = gl.load(m_ptr + offs).to(gl.float32)
            v = gl.load(v_ptr + offs).to(gl.float32)
            m = beta1 * m + (1.0 - beta1) * g
            v = beta2 * v + (1.0 - beta2) * g * g
            w = w * decay - step * m / (gl.sqrt(v) * inv_sqrt_bc2 + eps)
            gl.store(w_ptr + offs, w.to(gl.bfloat16))
            gl.store(m_ptr + offs, m.to(gl.bfloat16))
            gl.store(v_ptr + offs, v.to(gl.bfloat16))
        done += 1


@gluon.jit
def ws_wgrad_adamw_kernel(dy_desc, x_desc, w_ptr, m_ptr, v_ptr, T, N, K,
                          decay, step, beta1, beta2, inv_sqrt_bc2, eps):
    dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty = ws.allocate_buffers(dy_desc, x_desc, STAGES)
    worker_args = (dy_desc, x_desc, dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty,
                   w_ptr, m_ptr, v_ptr, T, N, K, decay, step, beta1, beta2, inv_sqrt_bc2, eps)
    gl.warp_specialize([
        (_mma_partition, (dy_bufs, x_bufs, ready, empty, acc_smem, acc_ready, acc_empty, T, N, K)),
        (_epilogue_partition, worker_args),
        (_load_partition, worker_args),
    ], [EPI_WARPS, 1], [EPI_REGS, 24])


def _descriptor_layouts():
    dy_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_T.value, BLOCK_N.value], gl.bfloat16)
    x_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_T.value, BLOCK_K.value], gl.bfloat16)
    return dy_layout, x_layout


CONFIG = dict(block_n=BLOCK_N.value, block_k=BLOCK_K.value, block_t=BLOCK_T.value, group_n=GROUP_N.value,
              stages=STAGES.value, rows=ROWS.value, epilogue_warps=EPI_WARPS.value,
              epilogue_regs=EPI_REGS.value, maxnreg=MAXNREG)


def adamw_coefficients(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, t=10):
    """torch.optim.AdamW's update as w * decay - step * m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""
    b1, b2 = betas
    return dict(decay=1.0 - lr * weight_decay, step=lr / (1.0 - b1**t), beta1=b1, beta2=b2,
                inv_sqrt_bc2=1.0 / math.sqrt(1.0 - b2**t), eps=eps)


def ws_update(w, m, v, dy, x, coefficients, programs=None):
    """One fused dW + AdamW step on bf16 w, m, v (N, K) from dy (T, N) and x (T, K), in place."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    T, N = dy.shape
    K = x.shape[1]
    bt, bn, bk = BLOCK_T.value, BLOCK_N.value, BLOCK_K.value
    assert T % bt == 0 and N % bn == 0 and K % bk == 0, "the probe needs shapes that tile exactly"
    dy_layout, x_layout = _descriptor_layouts()
    dy_desc = TensorDescriptor.from_tensor(dy, [bt, bn], dy_layout)
    x_desc = TensorDescriptor.from_tensor(x, [bt, bk], x_layout)
    programs = programs or torch.cuda.get_device_properties(dy.device).multi_processor_count
    grid = (min(programs, (N // bn) * (K // bk)),)
    c = coefficients
    ws_wgrad_adamw_kernel[grid](dy_desc, x_desc, w, m, v, T, N, K, c["decay"], c["step"], c["beta1"],
                                c["beta2"], c["inv_sqrt_bc2"], c["eps"], num_warps=4, maxnreg=MAXNREG)


def build_offline(arch: int = 90) -> dict:
    """Compile for sm_<arch> without a GPU; registers, spills and shared memory from cuobjdump."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from harness.kernel_build import _cubin_report

    dy_layout, x_layout = _descriptor_layouts()
    kernel = ws_wgrad_adamw_kernel
    signature = dict(dy_desc=f"tensordesc<bf16[{BLOCK_T.value}, {BLOCK_N.value}],{dy_layout!r}>",
                     x_desc=f"tensordesc<bf16[{BLOCK_T.value}, {BLOCK_K.value}],{x_layout!r}>",
                     w_ptr="*bf16", m_ptr="*bf16", v_ptr="*bf16", T="i32", N="i32", K="i32")
    signature.update({n: "fp32" for n in ("decay", "step", "beta1", "beta2", "inv_sqrt_bc2", "eps")})
    ordered = {name: signature[name] for name in kernel.arg_names}
    constexprs = {}
    divisible = ["w_ptr", "m_ptr", "v_ptr", "T", "N", "K"]
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    source = GluonASTSource(fn=kernel, signature=ordered, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=4, maxnreg=MAXNREG))
    usage, sass = _cubin_report(compiled.asm["cubin"])
    ptx = compiled.asm["ptx"]
    registers = sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
    instructions = len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]\s+)?[A-Z]", sass))
    return dict(usage=usage.strip(), shared_bytes=compiled.metadata.shared, hgmma=sass.count("HGMMA"),
                instructions=instructions,
                setmaxnreg=registers, spills=sass.count("STL") + sass.count("LDL"),
                global_loads_16_bytes=len(re.findall(r"ld\.global[.\w]*\.v4\.b32", ptx)),
                global_loads=len(re.findall(r"ld\.global", ptx)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="compile for sm_90 on this machine and report")
    args = parser.parse_args(argv)
    if args.build:
        os.environ["TRITON_INTERPRET"] = "0"
        print(json.dumps(build_offline(), indent=1))
        return 0
    if not torch.cuda.is_available():
        print("probe_ws_kernel times a Hopper GPU kernel: run it on an H100/H200 (or --build here)")
        return 2
    return check_and_time()


def _shipped_ms(dy: torch.Tensor, x: torch.Tensor, stochastic_rounding: bool) -> float:
    """The shipped fused kernel (`forge.attach`, AdamW, bf16 states) on a fresh layer."""
    from triton.testing import do_bench

    import forge

    layer = torch.nn.Linear(x.shape[1], dy.shape[1], bias=False, device="cuda", dtype=torch.bfloat16)
    opt = forge.attach(layer, "adamw", state_dtype="bf16", lr=1e-4, weight_decay=0.01,
                       stochastic_rounding=stochastic_rounding)
    return do_bench(lambda: opt.update_linear(layer.weight, dy, x), return_mode="median")


def _errors(w, m, v, dy, x, c) -> dict[str, dict[str, float]]:
    """One probe step against AdamW in fp32 on the fp32 gradient (cuBLAS's fp32 product of the same
    bf16 operands), for each of w, m, v: the fraction of elements more than one bf16 unit in the
    last place from the fp32 result (rounding alone gives none; the two gradients' summation
    orders flip a few where m cancels), and the norm-relative difference."""
    g = dy.float().t() @ x.float()
    m_ref = c["beta1"] * m.float() + (1 - c["beta1"]) * g
    v_ref = c["beta2"] * v.float() + (1 - c["beta2"]) * g * g
    w_ref = w.float() * c["decay"] - c["step"] * m_ref / (v_ref.sqrt() * c["inv_sqrt_bc2"] + c["eps"])
    w1, m1, v1 = w.clone(), m.clone(), v.clone()
    ws_update(w1, m1, v1, dy, x, c)
    errors = {}
    for label, got, ref in (("w", w1, w_ref), ("m", m1, m_ref), ("v", v1, v_ref)):
        ulp = (ref.abs().clamp_min(1e-30).log2().floor() - 7).exp2()
        diff = (got.float() - ref).abs()
        errors[label] = dict(over_one_ulp=float((diff > ulp).float().mean()),
                             norm_relative=float(diff.norm() / ref.norm()))
    return errors


def _point(name: str, N: int, K: int, T: int, c: dict, meta: dict) -> dict:
    from triton.testing import do_bench

    dy = torch.randn(T, N, device="cuda", dtype=torch.bfloat16) / math.sqrt(T)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(N, K, device="cuda") * 0.02).bfloat16()
    m = (torch.randn(N, K, device="cuda") * 1e-3).bfloat16()
    v = (torch.rand(N, K, device="cuda") * 1e-6).bfloat16()
    errors = _errors(w, m, v, dy, x, c)
    return dict(
        meta, shape_name=name, T=T, N=N, K=K, config=CONFIG, errors=errors,
        exact=all(e["over_one_ulp"] <= 1e-4 and e["norm_relative"] <= 1e-2 for e in errors.values()),
        probe_ms=do_bench(lambda: ws_update(w, m, v, dy, x, c), return_mode="median"),
        cublas_gemm_ms=do_bench(lambda: torch.mm(dy.t(), x), return_mode="median"),
        shipped_ms=_shipped_ms(dy, x, True), shipped_nearest_ms=_shipped_ms(dy, x, False),
    )


def check_and_time() -> int:
    from harness import env

    out_dir = Path(os.environ.get("OUT", "results/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"ws_probe-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    meta = dict(env=env.collect(env.git_info()), gpu_name=torch.cuda.get_device_name())
    meta["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    torch.manual_seed(0)
    ok = True
    shapes = {"gate": (14336, 4096), "q": (4096, 4096), "down": (4096, 14336), "k": (1024, 4096)}
    for (name, (N, K)), T in itertools.product(shapes.items(), (1024, 2048, 8192)):
        r = _point(name, N, K, T, adamw_coefficients(), meta)
        ok &= r["exact"]
        with out.open("a") as f:
            f.write(json.dumps(r) + "\n")
        print(f"{name:5s} T={T:5d} probe {r['probe_ms']:.4f} ms | shipped {r['shipped_ms']:.4f} "
              f"(nearest {r['shipped_nearest_ms']:.4f}) | cublas {r['cublas_gemm_ms']:.4f} | "
              f"probe / shipped nearest {r['probe_ms'] / r['shipped_nearest_ms']:.3f}, "
              f"/ cublas {r['probe_ms'] / r['cublas_gemm_ms']:.3f} | errors {r['errors']}",
              flush=True)
        torch.cuda.empty_cache()
    print(f"results: {out}; {'every point matches fp32 AdamW to bf16 rounding' if ok else 'SOME POINTS DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
