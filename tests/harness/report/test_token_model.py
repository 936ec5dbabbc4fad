"""harness.report.token_model: the time and peak models against tokens per step, on the
architectures of conf/model/ (no GPU: the models are arithmetic)."""

from __future__ import annotations

import pytest
import yaml

from harness.report import expectations as ex
from harness.report import token_model as tm
from harness.run.config import CONF_DIR

LLAMA_PARAMS = 8_030_261_248  # Llama-3.1-8B as transformers builds it (test_config checks 8.03e9)


def _arch(model: str) -> tm.Architecture:
    numbers = yaml.safe_load((CONF_DIR / "model" / f"{model}.yaml").read_text())
    arch = tm.Architecture.from_config(numbers)
    assert arch is not None
    return arch


@pytest.fixture(scope="module")
def llama() -> tm.Architecture:
    return _arch("llama3.1-8b")


# The H200's ceilings, as a record measured on one finds them (its conf/gpu kind's file).
H200 = ex.ceilings([{"gpu": "h200", "gpu_name": "NVIDIA H200"}])


def test_the_linear_layers_and_the_rest_add_up_to_the_model(llama):
    """Block linears and lm_head, plus the embedding and the RMSNorms, are every parameter."""
    embedding, norms = llama.vocab * llama.hidden, (2 * llama.layers + 1) * llama.hidden
    assert llama.gemm_params() == 7_504_658_432 == llama.fused_params()
    assert llama.gemm_params() + embedding + norms == LLAMA_PARAMS


def test_a_tied_lm_head_is_updated_element_wise():
    qwen = _arch("qwen3-0.6b")
    assert qwen.tied and qwen.gemm_params() - qwen.fused_params() == qwen.vocab * qwen.hidden
    assert qwen.q == 16 * 128 != qwen.hidden  # head_dim as given, not hidden / heads


def test_activation_bytes_a_token(llama):
    h, i, v = 4096, 14336, 128256
    per_layer = 12 * h + 10 * h + 8 * i  # norms, attention (q = h on Llama-3.1-8B), MLP
    assert tm.activation_bytes(llama, False) == 32 * per_layer + 6 * h + 6 * v == 7_347_712
    assert tm.activation_bytes(llama, True) == 32 * 2 * h + 6 * h + 6 * v
    assert tm.loss_backward_bytes(llama) == 6 * v
    qwen = _arch("qwen3-4b")
    plain = tm.Architecture(**{**qwen.__dict__, "family": "llama"})
    assert tm.activation_bytes(qwen, False) - tm.activation_bytes(plain, False) == 36 * 6 * (qwen.q + qwen.kv)


def test_an_update_hides_from_the_tokens_where_the_gemm_outlasts_it(llama):
    assert tm.hiding_tokens(12.0, H200) == pytest.approx(12 * 800e12 / (2 * 4.27e12))  # ~1,124
    bf16 = {"state_dtype": "bf16"}
    at = tm.hiding_tokens(12.0, H200)
    below, above = (
        tm.overhead("forge", bf16, llama, LLAMA_PARAMS, int(at) - 200, H200),
        tm.overhead("forge", bf16, llama, LLAMA_PARAMS, int(at) + 1, H200),
    )
    rest = tm.update_ms(12.0, LLAMA_PARAMS - llama.fused_params(), H200)
    assert below.hidden_ms > rest and above.hidden_ms == pytest.approx(rest)
    assert above.exposed_ms == below.exposed_ms == pytest.approx(tm.update_ms(12.0, LLAMA_PARAMS, H200))


def test_a_separate_optimizer_adds_its_traffic_beyond_the_floors_at_any_tokens(llama):
    for tokens in (1024, 8192):
        fused = tm.overhead("fused_adamw", {}, llama, LLAMA_PARAMS, tokens, H200)
        assert fused.hidden_ms == fused.exposed_ms == pytest.approx(14 * LLAMA_PARAMS / 4.27e12 * 1e3)
        fp32 = tm.overhead("fused_adamw_fp32grad", {}, llama, LLAMA_PARAMS, tokens, H200)
        assert fp32.exposed_ms == pytest.approx(18 * LLAMA_PARAMS / 4.27e12 * 1e3)
    assert tm.overhead("no_optimizer", {}, llama, LLAMA_PARAMS, 1024, H200) == tm.Overhead(0.0, 0.0)
    assert (
        tm.overhead("lomo", {}, llama, LLAMA_PARAMS, 1024, H200) is None
    )  # an update the model does not time


