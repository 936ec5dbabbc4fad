"""The chunked causal-LM losses: transformers' loss and gradients to fp32 tolerance, and the lm_head
updated by every method the same. In chunks of tokens the logits still come from the lm_head module;
in chunks of the vocabulary (`model.chunked_head`) lm_head runs inside the loss (`forge.head`), FORGE
updating it chunk by chunk."""

import pytest
import torch

from forge import head as forge_head
from harness.report.names import display_name
from harness.run import chunked_loss, grid, models, runner
from harness.run.config import compose_config
from harness.run.errors import ConfigError

MICRO = ["model=micro-llama", "gpu=cpu", "device=cpu", "dtype=fp32", "seq_len=8", "batch_size=2"]


def _loss_and_grads(chunked, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    cfg = compose_config(MICRO)
    model = models.build(cfg.model, "fp32", "cpu", seed=0)
    if chunked == "head":
        forge_head.install(model, chunk_elements=16 * 48)  # 16 tokens: 7 chunks of 48 rows, the last 32
    elif chunked:
        chunked_loss.install(model, chunk_elements=3 * cfg.model.vocab_size)  # 3 tokens: 6 chunks of 16
    ids = torch.randint(0, cfg.model.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=labels if labels is not None else ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunks", [True, "head"], ids=["tokens", "vocabulary"])
@pytest.mark.parametrize("ignored", [False, True], ids=["all-tokens", "some-ignored"])
def test_loss_and_gradients_equal_transformers_to_fp32_tolerance(ignored, chunks):
    ids = torch.randint(0, 320, (2, 8), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    if ignored:
        labels[0, :3] = -100
    ref_loss, ref_grads = _loss_and_grads(False, labels)
    loss, grads = _loss_and_grads(chunks, labels)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_sum_over_num_items_matches_transformers_too():
    from transformers.loss.loss_utils import ForCausalLMLoss

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 7, generator=g, requires_grad=True)
    labels = torch.randint(0, 7, (2, 5), generator=g)
    ref = ForCausalLMLoss(logits, labels, 7, num_items_in_batch=torch.tensor(6))
    ours = chunked_loss.causal_lm_loss(
        logits, labels, 7, num_items_in_batch=torch.tensor(6), chunk_elements=14
    )
    torch.testing.assert_close(ours, ref)
    (ref_grad,) = torch.autograd.grad(ref, logits)
    (grad,) = torch.autograd.grad(ours, logits)
    torch.testing.assert_close(grad, ref_grad)


def _lm_head_after_steps(
    method: str, chunked: bool, key: str = "chunked_loss"
) -> tuple[torch.Tensor, torch.Tensor]:
    overrides = [*MICRO, f"method={method}", "method.lr=1e-3", f"model.{key}={str(chunked).lower()}"]
    cfg = compose_config(overrides)
    model, m = runner.build_method(cfg, "cpu")
    before = model.lm_head.weight.detach().clone()
    m.step(models.random_batch(cfg.model.vocab_size, 2, 8, "cpu"))
    return before, model.lm_head.weight.detach().clone()


@pytest.mark.parametrize("method", ["fused_adamw", "adamw_in_backward", "fused_adamw_fp32grad", "forge_fp32"])
def test_every_method_updates_the_lm_head_the_same_with_the_chunked_loss(method):
    before, plain = _lm_head_after_steps(method, False)
    _, chunked = _lm_head_after_steps(method, True)
    assert not torch.equal(plain, before)  # the lm_head trained
    # AdamW's first step is lr * g / (|g| + eps): where g is near zero, an fp32 ulp of difference in
    # g moves the step by a little; 1% of lr (1e-3) bounds it
    torch.testing.assert_close(chunked - before, plain - before, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize(
    "method", ["fused_adamw", "adamw_in_backward", "forge_fp32", "forge_lion_fp32", "forge_amp"]
)
def test_every_method_updates_the_lm_head_the_same_with_the_head_in_the_loss(method):
    """FORGE updates lm_head chunk by chunk (one step of the whole weight); the others get its gradient."""
    before, plain = _lm_head_after_steps(method, False)
    _, chunked = _lm_head_after_steps(method, True, key="chunked_head")
    assert not torch.equal(plain, before)
    torch.testing.assert_close(chunked - before, plain - before, rtol=1e-3, atol=1e-5)


def test_a_chunked_head_point_is_another_configuration_and_notes_its_chunks():
    cfg = compose_config(
        [*MICRO, "method=forge_bf16", "model.chunked_head=true", "steps=2", "warmup_steps=1"]
    )
    record = runner.run_point(cfg, point="p")
    assert record["status"] == "ok", record["error"]
    assert record["method_options"]["chunked_head"] is True and record["chunked_head"] is True
    assert any(
        note.startswith("model.chunked_head: lm_head and the loss in 1 chunks") for note in record["notes"]
    )
    assert "/chunked-head/" in grid.point_id(cfg)
    assert display_name(record) == "forge_bf16 (chunked head)"


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (["method=forge_bf16", "model.chunked_loss=true"], "model.chunked_loss=false"),
        (["method=forge_bf16_clip"], "max_grad_norm"),
        (["method=fused_adamw_fp32grad"], "main_grad"),
        (["method=forge_bf16_compile"], "method.compile"),
    ],
)
def test_what_the_chunked_head_does_not_run_with_is_refused_before_anything_is_built(overrides, refused):
    with pytest.raises(ConfigError, match=refused):
        compose_config([*MICRO, "model.chunked_head=true", *overrides])


def test_a_chunked_point_is_another_configuration_and_notes_its_memory():
    cfg = compose_config(
        [*MICRO, "method=no_optimizer", "model.chunked_loss=true", "steps=2", "warmup_steps=1"]
    )
    record = runner.run_point(cfg, point="p")
    assert record["status"] == "ok", record["error"]
    assert record["chunked_loss"] is True and record["method_options"]["chunked_loss"] is True
    assert any(note.startswith("model.chunked_loss: cross-entropy in chunks of") for note in record["notes"])


@pytest.mark.gpu
@pytest.mark.parametrize("key", ["chunked_loss", "chunked_head"])
@pytest.mark.parametrize("method", ["forge_bf16_graph", "forge_bf16_stream"])
def test_forge_on_the_gpu_trains_the_same_with_the_loss_in_chunks(method, key):
    """GPU: FORGE with the loss in chunks of tokens, or with lm_head in it in chunks of the
    vocabulary (the fused kernel on row blocks of lm_head, captured, or on the update stream),
    follows the step with transformers' loss (graphed against graphed: a graphed point's warm-up
    and capture take optimizer steps an eager point does not, so its losses run ahead of an eager
    point's)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    records = []
    for chunked in ("false", "true"):
        overrides = ["model=tiny-llama", "device=cuda", "seq_len=64", "steps=8", "warmup_steps=4"]
        cfg = compose_config([*overrides, f"method={method}", f"model.{key}={chunked}", "method.lr=1e-3"])
        records.append(runner.run_point(cfg, point=f"{method}/{key}={chunked}"))
    plain, chunked = records
    assert plain["status"] == chunked["status"] == "ok", (plain["error"], chunked["error"])
    assert chunked["losses"][-1] < chunked["losses"][0]
    assert chunked["losses"] == pytest.approx(plain["losses"], rel=2e-2)
