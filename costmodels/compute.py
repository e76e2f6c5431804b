"""Achievable rates: how long a GEMM, an attention core or a memory-bound kernel takes on one device.

Datasheet path: the roofline model (Williams, Waterman & Patterson, CACM 2009):
t = max(FLOPs / (η_gemm · peak · σ · q), bytes / (η_mem · bandwidth)), bytes = B·(mk + kn + mn) for a
GEMM, so small or skinny GEMMs become bandwidth-bound; σ is the share of the datasheet rate the part
sustains under its power limit (``HardwareSpec.tensor_rate_share``) and q the shape's tile, wave and
depth efficiency (``kernel_efficiency``). A layer's backward runs two GEMMs per forward one, each of
its own shape (``backward_gemms``). Profile path: the measured FLOP/s for that shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoplan_base.dtypes import ELEMENT_BYTES
from hardware_specs.schema import HardwareSpec

from .assumptions import Assumptions
from .flops import Gemm, attention_backward_ratio
from .kernel_efficiency import (attention_block_efficiency, attention_head_dim_efficiency, attention_kernel_share,
                                best_quantisation_efficiency, depth_efficiency)

if TYPE_CHECKING:
    from profiles import HardwareProfile


LOW_PRECISION_DTYPES: tuple[str, ...] = ("fp8", "mxfp8", "nvfp4")
"""Training precisions whose weight GEMMs run below 16 bits (``costmodels.precision``)."""


def compute_dtype(precision: str, hardware: HardwareSpec) -> str:
    """GEMM dtype: the low-precision one where the hardware has its rate, else bf16 (fp16 on parts
    without bf16)."""
    if precision in LOW_PRECISION_DTYPES and hardware.supports(precision):
        return precision
    sixteen = precision in LOW_PRECISION_DTYPES or precision == "bf16"
    if sixteen and not hardware.supports("bf16"):
        return "fp16"
    return "bf16" if sixteen else precision


PROFILE, DATASHEET = "profile", "datasheet"


def merge_source(sources: dict[str, str], term: str, source: str) -> None:
    """Record ``source`` for ``term`` in ``sources``: a term is ``profile`` (or ``profile (nccl-tests)``,
    ...) if any of its rates was measured."""
    if not sources.get(term, "").startswith(PROFILE):
        sources[term] = source


def backward_gemms(g: Gemm) -> tuple[Gemm, Gemm]:
    """The two GEMMs of the backward of Y = X·W, X (m×k), W (k×n): the input gradient
    dX = dY·Wᵀ, an (m×n)·(n×k) product, and the weight gradient dW = Xᵀ·dY, (k×m)·(m×n), each with
    the forward's FLOPs (Narayanan et al. SC'21, Sec. 5.1: backward = 2x forward) but its own
    shape: a tensor-parallel slice's narrow n becomes the dgrad's reduction depth, and the tokens
    the wgrad's. Rows x columns (reduction): dgrad m x k (n), wgrad k x n (m)."""
    return Gemm(m=g.m, n=g.k, k=g.n, count=g.count), Gemm(m=g.k, n=g.n, k=g.m, count=g.count)


