"""Floating-point operations of a transformer, per layer and per token.

Symbols: b micro-batch (sequences), s sequence length, h hidden, a·d query width (q_dim),
kv·d key/value width, f FFN hidden, V vocabulary. A matmul of (m×k)·(k×n) costs 2mkn FLOPs.
Attention scores and the score-value product are counted over the full s×s matrix, as in
Narayanan et al. (SC'21, eq. 3) and PaLM (Chowdhery et al. 2022, App. B): 4·b·s²·(a·d) forward.
Backward costs twice the forward (input and weight gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_spec import ModelSpec
from .params import active_params, embedding_params


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


def attention_gemms(model: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    """q/k/v and output projections of one layer on one tp rank, ``tokens`` = b·s local tokens."""
    h = model.hidden_size
    q = model.q_dim // tp
    kv = _kv_per_rank(model, tp)
    return [Gemm(m=tokens, n=q + 2 * kv, k=h), Gemm(m=tokens, n=h, k=q)]


def mlp_gemms(model: ModelSpec, tokens: int, ffn_hidden: int, tp: int) -> list[Gemm]:
    """Up (and gate) and down projections of one MLP of hidden size ``ffn_hidden``."""
    h, f = model.hidden_size, ffn_hidden // tp
    up = 2 * f if model.gated_mlp else f
    return [Gemm(m=tokens, n=up, k=h), Gemm(m=tokens, n=h, k=f)]


def attention_core_flops(model: ModelSpec, b: int, s_q: int, s_kv: int, tp: int) -> float:
    """Scores Q·Kᵀ and the score-value product: 4·b·s_q·s_kv·(a·d)/t (Narayanan et al. eq. 3)."""
    return 4.0 * b * s_q * s_kv * model.q_dim / tp


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


def _kv_per_rank(model: ModelSpec, tp: int) -> int:
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
    are excluded as negligible. The attention term is unchanged (it has no weights).
    """
    n = matmul_params(model)
    per_weight = 4.0 if lora else 6.0
    return per_weight * n + 12.0 * model.num_layers * model.q_dim * seq_len
