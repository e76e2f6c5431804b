"""Achievable rates: how long a GEMM, an attention core or a memory-bound kernel takes on one device.

Datasheet path: the roofline model (Williams, Waterman & Patterson, CACM 2009):
t = max(FLOPs / (η_gemm · peak), bytes / (η_mem · bandwidth)), bytes = B·(mk + kn + mn) for a GEMM,
so small or skinny GEMMs become bandwidth-bound. Profile path: the measured FLOP/s for that shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hardware_specs.schema import HardwareSpec

from .assumptions import Assumptions
from .flops import Gemm, attention_backward_ratio
from .kernel_efficiency import (attention_block_efficiency, attention_head_dim_efficiency,
                                best_quantisation_efficiency, depth_efficiency)

if TYPE_CHECKING:
    from profiles import HardwareProfile


def compute_dtype(precision: str, hardware: HardwareSpec) -> str:
    """GEMM dtype: fp8 where the hardware has an FP8 rate, else bf16 (fp16 on parts without bf16)."""
    if precision == "fp8" and hardware.supports("fp8"):
        return "fp8"
    if precision in ("fp8", "bf16") and not hardware.supports("bf16"):
        return "fp16"
    return "bf16" if precision == "fp8" else precision


PROFILE, DATASHEET = "profile", "datasheet"


def fp8_cast_bytes(m: int, n: int, k: int) -> float:
    """HBM bytes to quantise the two 16-bit inputs of an (m×k)·(k×n) fp8 GEMM with current
    per-tensor scaling: read for the amax, read again and write the fp8 copy, 2 + 2 + 1 bytes per
    element (per-tensor scaling: Micikevicius et al. 2022, "FP8 Formats for Deep Learning", Sec. 4;
    Transformer Engine's current-scaling recipe computes the amax before the cast)."""
    return 5.0 * (m * k + k * n)


def merge_source(sources: dict[str, str], term: str, source: str) -> None:
    """Record ``source`` for ``term`` in ``sources``: a term is ``profile`` (or ``profile (nccl-tests)``,
    ...) if any of its rates was measured."""
    if not sources.get(term, "").startswith(PROFILE):
        sources[term] = source


class Rates:
    """Times of kernels on one device, each with the source of its rate (``profile`` or ``datasheet``).

    Holds no state that depends on what was asked before: the memo maps a GEMM shape to its time
    and source, which are pure functions of the shape and the specs."""

    def __init__(self, hardware: HardwareSpec, precision: str, profile: "HardwareProfile | None",
                 assumptions: Assumptions) -> None:
        self.dtype = compute_dtype(precision, hardware)
        self.attention_dtype = "bf16" if self.dtype == "fp8" else self.dtype
        self.elem_bytes = 4 if self.dtype == "fp32" else 2
        self.peak = hardware.peak_flops(self.dtype)
        self.attention_peak = hardware.peak_flops(self.attention_dtype)
        self.mfu_peak = self.attention_peak
        """Peak that MFU is quoted against: the 16-bit one even for fp8 training (as published work does)."""
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
        ``high_precision``: a GEMM fp8 recipes keep in 16 bits (the LM head; Transformer Engine
        and torchao leave the output layer in bf16)."""
        key = (g.m, g.n, g.k, high_precision)
        cached = self._gemm_memo.get(key)
        if cached is None:
            cached = self._gemm_memo[key] = self._single_gemm_time_s(g.m, g.n, g.k, high_precision)
        per, source = cached
        return per * g.count * self.a.compute_scale, source

    def _single_gemm_time_s(self, m: int, n: int, k: int, high_precision: bool) -> tuple[float, str]:
        flops = 2.0 * m * n * k
        fp8 = self.dtype == "fp8" and not high_precision
        dtype = self.dtype if fp8 or self.dtype != "fp8" else self.attention_dtype
        if self.profile is not None:
            rate = self.profile.gemm_flops_per_s(m, n, k, dtype)
            if rate:
                return flops / rate + (self.memory_time_s(fp8_cast_bytes(m, n, k)) if fp8 else 0.0), PROFILE
        moved = self.elem_bytes * (m * k + k * n + m * n)
        ceiling = self.a.fp8_gemm_efficiency * self.peak if fp8 else self.a.gemm_efficiency * self.attention_peak
        rate = ceiling * self.gemm_shape_efficiency(m, n, k)
        seconds = max(flops / rate, moved / self.memory_bandwidth)
        return seconds + (self.memory_time_s(fp8_cast_bytes(m, n, k)) if fp8 else 0.0), DATASHEET

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
                return flops / rate * self.a.compute_scale, PROFILE
        executed = flops * executed_fraction
        rate = self.attention_rate(s_kv_block or s, head_dim)
        return executed / rate * self.a.compute_scale, DATASHEET

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
        (``kernel_efficiency``). Forward and backward share it; backward has 2.5x the FLOPs."""
        a = self.a
        return (self.attention_peak * a.attention_efficiency
                * attention_block_efficiency(s_kv_block, a.attention_block_half_tokens)
                * attention_head_dim_efficiency(head_dim, a.attention_head_dim_half))

    def memory_time_s(self, moved_bytes: float) -> float:
        """Seconds for memory-bound kernels moving ``moved_bytes`` (reads + writes)."""
        return moved_bytes / self.memory_bandwidth * self.a.memory_bound_scale
