"""How each parameter of a FORGE optimizer trains in every backward: fused, or from a hook.

A wiring is what an optimizer calls for every parameter it gets, at construction and from each
later `add_param_group`:

* `ModelWiring` (what `forge.attach` builds) knows the model. Every plain nn.Linear whose weight is
  trained, used once in the model and not under data parallelism, becomes a `ForgeLinear` (the same
  module object, its class swapped), so the weight is updated inside the fused dW kernel and its
  gradient never exists. Every other trained parameter (biases, embeddings, norms, a weight shared
  between modules such as tied embeddings, a replicated tensor-parallel weight, every parameter
  under data parallelism) gets a post-accumulate-grad hook that hands its gradient to the optimizer
  (`update_elementwise`) and drops it. `unwire` turns the modules back into nn.Linear and removes
  the hooks; the weights stay as trained.
* `HookWiring` (an optimizer built directly, `ForgeOptimizer(model.parameters(), ...)`) knows no
  module: every parameter is hooked, nn.Linear weights included, the same step without the fused
  kernel's memory saving.

The optimizer is seen here through `forge.interface`: the hooks call its `update_elementwise`, and
a fused layer (`forge.nn.ForgeLinear.fuse`) holds it with what torch.compile's ops read instead of
it (its handle, the weight's index and state tensors).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterable

import torch
from torch import nn

from forge.distributed import is_dtensor, linear_layout
from forge.interface import CompiledUpdater, HookUpdater
from forge.nn import ForgeLinear

ATTACHED = "_forge_optimizer"  # the attribute of a model that holds its FORGE optimizer


def make_hook(updater: HookUpdater):
    """A post-accumulate-grad hook: the parameter's step from its gradient, which it then drops."""

    def hook(p: torch.Tensor) -> None:
        if p.grad is not None:
            updater.update_elementwise(p, p.grad)
            p.grad = None

    return hook


class HookWiring:
    """Every parameter updated from its post-accumulate-grad hook (no module is known)."""

    def __init__(self) -> None:
        self.hooks: list = []

    def check_attached(self, optimizer: CompiledUpdater) -> None:
        """Nothing to check: hooked parameters train wherever they are used."""

    def wire(self, optimizer: CompiledUpdater, params: Iterable[torch.Tensor], *, fuse: bool = True) -> None:
        """Train `params` with `optimizer` from the next backward on (`fuse`: ignored, no module is known)."""
        hook = make_hook(optimizer)
        self.hooks += [p.register_post_accumulate_grad_hook(hook) for p in params]

    def unwire(self, optimizer: CompiledUpdater) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []


class ModelWiring(HookWiring):
    """`forge.attach`'s wiring: eligible nn.Linear weights of `model` fused, the rest hooked.
    `names`: every parameter's name in the model; `fp8`, `fp8_skip`: attach's FP8 options."""

    def __init__(self, model: nn.Module, names: dict, fp8: str | None = None, fp8_skip: Iterable[str] = ()):
        super().__init__()
        self.model_ref = weakref.ref(model)  # no cycle: the model holds the optimizer, which holds this
        self.names = names
        self.fp8, self.fp8_skip = fp8, tuple(fp8_skip)

    def model(self, optimizer: CompiledUpdater) -> nn.Module:
        """The model `optimizer` is attached to, or a RuntimeError saying why there is none now."""
        model = self.model_ref()
        if model is None or getattr(model, ATTACHED, None) is not optimizer:
            raise RuntimeError(
                "this FORGE optimizer is no longer attached to its model (forge.detach, or the model is "
                "gone), so parameters added to it would never be updated. Call forge.attach(model, rule, "
                "params=[...]) with every group instead."
            )
        return model

    def check_attached(self, optimizer: CompiledUpdater) -> None:
        """Before a group is added after construction: refuse it if it could not be trained."""
        self.model(optimizer)

    def wire(self, optimizer: CompiledUpdater, params: Iterable[torch.Tensor], *, fuse: bool = True) -> None:
        """Fuse the eligible nn.Linear weights among `params` (unless `fuse` is off: under data
        parallelism every gradient is reduced first) and hook the rest."""
        params = list(params)
        fused = set()
        model = self.model_ref()
        if model is not None and fuse:
            fused = self._fuse_linears(model, optimizer, set(params))
        super().wire(optimizer, [p for p in params if p not in fused])

    def _fuse_linears(self, model: nn.Module, optimizer: CompiledUpdater, trained: set) -> set:
        """Swap eligible nn.Linear modules to ForgeLinear; return the weights now fused."""
        uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
        fused = set()
        for module_name, module in model.named_modules():
            w = getattr(module, "weight", None)
            if type(module) is not nn.Linear or w is None or w not in trained or uses[id(w)] != 1:
                continue
            name = self.names.get(w, "weight")
            if linear_layout(name, w) == "hook":
                continue  # a replicated DTensor weight: its gradient may need a reduction, the hook does it
            ForgeLinear.fuse(module, optimizer, name, fp8=self._runs_in_fp8(module_name, w))
            fused.add(w)
        return fused

    def _runs_in_fp8(self, module_name: str, weight: torch.Tensor) -> bool:
        """Whether a fused linear layer's GEMMs run in FP8 (attach's fp8 and fp8_skip)."""
        from forge.fp8 import eligible

        if self.fp8 is None:
            return False
        if is_dtensor(weight):
            raise ValueError(
                f"fp8 is not supported with tensor-parallel weights ({module_name}): leave fp8=None, or "
                "train FP8 on one GPU"
            )
        skipped = any(module_name == s or module_name.endswith("." + s) for s in self.fp8_skip)
        return not skipped and eligible(weight)

    def unwire(self, optimizer: CompiledUpdater) -> None:
        """Plain nn.Linear modules again and no hooks; the weights stay as trained."""
        model = self.model_ref()
        if model is not None:
            for module in model.modules():
                if type(module) is ForgeLinear and module.forge_updater is optimizer:
                    module.unfuse()
        super().unwire(optimizer)
