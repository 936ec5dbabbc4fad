"""ForgeTrainer: the Hugging Face `Trainer` with FORGE as its optimizer.

    from forge.integrations.transformers import ForgeTrainer
    trainer = ForgeTrainer(model=model, args=TrainingArguments(...), train_dataset=ds,
                           forge_options=dict(state_dtype="bf16"))
    trainer.train()

The Trainer's loop runs as written: forward, `loss.backward()`, clipping, `optimizer.step()`,
`lr_scheduler.step()`. Under FORGE the step happens inside that backward (each nn.Linear weight in its
fused dW kernel, every other parameter in a post-accumulate-grad hook), so no weight gradient is ever
stored; `optimizer.step()` has nothing left to do, and the scheduler's next lr is read by the next
backward: the same order of lr and step as with torch.optim.

What the TrainingArguments become:
* `optim` picks the rule (`OPTIM_RULES`); `learning_rate`, `adam_beta1/2`, `adam_epsilon` and
  `optim_args` the hyperparameters torch's class would get from the Trainer; `weight_decay` applies to
  the Trainer's own decay group (biases and norms get none), as in `Trainer.create_optimizer`.
* `max_grad_norm` > 0 is FORGE's exact global-norm clipping (`forge.attach(max_grad_norm=...)`), and
  the logged `grad_norm` is FORGE's norm before clipping. With clipping off no norm is logged: no
  gradient exists after backward to take one from.
* `lr_scheduler_type`, warm-up, `save_steps`, `resume_from_checkpoint`: the Trainer's own machinery.
  `optimizer.pt` holds `ForgeOptimizer.state_dict()` (states in their own dtype), and a resumed run
  attaches FORGE once, to the loaded weights, then loads it: the run continues bit for bit.

`forge_options` go to `forge.attach` as they are (`state_dtype`, `stochastic_rounding`, `capturable`,
...); `seed`, the stochastic-rounding seed, defaults to the Trainer's `seed`.

Muon (a matrix rule, `forge.rules.Rule.whole_matrix`): `forge_options=dict(muon=dict(lr=0.02, ...))`
trains the hidden matrices (`forge.muon.hidden_matrices`: every nn.Linear weight but the output
head) with FORGE's Muon, its hyperparameters torch.optim.Muon's (its defaults where left out;
`weight_decay` the TrainingArguments' unless named there), and every other parameter with the
`optim` rule as above, in the Trainer's two decay groups. The scheduler scales every group's lr
alike, and `optimizer.pt` resumes all three groups with their rules.

Several processes (torchrun, `accelerate launch`): data-parallel FORGE (`forge.data_parallel`).
FORGE is attached over the default process group, so each gradient is all-reduced before its
update, and the DDP wrapper the Trainer puts around the model afterwards is taken over at the first
training step (its own gradient synchronization off). Every rank holds the same states, and the
Trainer's `optimizer.pt` (written by rank 0, read by every rank) resumes them as on one process.

Refused when the trainer is built, before FORGE touches the model, each with what to do instead:
`gradient_accumulation_steps` > 1 (each backward is a step: there is nothing to accumulate into),
`ddp_static_graph` with several processes (FORGE takes over the DDP wrapper's synchronization),
`fp16` (its loss scaler unscales gradients after backward, by when FORGE has applied them), the
Trainer's FSDP and DeepSpeed integrations and several GPUs in one process (nn.DataParallel), an
optimizer of one's own (`optimizers`, `optimizer_cls_and_kwargs`), and `optim` names that have no
FORGE rule.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer, TrainingArguments
from transformers.training_args import OptimizerNames

import forge
from forge.data_parallel import take_over_ddp
from forge.muon import hidden_matrices

# `optim` names whose arithmetic is one of FORGE's rules, by the name of the optimizer class the Trainer
# builds for each: the rule is the one exact against that class (`forge.rules.Rule.torch_class`). A
# name's storage format (8-bit, paged) is not FORGE's: its state precision is
# `forge_options["state_dtype"]`, so those names are refused, not silently given another format.
# `adamw_hf` is transformers' own AdamW, gone from recent versions; `lion_32bit` is bitsandbytes' Lion.
_OPTIMIZER_CLASS = {
    "adamw_torch": "AdamW",
    "adamw_torch_fused": "AdamW",
    "adamw_hf": "AdamW",
    "sgd": "SGD",
    "adagrad": "Adagrad",
    "rmsprop": "RMSprop",
    "lion_32bit": "Lion",
}


def _optim_rules() -> dict[str, str]:
    """{`optim` name: FORGE rule} for the names this transformers knows (see `_OPTIMIZER_CLASS`)."""
    rule_of_class: dict[str, str] = {}
    for rule in forge.RULES.values():
        if not rule.whole_matrix:  # Muon needs the split of its attach (fallback=): not an `optim` name
            rule_of_class.setdefault(rule.torch_class().__name__, rule.name)
    known = {o.value for o in OptimizerNames}
    return {name: rule_of_class[cls] for name, cls in _OPTIMIZER_CLASS.items() if name in known}


OPTIM_RULES = _optim_rules()

# Accelerate's distributed types ForgeTrainer trains under: one process, or one process per device
# with the Trainer's DDP wrapper (taken over by FORGE's reducer).
_DATA_PARALLEL_TYPES = {"NO", "MULTI_CPU", "MULTI_GPU"}

# Names whose optimizer class the installed Trainer builds from torch alone: their hyperparameters are
# taken from `Trainer.get_optimizer_cls_and_kwargs`, so they follow the Trainer's own mapping (optim_args
# included). The others would make it import a third-party optimizer: their kwargs are built here, as its
# handler builds them.
_TORCH_OPTIMS = {"adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop"}

# forge.attach options that TrainingArguments set: naming them in forge_options too is refused.
_FROM_TRAINING_ARGS = {
    "lr": "learning_rate",
    "betas": "adam_beta1 and adam_beta2",
    "eps": "adam_epsilon",
    "weight_decay": "weight_decay",
    "max_grad_norm": "max_grad_norm",
    "params": "the model's parameters (ForgeTrainer groups them as Trainer does)",
    "rule": "optim",
}

# The Trainer methods ForgeTrainer overrides to report FORGE's gradient norm (see `_clip_grad_norm`).
_NORM_HOOKS = ("_clip_grad_norm", "_get_grad_norm")
if not all(callable(getattr(Trainer, name, None)) for name in _NORM_HOOKS):
    raise ImportError(
        "forge.integrations.transformers needs a transformers whose Trainer clips and reports the gradient "
        f"norm through {' and '.join(_NORM_HOOKS)} (tested with transformers 5.24); upgrade transformers"
    )


def forge_rule_and_hparams(args: TrainingArguments) -> tuple[str, dict[str, Any]]:
    """The FORGE rule and hyperparameters that `args` ask for, or a ValueError saying what is supported."""
    optim = str(getattr(args.optim, "value", args.optim))
    rule = OPTIM_RULES.get(optim)
    if rule is None:
        supported = ", ".join(f"{name} ({rule})" for name, rule in OPTIM_RULES.items())
        raise ValueError(
            f"ForgeTrainer has no FORGE rule for optim={optim!r}; supported: {supported}. The state "
            "precision is set by forge_options=dict(state_dtype='fp32' | 'bf16' | 'int8'), not by the "
            "optim name."
        )
    if optim in _TORCH_OPTIMS:
        _, hparams = Trainer.get_optimizer_cls_and_kwargs(args)
    else:  # the Trainer's handlers for these import bitsandbytes: lr, betas, and eps where the rule has one
        hparams = {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2)}
        if "eps" in forge.RULES[rule].defaults:
            hparams["eps"] = args.adam_epsilon
    hparams = dict(hparams)
    if args.max_grad_norm is not None and args.max_grad_norm > 0:
        hparams["max_grad_norm"] = float(args.max_grad_norm)
    return rule, hparams


def check_training_args(args: TrainingArguments) -> None:
    """Refuse, with what to do instead, the settings under which FORGE cannot train (see the module)."""
    forge_rule_and_hparams(args)
    steps = args.gradient_accumulation_steps
    if steps > 1:
        checkpointing = "activation_checkpointing"  # gradient_checkpointing before transformers 5
        if not hasattr(args, checkpointing):
            checkpointing = "gradient_checkpointing"
        raise ValueError(
            f"gradient_accumulation_steps={steps} cannot work with FORGE: it applies the optimizer step "
            "inside every backward, so micro-batches have no gradient to accumulate. Set "
            f"gradient_accumulation_steps=1 and per_device_train_batch_size="
            f"{steps * args.per_device_train_batch_size} (x{steps}) instead, with {checkpointing}=True if "
            "that batch does not fit in memory: for a mean-reduced loss it is the same update."
        )
    if args.ddp_static_graph and args.world_size > 1:
        raise ValueError(
            "ddp_static_graph=True cannot work with FORGE: FORGE takes over the DDP wrapper's gradient "
            "synchronization at the first step, and a static-graph wrapper has its reducer built by then. "
            "Set ddp_static_graph=False (FORGE reduces each gradient itself, in the backward's order)."
        )
    if args.fp16:
        raise ValueError(
            "fp16=True trains with a loss scaler, which unscales the gradients after backward; FORGE has "
            "applied them inside backward by then, so every step would use the scaled gradient. Use "
            "bf16=True (no loss scaling) or fp32."
        )


def matrix_rule_options(forge_options: dict) -> tuple[str, dict] | tuple[None, None]:
    """(the matrix rule `forge_options` names as a key, its hyperparameters), or (None, None);
    refused, saying why, where they are not a dict of its torch class's hyperparameters."""
    from forge.rules import check_hparams, get_rule, resolve_hparams

    named = [name for name in forge_options if name in forge.RULES and forge.RULES[name].whole_matrix]
    if not named:
        return None, None
    if len(named) > 1:
        raise ValueError(f"forge_options name {named}: one matrix rule trains the hidden matrices")
    rule, options = named[0], forge_options[named[0]]
    title = get_rule(rule).title
    if not isinstance(options, dict):
        raise ValueError(f"forge_options[{rule!r}] is a dict of {title}'s hyperparameters, got {options!r}")
    taken = sorted({"params", "rule", "fallback", "fallback_options"} & set(options))
    if taken:
        raise ValueError(
            f"forge_options[{rule!r}] {taken}: ForgeTrainer gives {title} the hidden matrices and the optim "
            f"rule the rest; name only {title}'s hyperparameters ({', '.join(get_rule(rule).defaults)})"
        )
    check_hparams(rule, resolve_hparams(get_rule(rule), {"weight_decay": 0.0, **options}))
    return rule, options


