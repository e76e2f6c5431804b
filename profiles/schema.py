"""The measured hardware profile: frozen records and the lookups the cost model calls.

Every lookup returns ``None`` where the profile holds no data for the request, so the cost
model falls back to the datasheet term by term.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoplan_base.errors import AutoplanError

from . import fit, work
from .segments import HockneySegment, segmented_time_s

SCHEMA_VERSION = 3
"""2 added ``segments`` (the regimes of ``segments.fit_segmented``) to each collective curve;
3 keys each curve by ``ranks_per_node`` and ``num_nodes`` instead of ``spans_nodes``. Version 1
and 2 files still load (``io.load_profile`` migrates them)."""
PROFILE_KIND = "autoplan-hardware-profile"
CALIBRATE_SOURCE = "autoplan calibrate"
"""``provenance.calibration.source`` of a profile ``autoplan calibrate`` wrote."""
MEMORY_KERNELS: tuple[str, ...] = ("copy", "layer_norm", "rms_norm", "softmax")
CURVE_SOURCES: tuple[str, ...] = ("measured", "nccl-tests", "trace", "calibration")
"""Where a collective curve came from: ``autoplan profile`` on this machine, an nccl-tests log
(``profiles.nccl_tests``), a PyTorch profiler trace (``profiles.trace_import``), or a calibration."""


class ProfileError(AutoplanError):
    """A profile file is missing, corrupt, truncated or not an autoplan profile."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputFit:
    """t = overhead_s + FLOPs/flops_per_s + bytes/bytes_per_s (``fit.fit_throughput``)."""

    overhead_s: float
    """Fixed time per call (launch, dispatch), seconds."""
    flops_per_s: float | None
    """Asymptotic compute rate (FLOP/s); None when the fit found no compute term."""
    bytes_per_s: float | None
    """Memory rate of the operand traffic (bytes/s); None when the fit found no memory term."""
    rms_relative_error: float
    """RMS of (fit − measured)/measured over the points it was fitted to."""

    def time_s(self, flop_count: float, bytes_moved: float) -> float:
        """Predicted seconds for a kernel of ``flop_count`` FLOPs moving ``bytes_moved`` bytes."""
        return fit.throughput_time_s(flop_count, bytes_moved, self.overhead_s,
                                     self.flops_per_s, self.bytes_per_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmPoint:
    """One measured GEMM shape: (m×k)·(k×n)."""

    m: int
    n: int
    k: int
    time_s: float
    """Median seconds per call (median over repeats, then over ranks)."""

    def work(self, dtype: str) -> tuple[float, float]:
        """(FLOPs, bytes) of this shape."""
        return work.gemm_flops(self.m, self.n, self.k), work.gemm_bytes(self.m, self.n, self.k, dtype)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionPoint:
    """One measured scaled-dot-product attention, causal, forward + backward."""

    batch: int
    seq_len: int
    num_heads: int
    head_dim: int
    time_s: float
    """Median seconds per forward + backward."""

    def work(self, dtype: str) -> tuple[float, float]:
        """(FLOPs, bytes) of this call in the ``work.attention_flops`` convention."""
        args = (self.batch, self.seq_len, self.num_heads, self.head_dim)
        return work.attention_flops(*args), work.attention_bytes(*args, dtype)


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeTable:
    """Measured points of one kernel family in one dtype, and the fit through them."""

    dtype: str
    """``fp32``, ``bf16``, ``fp16`` or ``fp8``."""
    points: tuple[GemmPoint, ...] | tuple[AttentionPoint, ...]
    fit: ThroughputFit

    def measured_flops_per_s(self) -> list[float]:
        """Achieved FLOP/s of each measured point."""
        return [p.work(self.dtype)[0] / p.time_s for p in self.points]

    def peak_flops_per_s(self) -> float:
        """Best achieved FLOP/s over the measured points."""
        return max(self.measured_flops_per_s())

    def rate(self, flop_count: float, bytes_moved: float) -> float:
        """FLOP/s the fit predicts for a kernel of this work."""
        return flop_count / self.fit.time_s(flop_count, bytes_moved)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPoint:
    """One memory-bound kernel over a buffer of ``size_bytes``."""

    size_bytes: int
    time_s: float

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth, read + write (``work.memory_kernel_bytes``)."""
        return work.memory_kernel_bytes(self.size_bytes) / self.time_s


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCurve:
    """One collective on groups of ``num_ranks`` ranks placed ``ranks_per_node`` to a node on
    ``num_nodes`` nodes: 16 ranks as 8 per node on 2 nodes is another curve than 16 nodes of 1."""

    op: str
    """``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``send_recv``."""
    num_ranks: int
    ranks_per_node: int
    """Most ranks of one group on one node."""
    num_nodes: int
    """Nodes one group spans (1: inside a node)."""
    dtype: str
    sizes_bytes: tuple[int, ...]
    """Full buffer sizes (nccl-tests convention), strictly increasing."""
    median_time_s: tuple[float, ...]
    """Median over repeats of the slowest rank's time."""
    smoothed_time_s: tuple[float, ...]
    """``median_time_s`` made nondecreasing (``fit.monotone_log_smooth``)."""
    latency_s: float
    """Alpha of the single-line alpha-beta fit over all sizes, seconds."""
    bus_bandwidth_bytes_per_s: float | None
    """Beta of that single line in the bus-bandwidth convention (bytes/s); None = latency only."""
    rms_relative_error: float
    """RMS relative error of the single-line fit over the measured sizes."""
    segments: tuple[HockneySegment, ...]
    """Regimes of the segmented alpha-beta fit (``segments.fit_segmented``), by increasing size."""
    source: str = "measured"
    """One of ``CURVE_SOURCES``; files without the field were measured by ``autoplan profile``."""

    @property
    def source_label(self) -> str:
        """How a cost term priced from this curve names its source: ``profile`` for a curve
        measured by ``autoplan profile``, else ``profile (nccl-tests)`` and so on."""
        return "profile" if self.source == "measured" else f"profile ({self.source})"

    @property
    def spans_nodes(self) -> bool:
        return self.num_nodes > 1

    @property
    def key(self) -> tuple[str, int, int, int]:
        """(op, num_ranks, ranks_per_node, num_nodes): what a lookup must match."""
        return self.op, self.num_ranks, self.ranks_per_node, self.num_nodes

    def time_s(self, size_bytes: float) -> float:
        """Seconds for one call on a ``size_bytes`` buffer: log-space interpolation of the
        smoothed curve inside the measured range; beyond it the slope of the last regime."""
        tail = fit.tail_seconds_per_byte(self.op, self.num_ranks, self.sizes_bytes, self.smoothed_time_s,
                                         self.segments[-1].bus_bandwidth_bytes_per_s)
        return fit.interpolate_time_s(self.sizes_bytes, self.smoothed_time_s, size_bytes, tail)

    def regime_time_s(self, size_bytes: float) -> float:
        """Seconds the fitted regimes alone predict (``segments.segmented_time_s``)."""
        return segmented_time_s(self.op, self.num_ranks, self.segments, size_bytes)

    def peak_bus_bandwidth_bytes_per_s(self) -> float:
        """Best measured bus bandwidth over the sizes."""
        return max(fit.bus_bandwidth_bytes_per_s(self.op, self.num_ranks, s, t)
                   for s, t in zip(self.sizes_bytes, self.median_time_s))


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareProfile:
    """What one machine (or cluster) measurably delivers; read with ``load_profile``."""

    device_type: str
    """torch device type the profile was measured on: ``cpu`` or ``cuda``."""
    provenance: dict[str, Any]
    """Device name and count, nodes, versions, host, date, command line, mode."""
    gemm: dict[str, ComputeTable] = field(default_factory=dict)
    """GEMM tables by dtype."""
    attention: dict[str, ComputeTable] = field(default_factory=dict)
    """Scaled-dot-product attention tables by dtype."""
    memory: dict[str, tuple[MemoryPoint, ...]] = field(default_factory=dict)
    """Memory-bound kernels (``MEMORY_KERNELS``) by name, points by increasing size."""
    collectives: tuple[CollectiveCurve, ...] = ()
    calibration: dict[str, float] = field(default_factory=dict)
    """Factors fitted by ``autoplan calibrate`` or ``autoplan validate --calibrate`` (Assumptions
    field names)."""
    sustained_rate_share: float | None = None
    """Share of its burst rate the device kept at the end of the profile's burn-in (the largest
    GEMM's burst time over its sustained time; ``bench_compute.sustained_burn_in``): replaces the
    preset's ``HardwareSpec.tensor_rate_share`` for the rates the profile does not measure. None =
    not measured (a CPU profile, or one made before it was)."""
    schema_version: int = SCHEMA_VERSION

    def logged_runs_fit(self) -> dict[str, Any] | None:
        """The report of the ``autoplan calibrate`` fit that wrote this file (``provenance.calibration``),
        or None when another command made it (``autoplan profile``, ``validate --calibrate``)."""
        fit = self.provenance.get("calibration")
        return fit if isinstance(fit, dict) and fit.get("source") == CALIBRATE_SOURCE else None

    def gemm_flops_per_s(self, m: int, n: int, k: int, dtype: str) -> float | None:
        """Achieved FLOP/s of an (m×k)·(k×n) GEMM in ``dtype``; None if that dtype was not measured."""
        table = self.gemm.get(dtype)
        if table is None or m <= 0 or n <= 0 or k <= 0:
            return None
        return table.rate(work.gemm_flops(m, n, k), work.gemm_bytes(m, n, k, dtype))

    def attention_flops_per_s(self, batch: int, seq_len: int, num_heads: int, head_dim: int,
                              dtype: str) -> float | None:
        """Achieved FLOP/s of causal attention (``work.attention_flops`` convention); None if unmeasured."""
        table = self.attention.get(dtype)
        if table is None or min(batch, seq_len, num_heads, head_dim) <= 0:
            return None
        args = (batch, seq_len, num_heads, head_dim)
        return table.rate(work.attention_flops(*args), work.attention_bytes(*args, dtype))

    def memory_bandwidth_bytes_per_s(self) -> float | None:
        """Copy bandwidth (read + write bytes/s) at the largest measured buffer; None if unmeasured."""
        return self.memory_bound_bytes_per_s("copy")

    def memory_bound_bytes_per_s(self, kernel: str) -> float | None:
        """Bandwidth of a memory-bound ``kernel`` (``MEMORY_KERNELS``) at its largest buffer."""
        points = self.memory.get(kernel)
        return points[-1].bytes_per_s if points else None

    def collective_curve(self, op: str, num_ranks: int, ranks_per_node: int,
                         num_nodes: int) -> CollectiveCurve | None:
        """The curve measured for exactly this (op, group size, ranks per node, nodes), if any."""
        for curve in self.collectives:
            if curve.key == (op, num_ranks, ranks_per_node, num_nodes):
                return curve
        return None

    def collective_source(self, op: str, num_ranks: int, ranks_per_node: int, num_nodes: int) -> str | None:
        """``source_label`` of the curve for (op, group size, placement); None if unmeasured."""
        curve = self.collective_curve(op, num_ranks, ranks_per_node, num_nodes)
        return None if curve is None else curve.source_label

    def collective_time_s(self, op: str, num_ranks: int, ranks_per_node: int, num_nodes: int,
                          size_bytes: float) -> float | None:
        """Seconds for ``op`` over ``num_ranks`` ranks, ``ranks_per_node`` to a node on
        ``num_nodes`` nodes, on a ``size_bytes`` buffer; None if that placement was not measured
        (the caller then uses the datasheet). One rank or an empty buffer costs 0."""
        if num_ranks <= 1 or size_bytes <= 0:
            return 0.0
        curve = self.collective_curve(op, num_ranks, ranks_per_node, num_nodes)
        return None if curve is None else curve.time_s(size_bytes)
