"""ForgeTrainer: FORGE under transformers.Trainer, against the Trainer with torch's own optimizers.

The oracle is the plain Trainer on the same model, data and arguments: the same loop, scheduler and
parameter groups, with torch.optim stepping on stored gradients where FORGE steps inside backward.
"""

import copy

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import forge.muon
from forge.integrations.transformers import ForgeTrainer
from forge.nn import ForgeLinear

VOCAB = 64


def tiny_llama() -> LlamaForCausalLM:
    """One decoder layer, hidden 32, GQA: every kind of parameter FORGE fuses or hooks, fp32."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).float()


class RandomTokens(torch.utils.data.Dataset):
    """Causal-LM examples of random tokens, the same for every run (their own generator)."""

    def __init__(self, n: int = 80, seq: int = 16):
        self.ids = torch.randint(0, VOCAB, (n, seq), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def training_args(output_dir, **overrides) -> TrainingArguments:
    options = dict(
        output_dir=str(output_dir),
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        per_device_train_batch_size=4,
        max_steps=20,
        optim="adamw_torch",
        learning_rate=1e-3,
        weight_decay=0.01,
        warmup_steps=3,
        lr_scheduler_type="linear",
        max_grad_norm=0.0,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    return TrainingArguments(**{**options, **overrides})


def logged(trainer: Trainer, key: str) -> list:
    """The per-step values of `key` in the trainer's logs (not the end-of-training summary)."""
    return [entry[key] for entry in trainer.state.log_history if key in entry and "train_loss" not in entry]


def untouched(model: nn.Module) -> bool:
    """No FORGE on `model`: no swapped module, no hook, no optimizer on it."""
    return (
        not any(isinstance(m, ForgeLinear) for m in model.modules())
        and getattr(model, "_forge_optimizer", None) is None
        and not any(p._post_accumulate_grad_hooks for p in model.parameters())
    )


def test_matches_trainer_with_torch_adamw(tmp_path):
    # fp32 weights and states: FORGE's update is torch.optim's on the same gradient up to the GEMM's
    # summation order (~1e-8 on these weights after 20 steps); the global norm likewise (1e-7 relative).
    # With the Trainer's default max_grad_norm=1.0, which clips these gradients (norms above 1).
    max_grad_norm = 1.0
    model, data = tiny_llama(), RandomTokens()
    args = dict(max_grad_norm=max_grad_norm)
    reference = Trainer(
        model=copy.deepcopy(model), args=training_args(tmp_path / "torch", **args), train_dataset=data
    )
    reference.train()
    trainer = ForgeTrainer(
        model=copy.deepcopy(model),
        args=training_args(tmp_path / "forge", **args),
        train_dataset=data,
        forge_options=dict(state_dtype="fp32"),
    )
    trainer.train()

    assert len(logged(trainer, "loss")) == 20
    torch.testing.assert_close(logged(trainer, "loss"), logged(reference, "loss"), rtol=1e-5, atol=1e-6)
    assert logged(trainer, "learning_rate") == logged(reference, "learning_rate")  # warm-up, then linear
    for (name, p), q in zip(reference.model.named_parameters(), trainer.model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    # the norm before clipping, FORGE's, as the Trainer logs clip_grad_norm_'s
    assert len(logged(trainer, "grad_norm")) == 20
    norms, reference_norms = logged(trainer, "grad_norm"), logged(reference, "grad_norm")
    torch.testing.assert_close(norms, reference_norms, rtol=1e-5, atol=0)
    assert max(norms) > max_grad_norm  # clipping was active


@pytest.mark.parametrize(
    "optim, optim_args",
    [
        ("adamw_torch", None),
        ("adamw_torch_fused", None),
        ("sgd", "momentum=0.9,nesterov=True"),
        ("adagrad", "lr_decay=0.01"),
        ("rmsprop", "alpha=0.9,centered=True,momentum=0.5"),
        ("lion_32bit", None),  # the Trainer's is bitsandbytes' Lion (CPU-constructible)
    ],
)
def test_param_groups_are_the_trainers(tmp_path, optim, optim_args):
    """Every hyperparameter torch's class gets from the Trainer, FORGE gets too, group by group."""
    model = tiny_llama()
    args = training_args(
        tmp_path, optim=optim, optim_args=optim_args, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6
    )
    reference = Trainer(model=copy.deepcopy(model), args=args).create_optimizer()
    forge_optimizer = ForgeTrainer(model=copy.deepcopy(model), args=args).create_optimizer()

    assert len(forge_optimizer.param_groups) == len(reference.param_groups) == 2
    for ours, theirs in zip(forge_optimizer.param_groups, reference.param_groups, strict=True):
        assert [p.shape for p in ours["params"]] == [p.shape for p in theirs["params"]]
        shared = (set(ours) & set(theirs)) - {"params"}
        assert {"lr", "weight_decay"} <= shared
        assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}
    assert [g["weight_decay"] for g in forge_optimizer.param_groups] == [0.01, 0.0]  # norms get none


