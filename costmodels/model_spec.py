"""``ModelSpec``: the architecture of a decoder-only transformer, as the cost model sees it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hardware_specs.checks import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_WIDTH, finite, flag, text, whole
from autoplan_base.errors import SpecError

Activation = Literal["gelu", "silu"]
Norm = Literal["layernorm", "rmsnorm"]
Positions = Literal["learned", "rotary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts layers: token-choice top-k routing (GShard, Switch, Mixtral) with
    DeepSeekMoE's fine-grained and shared experts (Dai et al. 2024) and dense first layers."""

    num_experts: int
    """Routed experts per MoE layer, E."""
    top_k: int
    """Routed experts each token goes to, k (8 for DeepSeek-V3 and Qwen3-MoE)."""
    expert_ffn_hidden_size: int
    """FFN hidden size of one routed expert (``moe_intermediate_size``), separate from the dense one."""
    num_shared_experts: int = 0
    """Experts every token passes through (DeepSeekMoE)."""
    shared_expert_ffn_hidden_size: int = 0
    """FFN hidden size of one shared expert; 0 = ``expert_ffn_hidden_size`` (DeepSeek). Qwen2-MoE's
    single shared expert is wider (``shared_expert_intermediate_size``)."""
    shared_expert_gate: bool = False
    """A sigmoid gate h -> 1 scales the shared experts' output (Qwen2-MoE)."""
    first_dense_layers: int = 0
    """Leading layers that keep a dense MLP (``first_k_dense_replace``: 3 in DeepSeek-V3)."""
    layer_interval: int = 1
    """Every ``layer_interval``-th layer after the dense prefix is MoE (1 = all)."""
    capacity_factor: float = 0.0
    """Expert capacity as a multiple of the even share k·T/E; tokens above it are dropped
    (Megatron ``--moe-expert-capacity-factor``). 0 = dropless (Megatron's default)."""
    pad_to_capacity: bool = False
    """With a capacity: every expert runs at its full capacity (``--moe-pad-expert-input-to-capacity``)."""
    load_imbalance: float = 1.0
    """Tokens of the busiest expert rank over the even share (1 + MaxVio, Wang et al. 2024,
    "Auxiliary-Loss-Free Load Balancing"). 1.0 by default: the vendor MoE benchmarks this is checked
    against force-balance routing (shared/published_runs README); set it for real routing."""

    def __post_init__(self) -> None:
        for name, high in (("num_experts", MAX_EXPERTS), ("top_k", MAX_EXPERTS),
                           ("expert_ffn_hidden_size", MAX_WIDTH), ("layer_interval", MAX_LAYERS)):
            _require_count(f"moe.{name}", getattr(self, name), high)
        _require_count("moe.num_shared_experts", self.num_shared_experts, MAX_EXPERTS, low=0)
        _require_count("moe.shared_expert_ffn_hidden_size", self.shared_expert_ffn_hidden_size, MAX_WIDTH, low=0)
        _require_count("moe.first_dense_layers", self.first_dense_layers, MAX_LAYERS, low=0)
        if self.top_k > self.num_experts:
            raise SpecError(f"moe.top_k ({self.top_k}) exceeds moe.num_experts ({self.num_experts})")
        finite("moe.capacity_factor", self.capacity_factor, low=0.0, high=float(MAX_EXPERTS), low_open=False)
        if 0 < self.capacity_factor < 1:
            raise SpecError(f"moe.capacity_factor must be 0 (dropless) or at least 1, got {self.capacity_factor!r}")
        finite("moe.load_imbalance", self.load_imbalance, low=1.0, high=float(MAX_EXPERTS), low_open=False)
        for name in ("shared_expert_gate", "pad_to_capacity"):
            flag(f"moe.{name}", getattr(self, name))

    @property
    def shared_ffn_hidden_size(self) -> int:
        """Hidden size of all shared experts together (they run as one wider MLP)."""
        return self.num_shared_experts * (self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size)

    @property
    def busiest_token_factor(self) -> float:
        """Tokens the busiest expert rank computes, over the even share k·T/E: the imbalance when
        dropless, capped at the capacity when tokens drop, the capacity itself when padded."""
        if self.capacity_factor == 0:
            return self.load_imbalance
        if self.pad_to_capacity:
            return self.capacity_factor
        return min(self.load_imbalance, self.capacity_factor)


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2, Liu et al. 2024, Sec. 2.1): queries and keys/values
    pass through low-rank latents; each head's key is a no-position part from the KV latent and a
    rotary part shared by all heads (decoupled RoPE, eq. 14-19). Field names as in the V3 config."""

    q_lora_rank: int
    """Query latent width d_c' (1536 in V3); 0 = queries projected directly from h (V2-Lite)."""
    kv_lora_rank: int
    """Key/value latent width d_c (512)."""
    qk_nope_head_dim: int
    """Per-head query/key width without positions, d_h (128)."""
    qk_rope_head_dim: int
    """Per-head rotary query/key width d_h^R (64); the key's rotary part is shared by the heads."""
    v_head_dim: int
    """Per-head value width (128)."""

    def __post_init__(self) -> None:
        _require_count("mla.q_lora_rank", self.q_lora_rank, MAX_WIDTH, low=0)
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _require_count(f"mla.{name}", getattr(self, name), MAX_WIDTH)

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head, d_h + d_h^R."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


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
    mla: MLASpec | None = None
    """Multi-head latent attention instead of q/k/v projections (then ``num_kv_heads`` = heads)."""
    qk_norm: bool = False
    """RMSNorm over each query and key head (Qwen3, Gemma 3): 2·d parameters per layer."""
    sandwich_norm: bool = False
    """Norms after attention and after the MLP too, 4 per layer (Gemma 2 and 3)."""
    sliding_window: int = 0
    """Tokens each query attends back to on local layers (Mistral, Gemma 2/3, Phi-3); 0 = none."""
    global_layer_period: int = 0
    """With a window, every ``global_layer_period``-th layer (1-based) attends to the whole sequence
    (2 for Gemma 2 and gpt-oss, 6 for Gemma 3); 0 = every layer is local."""
    num_mtp_layers: int = 0
    """Multi-token prediction modules after the last layer (DeepSeek-V3: 1), each an input
    projection 2h -> h, two norms and one transformer layer sharing the embedding and head."""

    def __post_init__(self) -> None:
        text("name", self.name)
        for name, high in (("num_layers", MAX_LAYERS), ("hidden_size", MAX_WIDTH), ("ffn_hidden_size", MAX_WIDTH),
                           ("num_attention_heads", MAX_HEADS), ("num_kv_heads", MAX_HEADS),
                           ("vocab_size", MAX_WIDTH), ("max_position_embeddings", 2**31)):
            _require_count(name, getattr(self, name), high)
        for name, high in (("head_dim", MAX_WIDTH), ("sliding_window", 2**31), ("global_layer_period", MAX_LAYERS),
                           ("num_mtp_layers", MAX_LAYERS)):
            _require_count(name, getattr(self, name), high, low=0)
        for name in ("gated_mlp", "tied_embeddings", "linear_bias", "qkv_bias", "dropout", "qk_norm",
                     "sandwich_norm"):
            flag(name, getattr(self, name))
        for name, choices in (("activation", ("gelu", "silu")), ("norm", ("layernorm", "rmsnorm")),
                              ("positions", ("learned", "rotary"))):
            if getattr(self, name) not in choices:
                raise SpecError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.moe is not None and not isinstance(self.moe, MoESpec):
            raise SpecError(f"moe must be a MoESpec or None, got {self.moe!r}")
        if self.mla is not None and not isinstance(self.mla, MLASpec):
            raise SpecError(f"mla must be a MLASpec or None, got {self.mla!r}")
        if self.mla is not None and self.num_kv_heads != self.num_attention_heads:
            raise SpecError("with mla, num_kv_heads must equal num_attention_heads (every head has its own key)")
        if self.global_layer_period and not self.sliding_window:
            raise SpecError("global_layer_period needs a sliding_window; set both or neither")
        if self.mla is None and self.head_dim == 0 and self.hidden_size % self.num_attention_heads:
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
        """Per-head query/key dimension d (MLA: d_h + d_h^R)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the keys under MLA), a·d."""
        return self.num_attention_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, kv·d."""
        return self.num_kv_heads * self.d_head

    @property
    def v_dim(self) -> int:
        """Width of the values and of the output projection's input: a·d_v under MLA, else a·d."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.v_head_dim
        return self.q_dim

    def attention_window(self, index: int) -> int:
        """Keys a query of layer ``index`` (0-based) sees back to; 0 = the whole sequence."""
        if not self.sliding_window:
            return 0
        if self.global_layer_period and (index + 1) % self.global_layer_period == 0:
            return 0
        return self.sliding_window

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
    for key, cls in (("moe", MoESpec), ("mla", MLASpec)):
        part = values.get(key)
        if part is None:
            continue
        if not isinstance(part, dict) or set(part) - set(cls.__dataclass_fields__):
            raise SpecError(f"model_spec.{key} must be an object with {cls.__name__} fields")
        try:
            values[key] = cls(**part)
        except TypeError as err:
            raise SpecError(f"model_spec.{key}: {err}") from None
    try:
        return ModelSpec(**values)
    except TypeError as err:
        raise SpecError(f"model_spec: {err}") from None
