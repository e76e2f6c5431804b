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


class Rates:
    """Times of kernels on one device; remembers whether a profile or the datasheet gave each rate."""

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
        self.sources: dict[str, str] = {}
        self._gemm_memo: dict[tuple[int, int, int], float] = {}
        measured_bw = profile.memory_bandwidth_bytes_per_s() if profile is not None else None
        self.memory_bandwidth = measured_bw or self.bandwidth * assumptions.memory_bandwidth_efficiency
        self.sources["memory_bound"] = "profile" if measured_bw else "datasheet"

    def gemm_time_s(self, g: Gemm) -> float:
        """Seconds for ``g.count`` GEMMs of shape (m×k)·(k×n)."""
        key = (g.m, g.n, g.k)
        per = self._gemm_memo.get(key)
        if per is None:
            per = self._single_gemm_time_s(g.m, g.n, g.k)
            self._gemm_memo[key] = per
        return per * g.count * self.a.compute_scale

    def _single_gemm_time_s(self, m: int, n: int, k: int) -> float:
        flops = 2.0 * m * n * k
        if self.profile is not None:
            rate = self.profile.gemm_flops_per_s(m, n, k, self.dtype)
            if rate:
                self.sources["gemm"] = "profile"
                return flops / rate
        self.sources.setdefault("gemm", "datasheet")
        moved = self.elem_bytes * (m * k + k * n + m * n)
        return max(flops / (self.peak * self.a.gemm_efficiency), moved / self.memory_bandwidth)

    def attention_time_s(self, flops: float, *, b: int, s: int, heads: int, head_dim: int) -> float:
        """Seconds for the attention core (scores and score-value product) of ``flops`` FLOPs."""
        if flops <= 0:
            return 0.0
        if self.profile is not None:
            rate = self.profile.attention_flops_per_s(b, s, heads, head_dim, self.attention_dtype)
            if rate:
                self.sources["attention"] = "profile"
                return flops / rate * self.a.compute_scale
        self.sources.setdefault("attention", "datasheet")
        return flops / (self.attention_peak * self.a.gemm_efficiency) * self.a.compute_scale

    def memory_time_s(self, moved_bytes: float) -> float:
        """Seconds for memory-bound kernels moving ``moved_bytes`` (reads + writes)."""
        return moved_bytes / self.memory_bandwidth * self.a.memory_bound_scale
