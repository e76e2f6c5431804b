"""Presets of models trained since 2024: MLA and DeepSeekMoE, Qwen3 (dense and MoE), Qwen1.5-MoE,
Gemma 2/3, Phi-3 and gpt-oss, each from the facts of its released ``config.json`` (repository
named per entry); ``tests/test_model_families.py`` checks each total and active count against the
model card or paper.
"""

from __future__ import annotations

from .model_spec import MLASpec, ModelSpec, MoESpec

_LLAMA_LIKE = dict(gated_mlp=True, activation="silu", norm="rmsnorm", positions="rotary")


def _spec(name: str, layers: int, hidden: int, ffn: int, heads: int, kv: int, vocab: int, **extra: object) -> ModelSpec:
    values = {**_LLAMA_LIKE, **extra}
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,  # type: ignore[arg-type]
                     num_attention_heads=heads, num_kv_heads=kv, vocab_size=vocab, **values)


def _qwen3_moe(name: str, layers: int, hidden: int, ffn: int, heads: int, expert_ffn: int) -> ModelSpec:
    return _spec(name, layers, hidden, ffn, heads, 4, 151936, head_dim=128, qk_norm=True,
                 max_position_embeddings=40960, rope_theta=1e6,
                 moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=expert_ffn))


RECENT_PRESETS: list[ModelSpec] = [
    # deepseek-ai/DeepSeek-V3: 671B main model + one MTP module (DeepSeek-V3 report, Sec. 2 and 4.2)
    _spec("deepseek-v3", 61, 7168, 18432, 128, 128, 129280, max_position_embeddings=163840,
          mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
          moe=MoESpec(num_experts=256, top_k=8, expert_ffn_hidden_size=2048, num_shared_experts=1,
                      first_dense_layers=3),
          num_mtp_layers=1),
    _qwen3_moe("qwen3-235b-a22b", 94, 4096, 12288, 64, 1536),  # Qwen/Qwen3-235B-A22B
    _qwen3_moe("qwen3-30b-a3b", 48, 2048, 6144, 32, 768),  # Qwen/Qwen3-30B-A3B
    _spec("qwen3-8b", 36, 4096, 12288, 32, 8, 151936, head_dim=128, qk_norm=True, max_position_embeddings=40960,
          rope_theta=1e6),  # Qwen/Qwen3-8B
    _spec("qwen1.5-moe-a2.7b", 24, 2048, 5632, 16, 16, 151936, qkv_bias=True, max_position_embeddings=8192,
          rope_theta=1e6,
          moe=MoESpec(num_experts=60, top_k=4, expert_ffn_hidden_size=1408, num_shared_experts=1,
                      shared_expert_ffn_hidden_size=5632, shared_expert_gate=True)),  # Qwen/Qwen1.5-MoE-A2.7B
    _spec("gemma2-9b", 42, 3584, 14336, 16, 8, 256000, head_dim=256, activation="gelu", sandwich_norm=True,
          tied_embeddings=True, max_position_embeddings=8192, sliding_window=4096,
          global_layer_period=2),  # google/gemma-2-9b
    _spec("gemma3-27b", 62, 5376, 21504, 32, 16, 262208, head_dim=128, activation="gelu", sandwich_norm=True,
          qk_norm=True, tied_embeddings=True, max_position_embeddings=131072, rope_theta=1e6, sliding_window=1024,
          global_layer_period=6),  # google/gemma-3-27b-pt, text model
    _spec("phi3-mini", 32, 3072, 8192, 32, 32, 32064, max_position_embeddings=4096, sliding_window=2047),  # microsoft/Phi-3-mini-4k-instruct
    _spec("gpt-oss-120b", 36, 2880, 2880, 64, 8, 201088, head_dim=64, linear_bias=True,
          max_position_embeddings=131072, rope_theta=150000.0, sliding_window=128, global_layer_period=2,
          moe=MoESpec(num_experts=128, top_k=4, expert_ffn_hidden_size=2880)),  # openai/gpt-oss-120b
    # A few million parameters, for CPU launches: MLA, a dense first layer, shared experts, a window.
    _spec("tiny-deepseek", 4, 256, 512, 8, 8, 1024, max_position_embeddings=512,
          mla=MLASpec(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32),
          moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=128, num_shared_experts=1,
                      first_dense_layers=1)),
    _spec("tiny-gemma", 4, 256, 768, 8, 4, 1024, max_position_embeddings=512, activation="gelu",
          sandwich_norm=True, qk_norm=True, tied_embeddings=True, sliding_window=16, global_layer_period=2),
]
