"""The harness's models give SDPA no mask for their whole-sequence batches in every mode: eager, under a
CUDA-graph capture (pretended here) and under torch.compile, where transformers alone would build
the full mask; a padded batch or a sliding window still gets transformers' mask; the loss is the
same either way."""

import pytest
import torch
from transformers.masking_utils import (
    AttentionMaskInterface,
    and_masks,
    causal_mask_function,
    packed_sequence_mask_function,
    sdpa_mask,
)

from harness.run import models
from harness.run.config import compose_config


@pytest.fixture
def micro(monkeypatch):
    """micro-llama, fp32, built as a point builds it; transformers' own mask again afterwards."""
    mapping = AttentionMaskInterface._global_mapping
    monkeypatch.setitem(mapping, "sdpa", mapping["sdpa"])
    cfg = compose_config(["model=micro-llama", "device=cpu"])
    model = models.build(cfg.model, "fp32", "cpu", seed=0)
    return model, models.random_batch(cfg.model.vocab_size, 2, 16, "cpu", 0)


def test_whole_sequences_get_no_mask_and_others_get_transformers_one():
    plain = dict(batch_size=2, q_length=16, kv_length=16, mask_function=causal_mask_function, device="cpu")
    assert models.whole_sequence_sdpa_mask(**plain) is None
    # what transformers asks for when it cannot read the position ids: causal within "packed" rows
    packed = and_masks(
        causal_mask_function, packed_sequence_mask_function(torch.zeros(2, 16, dtype=torch.long))
    )
    assert (
        models.whole_sequence_sdpa_mask(**{**plain, "mask_function": packed, "allow_is_causal_skip": False})
        is None
    )
    padded = torch.ones(2, 16, dtype=torch.bool)
    padded[0, :3] = False
    mask = models.whole_sequence_sdpa_mask(**plain, attention_mask=padded)
    assert mask is not None and mask.shape == (2, 1, 16, 16) and not mask[0, 0, 5, :3].any()
    assert models.whole_sequence_sdpa_mask(**plain, local_size=4) is not None


def test_the_model_builds_no_mask_under_capture_or_compile_and_its_loss_is_unchanged(micro, monkeypatch):
    model, batch = micro
    made = []

    def recorded(**kwargs):
        out = models.whole_sequence_sdpa_mask(**kwargs)
        made.append(out)
        return out

    AttentionMaskInterface.register("sdpa", recorded)
    eager = model(input_ids=batch, labels=batch).loss
    torch._dynamo.reset()
    compiled = torch.compile(model)(input_ids=batch, labels=batch).loss
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    captured = model(input_ids=batch, labels=batch).loss
    assert made == [None, None, None]
    assert torch.equal(captured, eager)
    assert torch.allclose(compiled, eager, rtol=1e-5, atol=1e-6)

    def transformers_alone(**kwargs):  # what a compiled model would run without the harness's mask
        out = sdpa_mask(**kwargs)
        made.append(out)
        return out

    AttentionMaskInterface.register("sdpa", transformers_alone)
    torch._dynamo.reset()
    torch.compile(model)(input_ids=batch, labels=batch)
    assert made[-1] is not None and made[-1].shape == (2, 1, 16, 16)


def test_records_say_how_attention_was_masked():
    from harness.run import record

    cfg = compose_config(["model=micro-llama", "device=cpu", "method=forge_bf16"])
    assert record.for_point(cfg, "p", "cpu").attention_mask == models.ATTENTION_MASK == "is_causal"
