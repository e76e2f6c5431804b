"""Read a Hugging Face style ``config.json`` into a ``ModelSpec`` (no transformers needed).

Field names follow the configs of the families gpt2, gpt_neox, llama, mistral, mixtral
and qwen2 as released on the Hugging Face Hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hardware_specs.errors import SpecError
from hardware_specs.files import read_json

from .model_spec import ModelSpec, MoESpec

FAMILIES: tuple[str, ...] = ("gpt2", "gpt_neox", "llama", "mistral", "mixtral", "qwen2")


def load_hf_config(path: Path) -> ModelSpec:
    """Parse ``path`` (a config.json, or a Hugging Face model directory holding one); errors name
    the file and the field."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(f"--model: directory {str(path)!r} holds no config.json")
        path = path / "config.json"
    raw = read_json(path, what="--model file")
    if not isinstance(raw, dict):
        raise SpecError(f"--model: {path} must hold a JSON object")
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise SpecError(f"{path}: model_type {family!r} is not supported; supported: {', '.join(FAMILIES)}")
    reader = _Fields(raw, path)
    name = path.parent.name if path.name == "config.json" else path.stem
    if family == "gpt2":
        return _gpt2(reader, name)
    if family == "gpt_neox":
        return _neox(reader, name)
    return _llama_like(reader, name, family)


class _Fields:
    def __init__(self, raw: dict[str, Any], path: Path) -> None:
        self.raw, self.path = raw, path

    def int(self, key: str, default: int | None = None) -> int:
        value = self.raw.get(key, default)
        if value is None:
            raise SpecError(f"{self.path}: missing field {key!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"{self.path}: field {key!r} must be a positive integer, got {value!r}")
        return value

    def positive_number(self, key: str, default: float) -> float:
        value = self.raw.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise SpecError(f"{self.path}: field {key!r} must be a positive number, got {value!r}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(f"{self.path}: field {key!r} must be true or false, got {value!r}")
        return value


def _gpt2(f: _Fields, name: str) -> ModelSpec:
    hidden = f.int("n_embd")
    inner = f.raw.get("n_inner")
    return ModelSpec(name=name, num_layers=f.int("n_layer"), hidden_size=hidden,
                     ffn_hidden_size=f.int("n_inner") if inner is not None else 4 * hidden,
                     num_attention_heads=f.int("n_head"), num_kv_heads=f.int("n_head"),
                     vocab_size=f.int("vocab_size"), max_position_embeddings=f.int("n_positions"),
                     tied_embeddings=f.bool("tie_word_embeddings", True), linear_bias=True, dropout=True)


def _neox(f: _Fields, name: str) -> ModelSpec:
    heads = f.int("num_attention_heads")
    return ModelSpec(name=name, num_layers=f.int("num_hidden_layers"), hidden_size=f.int("hidden_size"),
                     ffn_hidden_size=f.int("intermediate_size"), num_attention_heads=heads,
                     num_kv_heads=heads, vocab_size=f.int("vocab_size"), positions="rotary",
                     max_position_embeddings=f.int("max_position_embeddings", 2048),
                     rope_theta=f.positive_number("rotary_emb_base", 10000.0),
                     tied_embeddings=f.bool("tie_word_embeddings", False), linear_bias=True)


def _llama_like(f: _Fields, name: str, family: str) -> ModelSpec:
    heads = f.int("num_attention_heads")
    moe = None
    if family == "mixtral":
        moe = MoESpec(num_experts=f.int("num_local_experts"), top_k=f.int("num_experts_per_tok"),
                      expert_ffn_hidden_size=f.int("intermediate_size"))
    head_dim = f.raw.get("head_dim")
    return ModelSpec(
        name=name, num_layers=f.int("num_hidden_layers"), hidden_size=f.int("hidden_size"),
        ffn_hidden_size=f.int("intermediate_size"), num_attention_heads=heads,
        num_kv_heads=f.int("num_key_value_heads", heads), vocab_size=f.int("vocab_size"),
        head_dim=f.int("head_dim") if head_dim is not None else 0,
        gated_mlp=True, activation="silu", norm="rmsnorm", positions="rotary",
        max_position_embeddings=f.int("max_position_embeddings", 4096),
        rope_theta=f.positive_number("rope_theta", 10000.0),
        tied_embeddings=f.bool("tie_word_embeddings", False),
        qkv_bias=family == "qwen2" or f.bool("attention_bias", False),
        moe=moe,
    )
