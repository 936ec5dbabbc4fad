"""The paper's own FORGE: its public implementation, measured beside this project's, never copied.

The FORGE paper (Kukreja et al., arXiv 2606.22932) ships its code as the package
`fused_grad_optimizer` (https://github.com/dk4248/FORGE, Apache-2.0; not on the package index:
`pip install git+https://github.com/dk4248/FORGE`, or, for a GPU machine without network, a wheel
built by `FORGE_REFERENCE_SRC=<clone> bash scripts/device_wheels.sh`). This method drives it as
its README says, and nothing more:

    for every nn.Linear:  FusedLinear.from_linear(linear, optimizer_type="adamw", state_mode=...)
    manager = FusedOptimizerManager(model)
    opt = torch.optim.AdamW(manager.get_non_fused_params(), lr=..., fused=True)
    each step:  manager.pre_step(lr=...); loss.backward(); opt.step(); opt.zero_grad()

so each linear layer's weight is updated inside its backward by the reference's Triton kernel
(bf16 moments, or int8 moments with an fp32 absmax per 64 elements, `state_mode`), and the
embeddings and norms by torch's fused AdamW after the backward, all their gradients alive at once.
A weight read by two modules (a tied lm_head) stays an nn.Linear, trained by that AdamW, as the
reference's README prescribes. `FusedLinear.from_linear` builds a throwaway fp32 weight before it
adopts the layer's own; it is built on the layer's device (not on the CPU, where an 8B model's
would take minutes) and freed at once.

Its kernels tune themselves: the int8 kernel (and the bf16 one on layers under 256 tiles of
128 x 128) runs `triton.autotune` over about 40 configs for every new (tokens, N, K), the Hopper
path below over 9, copying the weight and states to restore them after each trial. `prime` runs
one step before the measured ones, so that neither the tuning's time nor its copies (on
Llama-3.1-8B's lm_head with int8 moments, 128256 x 4096 x 4 bytes and the scales) are taken for
the method's; the timed steps then start at the reference's second step.

Its kernel.py has two paths for bf16 states on large layers: the default (a persistent kernel on
block pointers, fixed 128 x 128 tiles) and, behind the module switches `_use_tma` (which its
comments say its benchmark forces on) and `_use_tma_ws`, a persistent kernel on TMA loads with
warp specialization, autotuned per shape ("the only path that brings total step time below the
cuBLAS+fused-AdamW baseline on H200"; its README's H200 results name "Hopper TMA path"). The
option `hopper_tma_ws` sets both switches, so both paths are measured.

Under `method.cuda_graph` the whole step is captured as for every method (harness.run.graphs);
the torch AdamW is built `capturable=True`. The reference passes the learning rate and the bias
corrections (1 - beta^step, from a Python step count) to its kernels as Python numbers, so a
replay repeats the captured step's values: the graphed point times the same kernels, with the
bias correction of the capture's step on every replay (the record's notes say so).

Needs CUDA even to run a step (its autotuner benchmarks on the GPU). A machine without the package
records its points `unavailable` with the command that installs it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.run.methods.base import Method, check_choice, state_tensors_of
from harness.run.methods.footprint import IN_GEMM, Footprint, element_bytes

PACKAGE = "fused_grad_optimizer"
REPOSITORY = "https://github.com/dk4248/FORGE"
INSTALL = (
    f"{PACKAGE} (the paper's FORGE, {REPOSITORY}) is not installed; it is not on the package index: "
    f"pip install git+{REPOSITORY}, or on a GPU machine without network, "
    "FORGE_REFERENCE_SRC=<a clone of it> bash scripts/device_wheels.sh and copy .whl/ along"
)
STATE_MODES = ("bf16", "int8")  # its AdamW moments: bf16, or int8 with an fp32 absmax per 64
INT8_BLOCK = 64  # the reference's qblock_size (state.py), the default it is always built with
STATE_FIELDS = ("m", "v", "m_q", "v_q", "m_scale", "v_scale")  # what its per-layer state holds
PRIME_STEPS = 1  # untimed steps before the measured ones: every layer shape tuned once


def installed() -> bool:
    """Whether the paper's package can be found here (found, not imported: that is `setup`'s)."""
    return importlib.util.find_spec(PACKAGE) is not None


@dataclass
class ForgeReferenceOptions:
    """The reference's AdamW (its OptimizerConfig names beta1 and beta2; torch's names here)."""

    state_mode: str = "bf16"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01
    # its Hopper path (kernel.py's _use_tma and _use_tma_ws): the bf16 kernel on TMA loads with warp
    # specialization, autotuned per shape, the path its README names for its H200 results; False:
    # its default path
    hopper_tma_ws: bool = False

    def __post_init__(self) -> None:
        check_choice("state_mode", self.state_mode, STATE_MODES)
        if self.hopper_tma_ws and self.state_mode != "bf16":
            raise ValueError(
                "hopper_tma_ws changes only the paper's bf16 kernel (its int8 one has no such path): "
                "use it with state_mode=bf16"
            )


class ForgeReference(Method):
    name = "forge_reference"
    title = "FORGE (paper's code)"
    summary = "the paper's own FORGE (fused_grad_optimizer, github.com/dk4248/FORGE), as its README uses it"
    order = 9  # beside this project's FORGE
    Options = ForgeReferenceOptions
    requires = ("fused-grad-optimizer",)
    needs_cuda = "the paper's FORGE needs CUDA: its Triton kernels autotune on the GPU"
    refuses_chunked_head = "lm_head is the reference's FusedLinear, whose backward is its own"
    graph_capturable = True
    triton_kernels = True

    @classmethod
    def unavailable_reason(cls, device: str, options: Any = None) -> str | None:
        if not installed():  # said first, with the command that installs it
            return INSTALL
        return cls.needs_cuda if device != "cuda" else None

    @classmethod
    def footprint(cls, options, weights: float) -> Footprint:
        """The linear layers' weights and two moments, no gradient; the update reads and writes
        weights and states once, inside the dW GEMM."""
        mode = str(options.get("state_mode") or "bf16")
        states = 2 * (element_bytes("int8", INT8_BLOCK) if mode == "int8" else weights)
        return Footprint(weights, 0.0, states, 2 * weights + 2 * states, IN_GEMM)

    def setup(self) -> None:
        from fused_grad_optimizer import FusedOptimizerManager

        o = self.options
        if o.hopper_tma_ws:
            from fused_grad_optimizer import kernel

            kernel._use_tma = kernel._use_tma_ws = True  # the switches its kernel.py documents
        fused, tied = self._swap_linears()
        self.manager = FusedOptimizerManager(self.model)
        self.rest = self.manager.get_non_fused_params()
        cuda = self.device == "cuda"
        self.opt = torch.optim.AdamW(
            self.rest,
            lr=self.lr,
            betas=tuple(o.betas),
            eps=o.eps,
            weight_decay=o.weight_decay,
            fused=cuda,
            capturable=self.cuda_graph,
        )
        if cuda:
            torch.cuda.empty_cache()  # the throwaway weights from_linear built
        self.notes.append(
            f"{PACKAGE}: {fused} FusedLinear ({o.state_mode} states"
            + (", Hopper TMA + warp-specialized kernel)" if o.hopper_tma_ws else ")")
            + (f", {tied} tied linear(s) left to torch AdamW" if tied else "")
        )
        if self.cuda_graph:
            self.notes.append(
                "cuda_graph: the reference passes lr and the bias corrections to its kernels as Python "
                "numbers: every replay repeats the captured step's"
            )

    def _swap_linears(self) -> tuple[int, int]:
        """Every nn.Linear whose weight no other module reads becomes a FusedLinear; returns how many
        were swapped and how many were left (tied)."""
        from fused_grad_optimizer import FusedLinear

        uses: dict[int, int] = {}
        for _, p in self.model.named_parameters(remove_duplicate=False):
            uses[id(p)] = uses.get(id(p), 0) + 1
        swapped = tied = 0
        for module in list(self.model.modules()):
            for child_name, child in list(module.named_children()):
                if type(child) is not torch.nn.Linear:
                    continue
                if uses.get(id(child.weight), 0) > 1:
                    tied += 1
                    continue
                with torch.device(child.weight.device):
                    fused = FusedLinear.from_linear(
                        child, optimizer_type="adamw", state_mode=self.options.state_mode
                    )
                setattr(module, child_name, fused)
                swapped += 1
        return swapped, tied

    def prime(self, input_ids: torch.Tensor) -> None:
        for _ in range(PRIME_STEPS):
            self.eager_step(input_ids)
        self.notes.append(f"{PRIME_STEPS} untimed step before the measured ones (its kernels autotune there)")

    def loss(self, input_ids: torch.Tensor) -> torch.Tensor:
        o = self.options
        self.manager.pre_step(
            lr=self.lr, beta1=o.betas[0], beta2=o.betas[1], eps=o.eps, weight_decay=o.weight_decay
        )
        return super().loss(input_ids)

    def update(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def optimizer_state_tensors(self):
        yield from state_tensors_of(self.opt)
        for module in self.model.modules():
            state = getattr(module, "_state", None)  # a FusedLinear's, built at its first forward
            if type(module).__name__ == "FusedLinear" and state is not None:
                yield from (getattr(state, f) for f in STATE_FIELDS if getattr(state, f, None) is not None)

    def gradient_bytes(self) -> int:
        """The gradients torch AdamW steps after the backward (embeddings, norms, tied weights):
        all alive at once; the linear layers' never exist."""
        return sum(p.numel() * p.element_size() for p in self.rest)