class ForgeTrainer(Trainer):
    """A `transformers.Trainer` whose optimizer is FORGE, built from its TrainingArguments.

    Takes every Trainer argument, plus `forge_options`: a dict of `forge.attach` options
    (`state_dtype`, `stochastic_rounding`, `seed`, `capturable`, ...), and `muon`, Muon's
    hyperparameters for the hidden matrices (module docstring)."""

    def __init__(
        self, model=None, args=None, *trainer_args, forge_options: dict | None = None, **trainer_kwargs
    ):
        bound = inspect.signature(Trainer.__init__).bind(None, model, args, *trainer_args, **trainer_kwargs)
        own_optimizer = any(o is not None for o in bound.arguments.get("optimizers", ()))
        if own_optimizer or bound.arguments.get("optimizer_cls_and_kwargs") is not None:
            raise ValueError(
                "ForgeTrainer builds its FORGE optimizer from the TrainingArguments (optim, "
                "learning_rate, ...) and forge_options; it takes neither `optimizers` nor "
                "`optimizer_cls_and_kwargs`. For another schedule set lr_scheduler_type and "
                "lr_scheduler_kwargs, or override create_scheduler."
            )
        self.forge_options = dict(forge_options or {})
        taken = sorted(set(self.forge_options) & set(_FROM_TRAINING_ARGS))
        if taken:
            where = "; ".join(f"{key}: {_FROM_TRAINING_ARGS[key]}" for key in taken)
            raise ValueError(f"forge_options {taken} are set from the TrainingArguments ({where})")
        matrix_rule_options(self.forge_options)
        if args is not None:
            check_training_args(args)  # before the Trainer moves or wraps anything
        self._forge_optimizer = None
        super().__init__(model, args, *trainer_args, **trainer_kwargs)
        check_training_args(self.args)  # the Trainer's default arguments, where none were given
        self._refuse_unsupported_parallelism()
        self._took_over_ddp = False

    def _refuse_unsupported_parallelism(self) -> None:

        args, kind = self.args, None
        distributed = self.accelerator.distributed_type
        if self.is_deepspeed_enabled:
            kind = "DeepSpeed"
        elif self.is_fsdp_enabled or getattr(self, "is_fsdp_xla_enabled", False):
            kind = "the Trainer's FSDP integration"
        elif args.n_gpu > 1:
            kind = f"{args.n_gpu} GPUs in one process (the Trainer would wrap the model in nn.DataParallel)"
        elif distributed not in _DATA_PARALLEL_TYPES:
            kind = f"a {distributed.value} run ({args.world_size} processes)"
        if kind is not None:
            raise RuntimeError(
                f"ForgeTrainer cannot train with {kind}. It trains on one device, or data-parallel with "
                "one process per device (torchrun or accelerate launch: DDP, each gradient reduced before "
                "FORGE's update). For sharded training, shard the model with FSDP2's fully_shard and "
                "call forge.attach directly (docs/distributed.md)."
            )

    def create_optimizer(self, model=None):
        """Attach FORGE to the model (once) with the Trainer's parameter groups; return its optimizer."""
        if self.optimizer is not None:
            return self.optimizer
        check_training_args(self.args)  # again: arguments changed since construction are refused here
        rule, hparams = forge_rule_and_hparams(self.args)
        clash = sorted(set(self.forge_options) & set(hparams))
        if clash:
            raise ValueError(f"forge_options {clash} are also set by the TrainingArguments (optim_args)")
        options = {"seed": self.args.seed, **self.forge_options}
        matrix_rule, matrix_options = matrix_rule_options(options)
        options.pop(matrix_rule, None)
        if self.args.world_size > 1:  # data parallel: every gradient reduced before its update
            import torch.distributed as dist

            options["process_group"] = dist.group.WORLD
        opt_model = self.model if model is None else model
        decay = set(self.get_decay_parameter_names(opt_model))
        trained = [(name, p) for name, p in opt_model.named_parameters() if p.requires_grad]
        if matrix_rule is None:
            groups = self._decay_groups(trained, decay)
            self._forge_optimizer = forge.attach(opt_model, rule, groups, **hparams, **options)
        else:  # the hidden matrices in the matrix rule's group, the rest in the optim rule's decay groups
            hidden = {id(p) for p in hidden_matrices(opt_model)[0]}
            if not hidden:
                raise ValueError(
                    f"forge_options[{matrix_rule!r}]: the model has no trainable hidden matrix (an nn.Linear "
                    f"weight but the output head) for it; leave {matrix_rule} out"
                )
            clip = {"max_grad_norm": hparams.pop("max_grad_norm")} if "max_grad_norm" in hparams else {}
            rest = [(name, p) for name, p in trained if id(p) not in hidden]
            groups = [{"params": [p for _, p in trained if id(p) in hidden]}]
            groups += [dict(g, rule=rule, **hparams) for g in self._decay_groups(rest, decay)]
            matrix_options = {"weight_decay": self.args.weight_decay, **matrix_options}
            self._forge_optimizer = forge.attach(
                opt_model, matrix_rule, groups, **matrix_options, **clip, **options
            )
        self.optimizer = self._forge_optimizer
        return self.optimizer

    def _decay_groups(self, trained: list, decay: set) -> list[dict]:
        """The Trainer's two groups of `trained` (name, parameter) pairs: those it decays, the rest."""
        return [
            {"params": [p for name, p in trained if name in decay], "weight_decay": self.args.weight_decay},
            {"params": [p for name, p in trained if name not in decay], "weight_decay": 0.0},
        ]

    def training_step(self, model, *args, **kwargs):
        """The Trainer's step; at the first, FORGE takes over the DDP wrapper the Trainer has put
        around the model since the optimizer was built (its own gradient synchronization off)."""
        if not self._took_over_ddp and isinstance(model, DistributedDataParallel):
            take_over_ddp(model)
            self._took_over_ddp = True
        return super().training_step(model, *args, **kwargs)

    # The Trainer clips after backward (`_clip_grad_norm`, called when max_grad_norm > 0, returns the norm
    # before clipping) and logs the norm that `_get_grad_norm` returns (the clipped one's, or one it takes
    # over the parameters' .grad). Under FORGE no .grad is left by then: the clipping already happened
    # inside backward, and clip_grad_norm_ over gradient-less parameters would log 0. These two methods
    # are the Trainer's own seams for exactly this (they hold nothing else), so overriding them keeps
    # every other line of the training loop the Trainer's, and max_grad_norm keeps its meaning for
    # everything that reads it (logging, callbacks, saved arguments).
    def _clip_grad_norm(self, model):
        return self._forge_grad_norm()

    def _get_grad_norm(self, model, grad_norm=None):
        return grad_norm if grad_norm is not None else self._forge_grad_norm()

    def _forge_grad_norm(self):
        """The total norm FORGE took before clipping in the last backward; None where it does not clip."""
        return getattr(self._forge_optimizer, "last_grad_norm", None)
