"""Readers of the Llama-derived ``config.json`` families: one function per family, each naming
the fields it reads (as released on the Hugging Face Hub), all building on ``_llama_base``.

MoE layer placement: Qwen marks layer i sparse when (i + 1) % ``decoder_sparse_step`` == 0 and i is
not in ``mlp_only_layers``; DeepSeek when i >= ``first_k_dense_replace`` and
i % ``moe_layer_freq`` == 0. Sliding windows: ``layer_types`` when given ("sliding_attention" /
"full_attention"), else the family's rule (Gemma 2: every 2nd layer global; Gemma 3: every
``sliding_window_pattern``-th; Mistral, Phi-3: every layer local; Qwen only with
``use_sliding_window``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from .hf_fields import Fields
from .model_spec import MLASpec, ModelSpec, MoESpec


def _llama_base(f: Fields, name: str, **extra: object) -> ModelSpec:
    heads = f.int("num_attention_heads")
    values: dict[str, object] = dict(
        name=name, num_layers=f.int("num_hidden_layers"), hidden_size=f.int("hidden_size"),
        ffn_hidden_size=f.int("intermediate_size"), num_attention_heads=heads,
        num_kv_heads=f.int("num_key_value_heads", heads), vocab_size=f.int("vocab_size"),
        head_dim=f.optional_int("head_dim"), gated_mlp=True, activation="silu", norm="rmsnorm",
        positions="rotary", max_position_embeddings=f.int("max_position_embeddings", 4096),
        rope_theta=f.positive_number("rope_theta", 10000.0),
        tied_embeddings=f.bool("tie_word_embeddings", False), qkv_bias=f.bool("attention_bias", False))
    values.update(extra)
    return ModelSpec(**values)  # type: ignore[arg-type]


def _window(f: Fields, default_period: int, *, enabled: bool = True) -> dict[str, int]:
    """``sliding_window`` and ``global_layer_period`` from ``layer_types`` or the family's rule."""
    window = f.optional_int("sliding_window") if enabled else 0
    types = f.raw.get("layer_types")
    if not window:
        return {}
    if types is None:
        return {"sliding_window": window, "global_layer_period": default_period}
    if not isinstance(types, list) or not all(t in ("sliding_attention", "full_attention") for t in types):
        raise f.fail("layer_types", "must list 'sliding_attention' or 'full_attention' per layer")
    if "sliding_attention" not in types:
        return {}
    period = types.index("full_attention") + 1 if "full_attention" in types else 0
    expected = [("full_attention" if period and (i + 1) % period == 0 else "sliding_attention")
                for i in range(len(types))]
    if types != expected:
        raise f.fail("layer_types", "is not periodic (every n-th layer global); this pattern is not supported")
    return {"sliding_window": window, "global_layer_period": period}


def _qwen_sparse(f: Fields) -> int:
    """Qwen's MoE placement as ``layer_interval`` (only every layer sparse is supported)."""
    if f.raw.get("mlp_only_layers"):
        raise f.fail("mlp_only_layers", "must be empty (dense layers between MoE layers are not supported)")
    if f.int("decoder_sparse_step", 1) != 1:
        raise f.fail("decoder_sparse_step", "must be 1 (every layer MoE); other steps are not supported")
    return 1


def llama_like(f: Fields, name: str, family: str) -> ModelSpec:
    """llama, mistral, mixtral, qwen2, phi3 (Phi-3's fused qkv and gate_up hold the same weights)."""
    moe = None
    if family == "mixtral":
        moe = MoESpec(num_experts=f.int("num_local_experts"), top_k=f.int("num_experts_per_tok"),
                      expert_ffn_hidden_size=f.int("intermediate_size"))
    enabled = family in ("mistral", "mixtral", "phi3") or f.bool("use_sliding_window", False)
    spec = _llama_base(f, name, moe=moe, **_window(f, 0, enabled=enabled))
    return replace(spec, qkv_bias=True) if family == "qwen2" else spec


