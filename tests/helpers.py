"""What the tests share: the rule cases, models, training loops against the torch.optim oracle
(`forge.torch_optimizer`, the harness's "torch" baselines too), distances."""

import copy

import torch
from torch import nn

import forge

# One case per rule and per option that changes its arithmetic (hyperparameters as torch.optim names them).
RULE_CASES = {
    "adamw": dict(lr=1e-2, weight_decay=0.1),
    "adamw-betas": dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05),
    "nadam": dict(lr=1e-2, weight_decay=0.1),
    "nadam-decoupled": dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    "radam": dict(lr=1e-2, weight_decay=0.1),
    "radam-decoupled-rectified": dict(
        lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, betas=(0.9, 0.5)
    ),
    "lion": dict(lr=1e-3, weight_decay=0.1),
    "rmsprop": dict(lr=1e-3, weight_decay=0.1),
    "rmsprop-centered-momentum": dict(lr=1e-3, weight_decay=0.1, centered=True, momentum=0.9),
    "rmsprop-momentum": dict(lr=1e-3, momentum=0.5),
    "adagrad": dict(lr=1e-2, weight_decay=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
    "sgd": dict(lr=1e-2, weight_decay=0.1),
    "sgd-momentum-dampening": dict(lr=1e-2, weight_decay=0.1, momentum=0.9, dampening=0.1),
    "sgd-nesterov": dict(lr=1e-2, weight_decay=0.1, momentum=0.9, nesterov=True),
}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp64 (Frobenius norms).

    Norm-wise rather than element-wise: normalizing rules (RMSprop, Adam) divide by the gradient's
    own magnitude, so an element whose gradient nearly cancels over the tokens amplifies the 1e-7
    summation-order difference of the GEMM; the norm measures the step as a whole.
    """
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def mlp() -> nn.Module:
    """Two Linear layers (fused) around a LayerNorm (element-wise), odd sizes."""
    return nn.Sequential(nn.Linear(24, 40), nn.LayerNorm(40), nn.GELU(), nn.Linear(40, 5))


def regression_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n (input, target) batches for `mlp`."""
    return [(torch.randn(6, 24), torch.randn(6, 5)) for _ in range(n)]


def regression_step(model: nn.Module, batch) -> torch.Tensor:
    """Forward and backward of the squared error: under FORGE, one optimizer step."""
    x, y = batch
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    return loss


def train_pair(model: nn.Module, rule: str, steps: int, make_batch, loss_fn, forge_kwargs=None, **hparams):
    """Train a copy of `model` with FORGE and a copy with the torch.optim reference, same batches.

    Also returns, per parameter of the reference, where its gradient was within rounding of zero at
    some step (`tests.forge.exactness.near_zero`)."""
    from tests.forge.exactness import near_zero

    a, b = copy.deepcopy(model), copy.deepcopy(model)
    opt_forge = forge.attach(a, rule, **(forge_kwargs or {}), **hparams)
    opt_torch = forge.torch_optimizer(rule, b.parameters(), **hparams)
    ambiguous = {p: torch.zeros_like(p, dtype=torch.bool) for p in b.parameters()}
    for _ in range(steps):
        batch = make_batch()
        loss_fn(a, batch).backward()
        opt_forge.step()
        opt_torch.zero_grad()
        loss_fn(b, batch).backward()
        for p in b.parameters():
            if p.grad is not None:
                ambiguous[p] |= near_zero(p.grad)
        opt_torch.step()
    return a, b, opt_forge, opt_torch, ambiguous


# Small but real: GQA (4 heads, 2 kv heads), SDPA attention, random init. One decoder layer holds
# every kind of parameter and of gradient path (the attention's and the MLP's dx through fused
# linears into a norm, the embeddings below them).
_TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    attn_implementation="sdpa",
)


def tiny_llama(vocab: int = 96, tie: bool = False, **config):
    """The tiny Llama; `config` overrides its LlamaConfig (num_hidden_layers=2, hidden_size=32...)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    options = {**_TINY, **config}
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, tie_word_embeddings=tie, **options)).float()


def tiny_qwen3(vocab: int = 96, tie: bool = True):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(
        Qwen3Config(vocab_size=vocab, tie_word_embeddings=tie, head_dim=16, **_TINY)
    ).float()


def lm_batch(vocab: int = 96, batch: int = 2, seq: int = 16):
    ids = torch.randint(0, vocab, (batch, seq))
    return {"input_ids": ids, "labels": ids}


def lm_loss(model, batch):
    return model(**batch).loss


def convergence_record(
    sweep: str, label: str, method: str, master: str, seed: int, day: str, **fields
) -> dict:
    """A finished convergence record of `label` at `seed` (the fields every fidelity table reads),
    made on `day`, with the curve `fields` of the table under test."""
    return dict(
        sweep=sweep,
        model="llama-100m",
        method=method,
        method_label=label,
        master_weights=master,
        status="ok",
        config=dict(seed=seed),
        time=f"{day}T00:00:0{seed}",
        method_options=dict(label=label),
        **fields,
    )


def damage_checkpoint(path, item: str, where: str, files: str = "") -> None:
    """Flip four bytes of a DCP checkpoint's data, keeping the file's size: inside `item` ("largest"
    or "last" of the records whose file name starts with `files`, e.g. "__1_" for rank 1's) at
    `where` ("middle" or "header")."""
    from pathlib import Path

    from torch.distributed.checkpoint import FileSystemReader

    path = Path(path)
    records = sorted(
        (i for i in FileSystemReader(str(path)).read_metadata().storage_data.values()
         if i.relative_path.startswith(files)),
        key=lambda i: i.offset,
    )  # fmt: skip
    record = max(records, key=lambda i: i.length) if item == "largest" else records[-1]
    at = record.offset + (record.length // 2 if where == "middle" else 0)
    data = path / record.relative_path
    raw = bytearray(data.read_bytes())
    raw[at : at + 4] = bytes(b ^ 0xFF for b in raw[at : at + 4])
    data.write_bytes(bytes(raw))


def without_checksums(path) -> None:
    """A checkpoint's manifest as one written before checksums were kept has it."""
    import json
    from pathlib import Path

    import forge.checkpoint as ckpt

    manifest_path = Path(path) / ckpt.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest.pop("files", None)
    manifest_path.write_text(json.dumps(manifest))