def straight_and_resumed(tmp_path, make_model, forge_options: dict) -> tuple[ForgeTrainer, ForgeTrainer]:
    """Four steps with clipping, a checkpoint every two: straight through, and resumed from the
    straight run's step-2 checkpoint into a model of other initial weights (`make_model` draws
    fresh ones each call), so the checkpoint's must be loaded."""
    data = RandomTokens()
    common = dict(max_steps=4, save_strategy="steps", save_steps=2, max_grad_norm=1.0)
    trainers = []
    for run in ("straight", "resumed"):
        trainer = ForgeTrainer(
            model=make_model(),
            args=training_args(tmp_path / run, **common),
            train_dataset=data,
            forge_options=forge_options,
        )
        trainer.train(
            resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-2") if trainers else None
        )
        trainers.append(trainer)
    return trainers[0], trainers[1]


def test_resume_from_checkpoint_is_bit_identical(tmp_path):
    # bf16 weights written with stochastic rounding and int8 states: the resumed run must restore the
    # int8 codes and scales in their own dtype and draw the same rounding seeds (they follow the step).
    straight, resumed = straight_and_resumed(
        tmp_path, lambda: tiny_llama().to(torch.bfloat16), dict(state_dtype="int8", stochastic_rounding=True)
    )

    assert resumed.state.global_step == 4
    assert logged(resumed, "loss") == logged(straight, "loss")  # steps 1-2 from the checkpoint's state
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    ours, theirs = resumed.optimizer.state_dict(), straight.optimizer.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for i, state in theirs["state"].items():
        assert state["step"] == 4
        assert state.keys() == ours["state"][i].keys()
        for key, value in state.items():
            other = ours["state"][i][key]
            assert torch.equal(other, value) if isinstance(value, torch.Tensor) else other == value, key
    # attached once: one FORGE optimizer, on the resumed model, every linear fused by it
    linears = [m for m in resumed.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is ForgeLinear for m in linears)
    assert {id(m._forge_optimizer) for m in linears} == {id(resumed._forge_optimizer)}


def test_gradient_accumulation_is_refused(tmp_path):
    model = tiny_llama()
    with pytest.raises(ValueError) as refused:
        ForgeTrainer(
            model=model,
            args=training_args(tmp_path, gradient_accumulation_steps=2),
            train_dataset=RandomTokens(),
        )
    message = str(refused.value)
    assert "gradient_accumulation_steps=2" in message
    assert "gradient_accumulation_steps=1 and per_device_train_batch_size=8" in message
    assert "activation_checkpointing=True" in message
    assert untouched(model)


