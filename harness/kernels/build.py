"""Build the fused kernel for a GPU architecture on any machine, and read what it costs on chip.

    python -m harness.kernels.build                    # the shipped Hopper configs and the candidates
    python -m harness.kernels.build --arch 90 --json   # one JSON line per config
    python -m harness.kernels.build --configs '[{"block_n": 128, "block_k": 64, "block_t": 64,
        "group_n": 8, "epilogue_split": 4, "num_warps": 8, "num_stages": 3, "maxnreg": 128}]'

Triton compiles to PTX and, with the toolchain it ships, to a cubin without a GPU. `cuobjdump`
then says what each program of the kernel holds: registers per thread, the stack frame where
spilled registers live (and the spill instructions in the machine code), and the shared memory
the pipeline buffers take. From those and the multiprocessor's budget
(Hopper: 64 Ki registers, 228 KiB of shared memory, 2048 threads) follows how many programs share
a multiprocessor, which is what lets one program's epilogue (memory-bound) run beside another's
main loop (tensor cores). None of this is a timing: it tells which configurations are worth a GPU
run (no spills, two programs per multiprocessor), and a CI test uses it to check that the kernel
still compiles for Hopper on a machine without one. It runs on a CPU, with the installed triton
(the GPU image's 3.6 and CI's 3.9 both build; their register counts differ by a few).

A kernel that Triton defined for its interpreter cannot be compiled, so the build sets
TRITON_INTERPRET=0 for its own process before forge's kernels are first imported; where they were
already defined under the interpreter (a test process, say), `resources()` builds in a fresh
process instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# The problem the kernels are built for (T tokens, N x K weight: Llama-3.1-8B's gate at T = 2048):
# Triton specializes a launch on its integer arguments, so the build needs their values.
PROBLEM = (2048, 14336, 4096)
HOPPER = {"registers": 65536, "shared_bytes": 228 * 1024, "threads": 2048, "reserved_shared": 1024}
STATE_POINTER = {"fp32": "*fp32", "bf16": "*bf16", "int8": "*i8"}
# The element-wise kernel (every parameter that is not a fused Linear weight) at the block shape
# it takes for a 4096-wide parameter; `measure` and `resources` accept it as a config.
ELEMENTWISE = {"kernel": "elementwise", "block_r": 8, "block_c": 512, "num_warps": 8}
# The FP8 cast of `forge.kernels.fp8_cast` (a bf16 tensor to e4m3, row-major and transposed) at its
# GPU tile; as a config, `measure` builds it.
FP8_CAST = {"kernel": "fp8_cast", "block_r": 64, "block_c": 128, "num_warps": 8}


def candidate_groups() -> dict[str, list[dict[str, Any]]]:
    """The launch configs worth timing on a GPU (`python -m harness kernels --tune`), as KernelConfig
    fields, in named groups; the tables behind `forge.kernels.pick_config` were measured from them.
    At 128 registers (two programs per multiprocessor) a 128 x 128 tile updated in 32-row
    slices spills in its epilogue with fp32 and int8 states (the accumulator alone takes 64
    registers); in 16-row slices (split 8) it does not, nor do 128 x 64 and 64 x 128 tiles, which
    read one operand twice as often from L2."""
    base = dict(block_t=64, group_n=8, epilogue_split=4, num_warps=8, num_stages=3)
    shipped = [
        dict(base, block_n=128, block_k=128, maxnreg=128),  # bf16 states, T > 2048
        dict(base, block_n=128, block_k=128, maxnreg=128, epilogue_split=8),  # the rest but int8 T <= 2048
        dict(base, block_n=64, block_k=128, maxnreg=128, overlap_slices=True),  # int8 states, T <= 2048
    ]
    warp_specialized_base = dict(
        block_n=128,
        block_k=128,
        block_t=64,
        num_warps=8,
        num_stages=4,
        warp_specialized=True,
        epilogue_rows=32,
    )
    pingpong = dict(  # the ping-pong kernel as shipped for bf16 states
        warp_specialized_base,
        num_warps=4,
        num_stages=6,
        pingpong=True,
        fast_epilogue=True,
        overlap_slices=True,
    )
    return {
        "shipped": shipped,
        "tiles": [
            dict(base, block_n=128, block_k=128, maxnreg=None),  # no spills, one per SM
            dict(base, block_n=128, block_k=64, maxnreg=128),  # no spills, two per SM
            dict(base, block_n=128, block_k=64, maxnreg=128, num_stages=4),
            dict(base, block_n=128, block_k=64, maxnreg=None, num_warps=4, num_stages=4),
            dict(base, block_n=128, block_k=64, maxnreg=128, epilogue_split=8),
        ],
        # Large T, where the main loop dominates: a 128 x 256 tile (two warpgroups of m64n256 MMAs)
        # ran the bare GEMM at 95-98% of cuBLAS in prototypes where 128 x 128 reaches ~70%; one
        # program per SM, no spills in 16-row slices.
        "wide": [
            dict(base, block_n=128, block_k=256, maxnreg=None, epilogue_split=8),
            dict(base, block_n=128, block_k=256, maxnreg=None, epilogue_split=8, num_stages=4),
        ],
        # Where the GEMM is shorter than its launch (Llama's k and v at T = 1024), the host's cost
        # per launch sets the time: plain pointers skip encoding two TMA descriptors per call
        # (shipped below 2e10 FLOPs). Persistent grids and descriptors built by each program were
        # timed too and lost everywhere (docs/performance.md); their knobs left the kernel.
        "pointers": [dict(c, tma="none") for c in shipped],
        # In slice order each epilogue slice's loads wait for the previous slice's stores (the
        # SASS reads LDG x3, STG x3, eight times over): load the next slice first (the int8
        # small-T config ships that way; here it is timed in slice order).
        "overlap": [dict(c, overlap_slices=not c.get("overlap_slices")) for c in shipped],
        # The warp-specialized kernel (`forge.kernels.wgrad_update_ws`, shipped on Hopper for every
        # state dtype): a loader warp and 4 MMA warps beside 8 or 4 epilogue warps, one program
        # per SM; with and without the fast epilogue (approximate sqrt and division, hardware bf16
        # rounding); with 8 warps, also with overlapped slices (the fast epilogue in 32-row slices,
        # the exact one in 16-row slices, where it fits its 152 registers).
        "warp_specialized": [
            dict(warp_specialized_base, num_warps=warps, fast_epilogue=fast_epilogue)
            for warps in (8, 4)
            for fast_epilogue in (False, True)
        ]
        + [
            dict(warp_specialized_base, fast_epilogue=True, overlap_slices=True),
            dict(warp_specialized_base, epilogue_rows=16, overlap_slices=True),
            # 256 x 128 tiles: two MMA warpgroups share each x tile, a quarter fewer operand bytes
            # through L2 per weight than 128 x 128 (what bounds the kernel at large T); 4 epilogue
            # warps fit beside them, and a ring of 3 x 32 tokens beside the 132 KiB staging buffer.
            # Measured 1.09-3.30x the shipped config: not shipped
            dict(
                warp_specialized_base,
                block_n=256,
                block_t=32,
                num_stages=3,
                num_warps=4,
                epilogue_rows=16,
                fast_epilogue=True,
            ),
        ],
        # Hopper's ping-pong schedule (`forge.kernels.wgrad_update_pingpong`): two MMA warpgroups
        # own every other tile, take turns at the tensor cores and update from their own
        # accumulator registers; no staging buffer, so 6 stages of dy and x fit. The configs of
        # `forge.kernels.configs.PINGPONG_CONFIGS` (bf16, fp32, int8 states), then bf16's with the
        # shipped kernel's 4 stages, and in pieces of 64 columns (spills 24-40 bytes).
        "pingpong": [
            pingpong,
            dict(warp_specialized_base, num_warps=4, num_stages=6, pingpong=True),
            dict(warp_specialized_base, num_warps=4, num_stages=6, pingpong=True, fast_epilogue=True),
            dict(pingpong, num_stages=4),
            dict(pingpong, pingpong_cols=64),
        ],
        # The ping-pong kernel with its update fed by bulk copies
        # (`forge.kernels.wgrad_update_pingpong_fed`): one piece loader per consumer brings 64-row
        # pieces of W and the states into that consumer's ring of `update_stages` slots (a power of 2) beside
        # `num_stages` stages of dy and x, within 227 KiB: for bf16 states (fast epilogue) a deep
        # operand ring and shallow piece rings, both halfway, and deep piece rings of narrow pieces;
        # for fp32 states (exact epilogue, which spills in 32-column pieces) 16-column pieces. And
        # the update in the pieces' slots (`update_in_slot`), on the shipped option's rings.
        "pingpong_fed": [
            dict(pingpong, overlap_slices=False, update_stages=2, pingpong_cols=16),
            dict(pingpong, overlap_slices=False, num_stages=5, update_stages=2),
            dict(pingpong, overlap_slices=False, num_stages=5, update_stages=4, pingpong_cols=16),
            dict(pingpong, overlap_slices=False, num_stages=4, update_stages=4, pingpong_cols=16),
            *(
                dict(pingpong, overlap_slices=False, fast_epilogue=False, num_stages=stages, update_stages=2,
                     pingpong_cols=16)
                for stages in (4, 5)
            ),
            dict(pingpong, overlap_slices=False, num_stages=5, update_stages=2, update_in_slot=True),
            dict(pingpong, overlap_slices=False, num_stages=5, update_stages=4, pingpong_cols=16, update_in_slot=True),
            dict(pingpong, overlap_slices=False, fast_epilogue=False, num_stages=4, update_stages=2, pingpong_cols=16,
                 update_in_slot=True),
        ],
        # Small grids (Qwen3-14B's k and v: 320 tiles of 128 x 128 for 132 programs, the last of
        # three rounds under half full): 128 x 64 tiles double the tiles (4.8 rounds) at 1.5x the
        # operand bytes per weight through L2; beside the shipped warp-specialized config. Measured
        # 1.18-1.74x it on Llama's and Qwen's k: not shipped
        "narrow": [
            dict(warp_specialized_base, block_k=block_k, fast_epilogue=True, overlap_slices=True)
            for block_k in (128, 64)
        ],
        # Grids under one tile per multiprocessor (Qwen3-0.6B's 1,024-wide layers: k and v 64 tiles
        # of 128 x 128, q and o 128, gate, up and down 192): 64-row tiles double the programs, 64 x
        # 64 ones quadruple them, each summing the same tokens (the warp-specialized kernel builds
        # 64-row tiles for FP8 operands only).
        "small_grid": [
            dict(base, block_n=64, block_k=128, maxnreg=128, overlap_slices=True),
            dict(base, block_n=64, block_k=64, maxnreg=128),
        ],
    }


def candidates(groups: list[str] | None = None) -> list[dict[str, Any]]:
    """The configs of the named `candidate_groups` (default: all), the config shipped for T > 2048
    first."""
    table = candidate_groups()
    unknown = sorted(set(groups or ()) - set(table))
    if unknown:
        raise ValueError(f"unknown candidate groups {unknown}; known: {sorted(table)}")
    chosen = ["shipped", *[g for g in (groups or table) if g != "shipped"]]
    return [c for g in chosen for c in table[g]]


def _compile(config: dict[str, Any], arch: int, state_dtype: str, tma: str, stochastic_rounding: bool = True):
    """The CompiledKernel of the fused AdamW update (bf16 weights) under `config` for sm_<arch>;
    `tma` as `KernelConfig.tma` ("host", "device", "none")."""
    if config.get("warp_specialized"):
        return _compile_warp_specialized(config, arch, state_dtype, stochastic_rounding)
    from forge.kernels import wgrad_update_kernel as kernel

    T, N, K = PROBLEM
    signature = _slots_signature(state_dtype)
    if config.get("fp8"):  # FP8 operands contiguous along T (forge.fp8): dy e5m2, x e4m3
        bt = config["block_t"]
        tile = lambda kind, rows: f"tensordesc<{kind}[{rows}, {bt}]>" if tma == "host" else f"*{kind}"
        signature.update(dy_src=tile("fp8e5", config["block_n"]), x_src=tile("fp8e4nv", config["block_k"]))
        strides = dict(stride_dy_t=1, stride_dy_n=T, stride_x_t=1, stride_x_k=T)
    else:
        tile = lambda rows: f"tensordesc<bf16[{config['block_t']}, {rows}]>" if tma == "host" else "*bf16"
        signature.update(dy_src=tile(config["block_n"]), x_src=tile(config["block_k"]))
        strides = dict(stride_dy_t=N, stride_dy_n=1, stride_x_t=K, stride_x_k=1)  # contiguous dy and x
    group = config.get("int8_group", 64)
    integers = dict(T=T, N=N, K=K, NUM_GROUPS=-(-K // group), **strides)
    constants = _epilogue_constants(state_dtype, stochastic_rounding, group)
    constants.update(
        TMA=tma,
        T_MAJOR=bool(config.get("fp8")),
        FP8_FAST_ACCUM=bool(config.get("fp8_fast_accum")),
        UPCAST_DOT=False,
        DOT_PRECISION="tf32",
        BLOCK_N=config["block_n"],
        BLOCK_K=config["block_k"],
        BLOCK_T=config["block_t"],
        GROUP_N=config["group_n"],
        EPILOGUE_SPLIT=config["epilogue_split"],
        OVERLAP_SLICES=config.get("overlap_slices", False),
    )
    options = dict(num_warps=config["num_warps"], num_stages=config["num_stages"])
    if config.get("maxnreg"):
        options["maxnreg"] = config["maxnreg"]
    return _build(kernel, signature, integers, constants, arch, options)


def _compile_warp_specialized(config: dict[str, Any], arch: int, state_dtype: str, stochastic_rounding: bool):
    """The CompiledKernel of `forge.kernels.wgrad_update_ws` (Gluon) for the fused AdamW update; with
    `fp8`, of e5m2 dy and e4m3 x contiguous along T (descriptors of their transposes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from forge.kernels import wgrad_update_pingpong, wgrad_update_pingpong_fed, ws_max_registers
    from forge.kernels.launch import FP_FUSION
    from forge.kernels.wgrad_update_ws import wgrad_update_ws_kernel

    pingpong = bool(config.get("pingpong"))  # two MMA warpgroups updating from their registers
    fed = pingpong and bool(config.get("update_stages"))  # ... from pieces the copy engine brought
    kernel = (
        wgrad_update_pingpong_fed.wgrad_update_pingpong_fed_kernel
        if fed
        else wgrad_update_pingpong.wgrad_update_pingpong_kernel
        if pingpong
        else wgrad_update_ws_kernel
    )
    bt, bn, bk = config["block_t"], config["block_n"], config["block_k"]
    T, N, K = PROBLEM
    signature = _slots_signature(state_dtype)
    fp8 = bool(config.get("fp8"))
    blocks = (
        (("dy_desc", "fp8e5", bn, bt), ("x_desc", "fp8e4nv", bk, bt))
        if fp8
        else (("dy_desc", "bf16", bt, bn), ("x_desc", "bf16", bt, bk))
    )
    element = {"bf16": gl.bfloat16, "fp8e5": gl.float8e5, "fp8e4nv": gl.float8e4nv}
    if fed:  # W and each state in blocks of a piece; AdamW has no third slot
        if state_dtype not in ("bf16", "fp32"):
            raise ValueError(f"the fed ping-pong kernel reads bf16 or fp32 states, not {state_dtype}")
        rows, cols = wgrad_update_pingpong_fed.PIECE_ROWS, config.get("pingpong_cols", 32)
        blocks += (("w_desc", "bf16", rows, cols), ("s1_desc", state_dtype, rows, cols))
        blocks += (("s2_desc", state_dtype, rows, cols), ("s3_desc", "bf16", rows, cols))
        element["fp32"] = gl.float32
    for name, dtype, rows, cols in blocks:
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], element[dtype])
        signature[name] = f"tensordesc<{dtype}[{rows}, {cols}],{layout!r}>"
    integers = dict(T=T, N=N, K=K, NUM_GROUPS=-(-K // config.get("int8_group", 64)))
    signature.update({name: "i32" for name in integers})
    signature.update({f"h{i}": "fp32" for i in range(9)}, seed="i32", step_ptr="*i32", scale_ptr="*fp32")
    constants = _epilogue_constants(state_dtype, stochastic_rounding, config.get("int8_group", 64))
    constants.update(
        STEPS_IN_MEMORY=False,
        STAGES=config["num_stages"],
        ROWS=config["epilogue_rows"],
        FAST_EPILOGUE=config.get("fast_epilogue", False),
        OVERLAP_SLICES=config.get("overlap_slices", False),
    )
    if fed:  # the piece is the descriptors' block; the piece ring replaces the overlapped loads
        if fp8:
            raise ValueError("the fed ping-pong kernel reads bf16 operands, not FP8 ones")
        for name in ("ROWS", "OVERLAP_SLICES"):
            constants.pop(name)
        constants["UPDATE_STAGES"] = config["update_stages"]
        constants["IN_SLOT"] = config.get("update_in_slot", False)
    elif pingpong:  # the consumers update in pieces of their own
        if fp8:
            raise ValueError("the ping-pong kernel reads bf16 operands, not FP8 ones")
        constants.pop("ROWS")
        constants["PIECE_COLS"] = config.get("pingpong_cols", 32)
    else:
        constants["OVERLAP_PROMOTION"] = config.get("overlap_promotion", False)
    signature.update({name: "constexpr" for name in constants})
    ordered = {name: signature[name] for name in kernel.arg_names}
    divisible = [name for name, kind in ordered.items() if kind.startswith("*")] + list(integers)
    source = GluonASTSource(
        fn=kernel,
        signature=ordered,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()},
        attrs={(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible},
    )
    maxnreg = (
        wgrad_update_pingpong_fed.max_registers()
        if fed
        else wgrad_update_pingpong.max_registers()
        if pingpong
        else ws_max_registers(config["num_warps"], bn, fp8)
    )
    options = dict(num_warps=config["num_warps"], maxnreg=maxnreg)
    return triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options=dict(options, enable_fp_fusion=FP_FUSION)
    )


def _compile_fp8_cast(arch: int, block_r: int, block_c: int, num_warps: int):
    """The CompiledKernel of `forge.kernels.fp8_cast.cast_kernel` (bf16 to e4m3, both layouts)."""
    from forge.kernels.fp8_cast import MAX_PARTIALS, cast_kernel

    signature = dict(t_ptr="*bf16", partial_ptr="*fp32", out_ptr="*u8", out_t_ptr="*u8", inv_ptr="*fp32")
    integers = dict(R=PROBLEM[1], C=PROBLEM[2], PARTIALS=MAX_PARTIALS)
    constants = dict(
        FP8_MAX=448.0,
        EPS=1e-12,
        FORMAT="e4m3",
        ROWS=True,
        TRANSPOSED=True,
        PARTIALS_BLOCK=MAX_PARTIALS,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
    )
    options = dict(num_warps=num_warps)
    return _build(cast_kernel, signature, integers, constants, arch, options, rule_arguments=False)


def _compile_elementwise(arch: int, state_dtype: str, block_r: int = 8, block_c: int = 512):
    """The CompiledKernel of the element-wise AdamW update (norms, embeddings) for sm_<arch>, at
    the block shape `forge.kernels.elementwise_update` picks for a 4096-wide parameter."""
    from forge.kernels import elementwise_num_warps as num_warps
    from forge.kernels import elementwise_update_kernel as kernel

    signature = _slots_signature(state_dtype)
    signature.update(g_ptr="*bf16")
    integers = dict(R=PROBLEM[1], C=PROBLEM[2], NUM_GROUPS=-(-PROBLEM[2] // 64))
    constants = _epilogue_constants(state_dtype, True)
    constants.update(BLOCK_R=block_r, BLOCK_C=block_c)
    return _build(kernel, signature, integers, constants, arch, dict(num_warps=num_warps(block_c)))


def _slots_signature(state_dtype: str) -> dict[str, str]:
    """Weight, state and scale pointers, then (appended by the caller) the kernel's own operands;
    the coefficients and seed are added by `_build`, after them."""
    signature = {"w_ptr": "*bf16"}
    signature.update({f"s{i}_ptr": STATE_POINTER[state_dtype] for i in (1, 2, 3)})
    signature.update({f"q{i}_ptr": "*bf16" for i in (1, 2, 3)})
    signature["r_ptr"] = "*bf16"  # the weight's residual (compensated weights), unread: KAHAN is off
    return signature


def _epilogue_constants(state_dtype: str, stochastic_rounding: bool, int8_group: int = 64) -> dict[str, Any]:
    """AdamW's compile-time arguments of the update (m signed in slot 1, v in slot 2), as the
    launchers build them (`forge.kernels.epilogue_constexprs`)."""
    from forge.kernels import epilogue_constexprs

    return epilogue_constexprs(
        (True, True, None),
        (True, False, False),
        rule="adamw",
        flags={"momentum": False, "centered": False},
        state_dtype=state_dtype,
        stochastic_rounding=stochastic_rounding,
        int8_group=int8_group,
    )


def launch_specialization(integers: dict[str, int]) -> tuple[list[str], list[str]]:
    """(integer arguments a launch turns into the constant 1, those it marks divisible by 16), as
    Triton's JIT specializes them (pointers from the caching allocator are always 16-aligned)."""
    ones = [name for name, value in integers.items() if value == 1]
    divisible = [name for name, value in integers.items() if value != 1 and value % 16 == 0]
    return ones, divisible


def _build(
    kernel: Any,
    signature: dict[str, str],
    integers: dict[str, int],
    constants: dict[str, Any],
    arch: int,
    options: dict,
    rule_arguments: bool = True,
):
    """Compile as a launch would: Triton specializes a real call on its argument values (an integer
    equal to 1 becomes a constant, one divisible by 16 and every 16-byte aligned pointer is marked
    divisible by 16), and that decides, among others, how wide the epilogue's loads and stores are.
    `integers` are the values of the integer arguments at the problem being built for."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from forge.kernels.launch import FP_FUSION

    ones, divisible_integers = launch_specialization(integers)
    constants = dict(constants, **{name: 1 for name in ones})
    signature = dict(signature, **{name: "i32" for name in integers if name not in ones})
    if rule_arguments:  # the update kernels' step scalars (the FP8 cast has none)
        signature.update({f"h{i}": "fp32" for i in range(9)})
        signature["seed"] = "i32"  # do_not_specialize: never a constant, never marked divisible
        signature["step_ptr"] = "*bf16"  # the weight again, unread: the launches of an eager step
        signature["scale_ptr"] = "*bf16"  # likewise: no clipping
        constants = dict(constants, STEPS_IN_MEMORY=False)
    signature.update({name: "constexpr" for name in constants})
    missing = [name for name in kernel.arg_names if name not in signature]
    if missing:
        raise ValueError(f"the build does not know the arguments {missing} of {kernel.fn.__name__}")
    ordered = {name: signature[name] for name in kernel.arg_names}
    divisible = [name for name, kind in ordered.items() if kind.startswith("*")] + divisible_integers
    source = ASTSource(
        fn=kernel,
        signature=ordered,
        constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()},
        attrs={(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible},
    )
    return triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options=dict(options, enable_fp_fusion=FP_FUSION)
    )


def _cubin_report(cubin: bytes) -> tuple[str, str]:
    """(`cuobjdump -res-usage`, `cuobjdump -sass`) of a cubin, with the cuobjdump Triton ships
    (unlike its ptxas, it reads what any Triton version's own toolchain produced)."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        run = lambda flag: (
            subprocess.run(
                [str(cuobjdump), flag, str(path)], capture_output=True, text=True, check=True
            ).stdout
        )
        return run("-res-usage"), run("-sass")


def mmas_serialized(ptx: str, arch: int) -> bool:
    """Whether ptxas serializes the kernel's asynchronous warpgroup MMAs (its C7514 note: each waits
    for the one before, which happens when other instructions touch the registers of an MMA in
    flight), with the ptxas the installed Triton compiles for `arch` with, which reads its PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        command = [str(ptxas), f"-arch=sm_{arch}a", "-v", str(path), "-o", str(path.with_suffix(".cubin"))]
        run = subprocess.run(command, capture_output=True, text=True, check=True)
    return "C7514" in run.stdout + run.stderr


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    return int(found.group(1)) if found else 0


def programs_per_multiprocessor(registers: int, shared_bytes: int, threads: int) -> int:
    """How many programs fit on one Hopper multiprocessor at once (registers are allocated per
    warp in units of 256; each program also reserves 1 KiB of shared memory)."""
    warps = threads // 32
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = HOPPER["registers"] // (per_warp * warps)
    by_shared = HOPPER["shared_bytes"] // (shared_bytes + HOPPER["reserved_shared"])
    return min(by_registers, by_shared, HOPPER["threads"] // threads)


def loads_before_first_store(sass: str) -> int:
    """Global loads the epilogue issues before its first global store (SASS after the last
    tensor-core MMA): 3 for AdamW with bf16 states updated slice by slice (W, m, v of one slice),
    more when the next slice's loads are in flight too."""
    ops = re.findall(r"\b(HGMMA|QGMMA|LDG|STG)\b", sass)
    last_mma = max((i for i, op in enumerate(ops) if op in ("HGMMA", "QGMMA")), default=-1)
    epilogue = ops[last_mma + 1 :]
    first_store = epilogue.index("STG") if "STG" in epilogue else len(epilogue)
    return epilogue[:first_store].count("LDG")


def measure(config: dict[str, Any], arch: int = 90, state_dtype: str = "bf16", tma: bool = True) -> dict:
    """Registers, spills, shared memory and programs per multiprocessor of one config, built in this
    process (`resources` builds in a fresh one). `ELEMENTWISE` as the config measures the element-wise
    kernel, `FP8_CAST` the FP8 cast."""
    if not compile_here():
        raise RuntimeError("forge's kernels were defined for Triton's interpreter here: use resources()")
    if config.get("kernel") == "elementwise":
        compiled = _compile_elementwise(arch, state_dtype, config["block_r"], config["block_c"])
    elif config.get("kernel") == "fp8_cast":
        compiled = _compile_fp8_cast(arch, config["block_r"], config["block_c"], config["num_warps"])
    else:
        compiled = _compile(config, arch, state_dtype, config.get("tma", "host") if tma else "none")
    usage, sass = _cubin_report(compiled.asm["cubin"])
    registers = _number(r"REG:(\d+)", usage)
    shared = int(compiled.metadata.shared)
    threads = 32 * config["num_warps"]
    if config.get("pingpong"):  # consumer 0 (num_warps), consumer 1 and the loader's group of four
        threads += 32 * (config["num_warps"] + 4)
    elif config.get("warp_specialized"):  # plus the MMA warps and the loader's group of four
        from forge.kernels.wgrad_update_ws import mma_warps

        threads += 32 * (mma_warps(config["block_n"], bool(config.get("fp8"))) + 4)
    record = dict(
        config=config,
        arch=arch,
        state_dtype=state_dtype,
        tma=config.get("tma", "host") if tma else "none",
        triton=_triton_version(),
        registers=registers,
        stack_bytes=_number(r"STACK:(\d+)", usage),  # per thread: where spilled registers live
        spill_stores=len(re.findall(r"\bSTL(?:\.\w+)*\s", sass)),  # instructions, not executions
        spill_loads=len(re.findall(r"\bLDL(?:\.\w+)*\s", sass)),
        shared_bytes=shared,
        instructions=len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]\s+)?[A-Z]", sass)),  # in the SASS
        epilogue_loads_before_first_store=loads_before_first_store(sass),
        global_loads=len(re.findall(r"\bLDG\b", sass)),  # instructions: each thread's loads into registers
        bulk_tensor_loads=len(re.findall(r"\bUTMALDG\b", sass)),  # the copy engine's, one thread each
        tensor_core_mmas={op: len(re.findall(rf"\b{op}\b", sass)) for op in ("HGMMA", "QGMMA", "HMMA")},
        programs_per_sm=programs_per_multiprocessor(registers, shared, threads),
    )
    if config.get("warp_specialized"):  # its MMAs are asynchronous by hand
        record["mmas_serialized"] = mmas_serialized(compiled.asm["ptx"], arch)
    return record


def _triton_version() -> str:
    import triton

    return triton.__version__


def resources(configs: list[dict[str, Any]], arch: int = 90, state_dtype: str = "bf16") -> list[dict]:
    """`measure` for each config, in a fresh process with the interpreter off (so that this works
    from tests and from code whose kernels were defined for the interpreter)."""
    return collect(start_resources(configs, arch, state_dtype))


def start_resources(
    configs: list[dict[str, Any]], arch: int = 90, state_dtype: str = "bf16"
) -> subprocess.Popen:
    """`resources` started in the background (builds of several state dtypes can run at once):
    `collect(process)` waits for its records."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness.kernels.build", "--json", "--arch", str(arch)]
        + ["--state-dtype", state_dtype, "--configs", json.dumps(configs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TRITON_INTERPRET="0"),
    )


def collect(process: subprocess.Popen) -> list[dict]:
    """The records of a `start_resources` process, in the order of its configs."""
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"building the kernel failed:\n{stderr[-3000:]}")
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def describe(c: dict) -> str:
    """A launch config in a few words: tile, slices, warps, stages, register cap, grid."""
    if c.get("kernel") in ("elementwise", "fp8_cast"):
        return f"{c['kernel'].replace('_', ' ')} {c['block_r']}x{c['block_c']} warps {c['num_warps']}"
    if c.get("warp_specialized"):
        return _describe_warp_specialized(c)
    name = (
        f"{c['block_n']}x{c['block_k']}x{c['block_t']} split {c['epilogue_split']} warps {c['num_warps']} "
        f"stages {c['num_stages']} maxnreg {c.get('maxnreg') or '-'}"
    )
    if c.get("programs_per_sm"):
        name += f" persistent {c['programs_per_sm']}/SM" + (" flatten" if c.get("flatten") else "")
    if c.get("tma", "host") != "host":
        name += " pointers" if c["tma"] == "none" else f" TMA descriptors on the {c['tma']}"
    if c.get("overlap_slices"):
        name += " overlapped slices"
    if c.get("stagger_ns"):  # records of the staggered-start candidates (6c56d66; no gain, perf notes)
        name += f" second program {c['stagger_ns'] / 1000:g} us late"
    if c.get("prefetch_ahead"):  # records of the L2-prefetch candidates (c1de37d; slower, perf notes)
        name += f" L2 prefetch {c['prefetch_ahead']} blocks ahead"
    if c.get("int8_group", 64) != 64:
        name += f" int8 groups of {c['int8_group']}"
    return name


def _describe_warp_specialized(c: dict) -> str:
    if c.get("pingpong"):
        return (
            f"{c['block_n']}x{c['block_k']}x{c['block_t']} ping-pong, two consumers of {c['num_warps']} "
            f"warps, {c['num_stages']} stages"
            + (", fast epilogue" if c.get("fast_epilogue") else "")
            + (", overlapped pieces" if c.get("overlap_slices") else "")
            + (
                f", {c['update_stages']} pieces of 64 x {c.get('pingpong_cols', 32)} fed by bulk copies"
                + (", updated in their slots" if c.get("update_in_slot") else "")
                if c.get("update_stages")
                else ""
            )
        )
    return (
        f"{c['block_n']}x{c['block_k']}x{c['block_t']} warp-specialized, {c['num_warps']} epilogue warps "
        f"({c.get('epilogue_rows', 32)} rows), {c['num_stages']} stages"
        + (", fast epilogue" if c.get("fast_epilogue") else "")
        + (", overlapped slices" if c.get("overlap_slices") and not c.get("update_stages") else "")
        + (f", W and states copied {c['update_stages']} slices ahead" if c.get("update_stages") else "")
    )


def _row(r: dict) -> str:
    return _cells(r, describe(r["config"]))


def _cells(r: dict, name: str) -> str:
    spills = f"{r['spill_stores']}/{r['spill_loads']}"
    cells = [name, r["registers"], r["stack_bytes"], spills, r["shared_bytes"] // 1024, r["programs_per_sm"]]
    return "| " + " | ".join(map(str, cells)) + " |"


def kernels_defined() -> bool:
    """Whether forge's Triton code is already defined in this process (a forge module imported
    triton): its kernels then stay as TRITON_INTERPRET was at that moment."""
    return any(
        name.split(".")[0] == "forge" and "triton" in getattr(module, "__dict__", {})
        for name, module in list(sys.modules.items())
    )


def compile_here() -> bool:
    """Make this process able to compile forge's kernels: set TRITON_INTERPRET=0 before they are
    first defined. False where they were already defined for the interpreter (build in a fresh
    process then: `resources`)."""
    if not kernels_defined():
        os.environ["TRITON_INTERPRET"] = "0"
        return True
    from triton.runtime.jit import JITFunction

    from forge.kernels import wgrad_update_kernel

    return isinstance(wgrad_update_kernel, JITFunction)


def known_fields() -> set[str]:
    """The config fields the build takes: KernelConfig's, the element-wise kernel's, the int8
    states' group size (`int8_group`, an option of the update rather than of the launch), and
    `fp8` (true: FP8 operands contiguous along T, as `forge.fp8` hands them over)."""
    import dataclasses

    from forge.kernels import KernelConfig

    return {f.name for f in dataclasses.fields(KernelConfig)} | set(ELEMENTWISE) | {"int8_group", "fp8"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.kernels.build",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n" + __doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    parser.add_argument("--state-dtype", default="bf16", choices=sorted(STATE_POINTER))
    parser.add_argument("--configs", help="a JSON list of KernelConfig fields (default: candidates())")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    args = parser.parse_args(argv)
    here = compile_here()  # before forge's kernels are imported, below
    configs = json.loads(args.configs) if args.configs else [*candidates(), ELEMENTWISE]
    known = known_fields()
    for config in configs:
        unknown = set(config) - known
        if unknown:
            parser.error(f"unknown KernelConfig fields {sorted(unknown)}; known: {sorted(known)}")
    if args.json and not here:
        parser.error("forge's kernels were defined for the interpreter here: they cannot be compiled")
    if not args.json:
        print(f"sm_{args.arch}, AdamW, {args.state_dtype} states, TMA operands (cuobjdump, no GPU)\n")
        print("| config | registers | stack bytes | spills (STL/LDL) | shared KiB | programs per SM |")
        print("|---|---:|---:|---:|---:|---:|")
    if not here:
        for r in resources(configs, args.arch, args.state_dtype):
            print(_row(r), flush=True)
        return 0
    for config in configs:
        r = measure(config, args.arch, args.state_dtype)
        print(json.dumps(r) if args.json else _row(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
