"""Parameter counts (elements) of a ``ModelSpec``, by part of the model.

Counts follow the architecture exactly (every matrix, bias and norm weight), so
presets reproduce published totals, e.g. Llama 2 7B = 6,738,415,616.
"""

from __future__ import annotations

from functools import lru_cache

from .model_spec import ModelSpec


def embedding_params(model: ModelSpec) -> int:
    """Input token embedding V·h, plus the learned position table if any."""
    positions = model.max_position_embeddings * model.hidden_size if model.positions == "learned" else 0
    return model.vocab_size * model.hidden_size + positions


def output_params(model: ModelSpec) -> int:
    """Output (LM head) projection h·V, zero when tied to the input embedding; plus the final norm."""
    head = 0 if model.tied_embeddings else model.vocab_size * model.hidden_size
    return head + norm_params(model)


def norm_params(model: ModelSpec) -> int:
    """One norm: weight (RMSNorm) or weight and bias (LayerNorm)."""
    return model.hidden_size * (2 if model.norm == "layernorm" else 1)


def attention_weights(model: ModelSpec) -> int:
    """The matrices of standard attention, q, k, v and output: h·(a·d) + 2·h·(kv·d) + (a·d)·h."""
    h, q, kv = model.hidden_size, model.q_dim, model.kv_dim
    return h * q + 2 * h * kv + q * h


def attention_params(model: ModelSpec) -> int:
    """``attention_weights`` plus biases and the per-head q/k norms (2·d); MLA's own count under
    ``mla_params``."""
    if model.mla is not None:
        return mla_params(model)
    h, q, kv = model.hidden_size, model.q_dim, model.kv_dim
    weights = attention_weights(model) + (2 * model.d_head if model.qk_norm else 0)
    if model.linear_bias:
        return weights + q + 2 * kv + h
    if model.qkv_bias:
        return weights + q + 2 * kv
    return weights


def mla_params(model: ModelSpec) -> int:
    """Multi-head latent attention of one layer (DeepSeek-V2 Sec. 2.1.2-2.1.3, eq. 9-18):

    query down h·d_c' + its RMSNorm d_c' + query up d_c'·a·(d_h + d_h^R) (or h·a·(d_h + d_h^R)
    without a query latent); joint KV down h·(d_c + d_h^R) (latent and the shared rotary key) + its
    RMSNorm d_c; KV up d_c·a·(d_h + d_v); output a·d_v·h. No biases."""
    m = model.mla
    assert m is not None
    h, a = model.hidden_size, model.num_attention_heads
    q_width = a * m.qk_head_dim
    query = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * q_width if m.q_lora_rank else h * q_width
    kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
    kv_up = m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
    output = a * m.v_head_dim * h
    return query + kv_down + kv_up + output


def mlp_weights(model: ModelSpec, ffn_hidden: int) -> int:
    """The matrices of one MLP of hidden size f: 3·h·f gated (SwiGLU) or 2·h·f plain."""
    return (3 if model.gated_mlp else 2) * model.hidden_size * ffn_hidden


def mlp_params(model: ModelSpec, ffn_hidden: int) -> int:
    """One MLP of hidden size f: ``mlp_weights`` plus biases."""
    h, f = model.hidden_size, ffn_hidden
    matrices = 3 if model.gated_mlp else 2
    bias = ((matrices - 1) * f + h) if model.linear_bias else 0
    return mlp_weights(model, f) + bias


def layer_matmul_weights(model: ModelSpec, index: int) -> int:
    """Weights one token multiplies in layer ``index`` (elements), as Megatron's FLOP formula
    counts them: standard attention's q, k, v, o and the MLP; a MoE layer the ``top_k`` routed
    experts plus the shared ones. No biases, norms or router (Narayanan et al. SC'21 eq. 3)."""
    if not model.is_moe_layer(index):
        return attention_weights(model) + mlp_weights(model, model.ffn_hidden_size)
    assert model.moe is not None
    experts = model.moe.top_k + model.moe.num_shared_experts
    return attention_weights(model) + experts * mlp_weights(model, model.moe.expert_ffn_hidden_size)


def router_params(model: ModelSpec) -> int:
    """MoE router h·E, plus a bias E when every linear has one (gpt-oss)."""
    assert model.moe is not None
    bias = model.moe.num_experts if model.linear_bias else 0
    return model.hidden_size * model.moe.num_experts + bias


def expert_params_per_layer(model: ModelSpec) -> int:
    """All routed experts of one MoE layer: E · mlp(f_e)."""
    assert model.moe is not None
    return model.moe.num_experts * mlp_params(model, model.moe.expert_ffn_hidden_size)


def shared_expert_params(model: ModelSpec) -> int:
    """The shared experts of one MoE layer (DeepSeekMoE): S · mlp(f_s), plus Qwen2-MoE's gate h·1."""
    moe = model.moe
    assert moe is not None
    size = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
    gate = model.hidden_size if moe.shared_expert_gate else 0
    return moe.num_shared_experts * mlp_params(model, size) + gate