def test_the_advice_instead_of_accumulation_gives_the_same_update(tmp_path):
    # The refusal's advice, checked: the Trainer's 2 x 4 accumulated (its loss normalized over both
    # micro-batches' tokens) equals FORGE on batches of 8 with activation checkpointing, to fp32 rounding.
    model, data = tiny_llama(), RandomTokens()
    accumulated = Trainer(
        model=copy.deepcopy(model),
        args=training_args(tmp_path / "torch", max_steps=3, gradient_accumulation_steps=2),
        train_dataset=data,
    )
    accumulated.train()
    trainer = ForgeTrainer(
        model=copy.deepcopy(model),
        args=training_args(
            tmp_path / "forge", max_steps=3, per_device_train_batch_size=8, activation_checkpointing=True
        ),
        train_dataset=data,
        forge_options=dict(state_dtype="fp32"),
    )
    trainer.train()

    torch.testing.assert_close(logged(trainer, "loss"), logged(accumulated, "loss"), rtol=1e-5, atol=1e-6)
    for p, q in zip(accumulated.model.parameters(), trainer.model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optim", ["adafactor", "adamw_8bit"])
def test_unsupported_optim_is_refused_before_anything_changes(tmp_path, optim):
    model = tiny_llama()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=f"no FORGE rule for optim='{optim}'.*adamw_torch.*sgd.*lion_32bit"):
        ForgeTrainer(model=model, args=training_args(tmp_path, optim=optim), train_dataset=RandomTokens())
    assert untouched(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_optim_changed_after_construction_is_refused_at_train(tmp_path):
    model = tiny_llama()
    trainer = ForgeTrainer(model=model, args=training_args(tmp_path), train_dataset=RandomTokens())
    trainer.args.optim = "adafactor"
    with pytest.raises(ValueError, match="no FORGE rule for optim='adafactor'"):
        trainer.train()
    assert untouched(model)


def test_other_optimizers_and_clashing_options_are_refused(tmp_path):
    model, args = tiny_llama(), training_args(tmp_path)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="neither `optimizers` nor `optimizer_cls_and_kwargs`"):
        ForgeTrainer(model=model, args=args, optimizers=(sgd, None))
    with pytest.raises(ValueError, match=r"\['lr'\] are set from the TrainingArguments \(lr: learning_rate"):
        ForgeTrainer(model=model, args=args, forge_options=dict(lr=1e-4))
    with pytest.raises(ValueError, match="fp16=True .* Use bf16=True"):
        ForgeTrainer(model=model, args=training_args(tmp_path, fp16=True, use_cpu=False))
    assert untouched(model)


class MuonBesideAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on the hidden matrices and torch's AdamW on the Trainer's two decay groups of
    the rest, stepped as one optimizer (the Trainer and its scheduler take one)."""

    def __init__(self, trainer: Trainer, muon: dict):
        model, args = trainer.model, trainer.args
        hidden, rest = forge.muon.hidden_matrices(model)
        decay = {
            id(p) for name, p in model.named_parameters() if name in trainer.get_decay_parameter_names(model)
        }
        self.muon = torch.optim.Muon(hidden, weight_decay=args.weight_decay, **muon)
        self.adamw = torch.optim.AdamW(
            [
                {"params": [p for p in rest if id(p) in decay], "weight_decay": args.weight_decay},
                {"params": [p for p in rest if id(p) not in decay], "weight_decay": 0.0},
            ],
            lr=args.learning_rate,
        )
        super().__init__([{**g} for g in self.muon.param_groups + self.adamw.param_groups], {})

    def step(self, closure=None):
        """Both steps at the lr the scheduler set on this optimizer's groups (accelerate's wrapper
        may replace those dicts, so they are handed over at every step, not shared)."""
        for outer, inner in zip(
            self.param_groups, self.muon.param_groups + self.adamw.param_groups, strict=True
        ):
            inner["lr"] = outer["lr"]
        self.muon.step()
        self.adamw.step()


MUON = dict(lr=0.02, momentum=0.9, ns_steps=4)


def test_muon_trains_the_hidden_matrices_as_torch_muon_beside_the_optim_rule(tmp_path):
    """forge_options["muon"]: FORGE's Muon on the hidden matrices and the `optim` rule (AdamW) on the
    Trainer's decay groups of the rest, against the plain Trainer stepping torch's Muon beside torch's
    AdamW on the same groups, with clipping and a decaying lr. Two steps land within 2e-3 of each
    other (norm-relative per parameter; the bf16 orthogonalization's flips, as in test_muon.py)."""
    model, data = tiny_llama(), RandomTokens()
    args = dict(max_steps=2, warmup_steps=0, max_grad_norm=1.0)
    reference = Trainer(
        model=copy.deepcopy(model), args=training_args(tmp_path / "torch", **args), train_dataset=data
    )
    reference.optimizer = MuonBesideAdamW(reference, MUON)
    reference.train()
    trainer = ForgeTrainer(
        model=copy.deepcopy(model),
        args=training_args(tmp_path / "forge", **args),
        train_dataset=data,
        forge_options=dict(state_dtype="fp32", muon=MUON),
    )
    trainer.train()

    groups = trainer.optimizer.param_groups
    assert [g.get("rule", "muon") for g in groups] == ["muon", "adamw", "adamw"]
    assert [len(g["params"]) for g in groups] == [len(g["params"]) for g in reference.optimizer.param_groups]
    assert [g["weight_decay"] for g in groups] == [0.01, 0.01, 0.0]
    assert (groups[0]["momentum"], groups[0]["ns_steps"], groups[0]["initial_lr"]) == (0.9, 4, 0.02)
    assert groups[1]["initial_lr"] == groups[2]["initial_lr"] == 1e-3
    assert logged(trainer, "learning_rate") == logged(reference, "learning_rate")
    norms, reference_norms = logged(trainer, "grad_norm"), logged(reference, "grad_norm")
    assert len(norms) == 2 and max(norms) > 1.0  # clipping was active
    torch.testing.assert_close(norms[0], reference_norms[0], rtol=1e-5, atol=0)  # the same weights
    torch.testing.assert_close(norms[1], reference_norms[1], rtol=1e-3, atol=0)  # after one Muon step each
    for (name, p), q in zip(reference.model.named_parameters(), trainer.model.parameters(), strict=True):
        assert float((q - p).norm() / p.norm()) < 2e-3, name


def test_a_muon_run_resumes_bit_for_bit(tmp_path):
    straight, resumed = straight_and_resumed(tmp_path, tiny_llama, dict(state_dtype="fp32", muon=MUON))

    assert logged(resumed, "loss") == logged(straight, "loss")
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert [g.get("rule", "muon") for g in resumed.optimizer.param_groups] == ["muon", "adamw", "adamw"]


@pytest.mark.parametrize(
    "muon, match",
    [
        ("muon", "a dict of Muon's hyperparameters"),
        (dict(lr=0.02, fallback="adamw"), r"\['fallback'\]: ForgeTrainer gives Muon the hidden matrices"),
        (dict(ns_steps=0), "ns_steps must be a whole number from 1 to 99"),
        (dict(betas=(0.9, 0.95)), r"unexpected hyperparameter\(s\) \['betas'\]"),
    ],
    ids=["not-a-dict", "fallback", "ns_steps", "not-muons"],
)
def test_muon_options_it_cannot_take_are_refused_before_anything_changes(tmp_path, muon, match):
    model = tiny_llama()
    with pytest.raises((ValueError, TypeError), match=match):  # TypeError: as torch.optim.Muon's own
        ForgeTrainer(model=model, args=training_args(tmp_path), forge_options=dict(muon=muon))
    assert untouched(model)


def test_several_gpus_in_one_process_are_refused(tmp_path, monkeypatch):
    """nn.DataParallel (one process driving several GPUs) is refused when the trainer is built; one
    process per device (torchrun) trains data-parallel (test_ddp_training_resumes_bit_for_bit)."""
    monkeypatch.setattr(TrainingArguments, "n_gpu", property(lambda self: 2))
    model = tiny_llama()
    with pytest.raises(RuntimeError) as refused:
        ForgeTrainer(model=model, args=training_args(tmp_path), train_dataset=RandomTokens())
    assert "2 GPUs in one process" in str(refused.value) and "torchrun" in str(refused.value)
    assert untouched(model)


def test_a_static_graph_ddp_run_is_refused_when_the_trainer_is_built(tmp_path, monkeypatch):
    """DDP(static_graph=True) cannot be taken over (`forge.data_parallel.take_over_ddp` refuses it at
    the first step): with several processes ForgeTrainer refuses ddp_static_graph when it is built."""
    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: 2))
    model = tiny_llama()
    with pytest.raises(
        ValueError, match="ddp_static_graph=True cannot work with FORGE.*ddp_static_graph=False"
    ):
        ForgeTrainer(
            model=model, args=training_args(tmp_path, ddp_static_graph=True), train_dataset=RandomTokens()
        )
    assert untouched(model)