def qwen3(f: Fields, name: str, family: str) -> ModelSpec:
    """qwen3 and qwen3_moe: per-head q/k RMSNorm, explicit head_dim, no qkv bias."""
    moe = None
    if family == "qwen3_moe":
        moe = MoESpec(num_experts=f.int("num_experts"), top_k=f.int("num_experts_per_tok"),
                      expert_ffn_hidden_size=f.int("moe_intermediate_size"), layer_interval=_qwen_sparse(f))
    return _llama_base(f, name, qk_norm=True, moe=moe,
                       **_window(f, 0, enabled=f.bool("use_sliding_window", False)))


def qwen2_moe(f: Fields, name: str, family: str) -> ModelSpec:
    """qwen2_moe: qkv biases, one shared expert of its own width behind a sigmoid gate."""
    shared = f.optional_int("shared_expert_intermediate_size")
    moe = MoESpec(num_experts=f.int("num_experts"), top_k=f.int("num_experts_per_tok"),
                  expert_ffn_hidden_size=f.int("moe_intermediate_size"), num_shared_experts=1 if shared else 0,
                  shared_expert_ffn_hidden_size=shared, shared_expert_gate=bool(shared),
                  layer_interval=_qwen_sparse(f))
    return _llama_base(f, name, qkv_bias=True, moe=moe,
                       **_window(f, 0, enabled=f.bool("use_sliding_window", False)))


def gemma(f: Fields, name: str, family: str) -> ModelSpec:
    """gemma2, gemma3_text: GeLU-gated MLP, 4 norms per layer, tied embeddings; Gemma 3 adds q/k
    norms and a 5 local : 1 global pattern (``sliding_window_pattern``)."""
    period = 2 if family == "gemma2" else f.int("sliding_window_pattern", 6)
    return _llama_base(f, name, activation="gelu", sandwich_norm=True, qk_norm=family != "gemma2",
                       tied_embeddings=f.bool("tie_word_embeddings", True), **_window(f, period))


def deepseek(f: Fields, name: str, family: str) -> ModelSpec:
    """deepseek_v2 / deepseek_v3: MLA, DeepSeekMoE (shared experts, dense first layers), MTP."""
    mla = MLASpec(q_lora_rank=f.optional_int("q_lora_rank"), kv_lora_rank=f.int("kv_lora_rank"),
                  qk_nope_head_dim=f.int("qk_nope_head_dim"), qk_rope_head_dim=f.int("qk_rope_head_dim"),
                  v_head_dim=f.int("v_head_dim"))
    moe = None
    if f.raw.get("n_routed_experts") is not None:
        moe = MoESpec(num_experts=f.int("n_routed_experts"), top_k=f.int("num_experts_per_tok"),
                      expert_ffn_hidden_size=f.int("moe_intermediate_size"),
                      num_shared_experts=f.int("n_shared_experts", 0, low=0),
                      first_dense_layers=f.int("first_k_dense_replace", 0, low=0),
                      layer_interval=f.int("moe_layer_freq", 1))
    heads = f.int("num_attention_heads")
    return _llama_base(f, name, num_kv_heads=heads, mla=mla, moe=moe,
                       num_mtp_layers=f.int("num_nextn_predict_layers", 0, low=0))


def gpt_oss(f: Fields, name: str, family: str) -> ModelSpec:
    """gpt_oss: every layer MoE with biases on every linear and the router, alternating local and
    global attention. Its per-head attention-sink logits (a per layer) are not counted."""
    moe = MoESpec(num_experts=f.int("num_local_experts"),
                  top_k=f.int("num_experts_per_tok", f.raw.get("experts_per_token")),
                  expert_ffn_hidden_size=f.int("intermediate_size"))
    return _llama_base(f, name, moe=moe, linear_bias=True, qkv_bias=False, **_window(f, 2))


READERS: dict[str, Callable[[Fields, str, str], ModelSpec]] = {
    "llama": llama_like, "mistral": llama_like, "mixtral": llama_like, "qwen2": llama_like, "phi3": llama_like,
    "qwen3": qwen3, "qwen3_moe": qwen3, "qwen2_moe": qwen2_moe, "gemma2": gemma, "gemma3_text": gemma,
    "deepseek_v2": deepseek, "deepseek_v3": deepseek, "gpt_oss": gpt_oss,
}
