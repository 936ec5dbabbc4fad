"""How fast is the element-wise update (embeddings, norms), and which block shape moves its bytes best?

At Llama-3.1-8B batch 1 the embedding's update is FORGE's one large element-wise launch: 525M
weights whose gradient arrives whole (`forge.kernels.elementwise_update`). In a step profile the
element-wise kernel runs longer than this probe times it alone (why is an open question), and below
the fused kernel's update half in bytes per second. This probe times, on one GPU and the same
tensors, the shipped launch beside the same Triton kernel at other block shapes and warp counts, a
multi-tensor pass over the same bytes (`torch._foreach_mul_` over W and the states, plus a read of
the gradient) and torch's fused AdamW on the same parameter (what the baseline pays for it), for
bf16 and int8 states. The kernel updates in place: every timed run is one more AdamW step on random
data, which keeps the weights finite (checked at the end).

    python -m harness.kernels.elementwise          # on a CUDA GPU; JSONL to $OUT (or results/out)
    python -m harness.kernels.elementwise --tiny   # a CPU dry run (Triton's interpreter, tiny shapes)

Everything goes through forge's public API: the optimizer's own states (`opt.state`, slots named
by the rule), the shipped launcher `forge.kernels.elementwise_update`, and the kernel itself,
`forge.kernels.elementwise_update_kernel`, launched at the other block shapes.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

import forge

SHAPES = {"embedding": (128256, 4096), "norm": (1, 4096)}
TINY_SHAPES = {"embedding": (16, 512), "norm": (1, 512)}
# (block_r, block_c, num_warps): the shape a 4096-wide parameter took with 4 warps first (it ships
# with 8 warps: `forge.kernels.elementwise_num_warps`)
BLOCKS = [
    (8, 512, 4),
    (16, 512, 4),
    (8, 512, 8),
    (16, 512, 8),
    (32, 512, 8),
    (8, 1024, 8),
    (4, 1024, 4),
    (16, 256, 4),
    (32, 256, 8),
]


def _once(fn, return_mode=None) -> float:
    """A stand-in for do_bench on the dry run: one call, its wall time in ms."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _point(name: str, rows: int, cols: int, state_dtype: str, device: str, blocks: list) -> dict:
    import triton
    from triton.testing import do_bench

    bench = do_bench if device == "cuda" else _once

    from forge.kernels import (
        elementwise_update,
        elementwise_update_kernel,
        epilogue_constexprs,
        slot_arguments,
        step_arguments,
    )

    if rows > 1:
        module = torch.nn.Embedding(rows, cols, device=device, dtype=torch.bfloat16)
        torch.nn.init.normal_(module.weight, std=0.02)
    else:
        module = torch.nn.RMSNorm(cols, device=device, dtype=torch.bfloat16)
    param = module.weight
    opt = forge.attach(module, "adamw", state_dtype=state_dtype, lr=1e-4, weight_decay=0.01)
    grad = torch.randn_like(param) * 1e-3
    opt.update_elementwise(param, grad)  # the states exist (and are non-zero) from here on
    group, state = opt.param_groups[0], opt.state[param]
    slots = opt.rule.slots(group)
    states = tuple(state[s.name] if s else None for s in slots)
    scales = tuple(state.get(s.name + "_absmax") if s else None for s in slots)
    signed = tuple(bool(s and s.signed) for s in slots)
    storage = opt.state_dtype_of(param)  # int8 is for weights: a vector's states are bf16
    kw = dict(
        rule=opt.rule.device_name,
        flags=opt.rule.flags(group),
        state_dtype=storage,
        stochastic_rounding=True,
        int8_group=64,
    )
    coefficients = opt.rule.coefficients(group, 10, dict(state))
    shipped = lambda: elementwise_update(param, grad, states, scales, signed, coefficients, 12345, **kw)  # noqa: E731

    r, c = param.numel() // cols, cols
    group_size = kw["int8_group"]
    args = (
        param,
        *slot_arguments(param, states, scales),
        grad,
        r,
        c,
        -(-c // group_size),
        *step_arguments(param, coefficients, 12345, None),
    )
    constexprs = epilogue_constexprs(
        states,
        signed,
        rule=kw["rule"],
        flags=kw["flags"],
        state_dtype=storage,
        stochastic_rounding=kw["stochastic_rounding"],
        int8_group=group_size,
    )

    tensors = [t for t in (param.detach(), *states, *scales) if t is not None]
    update_bytes = grad.numel() * grad.element_size() + sum(2 * t.numel() * t.element_size() for t in tensors)
    row = dict(
        shape_name=name, rows=r, cols=c, state_dtype=state_dtype, storage=storage, update_bytes=update_bytes
    )
    row["shipped_ms"] = bench(shipped, return_mode="median")
    for block_r, block_c, warps in blocks:
        br = min(block_r, triton.next_power_of_2(r))
        if block_c > max(64, c) or f"block_{br}x{block_c}_w{warps}_ms" in row:
            continue
        grid = (-(-r // br), -(-c // block_c))
        launch = elementwise_update_kernel[grid]
        shape = dict(STEPS_IN_MEMORY=False, BLOCK_R=br, BLOCK_C=block_c, num_warps=warps)
        row[f"block_{br}x{block_c}_w{warps}_ms"] = bench(
            lambda launch=launch, shape=shape: launch(*args, **constexprs, **shape), return_mode="median"
        )
    row["foreach_same_bytes_ms"] = bench(
        lambda: (torch._foreach_mul_(tensors, 1), grad.sum()), return_mode="median"
    )
    if storage == "bf16" and device == "cuda":
        m, v = (torch.randn_like(param) * 1e-3 for _ in range(2))
        v.abs_()
        step = torch.tensor(10.0, device="cuda")
        p = param.detach()
        row["torch_fused_adamw_ms"] = bench(
            lambda: torch._fused_adamw_(
                [p],
                [grad],
                [m],
                [v],
                [],
                [step],
                lr=1e-4,
                beta1=0.9,
                beta2=0.999,
                weight_decay=0.01,
                eps=1e-8,
                amsgrad=False,
                maximize=False,
            ),
            return_mode="median",
        )
    assert torch.isfinite(param).all(), "weights became non-finite during timing"
    return row


def main(argv: list[str]) -> int:
    tiny = "--tiny" in argv
    if not torch.cuda.is_available() and not tiny:
        print("this times a GPU kernel: run it on a CUDA GPU (or --tiny for a dry run)")
        return 2
    device = "cpu" if tiny else "cuda"
    shapes, blocks = (TINY_SHAPES, BLOCKS[:3]) if tiny else (SHAPES, BLOCKS)
    from harness import results, sources
    from harness.run import env

    out_dir = Path(os.environ.get("OUT", sources.OUT))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"elementwise-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    meta = dict(
        env=env.collect(env.git_info()),
        gpu_name=torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    torch.manual_seed(0)
    for state_dtype in ("bf16", "int8"):
        for name, (rows, cols) in shapes.items():
            row = results.kernel_record(meta, _point(name, rows, cols, state_dtype, device, blocks))
            results.append(out, row)
            gb = row["update_bytes"] / 1e9
            times = {k[:-3]: v for k, v in row.items() if k.endswith("_ms")}
            rates = " ".join(f"{k} {v:.4f} ({gb / v:.2f} TB/s)" for k, v in times.items())
            print(f"{name} {state_dtype}: {rates}", flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
