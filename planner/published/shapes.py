"""A run row's ``model`` block -> ``ModelSpec``: GPT-style or Llama-style, by the model's name.

GPT-style (GPT-3, Megatron GPT, BLOOM, MegaScale, MT-NLG, GPT-NeoX, OPT): a non-gated 4h GELU MLP,
LayerNorm, biases on every linear, input and output embeddings tied, multi-head attention.
Llama-style (Llama 2/3, Qwen, Mistral): SwiGLU, RMSNorm, rotary positions, no biases, untied.
A field a row leaves out is filled only where the architecture fixes it (GPT-style ffn = 4h and
kv heads = heads), from ``VOCAB_FILLS``, or whole from ``MODEL_SHAPES`` (Qwen3 MoE); everything
else raises ``ShapeError``.
"""

from __future__ import annotations

import re

from costmodels.model_spec import ModelSpec, MoESpec

GPT_STYLE = re.compile(r"^(GPT|BLOOM|MegaScale|MT-NLG|OPT|Megatron)", re.IGNORECASE)
LLAMA_STYLE = re.compile(r"^(LLAMA|Qwen|Mistral|Mixtral)", re.IGNORECASE)
MLA_MODELS = re.compile(r"DeepSeek|Kimi", re.IGNORECASE)
DROPOUT_FAMILIES = frozenset({"megatron_sc21_table1", "megatron_sc21_table2", "korthikanti_2022"})
"""Megatron GPT runs of 2021-22 train with dropout 0.1 (Korthikanti et al.'s 34·sbh counts its masks)."""

VOCAB_FILLS: dict[str, tuple[int, str]] = {
    "BLOOM candidate": (250880, "bigscience/bloom config.json vocab_size (the tr11 tokenizer, padded)"),
    "GPT-NeoX-20B": (50432, "EleutherAI/gpt-neox-20b config.json vocab_size"),
    "MT-NLG 530B": (51200, "GPT-2 BPE (50,257) padded by Megatron to a multiple of 128 x tp 8"),
    "OPT-175B": (50272, "facebook/opt config.json vocab_size"),
}
"""Vocabulary sizes a row omits, by model-name prefix, with where each number comes from."""


QWEN3_MOE_SOURCE = "Megatron arguments for Qwen3 MoE (THUDM/slime scripts/models/qwen3-*.sh, from the HF config.json)"
MODEL_SHAPES: dict[str, tuple[ModelSpec, str]] = {
    "Qwen3_30B_a3B": (ModelSpec(
        name="Qwen3_30B_a3B", num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
        num_kv_heads=4, head_dim=128, vocab_size=151936, gated_mlp=True, activation="silu", norm="rmsnorm",
        positions="rotary", moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768)), QWEN3_MOE_SOURCE),
    "Qwen3_235B_a22B": (ModelSpec(
        name="Qwen3_235B_a22B", num_layers=94, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=64,
        num_kv_heads=4, head_dim=128, vocab_size=151936, gated_mlp=True, activation="silu", norm="rmsnorm",
        positions="rotary", moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1536)), QWEN3_MOE_SOURCE),
}
"""Whole shapes for models the rows name without a shape, with where each comes from."""


class ShapeError(ValueError):
    """The row does not give enough to build the model; ``reason`` is the counted category."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def model_spec_for(row: dict) -> ModelSpec:
    """The ``ModelSpec`` of ``row['model']``; raise ``ShapeError`` when the shape is not known."""
    m, family = row["model"], row["source_family"]
    name = m["name"] or ""
    if MLA_MODELS.search(name):
        raise ShapeError("MLA", name)
    if name in MODEL_SHAPES and not m["hidden"]:
        return MODEL_SHAPES[name][0]
    if m["moe_experts"]:
        raise ShapeError("missing model shape", f"{name}: MoE expert FFN size not given")
    missing = [k for k in ("layers", "hidden", "heads", "seq_len") if not m[k]]
    if missing:
        raise ShapeError("missing model shape", f"{name}: {', '.join(missing)}")
    vocab = m["vocab"] or _vocab_fill(name)
    if GPT_STYLE.search(name):
        return ModelSpec(name=name, num_layers=m["layers"], hidden_size=m["hidden"],
                         ffn_hidden_size=m["ffn_hidden"] or 4 * m["hidden"], num_attention_heads=m["heads"],
                         num_kv_heads=m["kv_heads"] or m["heads"], vocab_size=vocab,
                         max_position_embeddings=max(2048, m["seq_len"]), tied_embeddings=True,
                         linear_bias=True, dropout=family in DROPOUT_FAMILIES)
    if LLAMA_STYLE.search(name):
        if not m["ffn_hidden"] or not m["kv_heads"]:
            raise ShapeError("missing model shape", f"{name}: ffn_hidden or kv_heads")
        return ModelSpec(name=name, num_layers=m["layers"], hidden_size=m["hidden"], ffn_hidden_size=m["ffn_hidden"],
                         num_attention_heads=m["heads"], num_kv_heads=m["kv_heads"], vocab_size=vocab,
                         gated_mlp=True, activation="silu", norm="rmsnorm", positions="rotary")
    raise ShapeError("unknown architecture", name)


def _vocab_fill(name: str) -> int:
    for prefix, (vocab, _source) in VOCAB_FILLS.items():
        if name.startswith(prefix):
            return vocab
    raise ShapeError("missing model shape", f"{name}: vocab")
