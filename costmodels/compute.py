"""Achievable rates: how long a GEMM, an attention core or a memory-bound kernel takes on one device.

Datasheet path: the roofline model (Williams, Waterman & Patterson, CACM 2009):
t = max(FLOPs / (η_gemm · peak), bytes / (η_mem · bandwidth)), bytes = B·(mk + kn + mn) for a GEMM,
so small or skinny GEMMs become bandwidth-bound. Profile path: the measured FLOP/s for that shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hardware_specs.schema import HardwareSpec

from .assumptions import Assumptions
from .flops import Gemm

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


def merge_source(sources: dict[str, str], term: str, source: str) -> None:
    """Record ``source`` for ``term`` in ``sources``: a term is ``profile`` if any of its rates was measured."""
    if sources.get(term) != PROFILE:
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
        self.bandwidth = hardware.memory_bandwidth_bytes_per_s
        self.profile = profile
        self.a = assumptions
        self._gemm_memo: dict[tuple[int, int, int], tuple[float, str]] = {}
        measured_bw = profile.memory_bandwidth_bytes_per_s() if profile is not None else None
        self.memory_bandwidth = measured_bw or self.bandwidth * assumptions.memory_bandwidth_efficiency
        self.memory_bound_source = PROFILE if measured_bw else DATASHEET

    def gemm_time_s(self, g: Gemm) -> float:
        """Seconds for ``g.count`` GEMMs of shape (m×k)·(k×n)."""
        return self.gemm_time_and_source(g)[0]

    def gemm_time_and_source(self, g: Gemm) -> tuple[float, str]:
        """(seconds for ``g.count`` GEMMs of shape (m×k)·(k×n), where the rate came from)."""
        key = (g.m, g.n, g.k)
        cached = self._gemm_memo.get(key)
        if cached is None:
            cached = self._gemm_memo[key] = self._single_gemm_time_s(g.m, g.n, g.k)
        per, source = cached
        return per * g.count * self.a.compute_scale, source

    def _single_gemm_time_s(self, m: int, n: int, k: int) -> tuple[float, str]:
        flops = 2.0 * m * n * k
        if self.profile is not None:
            rate = self.profile.gemm_flops_per_s(m, n, k, self.dtype)
            if rate:
                return flops / rate, PROFILE
        moved = self.elem_bytes * (m * k + k * n + m * n)
        return max(flops / (self.peak * self.a.gemm_efficiency), moved / self.memory_bandwidth), DATASHEET

    def attention_time_and_source(self, flops: float, *, b: int, s: int, heads: int,
                                  head_dim: int, executed_fraction: float = 1.0) -> tuple[float, str]:
        """(seconds for the attention core (scores and score-value product) of ``flops`` FLOPs,
        where the rate came from). On the datasheet path the kernel executes
        ``executed_fraction`` of them (causal tiles skipped); a measured rate already includes it."""
        if flops <= 0:
            return 0.0, DATASHEET
        if self.profile is not None:
            rate = self.profile.attention_flops_per_s(b, s, heads, head_dim, self.attention_dtype)
            if rate:
                return flops / rate * self.a.compute_scale, PROFILE
        executed = flops * executed_fraction
        return executed / (self.attention_peak * self.a.gemm_efficiency) * self.a.compute_scale, DATASHEET

    def memory_time_s(self, moved_bytes: float) -> float:
        """Seconds for memory-bound kernels moving ``moved_bytes`` (reads + writes)."""
        return moved_bytes / self.memory_bandwidth * self.a.memory_bound_scale