def test_clipping_adds_the_norms_the_cheaper_way_for_each_layer(llama):
    plain = tm.overhead("forge", {"state_dtype": "bf16"}, llama, LLAMA_PARAMS, 1024, H200)
    clipped = tm.overhead(
        "forge", {"state_dtype": "bf16", "max_grad_norm": 1.0}, llama, LLAMA_PARAMS, 1024, H200
    )
    assert clipped.exposed_ms - plain.exposed_ms == pytest.approx(tm.norms_ms(llama, 1024, H200))
    # at 1,024 tokens every layer's Gram is cheaper than its dW GEMM; at 16,384 none is
    assert tm.norms_ms(llama, 1024, H200) < tm.gemm_ms(llama, 1024, H200)
    norms, gemm = tm.norms_ms(llama, 16384, H200), tm.gemm_ms(llama, 16384, H200)
    assert norms == pytest.approx(tm.DIRECT_NORM_COST * gemm)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_forges_saving_is_the_gradient_then_shrinks_then_ends(llama, checkpointing):
    n, per_token = LLAMA_PARAMS, tm.activation_bytes(llama, checkpointing) + tm.loss_backward_bytes(llama)
    bf16, embedding_gradient = {"state_dtype": "bf16"}, 2 * llama.vocab * llama.hidden
    end = tm.saving_ends_tokens(llama, n, checkpointing)
    late = lambda tokens: 2 * (n - llama.vocab * llama.hidden) + tokens * tm.layer_bytes(llama)
    for tokens in (0, 512, 8192, int(end) - 1, int(end) + 1, 4 * int(end)):
        fused = tm.peak_gib("fused_adamw", {}, llama, n, tokens, checkpointing)
        forge = tm.peak_gib("forge", bf16, llama, n, tokens, checkpointing)
        kept = max(tokens * per_token, embedding_gradient)  # FORGE still forms the embedding's
        saving = max(2 * n, late(tokens), tokens * per_token) - kept
        assert (fused - forge) * tm.GIB == pytest.approx(saving)
        assert (saving > 0) == (tokens < end)
    assert tm.peak_gib("fused_adamw", {}, llama, n, 0, checkpointing) == pytest.approx(8 * n / tm.GIB)


def test_fused_adamws_peak_late_in_the_backward_holds_the_first_layers_activations(llama):
    """With checkpointing and many tokens fused AdamW's peak is in the first decoder layer's
    backward: every gradient but the embedding's, beside that layer's recomputed activations (the
    allocator's pools at 16,384 tokens on Llama-3.1-8B: 13.7 GiB of gradients, 4.2 of activations)."""
    n, e = LLAMA_PARAMS, llama.vocab * llama.hidden
    assert tm.layer_bytes(llama) == 12 * 4096 + 10 * 4096 + 8 * 14336
    fused = tm.peak_gib("fused_adamw", {"chunked_loss": True}, llama, n, 16384, True)
    assert fused * tm.GIB == pytest.approx(6 * n + 2 * (n - e) + 16384 * tm.layer_bytes(llama))
    # below T a_layer = 2 E (about 5,100 tokens) the whole gradient at the end sets it
    below = tm.peak_gib("fused_adamw", {"chunked_loss": True}, llama, n, 4096, True)
    assert below * tm.GIB == pytest.approx(8 * n)
    tied = tm.Architecture(**{**llama.__dict__, "tied": True})
    assert tm.late_backward_bytes(tied, n, 2.0, 0) == 2 * n  # a tied embedding's gradient comes first


def test_the_chunked_loss_keeps_the_bf16_logits_and_their_gradient_alone(llama):
    """In chunks the loss keeps no fp32 copy of the logits: a token leaves 4 V + 4 bytes of the
    loss where the whole loss leaves 12 V, with the layers' part unchanged; the saving ends later."""
    v, n = llama.vocab, LLAMA_PARAMS
    for checkpointing in (False, True):
        whole = tm.activation_bytes(llama, checkpointing) + tm.loss_backward_bytes(llama)
        chunked = tm.activation_bytes(llama, checkpointing, "chunked_loss") + tm.loss_backward_bytes(
            llama, "chunked_loss"
        )
        assert whole - chunked == 12 * v - (4 * v + 4)
        late = 2 * (n - v * llama.hidden) / (chunked - tm.layer_bytes(llama))
        ends = tm.saving_ends_tokens(llama, n, checkpointing, "chunked_loss")
        assert ends == pytest.approx(max(2 * n / chunked, late))
        options = {"state_dtype": "bf16", "chunked_loss": True}
        forge = tm.peak_gib("forge", options, llama, n, 4096, checkpointing)
        assert forge == pytest.approx((2 + 4) * n / tm.GIB + 4096 * chunked / tm.GIB)


