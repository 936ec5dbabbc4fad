"""What the kernel benchmarks time: the models' linear layers, and the layers they build on the GPU.

`MODELS` holds the decoder shapes of Llama-3.1-8B and Qwen3-14B; `linear_shapes` turns one into
the (out_features, in_features) of each linear layer of a block, and lm_head. `TIMED_RULES` are
the rules the benchmarks time and the hyperparameters they give each: a choice of the lab's, every
name one of `forge.RULES` (`timed_rules` checks). On a GPU, `forge_layer` builds a bf16
layer with FORGE attached, and `baseline_weight` and `capture_graphed_baseline` what the baseline
pays for the same layer: the weight-gradient GEMM into .grad, then torch's fused AdamW, eager or
replayed from a CUDA graph. The full benchmark (`bench`), the regression check's suite
(`regress_suite`) and the report's kernel table (layer counts) share them.
"""

from __future__ import annotations

import torch

import forge

LLAMA_8B = dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256, layers=32)
QWEN3_14B = dict(hidden=5120, intermediate=17408, heads=40, kv_heads=8, head_dim=128, vocab=151936, layers=40)
MODELS = {"llama3.1-8b": LLAMA_8B, "qwen3-14b": QWEN3_14B}
TIMED_RULES = {
    "adamw": dict(lr=1e-4, weight_decay=0.01),
    "lion": dict(lr=1e-5),
    "sgd": dict(lr=1e-3, momentum=0.9),
}


def timed_rules() -> tuple[str, ...]:
    """The rules the benchmarks time (`TIMED_RULES`), each checked against forge's registry."""
    unknown = sorted(set(TIMED_RULES) - set(forge.RULES))
    if unknown:
        raise ValueError(
            f"harness.kernels.layers.TIMED_RULES names {unknown}, which forge.RULES lacks; "
            f"time rules of {', '.join(forge.RULES)}"
        )
    return tuple(TIMED_RULES)


def state_count(rule: str) -> int:
    """Full-size state tensors `rule` keeps at the benchmarks' hyperparameters."""
    return forge.RULES[rule].state_count(TIMED_RULES[rule])


def linear_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(N, K) = (out_features, in_features) of each linear layer of a decoder block, and lm_head."""
    h, i = cfg["hidden"], cfg["intermediate"]
    q, kv = cfg["heads"] * cfg["head_dim"], cfg["kv_heads"] * cfg["head_dim"]
    return {
        "q": (q, h),
        "k": (kv, h),
        "v": (kv, h),
        "o": (h, q),
        "gate": (i, h),
        "up": (i, h),
        "down": (h, i),
        "lm_head": (cfg["vocab"], h),
    }


def forge_layer(N: int, K: int, rule: str, state_dtype: str):
    """A bf16 (N, K) nn.Linear on the GPU (weights ~ N(0, 0.02)) with FORGE attached: `rule` at the
    benchmarks' hyperparameters (`TIMED_RULES`), states in `state_dtype`. Returns (layer, optimizer)."""
    layer = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(layer.weight, std=0.02)
    opt = forge.attach(layer, rule, state_dtype=state_dtype, **TIMED_RULES[rule])
    return layer, opt


def baseline_weight(N: int, K: int, capturable: bool = False):
    """A bf16 (N, K) weight and the baseline's torch fused AdamW over it (bf16 states), the same
    for the eager and the graphed baseline."""
    p = torch.nn.Parameter(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02)
    return p, torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True, capturable=capturable)


def capture_graphed_baseline(dy, x, N, K) -> tuple[torch.cuda.CUDAGraph, torch.nn.Parameter]:
    """The baseline's step for one layer captured in a CUDA graph: the GEMM into a fixed .grad, then
    one capturable fused AdamW step (warmed up on a side stream first, as graph capture asks).
    Returns (graph, weight)."""
    p, opt = baseline_weight(N, K, capturable=True)
    p.grad = torch.empty_like(p)

    def step():
        torch.mm(dy.t(), x, out=p.grad)
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.keepalive = (opt, step)  # the optimizer's states and .grad live as long as the graph
    return graph, p
