"""Raw medians (from the harness) -> a fitted ``HardwareProfile``. Pure: no torch, no I/O."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from . import fit, segments
from .schema import (AttentionPoint, CollectiveCurve, ComputeTable, GemmPoint, HardwareProfile,
                     MemoryPoint, ThroughputFit)


def fit_compute_table(dtype: str, points: tuple[GemmPoint, ...] | tuple[AttentionPoint, ...]) -> ComputeTable:
    """Fit t = t₀ + F/R + B/W through measured points of one dtype (``fit.fit_throughput``)."""
    works = [p.work(dtype) for p in points]
    flops = [w[0] for w in works]
    bytes_moved = [w[1] for w in works]
    times = [p.time_s for p in points]
    overhead, rate, bandwidth = fit.fit_throughput(flops, bytes_moved, times)
    predicted = [fit.throughput_time_s(f, b, overhead, rate, bandwidth) for f, b in zip(flops, bytes_moved)]
    err = fit.rms_relative_error(predicted, times)
    return ComputeTable(dtype=dtype, points=points, fit=ThroughputFit(
        overhead_s=overhead, flops_per_s=rate, bytes_per_s=bandwidth, rms_relative_error=err))


def fit_collective(*, op: str, num_ranks: int, ranks_per_node: int, num_nodes: int, dtype: str,
                   sizes_bytes: tuple[int, ...], median_time_s: tuple[float, ...],
                   source: str = "measured") -> CollectiveCurve:
    """Smooth the curve monotone, fit one alpha-beta line and the regimes through the medians;
    ``source`` says where the medians came from (``schema.CURVE_SOURCES``)."""
    latency, bandwidth = fit.fit_alpha_beta(op, num_ranks, sizes_bytes, median_time_s)
    predicted = [fit.alpha_beta_time_s(op, num_ranks, s, latency, bandwidth) for s in sizes_bytes]
    return CollectiveCurve(
        op=op, num_ranks=num_ranks, ranks_per_node=ranks_per_node, num_nodes=num_nodes, dtype=dtype,
        sizes_bytes=tuple(sizes_bytes), median_time_s=tuple(median_time_s),
        smoothed_time_s=tuple(fit.monotone_log_smooth(median_time_s)),
        latency_s=latency, bus_bandwidth_bytes_per_s=bandwidth,
        rms_relative_error=fit.rms_relative_error(predicted, median_time_s),
        segments=segments.fit_segmented(op, num_ranks, sizes_bytes, median_time_s), source=source)


def refit_collectives(profile: HardwareProfile) -> HardwareProfile:
    """The same profile with every collective fit recomputed from its stored medians."""
    curves = tuple(fit_collective(op=c.op, num_ranks=c.num_ranks, ranks_per_node=c.ranks_per_node,
                                  num_nodes=c.num_nodes, dtype=c.dtype, sizes_bytes=c.sizes_bytes,
                                  median_time_s=c.median_time_s, source=c.source)
                   for c in profile.collectives)
    return replace(profile, collectives=curves)


def build_profile(raw: Mapping[str, Any], *, device_type: str, provenance: dict[str, Any]) -> HardwareProfile:
    """A fitted profile from the harness's raw medians.

    ``raw`` = {"gemm": {dtype: [{m, n, k, time_s}]}, "attention": {dtype: [{batch, seq_len,
    num_heads, head_dim, time_s}]}, "memory": {kernel: [{size_bytes, time_s}]},
    "collectives": [{op, num_ranks, ranks_per_node, num_nodes, dtype, sizes_bytes, median_time_s}],
    "sustained": [{burst_s, sustained_s, burn_in_s, gemm, dtype}] (optional: the burn-in's timing)}.
    """
    gemm = {d: fit_compute_table(d, tuple(GemmPoint(**p) for p in pts))
            for d, pts in sorted(raw.get("gemm", {}).items()) if pts}
    attention = {d: fit_compute_table(d, tuple(AttentionPoint(**p) for p in pts))
                 for d, pts in sorted(raw.get("attention", {}).items()) if pts}
    memory = {k: tuple(sorted((MemoryPoint(**p) for p in pts), key=lambda p: p.size_bytes))
              for k, pts in sorted(raw.get("memory", {}).items()) if pts}
    curves = tuple(fit_collective(**{**c, "sizes_bytes": tuple(c["sizes_bytes"]),
                                     "median_time_s": tuple(c["median_time_s"])})
                   for c in raw.get("collectives", []))
    sustained = raw.get("sustained") or []
    share = round(sustained[0]["burst_s"] / sustained[0]["sustained_s"], 4) if sustained else None
    if sustained:
        provenance = {**provenance, "sustained_burn_in": sustained[0]}
    return HardwareProfile(device_type=device_type, provenance=provenance, gemm=gemm,
                           attention=attention, memory=memory, collectives=curves, sustained_rate_share=share)
