"""Read a Hugging Face style ``config.json`` into a ``ModelSpec`` (no transformers needed).

Field names follow the configs of the families gpt2, gpt_neox, llama, mistral, mixtral, qwen2,
qwen2_moe, qwen3, qwen3_moe, phi3, gemma2, gemma3 (and gemma3_text), deepseek_v2, deepseek_v3 and
gpt_oss as released on the Hugging Face Hub; the newer families are read in ``hf_families``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan_base.errors import SpecError, field
from hardware_specs.files import read_json

from .hf_families import READERS
from .hf_fields import Fields
from .model_spec import ModelSpec

FAMILIES: tuple[str, ...] = ("gpt2", "gpt_neox", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
                             "qwen3_moe", "phi3", "gemma2", "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3",
                             "gpt_oss")


def load_hf_config(path: Path) -> ModelSpec:
    """Parse ``path`` (a config.json, or a Hugging Face model directory holding one); errors name
    the file and the field."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(f"{field('model')}: directory {str(path)!r} holds no config.json")
        path = path / "config.json"
    raw = read_json(path, what=f"{field('model')} file")
    if not isinstance(raw, dict):
        raise SpecError(f"{field('model')}: {path} must hold a JSON object")
    name = path.parent.name if path.name == "config.json" else path.stem
    return spec_from_hf_dict(raw, name, where=str(path))


def spec_from_hf_dict(raw: dict[str, Any], name: str, *, where: str = "config") -> ModelSpec:
    """The ``ModelSpec`` of a parsed ``config.json``; ``where`` names it in errors."""
    family = raw.get("model_type")
    if family == "gemma3" and isinstance(raw.get("text_config"), dict):
        raw, family = {**raw["text_config"], "model_type": "gemma3_text"}, "gemma3_text"
    if family not in FAMILIES:
        raise SpecError(f"{where}: model_type {family!r} is not supported; supported: {', '.join(FAMILIES)}")
    reader = Fields(raw, where)
    if family == "gpt2":
        return _gpt2(reader, name)
    if family == "gpt_neox":
        return _neox(reader, name)
    return READERS[family](reader, name, family)


def _gpt2(f: Fields, name: str) -> ModelSpec:
    hidden = f.int("n_embd")
    inner = f.raw.get("n_inner")
    return ModelSpec(name=name, num_layers=f.int("n_layer"), hidden_size=hidden,
                     ffn_hidden_size=f.int("n_inner") if inner is not None else 4 * hidden,
                     num_attention_heads=f.int("n_head"), num_kv_heads=f.int("n_head"),
                     vocab_size=f.int("vocab_size"), max_position_embeddings=f.int("n_positions"),
                     tied_embeddings=f.bool("tie_word_embeddings", True), linear_bias=True, dropout=True)


def _neox(f: Fields, name: str) -> ModelSpec:
    heads = f.int("num_attention_heads")
    return ModelSpec(name=name, num_layers=f.int("num_hidden_layers"), hidden_size=f.int("hidden_size"),
                     ffn_hidden_size=f.int("intermediate_size"), num_attention_heads=heads,
                     num_kv_heads=heads, vocab_size=f.int("vocab_size"), positions="rotary",
                     max_position_embeddings=f.int("max_position_embeddings", 2048),
                     rope_theta=f.positive_number("rotary_emb_base", 10000.0),
                     tied_embeddings=f.bool("tie_word_embeddings", False), linear_bias=True)
