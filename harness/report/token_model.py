"""What a step should cost as its tokens grow, before it is measured: time over the floor, and the peak.

Both models take a decoder's architecture numbers (a record's `config.model`, `Architecture`) and
the bytes per parameter of `harness.report.expectations.footprint`; the time model takes the
ceilings of the card (`expectations.Ceilings`: its measured bf16 matmul and device copy rates, from
its conf/gpu file; 800 TFLOP/s and 4.27 TB/s on the H200).

Time over the floor. The no-optimizer step (forward and backward, gradients dropped) is the floor;
a method's step is the floor plus what its update adds. With T tokens a step, a linear layer's
weight-gradient GEMM does 2 T N K FLOPs, so the dW GEMMs of a step take `gemm_ms` = 2 T P_gemm /
peak, growing with T, while the update moves b bytes a parameter (`footprint().update_traffic`),
whatever T is (`update_ms` = b P / bandwidth).
- A separate optimizer (fused AdamW on bf16 or fp32 gradients: a footprint whose update runs
  `AFTER_BACKWARD`) runs after the backward: nothing
  overlaps it. It adds its traffic less the floor's own (the floor's GEMM writes dW too, 2 B a
  parameter): 14 B a parameter for fused AdamW, 18 on fp32 gradients.
- FORGE runs the update inside the dW GEMM of each linear layer. At best the update hides under
  the GEMM, and only what exceeds it shows: max(0, b P_fused / bandwidth - 2 T P_fused / peak),
  plus the element-wise update of the parameters outside those layers (embeddings, norms, a tied
  lm_head), which no GEMM covers. At worst nothing hides: b P / bandwidth. Both bounds are
  `Overhead`; the update can hide entirely from T* = b peak / (2 bandwidth) tokens on
  (`hiding_tokens`): ~1,100 for bf16 states (12 B), ~760 for int8 (8.1 B).
- FORGE with global-norm clipping (`max_grad_norm`) adds the norms of the layers' gradients
  (`forge.clip`): per layer the cheaper of the Gram form, 2 T^2 (N + K) FLOPs, and the direct
  one, the GEMM's 2 T N K at 1.5 times its time, every input's Gram counted once per layer (an
  upper bound: q, k and v share theirs, as gate and up do).
Traffic at the copy rate is a lower bound: an update whose epilogue is bound by instructions
(int8 states) or whose multi-tensor pass runs below the copy rate (torch's fused AdamW,
~2.7 TB/s) sits above its line.

The peak. At the peak a method holds its weights and optimizer states (`footprint`), and either
the activations at the start of the backward (with checkpointing, or the last layer's
recomputation where that holds more), or, for a method that keeps every gradient until its
update, those gradients with little else, or, late in its backward, nearly all of them beside the
first decoder layer's activations, or, for a method that keeps none, the embedding's gradient at
the backward's end:

    peak = (weights + states) P + max(T (a + l), T r, gradients P, gradients (P - E) + T a_layer)
    peak = (weights + states) P + max(T (a + l), T r, 2 V h)                  (no gradients kept)

- a, the activations a token leaves for the backward (`activation_bytes`), counted from what
  transformers' Llama and Qwen3 decoder layers keep: per layer two RMSNorms (their fp32 input and
  bf16 output, 6 h bytes each), q, k and v at the query heads' width and the attention's output
  (SDPA), o_proj's input (10 q bytes), the MLP's gate, up, SiLU and product (8 I bytes), and
  Qwen3's q and k norms (6 (q + kv)); then the final norm (6 h) and the loss: the bf16 logits and
  the fp32 log-softmax (6 V). With activation checkpointing a layer keeps only its input (2 h).
- l, the loss's backward (`loss_backward_bytes`): the logits' fp32 and bf16 gradients (6 V) on
  top of the activations at the start of the backward.
- With the loss in chunks (`model.chunked_loss`, harness.run.chunked_loss) no whole fp32 copy of
  the logits exists: the forward keeps the bf16 logits and a log-sum-exp a token (2 V + 4), the
  backward adds the logits' bf16 gradient (2 V) and one chunk's fp32 rows (a constant 64 MiB, not
  counted). The lm_head GEMM is still one call over every token, so 4 V bytes a token remain.
- With lm_head in the loss, a chunk of the vocabulary at a time (`model.chunked_head`,
  `forge.head`) no logits are whole: the forward keeps a log-sum-exp a token (4), the backward
  adds the hidden state's fp32 gradient (4 h).
- E, the embedding's parameters, whose gradient comes last (none when tied to lm_head, whose
  gradient comes first); a_layer, one decoder layer's activations a token (`layer_bytes`): kept
  by the first layer without checkpointing, recomputed for its backward with it. Where
  T a_layer > gradients E (from about 5,100 tokens on Llama-3.1-8B) and the activations at the
  start of the backward are smaller, this term sets the peak.
- r, with checkpointing only, what the last layer's recomputation holds (`recompute_bytes`):
  every layer's checkpointed input beside that layer's activations (L 2 h + a_layer). It sets the
  peak where the loss leaves little at the start of the backward (lm_head in chunks).
- 2 V h, the embedding's bf16 gradient (`embedding_gradient_bytes`): formed whole at the end of
  the backward even where no gradient is kept (FORGE updates the embedding element-wise from it;
  the floor drops it), so it bounds the peak of a method without gradients from below: 0.98 GiB
  on Llama-3.1-8B, 6.5% of the gradient FORGE removes.
- gradients: 2 B a parameter for fused AdamW, none for FORGE (its linear layers' gradients never
  exist; the others' live one at a time), none for the floor. The fp32-gradient baseline's
  `main_grad` buffers (4 B) persist through the step, so they add to the activations instead.

Muon (`harness.run.methods.muon`). A method that trains the hidden matrices (`hidden_params`) by
one rule and the rest by another has its bytes a parameter averaged over the model's split
(`footprint_at`). Its orthogonalization holds one layer's workspace at a time (`workspace_bytes`,
the largest hidden layer's): torch's Muon in its step, beside every gradient, so `gradients P`
becomes `gradients P + workspace`; FORGE's inside the backward, from the last decoder layer's on,
when the loss's and lm_head's backward have freed what they held: at most `T a_hidden + workspace`
beside the start of the backward's `T (a + l)`, where a_hidden is every decoder layer's activations
(`hidden_layers_bytes`; with checkpointing, the last layer's recomputation, r). Newton-Schulz is
matrix work of its own, 5 (4 m^2 n + 2 m^3) FLOPs an (m, n) matrix (m <= n) at 5 iterations
(`newton_schulz_flops`), whatever the tokens, the same for both; the time model does not place it
(`overhead` is None).

So FORGE's saving over fused AdamW with the same states is the gradient's 2 B a parameter less
the embedding's gradient it still forms when the activations are small, shrinks by s = max(a + l,
r) bytes for each token (by s - a_layer once the first layer's backward sets fused AdamW's peak),
and is zero from `saving_ends_tokens` = max(2 P / s, 2 (P - E) / (s - a_layer)) tokens on, where
the activations set both peaks. Activation checkpointing divides a by about 7 on Llama-3.1-8B, and
moves that point out by more. The largest step that fits (`largest_tokens`) is where the peak
meets the card's memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.points import loss_mode, options_dict
from harness.report import expectations as ex
from harness.run.methods.footprint import AFTER_BACKWARD, IN_GEMM, NONE, Footprint

GIB = ex.GIB
DIRECT_NORM_COST = 1.5  # the direct norm's time per multiply-add against the GEMM's (forge.clip.DIRECT_COST)


@dataclass(frozen=True)
class Architecture:
    """A decoder's numbers, as conf/model/ gives them."""

    family: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False

    @classmethod
    def from_config(cls, model: Any) -> Architecture | None:
        """From a record's `config.model` (None where a number is missing)."""
        if not isinstance(model, Mapping):
            return None
        try:
            hidden, heads = int(model["hidden_size"]), int(model["num_attention_heads"])
            return cls(
                family=str(model.get("family") or ""),
                hidden=hidden,
                intermediate=int(model["intermediate_size"]),
                layers=int(model["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(model["num_key_value_heads"]),
                head_dim=int(model.get("head_dim") or hidden // heads),
                vocab=int(model["vocab_size"]),
                tied=bool(model.get("tie_word_embeddings")),
            )
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    def block_shapes(self) -> list[tuple[int, int]]:
        """(N, K) of each linear layer of one decoder block."""
        h, i = self.hidden, self.intermediate
        return [(self.q, h), (self.kv, h), (self.kv, h), (h, self.q), (i, h), (i, h), (h, i)]

    def gemm_params(self) -> int:
        """Weights behind a dW GEMM in a step: every block's linear layers and lm_head."""
        return self.layers * sum(n * k for n, k in self.block_shapes()) + self.vocab * self.hidden

    def fused_params(self) -> int:
        """Weights whose update FORGE fuses into their dW GEMM: a tied lm_head is the embedding's
        weight, updated element-wise."""
        return self.gemm_params() - (self.vocab * self.hidden if self.tied else 0)

    def hidden_params(self) -> int:
        """The hidden matrices, every decoder block's linear layers: what Muon's recipe trains with
        Muon (`forge.muon.hidden_matrices`), the embedding, lm_head and norms going to AdamW."""
        return self.layers * sum(n * k for n, k in self.block_shapes())

    def params(self) -> int:
        """Every parameter, as transformers builds the decoder: the embedding, lm_head unless tied,
        the hidden matrices, each layer's two RMSNorms (Qwen3's q and k norms too) and the final one."""
        norms = 2 * self.hidden + (2 * self.head_dim if self.family == "qwen3" else 0)
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + head + self.hidden_params() + self.layers * norms + self.hidden


def architecture(record: Mapping[str, Any]) -> Architecture | None:
    config = record.get("config")
    return Architecture.from_config(config.get("model")) if isinstance(config, Mapping) else None


def footprint_at(
    method: str, options: Any, arch: Architecture, n_params: float, master_weights: Any = None
) -> Footprint | None:
    """`expectations.footprint`, averaged over the model's split where the method trains its hidden
    matrices by one rule and the rest by another (`Footprint.mixed`)."""
    fp = ex.footprint(method, options, master_weights)
    return fp.mixed(arch.hidden_params() / n_params) if fp is not None and n_params else fp


def workspace_bytes(fp: Footprint, arch: Architecture) -> float:
    """The method's transient workspace at the model's largest hidden layer (0 for most methods)."""
    return fp.workspace_bytes(arch.block_shapes())


def newton_schulz_flops(arch: Architecture, steps: int) -> float:
    """Muon's orthogonalization of every hidden matrix, `steps` iterations each: per iteration on
    an (m, n) matrix, m <= n, X X^T (2 m^2 n), its polynomial's A A (2 m^3) and B X (2 m^2 n)."""
    per_layer = sum(4.0 * min(s) ** 2 * max(s) + 2.0 * min(s) ** 3 for s in arch.block_shapes())
    return steps * arch.layers * per_layer


def newton_schulz_ms(arch: Architecture, steps: int, ceilings: ex.Ceilings) -> float:
    """`newton_schulz_flops` at the matmul rate: the same for any tokens a step, and for torch's
    Muon and FORGE's, which both run it on every hidden matrix every step."""
    return newton_schulz_flops(arch, steps) / ceilings.matmul_flops * 1e3


# ---------------------------------------------------------------------------------------------
# Time over the floor


@dataclass(frozen=True)
class Overhead:
    """What a method's update adds to the floor's step, in ms: `hidden`, where as much of it as
    can hide under the dW GEMM does; `exposed`, where none does (equal for a separate optimizer)."""

    hidden_ms: float
    exposed_ms: float


def gemm_ms(arch: Architecture, tokens: int, ceilings: ex.Ceilings) -> float:
    """The dW GEMMs of one step at the matmul rate."""
    return 2.0 * tokens * arch.gemm_params() / ceilings.matmul_flops * 1e3


def update_ms(bytes_per_param: float, n_params: float, ceilings: ex.Ceilings) -> float:
    """An update's traffic over `n_params` parameters at the copy rate."""
    return bytes_per_param * n_params / ceilings.copy_bytes_per_s * 1e3


def norms_ms(arch: Architecture, tokens: int, ceilings: ex.Ceilings) -> float:
    """The clipped step's gradient norms, each layer's the cheaper of Gram and direct."""

    def layer(n: int, k: int) -> float:
        return min(2.0 * tokens**2 * (n + k), DIRECT_NORM_COST * 2.0 * tokens * n * k)

    total = arch.layers * sum(layer(n, k) for n, k in arch.block_shapes()) + layer(arch.vocab, arch.hidden)
    return total / ceilings.matmul_flops * 1e3


def hiding_tokens(bytes_per_param: float, ceilings: ex.Ceilings) -> float:
    """Tokens a step from which an update of `bytes_per_param` fits under the dW GEMM it rides on."""
    return bytes_per_param * ceilings.matmul_flops / (2.0 * ceilings.copy_bytes_per_s)


def overhead(
    method: str, options: Any, arch: Architecture, n_params: float, tokens: int, ceilings: ex.Ceilings
) -> Overhead | None:
    """The update's cost over the floor for `method` at `tokens` a step; None where unmodelled (an
    update with matrix work of its own: Muon's Newton-Schulz, `newton_schulz_ms`)."""
    fp, floor = footprint_at(method, options, arch, n_params), ex.footprint("no_optimizer")
    if fp is None or floor is None or fp.workspace != (0.0, 0.0):
        return None
    if fp.update == NONE:
        return Overhead(0.0, 0.0)
    if fp.update == AFTER_BACKWARD:
        ms = update_ms(fp.update_traffic - floor.update_traffic, n_params, ceilings)
        return Overhead(ms, ms)
    if fp.update != IN_GEMM:
        return None
    fused = arch.fused_params()
    rest = update_ms(fp.update_traffic, max(0.0, n_params - fused), ceilings)
    gemm = 2.0 * tokens * fused / ceilings.matmul_flops * 1e3
    hidden = max(0.0, update_ms(fp.update_traffic, fused, ceilings) - gemm)
    clip = norms_ms(arch, tokens, ceilings) if options_dict(options).get("max_grad_norm") else 0.0
    return Overhead(hidden + rest + clip, update_ms(fp.update_traffic, n_params, ceilings) + clip)


# ---------------------------------------------------------------------------------------------
# The peak


def activation_bytes(arch: Architecture, checkpointing: bool, loss: str | None = None) -> float:
    """Bytes a token leaves for the backward when the forward returns (see the module's count);
    `loss`: the loss's chunks, as `harness.points.loss_mode` names them (None: transformers' loss)."""
    h = arch.hidden
    # the final norm; the bf16 logits and the fp32 log-softmax, in chunks of tokens the bf16 logits
    # and the log-sum-exp, in chunks of the vocabulary the log-sum-exp alone
    head = 6 * h + {None: 6 * arch.vocab, "chunked_loss": 2 * arch.vocab + 4, "chunked_head": 4}[loss]
    if checkpointing:
        return checkpoint_bytes(arch) + head
    return arch.layers * layer_bytes(arch) + head


def layer_bytes(arch: Architecture) -> float:
    """Bytes a token leaves in one decoder layer for its backward: what each layer keeps without
    checkpointing, and what the layer being recomputed holds with it."""
    h, q, kv = arch.hidden, arch.q, arch.kv
    layer = 12 * h + 10 * q + 8 * arch.intermediate
    if arch.family == "qwen3":
        layer += 6 * (q + kv)  # the q and k RMSNorms
    return layer


def embedding_params(arch: Architecture) -> int:
    """Parameters whose gradient a backward forms last: the input embedding's, unless tied to
    lm_head (whose gradient comes first)."""
    return 0 if arch.tied else arch.vocab * arch.hidden


def late_backward_bytes(arch: Architecture, n_params: float, grad_bytes: float, tokens: int) -> float:
    """What a method that keeps its gradients holds in the first decoder layer's backward: every
    gradient but the embedding's, beside that layer's activations."""
    return grad_bytes * (n_params - embedding_params(arch)) + tokens * layer_bytes(arch)


def checkpoint_bytes(arch: Architecture) -> float:
    """Bytes a token keeps in every layer's checkpointed input (2 h a layer)."""
    return arch.layers * 2 * arch.hidden


def recompute_bytes(arch: Architecture) -> float:
    """Bytes a token holds while checkpointing recomputes the last decoder layer for its backward:
    every layer's checkpointed input beside that layer's activations."""
    return checkpoint_bytes(arch) + layer_bytes(arch)


def hidden_layers_bytes(arch: Architecture, checkpointing: bool) -> float:
    """Bytes a token holds when the backward reaches the hidden matrices (the last decoder layer's,
    after the loss's and lm_head's backward freed what they held): every decoder layer's
    activations, or with checkpointing every checkpointed input beside the recomputed layer."""
    return recompute_bytes(arch) if checkpointing else arch.layers * layer_bytes(arch)


def embedding_gradient_bytes(arch: Architecture) -> float:
    """The embedding's bf16 gradient, formed whole at the end of the backward: what a method that
    keeps no gradients still holds there (FORGE updates the embedding element-wise from it)."""
    return 2.0 * arch.vocab * arch.hidden


def loss_backward_bytes(arch: Architecture, loss: str | None = None) -> float:
    """Bytes a token adds at the start of the backward: the logits' fp32 and bf16 gradients; in
    chunks of tokens the bf16 one alone; in chunks of the vocabulary the hidden state's fp32
    gradient, summed over the chunks (one chunk's logits at a time: a constant, not counted)."""
    return {None: 6.0 * arch.vocab, "chunked_loss": 2.0 * arch.vocab, "chunked_head": 4.0 * arch.hidden}[loss]


def _per_token(arch: Architecture, checkpointing: bool, loss: str | None) -> float:
    """What a token holds at the backward's fullest moment: a + l at its start, or, with
    checkpointing, the last layer's recomputation where that holds more (lm_head in chunks)."""
    start = activation_bytes(arch, checkpointing, loss) + loss_backward_bytes(arch, loss)
    return max(start, recompute_bytes(arch)) if checkpointing else start


def _loss(options: Any) -> str | None:
    """The loss's chunks a point's options name (`harness.points.loss_mode`), or None."""
    return loss_mode({"method_options": options})


def peak_gib(
    method: str,
    options: Any,
    arch: Architecture,
    n_params: float,
    tokens: int,
    checkpointing: bool,
    master_weights: Any = None,
) -> float | None:
    """The step's predicted peak allocated memory in GiB; None for a method without a footprint."""
    fp = footprint_at(method, options, arch, n_params, master_weights)
    if fp is None:
        return None
    static = (fp.weights + fp.states) * n_params
    activations = tokens * _per_token(arch, checkpointing, _loss(options))
    gradients = fp.grads * n_params
    workspace = workspace_bytes(fp, arch)
    if fp.grads_persist:
        return (static + gradients + activations) / GIB
    if not gradients:  # a workspace in the backward, beside the decoder layers' activations
        inside = tokens * hidden_layers_bytes(arch, checkpointing) + workspace if workspace else 0.0
        return (static + max(activations, inside, embedding_gradient_bytes(arch))) / GIB
    late = late_backward_bytes(arch, n_params, fp.grads, tokens)
    return (static + max(activations, gradients + workspace, late)) / GIB  # a workspace in the step


def saving_ends_tokens(
    arch: Architecture, n_params: float, checkpointing: bool, loss: str | None = None
) -> float:
    """Tokens from which the activations set fused AdamW's peak as they set FORGE's (bf16 weights
    and gradients, the same states): FORGE's saving is zero from here on (inf if never)."""
    per_token, layer = _per_token(arch, checkpointing, loss), layer_bytes(arch)
    if per_token <= layer:
        return float("inf")
    late = 2.0 * (n_params - embedding_params(arch)) / (per_token - layer)
    return max(2.0 * n_params / per_token, late)


def largest_tokens(
    method: str,
    options: Any,
    arch: Architecture,
    n_params: float,
    checkpointing: bool,
    capacity_gib: float,
    master_weights: Any = None,
) -> int | None:
    """The most tokens a step whose predicted peak fits in `capacity_gib`: 0 when not even the
    static memory fits, None for a method without a footprint."""
    fp = footprint_at(method, options, arch, n_params, master_weights)
    if fp is None:
        return None
    capacity = capacity_gib * GIB
    static = (fp.weights + fp.states) * n_params
    gradients = fp.grads * n_params
    workspace = workspace_bytes(fp, arch)
    if fp.grads_persist:
        static, gradients = static + gradients, 0.0
    transient = workspace if fp.grads else max(workspace, embedding_gradient_bytes(arch))  # as in peak_gib
    if static + gradients + transient > capacity:
        return 0
    largest = (capacity - static) // _per_token(arch, checkpointing, _loss(options))
    if workspace and not fp.grads:  # and a hidden layer's update, beside the decoder's activations
        largest = min(largest, (capacity - static - workspace) // hidden_layers_bytes(arch, checkpointing))
    if gradients:  # and the first layer's backward, beside nearly every gradient
        kept = late_backward_bytes(arch, n_params, fp.grads, 0)
        largest = min(largest, (capacity - static - kept) // layer_bytes(arch))
    return int(largest)