def test_with_the_head_in_chunks_the_recomputed_layer_or_the_embeddings_gradient_sets_forges_peak(llama):
    """lm_head a chunk of the vocabulary at a time leaves a token 4 + 4 h bytes of the loss, so
    with checkpointing FORGE's peak is where the last layer is recomputed beside every
    checkpointed input, or, at few tokens, the embedding's whole bf16 gradient at the end of the
    backward (the allocator's pools on Llama-3.1-8B: 0.99 GiB at 1,024 tokens, 8.1 at 16,384)."""
    n, options = LLAMA_PARAMS, {"state_dtype": "bf16", "chunked_head": True}
    recompute = llama.layers * 2 * llama.hidden + tm.layer_bytes(llama)
    assert tm.recompute_bytes(llama) == recompute
    start = tm.activation_bytes(llama, True, "chunked_head") + tm.loss_backward_bytes(llama, "chunked_head")
    assert start < recompute
    static = (2 + 4) * n / tm.GIB
    assert tm.peak_gib("forge", options, llama, n, 1024, True) - static == pytest.approx(
        tm.embedding_gradient_bytes(llama) / tm.GIB
    )
    assert tm.peak_gib("forge", options, llama, n, 16384, True) - static == pytest.approx(
        16384 * recompute / tm.GIB
    )
    # without checkpointing no layer is recomputed: the start of the backward holds every layer
    whole = tm.activation_bytes(llama, False, "chunked_head") + tm.loss_backward_bytes(llama, "chunked_head")
    forge = tm.peak_gib("forge", options, llama, n, 16384, False)
    assert forge - static == pytest.approx(16384 * whole / tm.GIB)


def test_persistent_fp32_gradients_add_to_the_activations(llama):
    n, tokens = LLAMA_PARAMS, 1024
    acts = tokens * (tm.activation_bytes(llama, False) + tm.loss_backward_bytes(llama))
    assert tm.peak_gib("fused_adamw_fp32grad", {}, llama, n, tokens, False) == pytest.approx(
        (2 + 4 + 4) * n / tm.GIB + acts / tm.GIB
    )


@pytest.mark.parametrize(
    "method, options", [("fused_adamw", {}), ("forge", {"state_dtype": "int8"}), ("fused_adamw_fp32grad", {})]
)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_largest_step_is_where_the_predicted_peak_meets_the_memory(llama, method, options, checkpointing):
    largest = tm.largest_tokens(method, options, llama, LLAMA_PARAMS, checkpointing, 139.8)
    assert tm.peak_gib(method, options, llama, LLAMA_PARAMS, largest, checkpointing) <= 139.8
    assert tm.peak_gib(method, options, llama, LLAMA_PARAMS, largest + 1, checkpointing) > 139.8
    assert (
        tm.largest_tokens(method, options, llama, LLAMA_PARAMS, checkpointing, 20.0) == 0
    )  # not even static


def test_the_ceilings_are_the_cards_from_its_conf_gpu_file():
    """conf/gpu/h200.yaml's measured rates, as whole FLOP/s and B/s; a record's own copy wins over
    the file; an emulated card's points run at the ceilings of the card under the cap; none for the
    CPU or a card without measured ceilings."""
    assert (H200.gpu, H200.matmul_flops, H200.copy_bytes_per_s) == ("H200", 800e12, 4.27e12)
    assert H200.rates == "800 TFLOP/s, 4.27 TB/s"
    kept = {"gpu": "h200", "config": {"gpu": {"name": "h200", "matmul_tflops": 700.0, "copy_tbps": None}}}
    assert (ex.ceilings([kept]).matmul_tflops, ex.ceilings([kept]).copy_tbps) == (700.0, 4.27)
    assert ex.ceilings([{"gpu": "a100_40gb", "memory_cap_gib": 40, "gpu_name": "NVIDIA H200"}]) == H200
    assert ex.ceilings([{"gpu": "cpu", "device": "cpu"}]) is None
    assert ex.ceilings([{"gpu": "h100_80gb", "gpu_name": "NVIDIA H100 80GB HBM3"}]) is None
    assert tm.Architecture.from_config({"hidden_size": 8}) is None
    assert tm.architecture({"config": None}) is None


def test_the_chunked_head_keeps_no_logits(llama):
    """lm_head in the loss a chunk of the vocabulary at a time: a log-sum-exp a token for the
    backward, then the hidden state's fp32 gradient; no V term."""
    h, n = llama.hidden, LLAMA_PARAMS
    whole = tm.activation_bytes(llama, True) + tm.loss_backward_bytes(llama)
    head = tm.activation_bytes(llama, True, "chunked_head") + tm.loss_backward_bytes(llama, "chunked_head")
    assert whole - head == 12 * llama.vocab - (4 + 4 * h)
    assert tm.saving_ends_tokens(llama, n, True, "chunked_head") > tm.saving_ends_tokens(
        llama, n, True, "chunked_loss"
    )


