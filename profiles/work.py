"""FLOPs and bytes of the kernels the profiler times: one convention shared by harness and lookup.

A measured rate is only meaningful with the work count it was divided by; the harness and
``HardwareProfile`` both call these functions so the two can never disagree.
"""

from __future__ import annotations

from autoplan_base.dtypes import ELEMENT_BYTES

PROFILE_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8")
"""Dtype names a profile times its kernels in (sizes in ``autoplan_base.dtypes.ELEMENT_BYTES``)."""
OUTPUT_BYTES: dict[str, int] = {**{d: ELEMENT_BYTES[d] for d in PROFILE_DTYPES}, "fp8": 2}
"""Bytes per element of a GEMM's output: fp8 GEMMs write bf16 (``torch._scaled_mm(out_dtype=bf16)``)."""


def gemm_flops(m: int, n: int, k: int) -> float:
    """FLOPs of an (m×k)·(k×n) matrix multiply: 2·m·n·k (one multiply and one add per term)."""
    return 2.0 * m * n * k


def gemm_bytes(m: int, n: int, k: int, dtype: str) -> float:
    """Bytes a GEMM must move at least once: read A (m×k) and B (k×n), write C (m×n) in the
    output dtype (``OUTPUT_BYTES``)."""
    return float(ELEMENT_BYTES[dtype] * (m * k + k * n) + OUTPUT_BYTES[dtype] * m * n)


def attention_flops(batch: int, seq_len: int, num_heads: int, head_dim: int) -> float:
    """FLOPs of one attention core, forward + backward: 3 · 4·b·s²·a·d.

    Forward Q·Kᵀ and P·V over the full s×s matrix, 4·b·s²·(a·d) (Narayanan et al., SC'21,
    eq. 3; the causal mask is not discounted, as in the cost model's ``attention_core_flops``),
    and backward twice the forward. A causal kernel that skips masked blocks therefore shows
    a rate above a GEMM's: that is the rate the cost model needs for its FLOP count.
    """
    b, s, a, d = batch, seq_len, num_heads, head_dim
    return 3.0 * 4.0 * b * s * s * a * d


def attention_bytes(batch: int, seq_len: int, num_heads: int, head_dim: int, dtype: str) -> float:
    """Bytes of the attention operands, forward + backward: Q, K, V, O and their four gradients."""
    return float(8 * ELEMENT_BYTES[dtype] * batch * seq_len * num_heads * head_dim)


def memory_kernel_bytes(size_bytes: int) -> float:
    """Bytes a copy-like kernel moves over a buffer of ``size_bytes``: read it once, write once
    (the STREAM copy convention, McCalpin 1995)."""
    return 2.0 * size_bytes
