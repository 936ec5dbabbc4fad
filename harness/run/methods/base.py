"""The one interface every training method implements, and the helpers they share.

A method is one `Method` subclass, and the class says everything the harness knows about it: what
it is (`name`, the `name:` of a conf/method file; `title`, how tables name it; `summary`, its line
in `python -m harness list`; `order`, where tables list it), what it needs (`requires`: pip
distributions, whose versions every record stamps; `needs_cuda`), what it can do
(`tensor_parallel`, `graph_capturable`, `refuses_chunked_head`) and what it should cost
(`footprint`: bytes per parameter, `harness.run.methods.footprint`). Defining a subclass with a
`name` registers it (`register`); `harness.run.methods` finds the harness's own by importing
this package's modules, so a new method is one module here and one conf/method file.

A method turns "a model and a batch" into "a trained step". The runner calls, in order:

    reason = Method.unavailable_reason(device, options)  # cheap, no imports: None if it can run
    m = Method(model, lr, options, device)       # options: an instance of the method's Options
    m.autocast = "bf16"                          # optional: loss() under torch.autocast
    m.cuda_graph = True                          # optional: step() replays a captured eager_step
    m.setup()                                    # build the optimizer, register hooks
    m.prime(input_ids)                           # one-time work outside what is measured
    loss = m.step(input_ids)                     # forward, backward and update; returns the loss
    m.optimizer_state_tensors()                  # for the memory breakdown
    m.gradient_bytes()                           # peak gradient bytes alive at once, by design

`gradient_bytes` is modelled from the parameters' sizes and the method's design (all gradients
at once, one parameter's at a time, none), because a gradient that lives inside a backward hook
cannot be observed from outside without perturbing the timed step. Everything else is measured.

`step` runs `eager_step` (override that, or `update`, for a method's own step). With
`cuda_graph` on, a method whose class says `graph_capturable` has its first `step` capture one
`eager_step` in a CUDA graph (`harness.run.graphs`) and every step replay it, calling `before_replay`
first: the hook where a method refreshes what the graph reads from memory (FORGE's step and seeds).

Hooks are kept on `self` on purpose: a hook handle that is garbage-collected takes its hook with
it, and the method then trains nothing while looking fast (the runner's training check catches
that: a point whose parameters did not move is an `error`).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from harness.run.methods.footprint import Footprint

if TYPE_CHECKING:
    from harness.run.graphs import CapturedStep


@dataclass
class NoOptions:
    """For methods without options."""


class Method:
    """Base class: override `setup` and `update`/`step`; declare the class attributes."""

    name: ClassVar[str] = ""  # the `name:` of a conf/method file; a class that sets one is registered
    title: ClassVar[str] = ""  # how tables and plots name it ("fused AdamW"); empty: its name
    summary: ClassVar[str] = ""  # one line: what it is (`python -m harness list implementation`)
    order: ClassVar[int] = 100  # where tables list it, smallest first: the reference, ..., FORGE
    Options: ClassVar[type] = NoOptions
    # pip distributions it needs beyond the harness (its import name: '-' read as '_'); a record
    # stamps their versions, and a point whose package is missing is `unavailable`
    requires: ClassVar[tuple[str, ...]] = ()
    needs_cuda: ClassVar[str | None] = None  # why it cannot run without CUDA, if it cannot
    # why it cannot train with lm_head in the loss a chunk at a time (`model.chunked_head`); None: it can
    refuses_chunked_head: ClassVar[str | None] = None
    trains: ClassVar[bool] = True  # False for the no-optimizer floor: skip the "did it train" check
    tensor_parallel: ClassVar[bool] = False  # runs on DTensor (TP-sharded) parameters, gpus > 1
    graph_capturable: ClassVar[bool] = False  # its eager_step can be captured in a CUDA graph
    # its update runs Triton kernels: on a CPU they run in Triton's interpreter, and its step
    # times then say nothing about speed (the sweep's summary says so)
    triton_kernels: ClassVar[bool] = False
    autocast: str | None = None  # "bf16": mixed precision (set from the config's method.autocast)
    cuda_graph: bool = False  # capture the step once, replay it (set from method.cuda_graph)
    compile: bool = False  # the model's forward through torch.compile (set from method.compile)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):  # its own name, not one inherited from the class it extends
            register(cls)

    @classmethod
    def display_title(cls) -> str:
        """How tables name the method: its `title`, else its `name`."""
        return cls.title or cls.name

    @classmethod
    def footprint(cls, options: Mapping[str, Any], weights: float) -> Footprint | None:
        """Bytes per parameter at the step's peak and moved by the update, from the options a record
        keeps (`method_options`) and the weights' bytes per parameter; None: no model of it."""
        return None

    @classmethod
    def ran_as(cls, options: Mapping[str, Any], device: str) -> str | None:
        """What a point of this method ran on `device`, named for a reader, where that is not what
        its title says (fused AdamW without CUDA: plain for-each AdamW); None: its title. `options`:
        as a record keeps them (`method_options`)."""
        return None

    @classmethod
    def torch_reference(cls, options: Any) -> tuple[str, dict[str, Any]] | None:
        """The torch.optim rule this method stands for, as (method name, options) of a registered
        method that runs it after the backward: what a fidelity measurement trains beside it in fp32
        (`harness.run.fidelity`). None: no reference (no update, or one torch.optim does not have)."""
        return None

    def __init__(self, model: torch.nn.Module, lr: float, options: Any, device: str) -> None:
        self.model = model
        self.lr = lr
        self.options = options
        self.device = device
        self.notes: list[str] = []
        self.hooks: list[Any] = []
        self.captured: CapturedStep | None = None  # the CUDA graph of the step, once captured
        self._compiled: torch.nn.Module | None = None  # with `compile`: torch.compile(model)

    @classmethod
    def unavailable_reason(cls, device: str, options: Any = None) -> str | None:
        """None when this method can run here; else why not (missing package, needs CUDA)."""
        for package in map(import_name, cls.requires):
            if importlib.util.find_spec(package) is None:
                return f"{package} is not installed (pip install 'forge-bench[baselines]')"
        if cls.needs_cuda and device != "cuda":
            return cls.needs_cuda
        return None

    @classmethod
    def graph_unavailable_reason(cls, device: str) -> str | None:
        """None when this capturable method's step can be captured in a CUDA graph here; else why
        not (`methods.unavailable_reason` answers for methods that cannot capture at all)."""
        if device != "cuda":
            return f"method.cuda_graph=true needs CUDA (device is {device!r}); set method.cuda_graph=false"
        return None

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def setup(self) -> None:
        """Build optimizers and register hooks. Called once, before the first step. An ImportError
        raised here (a package that is installed but cannot load on this machine) makes the point
        `unavailable`, with the error as the reason."""

    def prime(self, input_ids: torch.Tensor) -> None:
        """One-time work before the measured steps, outside their times and memory peaks (the
        runner calls it after `setup`, before it snapshots the weights). Default: nothing. A method
        whose kernels autotune on their first use runs its first step here, so that the autotuner's
        trial copies of weights and states are not counted as the method's memory."""

    def loss(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Causal-LM loss of the batch against itself (labels are shifted inside the model)."""
        with self.autocast_context():
            return self.forward_model()(input_ids=input_ids, labels=input_ids).loss

    def forward_model(self) -> torch.nn.Module:
        """The model to run the forward through: itself, or with `compile` its torch.compile
        wrapper (built at the first step, after `setup`, so that it traces the method's modules)."""
        if not self.compile:
            return self.model
        if self._compiled is None:
            self._compiled = torch.compile(self.model)
        return self._compiled

    def autocast_context(self) -> contextlib.AbstractContextManager:
        """torch.autocast to `self.autocast` (config `method.autocast`), or nothing. Under
        `cuda_graph` without autocast's cache of cast weights: a graph cannot capture it."""
        if self.autocast is None:
            return contextlib.nullcontext()
        dtype = AUTOCAST_DTYPES[self.autocast]
        return torch.autocast(self.device, dtype=dtype, cache_enabled=not self.cuda_graph)

    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One whole training step; returns the loss. `eager_step`, or with `cuda_graph` on, a
        replay of it captured at the first call (which runs warm-up steps first: see the note)."""
        if not self.cuda_graph:
            return self.eager_step(input_ids)
        if self.captured is None:
            from harness.run.graphs import CapturedStep

            self.captured = CapturedStep(self.eager_step, self.params(), input_ids, self.before_replay)
            self.notes.append(
                f"cuda_graph: the first step ran {self.captured.warmup} eager warm-up steps and the "
                "capture before its replay"
            )
        return self.captured.replay(input_ids)

    def eager_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One whole training step, run as Python says. Default: forward, backward, `update()`."""
        loss = self.loss(input_ids)
        loss.backward()
        self.update()
        return loss.detach()

    def before_replay(self) -> None:
        """Called before every replay of the captured step (never before eager steps): refresh
        what the graph reads from device memory. Default: nothing."""

    def update(self) -> None:
        """Apply the update after backward (methods that update in backward leave this empty)."""

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The torch optimizers whose param groups carry this method's learning rates (a convergence
        run schedules them): `self.opt` where it is one; a method with several lists them all."""
        opt = getattr(self, "opt", None)
        return [opt] if isinstance(opt, torch.optim.Optimizer) else []

    def optimizer_state_tensors(self) -> Iterable[Any]:
        """Every tensor of optimizer state, or object holding some (master weights count here)."""
        return ()

    def gradient_bytes(self) -> int:
        """Peak bytes of gradients alive at once. Default: every trainable parameter's gradient."""
        return sum(local_numel(p) * p.element_size() for p in self.params())

    def master_weights(self) -> str:
        """The precision of the weights the update is applied to (recorded as master_weights)."""
        dtypes = {p.dtype for p in self.params()}
        return "+".join(sorted(_DTYPE_NAMES.get(d, str(d)) for d in dtypes))


_REGISTERED: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Make `cls` a method the harness knows by `cls.name` (defining a named subclass does this).
    Another class under a name already taken is refused; the same class again replaces itself."""
    known = _REGISTERED.get(cls.name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise TypeError(
            f"method name {cls.name!r} is taken by {known.__module__}:{known.__qualname__}; "
            f"give {cls.__module__}:{cls.__qualname__} another name"
        )
    _REGISTERED[cls.name] = cls
    return cls


def registered() -> dict[str, type[Method]]:
    """Every method class registered so far, by name (`harness.run.methods.registry` finds them all)."""
    return dict(_REGISTERED)


def import_name(distribution: str) -> str:
    """The module a pip distribution installs, as the packages in `requires` name theirs."""
    return distribution.replace("-", "_")


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}
AUTOCAST_DTYPES = {"bf16": torch.bfloat16}


def largest_param_bytes(params: Iterable[torch.Tensor]) -> int:
    """Bytes of the largest parameter: the gradient peak of one-parameter-at-a-time methods."""
    return max((local_numel(p) * p.element_size() for p in params), default=0)


def local_numel(p: torch.Tensor) -> int:
    """Elements this process holds: a tensor-parallel DTensor's local shard, else all of them."""
    to_local = getattr(p, "to_local", None)
    return (to_local() if callable(to_local) else p).numel()


def state_tensors_of(optimizer: torch.optim.Optimizer) -> Iterator[Any]:
    """The values in a torch.optim-style optimizer's `state`: tensors (step counters included)
    and any helper objects holding tensors (FlashOptim's); `measure.nbytes` walks both."""
    for state in optimizer.state.values():
        yield from state.values()


@dataclass
class AdamWOptions:
    """AdamW's hyperparameters as torch.optim names them (the learning rate is `method.lr`)."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01

    def as_torch_rule(self) -> tuple[str, dict[str, Any]]:
        """torch.optim.AdamW with these hyperparameters, as the `torch_rule` method runs it."""
        hparams = {"betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}
        return "torch_rule", {"rule": "adamw", "hparams": hparams}


class StepOptimizerMethod(Method):
    """A method whose optimizer `self.opt` runs `step()` after backward, every gradient present."""

    opt: Any

    def update(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def optimizer_state_tensors(self):
        return state_tensors_of(self.opt)


def check_max_grad_norm(value: Any) -> None:
    """For Options.__post_init__: max_grad_norm is None (no clipping) or a positive finite number."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ValueError(
            f"max_grad_norm={value!r} is not valid: give a positive number (the largest global gradient "
            "norm allowed), or null for no clipping"
        )


def check_choice(key: str, value: Any, choices: tuple[Any, ...]) -> None:
    """For Options.__post_init__: a ValueError naming the valid choices."""
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")
