"""``ModelSpec``: the architecture of a decoder-only transformer, as the cost model sees it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hardware_specs.checks import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_WIDTH, finite, flag, text, whole
from hardware_specs.errors import SpecError

Activation = Literal["gelu", "silu"]
Norm = Literal["layernorm", "rmsnorm"]
Positions = Literal["learned", "rotary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts layers (GShard / Switch / Mixtral style, token-choice top-k routing)."""

    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts each token is routed to."""
    expert_ffn_hidden_size: int
    """FFN hidden size of one expert."""
    num_shared_experts: int = 0
    """Experts every token passes through (DeepSeekMoE), each of ``expert_ffn_hidden_size``."""
    first_dense_layers: int = 0
    """Leading layers that keep a dense MLP."""
    layer_interval: int = 1
    """Every ``layer_interval``-th layer after the dense prefix is MoE (1 = all)."""
    capacity_factor: float = 1.0
    """Expert capacity as a multiple of the even share of tokens (1.0 = dropless in expectation)."""

    def __post_init__(self) -> None:
        for name, high in (("num_experts", MAX_EXPERTS), ("top_k", MAX_EXPERTS),
                           ("expert_ffn_hidden_size", MAX_WIDTH), ("layer_interval", MAX_LAYERS)):
            _require_count(f"moe.{name}", getattr(self, name), high)
        _require_count("moe.num_shared_experts", self.num_shared_experts, MAX_EXPERTS, low=0)
        _require_count("moe.first_dense_layers", self.first_dense_layers, MAX_LAYERS, low=0)
        if self.top_k > self.num_experts:
            raise SpecError(f"moe.top_k ({self.top_k}) exceeds moe.num_experts ({self.num_experts})")
        finite("moe.capacity_factor", self.capacity_factor, low=1.0, high=float(MAX_EXPERTS), low_open=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer (GPT / Llama family), sizes in elements."""

    name: str
    """Preset or file name, for reports."""
    num_layers: int
    """Transformer blocks, L."""
    hidden_size: int
    """Model width, h."""
    ffn_hidden_size: int
    """Dense MLP hidden size, f (4h for GPT, about 8h/3 for SwiGLU models)."""
    num_attention_heads: int
    """Query heads, a."""
    num_kv_heads: int
    """Key/value heads: a for MHA, 1 for MQA, in between for GQA."""
    vocab_size: int
    """Vocabulary size, V."""
    head_dim: int = 0
    """Per-head dimension d; 0 means h / a."""
    gated_mlp: bool = False
    """SwiGLU-style MLP (three matrices) instead of two."""
    activation: Activation = "gelu"
    norm: Norm = "layernorm"
    positions: Positions = "learned"
    max_position_embeddings: int = 2048
    """Rows of the learned position table; with rotary positions, the context length the released
    config declares."""
    rope_theta: float = 10000.0
    """Rotary base (RoPE theta) of the released config; unused with learned positions."""
    tied_embeddings: bool = False
    """Output projection shares the input embedding matrix."""
    linear_bias: bool = False
    """Biases on every linear layer (GPT-2/3)."""
    qkv_bias: bool = False
    """Biases on the q, k, v projections only (Qwen2)."""
    dropout: bool = False
    """Dropout after attention scores and each residual branch (stores 1-byte masks)."""
    moe: MoESpec | None = None

    def __post_init__(self) -> None:
        text("name", self.name)
        for name, high in (("num_layers", MAX_LAYERS), ("hidden_size", MAX_WIDTH), ("ffn_hidden_size", MAX_WIDTH),
                           ("num_attention_heads", MAX_HEADS), ("num_kv_heads", MAX_HEADS),
                           ("vocab_size", MAX_WIDTH), ("max_position_embeddings", 2**31)):
            _require_count(name, getattr(self, name), high)
        _require_count("head_dim", self.head_dim, MAX_WIDTH, low=0)
        for name in ("gated_mlp", "tied_embeddings", "linear_bias", "qkv_bias", "dropout"):
            flag(name, getattr(self, name))
        for name, choices in (("activation", ("gelu", "silu")), ("norm", ("layernorm", "rmsnorm")),
                              ("positions", ("learned", "rotary"))):
            if getattr(self, name) not in choices:
                raise SpecError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.moe is not None and not isinstance(self.moe, MoESpec):
            raise SpecError(f"moe must be a MoESpec or None, got {self.moe!r}")
        if self.head_dim == 0 and self.hidden_size % self.num_attention_heads:
            raise SpecError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; set head_dim explicitly"
            )
        if self.num_attention_heads % self.num_kv_heads:
            raise SpecError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}"
            )

    @property
    def d_head(self) -> int:
        """Per-head dimension d."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection, a·d."""
        return self.num_attention_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, kv·d."""
        return self.num_kv_heads * self.d_head

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) has a mixture-of-experts MLP."""
        if self.moe is None or index < self.moe.first_dense_layers:
            return False
        return (index - self.moe.first_dense_layers) % self.moe.layer_interval == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))


def _require_count(name: str, value: object, high: int, *, low: int = 1) -> None:
    """``value`` must be an int (not a bool or float) in [low, high]."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{name} must be a whole number, got {value!r}")
    whole(name, value, low=low, high=high)


def model_to_dict(model: ModelSpec) -> dict:
    """Plain-JSON form of ``model`` (the ``inputs.model_spec`` of a plan file)."""
    from dataclasses import asdict

    return asdict(model)


def model_from_dict(raw: dict) -> ModelSpec:
    """Inverse of ``model_to_dict``; unknown or bad fields raise ``SpecError`` naming them."""
    if not isinstance(raw, dict):
        raise SpecError("model_spec must be a JSON object")
    known = set(ModelSpec.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SpecError(f"model_spec: unknown field {unknown[0]!r}")
    values = dict(raw)
    moe = values.get("moe")
    if moe is not None:
        if not isinstance(moe, dict) or set(moe) - set(MoESpec.__dataclass_fields__):
            raise SpecError("model_spec.moe must be an object with MoESpec fields")
    try:
        if moe is not None:
            values["moe"] = MoESpec(**moe)
        return ModelSpec(**values)
    except TypeError as err:
        raise SpecError(f"model_spec: {err}") from None
