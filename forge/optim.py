"""ForgeOptimizer: the torch.optim.Optimizer face of FORGE.

With FORGE the update happens during `loss.backward()`: each nn.Linear weight inside its fused
weight-gradient kernel (`forge.nn`), every other parameter in a post-accumulate-grad hook that runs
the element-wise kernel and drops the gradient at once. This class owns what an optimizer owns
(param groups with their hyperparameters, per-parameter state and step counters, `state_dict`) so
that the tools built around torch.optim keep working:

* LR schedulers change `param_groups[i]["lr"]`; the next backward reads it.
* `state_dict()` / `load_state_dict()` round-trip the states bit for bit, in their storage dtype
  (torch.optim's loader would cast them to the parameter's dtype: here it does not).
* `step()` and `zero_grad()` are allowed and do nothing (the step already happened), so an
  ordinary training loop runs unchanged.

What users must know: each backward IS an optimizer step, so there is no gradient accumulation over
micro-batches and no global gradient-norm clipping; a second backward through the same graph
(`retain_graph=True`) is refused rather than applied twice.

States per parameter, named as torch.optim names them (`exp_avg`, `exp_avg_sq`, `momentum_buffer`,
`square_avg`, `grad_avg`, `sum`), are allocated when the optimizer is built, in `state_dtype`:
fp32, bf16, or int8 codes plus `<name>_absmax` scales (one per `int8_group` elements along the
last dim: 64 by default, or 128 for half the scales' memory at ~20% more quantization error,
docs/int8-states.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from forge.distributed import check_param, like_param, local, local_grad
from forge.kernels import interpreting, quant
from forge.kernels.elementwise_update import elementwise_update
from forge.kernels.wgrad_update import wgrad_update
from forge.rules import get_rule, resolve_hparams

STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": None}
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


class ForgeOptimizer(torch.optim.Optimizer):
    """Holds FORGE's param groups and states; the updates themselves run inside backward."""

    def __init__(
        self,
        params: Iterable,
        rule: str = "adamw",
        *,
        state_dtype: str = "bf16",
        stochastic_rounding: bool = True,
        seed: int = 0,
        int8_group: int = quant.GROUP,
        **hparams,
    ):
        self.rule = get_rule(rule)
        if state_dtype not in STATE_DTYPES:
            raise ValueError(
                f"state_dtype={state_dtype!r} is not supported; choose one of {list(STATE_DTYPES)}"
            )
        if int8_group not in quant.GROUPS:
            raise ValueError(
                f"int8_group={int8_group!r} is not supported; choose one of {list(quant.GROUPS)} "
                "(elements per int8 scale)"
            )
        self.state_dtype = state_dtype
        self.int8_group = int(int8_group)
        self.stochastic_rounding = bool(stochastic_rounding)
        self.seed = int(seed)
        self._version: dict[torch.Tensor, int] = {}
        self._index: dict[torch.Tensor, int] = {}
        self._group_of: dict[torch.Tensor, dict] = {}
        self._slot_cache: dict[torch.Tensor, tuple] = {}
        # Names for messages (and checkpoint keys); forge.attach fills them in before __init__.
        self.param_names: dict[torch.Tensor, str] = getattr(self, "param_names", {})
        super().__init__(params, resolve_hparams(self.rule, hparams))

    # ------------------------------------------------------------------ groups and states

    def add_param_group(self, param_group: dict) -> None:
        options = {k: v for k, v in param_group.items() if k != "params"}
        resolve_hparams(self.rule, options)  # reject unknown or unsupported options early
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.update(resolve_hparams(self.rule, {k: group[k] for k in self.rule.defaults}))
        for p in group["params"]:
            self._check_param(p)
            self._index[p] = len(self._index)
            self._group_of[p] = group
            self._version[p] = 0
            self._init_state(p, group)

    def _check_param(self, p: torch.Tensor) -> None:
        name = self.param_names.get(p, f"parameter of shape {tuple(p.shape)}")
        check_param(name, p)  # a tensor-parallel DTensor: 1-D mesh, sharded or replicated
        if p.dtype not in WEIGHT_DTYPES:
            raise TypeError(
                f"{name} has dtype {p.dtype}; FORGE updates fp32 and bf16 weights only. "
                "Convert the model (model.to(torch.bfloat16) or .float()) before forge.attach."
            )
        if not p.is_contiguous():
            raise ValueError(
                f"{name} is not contiguous; FORGE updates weights in place and needs them contiguous"
            )
        if p.device.type == "cpu" and not interpreting():
            raise RuntimeError(
                f"{name} is on the CPU but Triton's interpreter is off. Move the model to a CUDA device, "
                "or set TRITON_INTERPRET=1 before importing forge to run the kernels on the CPU (slow)."
            )
        if p.device.type not in ("cuda", "cpu"):
            raise RuntimeError(
                f"{name} is on {p.device}; FORGE's kernels run on CUDA devices (or the CPU interpreter)"
            )

    def _slots(self, group: dict):
        return self.rule.slots(group)

    def _init_state(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        state["step"] = 0
        state.update(self.rule.host_state)
        shard = local(p)  # a DTensor's states hold only this rank's shard, laid out like p
        for slot in self._slots(group):
            if slot is None:
                continue
            init = group.get("initial_accumulator_value", 0.0) if slot.name == "sum" else 0.0
            if self.state_dtype == "int8":
                values = torch.full_like(shard, init, dtype=torch.float32)
                codes, scale = quant.quantize(values, slot.signed, self.int8_group)
                state[slot.name] = like_param(p, codes)
                state[slot.name + "_absmax"] = like_param(p, scale)
            else:
                state[slot.name] = like_param(
                    p, torch.full_like(shard, init, dtype=STATE_DTYPES[self.state_dtype])
                )

    def _slot_tensors(self, p: torch.Tensor, group: dict):
        """(states, scales, signed) for the kernels, cached: the tensors are updated in place only."""
        cached = self._slot_cache.get(p)
        if cached is None:
            state = self.state[p]
            slots = self._slots(group)
            states = tuple(local(state[s.name]) if s else None for s in slots)
            scales = tuple(local(state.get(s.name + "_absmax")) if s else None for s in slots)
            signed = tuple(bool(s and s.signed) for s in slots)
            cached = self._slot_cache[p] = (states, scales, signed)
        return cached

    # ------------------------------------------------------------------ the updates (called in backward)

    def _begin_update(self, p: torch.Tensor):
        group = self._group_of[p]
        state = self.state[p]
        state["step"] += 1
        self._version[p] += 1
        coefficients = self.rule.coefficients(group, state["step"], state)
        return group, coefficients, self._seed_for(p, state["step"])

    def _seed_for(self, p: torch.Tensor, step: int) -> int:
        """A per-step, per-tensor Philox seed: fixed seed -> reproducible bits."""
        x = (self.seed * 0x9E3779B1 + self._index[p] * 0x85EBCA77 + step * 0xC2B2AE3D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
        return (x ^ (x >> 13)) & 0x7FFFFFFF

    def _kernel_options(self, group: dict) -> dict:
        return dict(
            rule=self.rule.name,
            flags=self.rule.flags(group),
            state_dtype=self.state_dtype,
            stochastic_rounding=self.stochastic_rounding,
            int8_group=self.int8_group,
        )

    def update_linear(self, weight: torch.Tensor, dy: torch.Tensor, x: torch.Tensor) -> None:
        """One step of `weight` (N, K) from the gradient dy^T x (dy: (T, N), x: (T, K)), fused.

        No torch.no_grad() here: nothing below is a torch op that autograd could record (the
        kernel writes through raw pointers), and the context manager cost each of the 225 calls of
        a Llama-3.1-8B step a few microseconds of host."""
        group, coefficients, seed = self._begin_update(weight)
        states, scales, signed = self._slot_tensors(weight, group)
        wgrad_update(
            local(weight), states, scales, signed, dy, x, coefficients, seed, **self._kernel_options(group)
        )

    @torch.no_grad()
    def update_elementwise(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        """One step of any parameter from its materialized gradient (element-wise kernel)."""
        group, coefficients, seed = self._begin_update(p)
        states, scales, signed = self._slot_tensors(p, group)
        grad = local_grad(p, grad)  # a Partial gradient (sequence parallel) is all-reduced first
        elementwise_update(
            local(p), grad, states, scales, signed, coefficients, seed, **self._kernel_options(group)
        )

    def version(self, p: torch.Tensor) -> int:
        """How many updates `p` has received from this optimizer (guards double backward)."""
        return self._version[p]

    # ------------------------------------------------------------------ torch.optim surface

    @torch.no_grad()
    def step(self, closure=None):
        """Nothing to do: FORGE applied the step during backward. Runs `closure` if given."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore states in their own dtype (torch.optim's loader would cast them to the param's)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        id_to_param = {}
        for saved, group in zip(saved_groups, self.param_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError("loaded state dict has a group of a different size than this optimizer's")
            id_to_param.update(zip(saved["params"], group["params"]))
        for pid, saved_state in state_dict["state"].items():
            p = id_to_param[pid]
            self._load_param_state(p, saved_state)
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def _load_param_state(self, p: torch.Tensor, saved: dict) -> None:
        state = self.state[p]
        name = self.param_names.get(p, f"parameter of shape {tuple(p.shape)}")
        for key, value in saved.items():
            current = state.get(key)
            if isinstance(current, torch.Tensor):
                if (
                    not isinstance(value, torch.Tensor)
                    or value.shape != current.shape
                    or value.dtype != current.dtype
                ):
                    raise ValueError(
                        f"state {key!r} of {name} was saved as {getattr(value, 'dtype', type(value))} "
                        f"{tuple(getattr(value, 'shape', ()))}, this optimizer holds {current.dtype} "
                        f"{tuple(current.shape)}: attach with the same rule, options, state_dtype and "
                        "int8_group as the run that saved it"
                    )
                current.copy_(value)
            else:
                state[key] = value