class Rates:
    """Times of kernels on one device, each with the source of its rate (``profile`` or ``datasheet``).

    Holds no state that depends on what was asked before: the memo maps a GEMM shape to its time
    and source, which are pure functions of the shape and the specs."""

    def __init__(self, hardware: HardwareSpec, precision: str, profile: "HardwareProfile | None",
                 assumptions: Assumptions, *, attention_kernel_capability: float = 0.0) -> None:
        self.dtype = compute_dtype(precision, hardware)
        self.low_precision = self.dtype in LOW_PRECISION_DTYPES
        """Weight GEMMs run at a low-precision peak (and pay the recipe's casts, ``layer_costs``)."""
        self.attention_dtype = "bf16" if self.low_precision else self.dtype
        self.elem_bytes = ELEMENT_BYTES[self.attention_dtype]
        """Bytes of an activation element: 16-bit around low-precision GEMMs, as attention runs."""
        self.peak = hardware.peak_flops(self.dtype)
        self.attention_peak = hardware.peak_flops(self.attention_dtype)
        self.mfu_peak = self.attention_peak
        """Peak that MFU is quoted against: the 16-bit dense one even for fp8 training (as Meta's
        Llama 3 paper, Sec. 3.3.4, and NVIDIA's NeMo performance tables do)."""
        measured_share = profile.sustained_rate_share if profile is not None else None
        self.tensor_share = min(1.0, measured_share) if measured_share else hardware.tensor_rate_share()
        """Share of the datasheet tensor-core rate sustained through a step under the part's power
        limit: scales the GEMM and attention rates below, not the peaks that MFU is quoted
        against. A profile's burn-in measures it (``HardwareProfile.sustained_rate_share``); else
        the preset's (``HardwareSpec.tensor_rate_share``)."""
        self.attention_kernel_share = attention_kernel_share(
            attention_kernel_capability, hardware.compute_capability, assumptions.legacy_attention_share)
        """Rate of the runtime's attention kernel relative to one written for this part
        (``RuntimeConvention.attention_kernel_capability``)."""
        self.low_precision_peak = self.peak if self.low_precision else 0.0
        """The low-precision dense peak, for the MFU figure quoted beside it (0 = 16/32-bit training)."""
        self.bandwidth = hardware.memory_bandwidth_bytes_per_s
        self.num_sms = hardware.num_sms
        self.profile = profile
        self.a = assumptions
        self._gemm_memo: dict[tuple[int, int, int, bool], tuple[float, str]] = {}
        measured_bw = profile.memory_bandwidth_bytes_per_s() if profile is not None else None
        self.memory_bandwidth = measured_bw or self.bandwidth * assumptions.memory_bandwidth_efficiency
        self.memory_bound_source = PROFILE if measured_bw else DATASHEET

    def gemm_time_s(self, g: Gemm) -> float:
        """Seconds for ``g.count`` GEMMs of shape (m×k)·(k×n)."""
        return self.gemm_time_and_source(g)[0]

    def gemm_time_and_source(self, g: Gemm, *, high_precision: bool = False) -> tuple[float, str]:
        """(seconds for ``g.count`` GEMMs of shape (m×k)·(k×n), where the rate came from).
        ``high_precision``: a GEMM low-precision recipes keep in 16 bits (the LM head, the router,
        LoRA adapters; ``costmodels.precision``). Cast kernels are costed by the caller."""
        key = (g.m, g.n, g.k, high_precision)
        cached = self._gemm_memo.get(key)
        if cached is None:
            cached = self._gemm_memo[key] = self._single_gemm_time_s(g.m, g.n, g.k, high_precision)
        per, source = cached
        return per * g.count * self.a.compute_scale, source

    def _single_gemm_time_s(self, m: int, n: int, k: int, high_precision: bool) -> tuple[float, str]:
        flops = 2.0 * m * n * k
        low = self.low_precision and not high_precision
        dtype = self.dtype if low else self.attention_dtype
        if self.profile is not None:
            rate = self.profile.gemm_flops_per_s(m, n, k, dtype)
            if rate:
                return flops / rate, PROFILE
        moved = self.elem_bytes * (m * k + k * n + m * n)
        ceiling = self.a.fp8_gemm_efficiency * self.peak if low else self.a.gemm_efficiency * self.attention_peak
        rate = ceiling * self.tensor_share * self.gemm_shape_efficiency(m, n, k)
        return max(flops / rate, moved / self.memory_bandwidth), DATASHEET

    def backward_time_and_source(self, g: Gemm, *, high_precision: bool = False) -> tuple[float, float, str]:
        """(seconds of the input-gradient GEMMs, of the weight-gradient GEMMs, where the rate came
        from) for the backward of ``g.count`` forward GEMMs ``g`` (``backward_gemms``)."""
        dgrad, wgrad = backward_gemms(g)
        dgrad_s, source = self.gemm_time_and_source(dgrad, high_precision=high_precision)
        wgrad_s, _ = self.gemm_time_and_source(wgrad, high_precision=high_precision)
        return dgrad_s, wgrad_s, source

    def gemm_shape_efficiency(self, m: int, n: int, k: int) -> float:
        """Share of the GEMM ceiling an (m×k)·(k×n) GEMM reaches: tile/wave quantisation of its
        m×n output over the SMs times the depth of its k loop (``kernel_efficiency``)."""
        return best_quantisation_efficiency(m, n, k, self.num_sms) * depth_efficiency(k, self.a.gemm_k_overhead)

    def attention_time_and_source(self, flops: float, *, b: int, s: int, heads: int, head_dim: int,
                                  s_kv_block: int | None = None, executed_fraction: float = 1.0) -> tuple[float, str]:
        """(seconds for the forward attention core (scores and score-value product) of ``flops``
        FLOPs, where the rate came from). On the datasheet path the kernel executes
        ``executed_fraction`` of them (causal tiles skipped) at ``attention_rate``, with key blocks
        of ``s_kv_block`` tokens per kernel call (a context-parallel ring step's block; default
        ``s``); a measured rate already includes all of it."""
        if flops <= 0:
            return 0.0, DATASHEET
        if self.profile is not None:
            rate = self.profile.attention_flops_per_s(b, s, heads, head_dim, self.attention_dtype)
            if rate:
                return flops / rate * self.a.attention_scale, PROFILE
        executed = flops * executed_fraction
        rate = self.attention_rate(s_kv_block or s, head_dim)
        return executed / rate * self.a.attention_scale, DATASHEET

    def attention_backward_s(self, forward_s: float, source: str, *, fused: bool) -> float:
        """Seconds of the attention core's backward given its forward's: ``attention_backward_ratio``
        × the forward FLOPs (2.5 fused, 2 eager; ``flops``), and on the datasheet path a fused
        kernel runs them at ``attention_backward_efficiency`` of its forward rate (FlashAttention-3,
        Shah et al. 2024, Fig. 5-6). A measured rate already covers forward and backward."""
        ratio = attention_backward_ratio(fused)
        if fused and source == DATASHEET:
            ratio /= self.a.attention_backward_efficiency
        return ratio * forward_s

    def attention_rate(self, s_kv_block: int, head_dim: int) -> float:
        """Datasheet FLOP/s of a fused attention kernel over key blocks of ``s_kv_block`` tokens at
        head dim ``head_dim``: 16-bit peak × ``attention_efficiency`` × block and head-dim factors
        (``kernel_efficiency``), the sustained tensor-rate share and the share of the runtime's kernel
        on this architecture. Forward and backward share it; backward has 2.5x the FLOPs."""
        a = self.a
        return (self.attention_peak * a.attention_efficiency * self.tensor_share * self.attention_kernel_share
                * attention_block_efficiency(s_kv_block, a.attention_block_half_tokens)
                * attention_head_dim_efficiency(head_dim, a.attention_head_dim_half))

    def memory_time_s(self, moved_bytes: float) -> float:
        """Seconds for memory-bound kernels moving ``moved_bytes`` (reads + writes)."""
        return moved_bytes / self.memory_bandwidth * self.a.memory_bound_scale
