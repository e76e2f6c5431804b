"""A run row's ``model`` block -> ``ModelSpec``: GPT-style or Llama-style, by the model's name.

GPT-style (GPT-3, Megatron GPT, BLOOM, MegaScale, MT-NLG, GPT-NeoX, OPT): a non-gated 4h GELU MLP,
LayerNorm, biases on every linear, input and output embeddings tied, multi-head attention.
Llama-style (Llama 2/3, Qwen, Mistral): SwiGLU, RMSNorm, rotary positions, no biases, untied.
A field a row leaves out is filled only where the architecture fixes it (GPT-style ffn = 4h and
kv heads = heads), from ``VOCAB_FILLS``, or whole from a shipped preset named in ``PRESET_SHAPES``
(DeepSeek-V3, Qwen3 MoE, gpt-oss: models the rows name without their attention or expert shapes),
checked against every shape field the row does give; everything else raises ``ShapeError``.
"""

from __future__ import annotations

import re

from costmodels.model_spec import ModelSpec, MoESpec, model_from_dict

GPT_STYLE = re.compile(r"^(GPT|BLOOM|MegaScale|MT-NLG|OPT|Megatron)", re.IGNORECASE)
LLAMA_STYLE = re.compile(r"^(LLAMA|Qwen|Mistral|Mixtral)", re.IGNORECASE)
MLA_MODELS = re.compile(r"DeepSeek|Kimi", re.IGNORECASE)
"""Multi-head latent attention models; expressible when ``PRESET_SHAPES`` names their preset."""
DROPOUT_FAMILIES = frozenset({"megatron_sc21_table1", "megatron_sc21_table2", "korthikanti_2022"})
"""Megatron GPT runs of 2021-22 train with dropout 0.1 (Korthikanti et al.'s 34·sbh counts its masks)."""

VOCAB_FILLS: dict[str, tuple[int, str]] = {
    "BLOOM candidate": (250880, "bigscience/bloom config.json vocab_size (the tr11 tokenizer, padded)"),
    "GPT-NeoX-20B": (50432, "EleutherAI/gpt-neox-20b config.json vocab_size"),
    "MT-NLG 530B": (51200, "GPT-2 BPE (50,257) padded by Megatron to a multiple of 128 x tp 8"),
    "OPT-175B": (50272, "facebook/opt config.json vocab_size"),
}
"""Vocabulary sizes a row omits, by model-name prefix, with where each number comes from."""


PRESET_SHAPES: dict[str, str] = {
    "DeepSeek-V3": "deepseek-v3", "DeepSeekV3": "deepseek-v3",
    "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "GPT OSS 120B": "gpt-oss-120b",
}
"""Row model name -> shipped preset (``costmodels.presets``, from each released config.json)."""
ROW_FIELDS = (("layers", "num_layers"), ("hidden", "hidden_size"), ("heads", "num_attention_heads"))


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
    exact = (row.get("extra") or {}).get("model_spec")
    if exact is not None:  # a run autoplan measured itself (benchmarks/gpu_records.py) records its spec
        return model_from_dict(exact)
    if name in PRESET_SHAPES:
        return _preset_shape(m, PRESET_SHAPES[name])
    if MLA_MODELS.search(name):
        raise ShapeError("MLA", f"{name}: no preset with its shape")
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


def _preset_shape(m: dict, preset: str) -> ModelSpec:
    """The preset, after checking it against the layers, width, heads and expert counts the row gives."""
    from costmodels.presets import PRESETS

    spec = PRESETS[preset]
    moe = spec.moe
    given = [(field, m[field], getattr(spec, attr)) for field, attr in ROW_FIELDS]
    if moe is not None:
        given += [("moe_experts", m["moe_experts"], moe.num_experts), ("moe_top_k", m["moe_top_k"], moe.top_k),
                  ("moe_shared_experts", m["moe_shared_experts"], moe.num_shared_experts)]
    for field, row_value, ours in given:
        if row_value is not None and row_value != ours:
            raise ShapeError("missing model shape", f"{m['name']}: row {field} {row_value} != preset {preset}'s {ours}")
    return spec
