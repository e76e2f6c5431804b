"""Floating-point operations of a transformer, per layer and per token.

Symbols: b micro-batch (sequences), s sequence length, h hidden, a·d query width (q_dim),
kv·d key/value width, f FFN hidden, V vocabulary. A matmul of (m×k)·(k×n) costs 2mkn FLOPs.
Attention scores and the score-value product are counted over the full s×s matrix, as in
Narayanan et al. (SC'21, eq. 3) and PaLM (Chowdhery et al. 2022, App. B): 4·b·s²·(a·d) forward.
Backward costs twice the forward (input and weight gradients).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .model_spec import ModelSpec
from .params import active_params, embedding_params, layer_matmul_weights

FlopConvention = Literal["model", "hardware"]
"""How a published TFLOP/s counts: ``model`` FLOPs (no recomputation) or ``hardware`` FLOPs (with it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Gemm:
    """One matrix multiply of a layer's forward pass on one rank: (m×k)·(k×n), ``count`` times."""

    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def attention_gemms(model: ModelSpec, tokens: int, tp: int, sp: bool = False) -> list[Gemm]:
    """q/k/v and output projections of one layer on one tp rank, ``tokens`` = b·s local tokens
    (``sp``: sequence parallel, which MLA's down-projections run under on their 1/tp share)."""
    if model.mla is not None:
        down_tokens = tokens // tp if sp else tokens
        return mla_down_gemms(model, down_tokens) + mla_up_gemms(model, tokens, tp) + \
            [Gemm(m=tokens, n=model.hidden_size, k=model.v_dim // tp)]
    h = model.hidden_size
    q = model.q_dim // tp
    kv = kv_per_rank(model, tp)
    return [Gemm(m=tokens, n=q + 2 * kv, k=h), Gemm(m=tokens, n=h, k=q)]


def mla_down_gemms(model: ModelSpec, tokens: int) -> list[Gemm]:
    """MLA's down-projections to the query latent (h -> d_c') and to the KV latent plus the shared
    rotary key (h -> d_c + d_h^R). Megatron-Core's MLA keeps their weights whole on every tp rank
    (they are small): without SP each rank projects all ``tokens``; with SP its own sequence share,
    gathering the latents afterwards (DeepSeek-V2 eq. 9, 12, 17)."""
    m = model.mla
    assert m is not None
    h = model.hidden_size
    gemms = [Gemm(m=tokens, n=m.kv_lora_rank + m.qk_rope_head_dim, k=h)]
    if m.q_lora_rank:
        gemms.append(Gemm(m=tokens, n=m.q_lora_rank, k=h))
    return gemms


def mla_up_gemms(model: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    """MLA's up-projections, column-parallel over heads: query latent -> a/t·(d_h + d_h^R) (or
    h -> that without a query latent), KV latent -> a/t·(d_h + d_v) (DeepSeek-V2 eq. 10, 13, 14).
    These are what ``--recompute-modules mla_up_proj`` reruns in backward."""
    m = model.mla
    assert m is not None
    heads = model.num_attention_heads // tp
    q_in = m.q_lora_rank or model.hidden_size
    return [Gemm(m=tokens, n=heads * m.qk_head_dim, k=q_in),
            Gemm(m=tokens, n=heads * (m.qk_nope_head_dim + m.v_head_dim), k=m.kv_lora_rank)]


def mlp_gemms(model: ModelSpec, tokens: int, ffn_hidden: int, tp: int) -> list[Gemm]:
    """Up (and gate) and down projections of one MLP of hidden size ``ffn_hidden``."""
    h, f = model.hidden_size, ffn_hidden // tp
    up = 2 * f if model.gated_mlp else f
    return [Gemm(m=tokens, n=up, k=h), Gemm(m=tokens, n=h, k=f)]


def attention_core_flops(model: ModelSpec, b: int, s_q: int, s_kv: int, tp: int) -> float:
    """Scores Q·Kᵀ and the score-value product: 2·b·s_q·s_kv·(a·d_qk + a·d_v)/t, which is
    4·b·s_q·s_kv·(a·d)/t when keys and values are as wide (Narayanan et al. eq. 3); MLA's keys are
    d_h + d_h^R wide and its values d_v (DeepSeek-V2 eq. 17-18)."""
    return 2.0 * b * s_q * s_kv * (model.q_dim + model.v_dim) / tp


def window_fraction(seq_len: int, window: int) -> float:
    """Share of the causal score pairs a sliding window of ``window`` keys keeps (1 = full).

    Causal attention scores s(s + 1)/2 pairs; with a window w < s query i sees min(i, w) keys,
    Σ = w·s − w(w − 1)/2 (Beltagy et al. 2020, Longformer, Sec. 3.1: O(s·w) instead of O(s²);
    Jiang et al. 2023, Mistral 7B, Sec. 2)."""
    s, w = seq_len, window
    if w == 0 or w >= s:
        return 1.0
    return (w * s - w * (w - 1) / 2) / (s * (s + 1) / 2)


def mean_window_fraction(model: ModelSpec, seq_len: int) -> float:
    """``window_fraction`` averaged over the layers (local and global layers mixed, as in Gemma)."""
    if not model.sliding_window:
        return 1.0
    return sum(window_fraction(seq_len, model.attention_window(i)) for i in range(model.num_layers)) / model.num_layers


def attention_executed_fraction(fused: bool) -> float:
    """Share of the s_q·s_kv score tiles a causal attention kernel computes: a fused kernel skips
    the tiles above the diagonal, about half (FlashAttention-2, Dao 2023, Sec. 3.1.1); eager
    attention computes every score and then masks it."""
    return 0.5 if fused else 1.0


def attention_backward_ratio(fused: bool) -> float:
    """Backward / forward time of the attention core. A fused kernel recomputes the scores and
    runs 5 matmuls in backward against 2 in forward: 2.5x (FlashAttention-2, Dao 2023, Sec. 4.1,
    which counts backward FLOPs as 2.5x forward); eager attention: input and score gradients, 2x
    (Narayanan et al. SC'21)."""
    return 2.5 if fused else 2.0


def logits_gemm(model: ModelSpec, tokens: int, tp: int) -> Gemm:
    """Output projection to the (tp-split) vocabulary: 2·tokens·h·V/t."""
    return Gemm(m=tokens, n=model.vocab_size // tp or 1, k=model.hidden_size)


def lora_flops(model: ModelSpec, tokens: int, rank: int, targets: tuple[str, ...], tp: int) -> float:
    """Forward FLOPs of one layer's LoRA adapters: 2·tokens·r·(d_in + d_out) per adapted matrix."""
    from .params import lora_params_per_layer

    return 2.0 * tokens * lora_params_per_layer(model, rank, targets) / tp


def kv_per_rank(model: ModelSpec, tp: int) -> int:
    """K (or V) width on one rank: kv heads split over tp, replicated when kv < tp."""
    return max(model.num_kv_heads // tp, 1) * model.d_head


def matmul_params(model: ModelSpec) -> int:
    """Parameters used in matmuls per token, N in PaLM's 6N: active parameters minus the embedding
    lookup tables, plus the output projection when it is tied to the embedding."""
    tied_head = model.vocab_size * model.hidden_size if model.tied_embeddings else 0
    return active_params(model) - embedding_params(model) + tied_head


def model_flops_per_token(model: ModelSpec, seq_len: int, lora: bool = False) -> float:
    """Model FLOPs per token for one training step (PaLM App. B): 6·N + 12·L·(a·d)·s.

    With LoRA the frozen weights need no weight gradient: 4·N (forward + input gradient); adapters
    are excluded as negligible. The attention term is unchanged (it has no weights). With MLA the
    attention term is 6·L·(a·d_qk + a·d_v)·s; with sliding windows each layer's term is scaled by
    the share of score pairs it keeps (``window_fraction``).
    """
    n = matmul_params(model)
    per_weight = 4.0 if lora else 6.0
    attention = 6.0 * (model.q_dim + model.v_dim) * seq_len * model.num_layers * mean_window_fraction(model, seq_len)
    return per_weight * n + attention


def reported_flops_per_token(model: ModelSpec, seq_len: int, recompute: str, convention: FlopConvention) -> float:
    """FLOPs per trained token as a published run counted them for its TFLOP/s, under ``convention``
    (SC'21 eq. 3 generalised per matrix; ``planner.published.conventions`` says which source uses which).
    ``model_flops_per_token`` is the cost model's own count (PaLM, causal windows, MLA).

    Forward per layer: 2·P_layer (GEMMs) + 4·s·q_dim (QKᵀ and AV); logits 2·V·h. Training is 3x
    forward. ``hardware`` adds the recomputed forward: every layer under full recomputation,
    the attention core (4·s·q_dim per layer) under selective (Korthikanti et al. 2022, Sec. 5).
    """
    s, h, V = seq_len, model.hidden_size, model.vocab_size
    attention_core = 4 * s * model.q_dim
    layers_forward = sum(2 * layer_matmul_weights(model, i) + attention_core for i in range(model.num_layers))
    logits_forward = 2 * V * h
    flops = 3 * (layers_forward + logits_forward)
    if convention == "hardware":
        if recompute == "full":
            flops += layers_forward
        elif recompute == "selective":
            flops += attention_core * model.num_layers
    return float(flops)