def _ddp_trainers(rank: int, world: int, tmp) -> dict:
    """On each of 2 gloo ranks: ForgeTrainer under DDP, straight for 4 steps (saved at step 2) and
    resumed from that checkpoint, and the plain Trainer with torch AdamW under DDP as the oracle."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    common = dict(max_steps=4, save_strategy="steps", save_steps=2, max_grad_norm=1.0, ddp_backend="gloo")
    torch.manual_seed(0)
    model, data = tiny_llama(), RandomTokens()
    out = {}
    straight = ForgeTrainer(
        model=copy.deepcopy(model),
        args=training_args(tmp / "straight", **common),
        train_dataset=data,
        forge_options=dict(state_dtype="fp32"),
    )
    straight.train()
    out["straight"] = logged(straight, "loss")
    out["data_parallel"] = straight._forge_optimizer.data_parallel is not None
    resumed = ForgeTrainer(
        model=tiny_llama(),
        args=training_args(tmp / "resumed", **common),
        train_dataset=data,
        forge_options=dict(state_dtype="fp32"),
    )
    resumed.train(resume_from_checkpoint=str(tmp / "straight" / "checkpoint-2"))
    out["resumed"] = logged(resumed, "loss")
    out["same_weights"] = all(
        torch.equal(p, q)
        for p, q in zip(straight.model.parameters(), resumed.model.parameters(), strict=True)
    )
    oracle = Trainer(
        model=copy.deepcopy(model), args=training_args(tmp / "oracle", **common), train_dataset=data
    )
    oracle.train()
    out["oracle"] = logged(oracle, "loss")
    out["weights"] = {n: p.detach().clone() for n, p in straight.model.named_parameters()}
    out["oracle_weights"] = {n: p.detach().clone() for n, p in oracle.model.named_parameters()}
    out["initial"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def test_ddp_training_resumes_bit_for_bit(tmp_path):
    """Two processes, as torchrun starts them: FORGE all-reduces each gradient (the Trainer's DDP
    wrapper taken over), trains as the plain Trainer with torch AdamW under DDP does, and resumes
    from the Trainer's own checkpoint bit for bit on every rank."""
    from tests.forge.exactness import TRANSFORMER_FP32, assert_close_to_update
    from tests.forge.ranks import run_on_ranks

    runs = run_on_ranks(_ddp_trainers, 2, tmp_path)
    for rank in runs:
        assert rank["data_parallel"]
        # steps 1-2 from the checkpoint's log history, steps 3-4 trained again from its state
        assert len(rank["straight"]) == 4 and rank["resumed"] == rank["straight"]
        assert rank["same_weights"]
        assert rank["straight"] == pytest.approx(rank["oracle"], rel=1e-5)
        for name, w in rank["weights"].items():
            assert_close_to_update(
                w, rank["oracle_weights"][name], rank["initial"][name], TRANSFORMER_FP32, name
            )
    assert runs[0]["weights"].keys() == runs[1]["weights"].keys()
    for name, w in runs[0]["weights"].items():  # the replicas stay equal
        assert torch.equal(w, runs[1]["weights"][name]), name