def dense_layer_params(model: ModelSpec, index: int) -> int:
    """Parameters of layer ``index`` that are replicated over data parallel (all but routed experts):
    attention, 2 norms (4 with sandwich norms), and the dense MLP or the router and shared experts."""
    base = attention_params(model) + (4 if model.sandwich_norm else 2) * norm_params(model)
    if not model.is_moe_layer(index):
        return base + mlp_params(model, model.ffn_hidden_size)
    return base + router_params(model) + shared_expert_params(model)


def layer_params(model: ModelSpec, index: int) -> int:
    """All parameters of layer ``index``."""
    experts = expert_params_per_layer(model) if model.is_moe_layer(index) else 0
    return dense_layer_params(model, index) + experts


def mtp_layer_index(model: ModelSpec) -> int:
    """The layer an MTP module's block copies: the last one (an MoE layer in DeepSeek-V3)."""
    return model.num_layers - 1


def mtp_module_params(model: ModelSpec) -> int:
    """One multi-token prediction module (DeepSeek-V3, Sec. 2.2, eq. 21-23): RMSNorms of the
    hidden state and of the next token's embedding (2h), the projection M: 2h -> h, one
    transformer block, and the final norm of the shared head (h); embedding and head are shared."""
    h = model.hidden_size
    return 3 * norm_params(model) + 2 * h * h + layer_params(model, mtp_layer_index(model))


def mtp_params(model: ModelSpec) -> int:
    """All MTP modules (held by the last pipeline stage)."""
    return model.num_mtp_layers * mtp_module_params(model)


def mtp_expert_params(model: ModelSpec) -> int:
    """Of ``mtp_params``, the routed experts of the MTP blocks' MoE layers: split over expert
    parallelism like every other layer's experts (Megatron-Core builds the MTP block from the
    same MoE layer spec, DeepSeek-V3 Sec. 2.2)."""
    moe = model.is_moe_layer(mtp_layer_index(model))
    return model.num_mtp_layers * (expert_params_per_layer(model) if moe else 0)


@lru_cache(maxsize=256)
def main_model_params(model: ModelSpec) -> int:
    """Parameters of the model without its MTP modules: the total papers report (DeepSeek-V3:
    671B; its checkpoint with the MTP module holds 685B)."""
    layers = sum(layer_params(model, i) for i in range(model.num_layers))
    return embedding_params(model) + layers + output_params(model)


@lru_cache(maxsize=256)
def total_params(model: ModelSpec) -> int:
    """Every parameter the job trains and holds, Ψ, MTP modules included."""
    return main_model_params(model) + mtp_params(model)


@lru_cache(maxsize=256)
def active_params(model: ModelSpec) -> int:
    """Parameters one token passes through in the main model (MoE: top-k of the routed experts),
    Ψ_active, as papers report it (without MTP modules; DeepSeek-V3: 37B)."""
    if model.moe is None:
        return main_model_params(model)
    routed_per_layer = expert_params_per_layer(model)
    active_routed = model.moe.top_k * mlp_params(model, model.moe.expert_ffn_hidden_size)
    return main_model_params(model) - model.num_moe_layers * (routed_per_layer - active_routed)


COLUMN_PARALLEL_TARGETS = ("q", "k", "v", "gate", "up")
"""LoRA targets whose projection tensor parallelism splits by output (the rest, o and down, by input)."""


def _lora_shapes(model: ModelSpec, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each adapted projection of one layer (no gate in a plain MLP)."""
    h, q, kv, f = model.hidden_size, model.q_dim, model.kv_dim, model.ffn_hidden_size
    shapes = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, f), "up": (h, f), "down": (f, h)}
    if not model.gated_mlp:
        shapes.pop("gate")
    return {name: shape for name, shape in shapes.items() if name in targets}


def lora_params_per_layer(model: ModelSpec, rank: int, targets: tuple[str, ...]) -> int:
    """LoRA adapters of one layer: Σ over adapted matrices of r·(d_in + d_out) (Hu et al. 2021)."""
    return sum(rank * (d_in + d_out) for d_in, d_out in _lora_shapes(model, targets).values())


def lora_params_per_layer_per_rank(model: ModelSpec, rank: int, targets: tuple[str, ...], tp: int) -> float:
    """LoRA adapter elements of one layer on one tensor-parallel rank: an adapter splits with its
    projection (Megatron column/row split), so a column-parallel one keeps A (r·d_in) whole and
    splits B (r·d_out / tp), a row-parallel one splits A (r·d_in / tp) and keeps B (r·d_out)."""
    return sum(rank * (d_in + d_out / tp) if name in COLUMN_PARALLEL_TARGETS else rank * (d_in / tp + d_out)
               for name, (d_in, d_out) in _lora_shapes(model, targets).items())