# ---------------------------------------------------------------------------------------------
# Muon: the recipe's split, Newton-Schulz's workspace and its matrix work


def test_the_architecture_counts_every_parameter_as_transformers_builds_it():
    """`params` is the meta-device count of every conf/model entry; the hidden matrices are the
    block linears, what forge.muon.hidden_matrices gives Muon."""
    from harness.run import architecture
    from harness.run.config import compose_config, group_choices

    for model in group_choices("model"):
        cfg = compose_config([f"model={model}"])
        assert _arch(model).params() == architecture.n_params_of(cfg.model), model
    llama = _arch("llama3.1-8b")
    assert llama.params() == LLAMA_PARAMS
    assert llama.hidden_params() == llama.gemm_params() - llama.vocab * llama.hidden == 6_979_321_856


def test_newton_schulz_is_matrix_work_whatever_the_tokens():
    """Per iteration on an (m, n) matrix, m <= n: X X^T and B X at 2 m^2 n each, A A at 2 m^3;
    a wide matrix is transposed first, so a (K, N) weight costs what an (N, K) one does."""
    one = tm.Architecture(
        "llama", hidden=64, intermediate=256, layers=1, heads=1, kv_heads=1, head_dim=64, vocab=8
    )
    shapes = [(64, 64), (64, 64), (64, 64), (64, 64), (256, 64), (256, 64), (64, 256)]
    assert one.block_shapes() == shapes
    per_iteration = 4 * (4 * 64**2 * 64 + 2 * 64**3) + 3 * (4 * 64**2 * 256 + 2 * 64**3)
    assert tm.newton_schulz_flops(one, 5) == 5 * per_iteration
    assert tm.newton_schulz_ms(one, 5, H200) == pytest.approx(5 * per_iteration / 800e12 * 1e3)
    # the time model does not place an update with matrix work of its own
    assert tm.overhead("muon", {}, one, one.params(), 1024, H200) is None


def test_torch_muons_peak_holds_every_gradient_and_one_layers_workspace(llama):
    """Weights, Muon's momentum on the hidden matrices and AdamW's two moments on the rest, all in
    bf16; at few tokens the step sets the peak: every gradient beside the largest layer's workspace
    (6 N K + 4 K^2 bytes, the MLP's 14336 x 4096); at many, the activations."""
    n, hidden = LLAMA_PARAMS, llama.hidden_params()
    static = 2 * n + 2 * hidden + 4 * (n - hidden)
    workspace = 6 * 14336 * 4096 + 4 * 4096**2
    assert tm.peak_gib("muon", {}, llama, n, 0, False) * tm.GIB == pytest.approx(static + 2 * n + workspace)
    per_token = tm.activation_bytes(llama, False) + tm.loss_backward_bytes(llama)
    assert tm.peak_gib("muon", {}, llama, n, 8192, False) * tm.GIB == pytest.approx(static + 8192 * per_token)
    largest = tm.largest_tokens("muon", {}, llama, n, False, 139.8)
    assert (
        tm.peak_gib("muon", {}, llama, n, largest, False)
        <= 139.8
        < tm.peak_gib("muon", {}, llama, n, largest + 1, False)
    )


@pytest.mark.parametrize("checkpointing", [False, True])
def test_forge_muons_workspace_lands_beside_the_decoder_layers_activations(llama, checkpointing):
    """FORGE orthogonalizes in the backward once the loss's and lm_head's backward are done: its
    workspace sits beside the decoder layers' activations (with checkpointing, the recomputed
    layer's and every checkpointed input), not beside the start of the backward's peak."""
    n, bf16 = LLAMA_PARAMS, {"state_dtype": "bf16"}
    static = 2 * n + 2 * llama.hidden_params() + 4 * (n - llama.hidden_params())
    workspace = 6 * 14336 * 4096 + 4 * 4096**2
    start = tm.activation_bytes(llama, checkpointing) + tm.loss_backward_bytes(llama)
    per_token = max(start, tm.recompute_bytes(llama)) if checkpointing else start
    inside = tm.recompute_bytes(llama) if checkpointing else llama.layers * tm.layer_bytes(llama)
    assert tm.hidden_layers_bytes(llama, checkpointing) == inside
    for tokens in (1, 1024, 8192):
        peak = tm.peak_gib("forge_muon", bf16, llama, n, tokens, checkpointing) * tm.GIB
        expected = max(tokens * per_token, tokens * inside + workspace, 2 * llama.vocab * llama.hidden)
        assert peak == pytest.approx(static + expected)
    largest = tm.largest_tokens("forge_muon", bf16, llama, n, checkpointing, 139.8)
    peak = lambda t: tm.peak_gib("forge_muon", bf16, llama, n, t, checkpointing)  # noqa: E731
    assert peak(largest) <= 139.8 < peak(largest + 1)
