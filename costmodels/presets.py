"""Named model presets, and ``load_model`` for a preset name or a ``config.json`` path.

Architectures come from each family's paper or released ``config.json``:
GPT-3 (Brown et al. 2020, Table 2.1; 13B uses h = 5120 = 40 heads x 128 as
Megatron-LM does, since 5140 is not divisible by 40 heads), Llama 2 (Touvron et al.
2023), Llama 3 (Dubey et al. 2024, Table 3), Mistral 7B and Mixtral (Jiang et al.
2023, 2024), Qwen2.5 (config.json of Qwen/Qwen2.5-72B). Max positions and RoPE base are those of
the released config.json (Llama 3 8B/70B: 8192 and 500000; the only 405B release is Llama 3.1's,
131072). Mistral 7B attends through a 4096-token sliding window (Jiang et al. 2023, Table 1).
Newer families are in ``presets_recent``.
"""

from __future__ import annotations

from pathlib import Path

from autoplan_base.errors import field
from hardware_specs.names import match_name

from .hf_config import load_hf_config
from .model_spec import ModelSpec, MoESpec
from .presets_recent import RECENT_PRESETS


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                     num_attention_heads=heads, num_kv_heads=heads, vocab_size=50257,
                     max_position_embeddings=2048, tied_embeddings=True, linear_bias=True,
                     dropout=True)


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int, kv: int, vocab: int,
           **extra: object) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
                     num_attention_heads=heads, num_kv_heads=kv, vocab_size=vocab, gated_mlp=True,
                     activation="silu", norm="rmsnorm", positions="rotary", **extra)  # type: ignore[arg-type]


PRESETS: dict[str, ModelSpec] = {m.name: m for m in [
    _gpt3("gpt3-1.3b", 24, 2048, 16),
    _gpt3("gpt3-2.7b", 32, 2560, 32),
    _gpt3("gpt3-6.7b", 32, 4096, 32),
    _gpt3("gpt3-13b", 40, 5120, 40),
    _gpt3("gpt3-175b", 96, 12288, 96),
    _llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, max_position_embeddings=4096),
    _llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000, max_position_embeddings=4096),
    _llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000, max_position_embeddings=4096),
    _llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, max_position_embeddings=8192, rope_theta=500000.0),
    _llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, max_position_embeddings=8192, rope_theta=500000.0),
    _llama("llama3-405b", 126, 16384, 53248, 128, 8, 128256, max_position_embeddings=131072,
           rope_theta=500000.0),
    _llama("mistral-7b", 32, 4096, 14336, 32, 8, 32000, max_position_embeddings=32768, sliding_window=4096),
    _llama("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, max_position_embeddings=32768, rope_theta=1e6,
           moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336)),
    _llama("mixtral-8x22b", 56, 6144, 16384, 48, 8, 32768, max_position_embeddings=65536, rope_theta=1e6,
           moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=16384)),
    _llama("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064, qkv_bias=True, max_position_embeddings=131072,
           rope_theta=1e6),
    # Tiny models for tests and CPU runs (a few million parameters).
    _llama("tiny-llama", 4, 256, 768, 8, 4, 1024),
    _llama("tiny-mixtral", 4, 256, 512, 8, 4, 1024,
           moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=512)),
    ModelSpec(name="tiny-gpt", num_layers=4, hidden_size=256, ffn_hidden_size=1024,
              num_attention_heads=4, num_kv_heads=4, vocab_size=1024, max_position_embeddings=512,
              tied_embeddings=True, linear_bias=True),
    *RECENT_PRESETS,
]}


def model_name(name_or_path: str) -> str:
    """The full preset name ``name_or_path`` stands for (``LLAMA3-8B`` -> ``llama3-8b``); a path as given."""
    if name_or_path.endswith(".json") or "/" in name_or_path or Path(name_or_path).is_dir():
        return name_or_path
    return load_model(name_or_path).name


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A preset by name, or a Hugging Face style ``config.json`` by path."""
    text = str(name_or_path)
    if text in PRESETS:
        return PRESETS[text]
    if text.endswith(".json") or "/" in text or Path(text).is_dir():
        return load_hf_config(Path(text))
    return PRESETS[match_name(text, list(PRESETS), option=field("model"),
                              fix="run 'autoplan models' for the list or pass a config.json path or model directory")]
