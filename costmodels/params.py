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


def attention_params(model: ModelSpec) -> int:
    """q, k, v and output projections: h·(a·d) + 2·h·(kv·d) + (a·d)·h, plus biases."""
    h, q, kv = model.hidden_size, model.q_dim, model.kv_dim
    weights = h * q + 2 * h * kv + q * h
    if model.linear_bias:
        return weights + q + 2 * kv + h
    if model.qkv_bias:
        return weights + q + 2 * kv
    return weights


def mlp_params(model: ModelSpec, ffn_hidden: int) -> int:
    """One MLP of hidden size f: 3·h·f gated (SwiGLU) or 2·h·f plain, plus biases."""
    h, f = model.hidden_size, ffn_hidden
    matrices = 3 if model.gated_mlp else 2
    bias = ((matrices - 1) * f + h) if model.linear_bias else 0
    return matrices * h * f + bias


def router_params(model: ModelSpec) -> int:
    """MoE router h·E (no bias)."""
    assert model.moe is not None
    return model.hidden_size * model.moe.num_experts


def expert_params_per_layer(model: ModelSpec) -> int:
    """All routed experts of one MoE layer: E · mlp(f_e)."""
    assert model.moe is not None
    return model.moe.num_experts * mlp_params(model, model.moe.expert_ffn_hidden_size)


def dense_layer_params(model: ModelSpec, index: int) -> int:
    """Parameters of layer ``index`` that are replicated over data parallel (all but routed experts)."""
    base = attention_params(model) + 2 * norm_params(model)
    if not model.is_moe_layer(index):
        return base + mlp_params(model, model.ffn_hidden_size)
    moe = model.moe
    assert moe is not None
    shared = moe.num_shared_experts * mlp_params(model, moe.expert_ffn_hidden_size)
    return base + router_params(model) + shared


def layer_params(model: ModelSpec, index: int) -> int:
    """All parameters of layer ``index``."""
    experts = expert_params_per_layer(model) if model.is_moe_layer(index) else 0
    return dense_layer_params(model, index) + experts


@lru_cache(maxsize=256)
def total_params(model: ModelSpec) -> int:
    """Every parameter of the model, Ψ."""
    layers = sum(layer_params(model, i) for i in range(model.num_layers))
    return embedding_params(model) + layers + output_params(model)


@lru_cache(maxsize=256)
def active_params(model: ModelSpec) -> int:
    """Parameters one token passes through (MoE: top-k of the routed experts), Ψ_active."""
    if model.moe is None:
        return total_params(model)
    routed_per_layer = expert_params_per_layer(model)
    active_routed = model.moe.top_k * mlp_params(model, model.moe.expert_ffn_hidden_size)
    return total_params(model) - model.num_moe_layers * (routed_per_layer - active_routed)


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
