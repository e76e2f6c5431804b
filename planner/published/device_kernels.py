"""Fit the cost model's kernel constants on one device's kernel times (``device_records``).

Each kernel of a layer-times record was timed alone, in a short burst, from Python: between the two
CUDA events the device also waits for the host to dispatch the call (autograd, the kernel launch;
for cuDNN attention its graph lookup), which a training step's host hides by running ahead of the
device. So every timed call is modelled as

    measured = model(kernel) + τ

with τ one host time per device and per kind of call (forward alone, forward + backward; one per
attention backend), taken as the median of measured − model: a nuisance of the measurement,
never part of the cost model. A GEMM's forward + backward call also accumulates the two gradients
into ``.grad`` (the script does not zero them between timings): an add reading two bf16 tensors and
writing one, for X (m×k) and W (n×k), at the memory-bound rate.

The model is ``costmodels.compute.Rates`` itself, at burst rates (``sustained_rate_share`` 1: these
are bursts; the sustained share is measured apart, ``sustained_share``). Fitted by grid search on
the squared log error over every record:
- GEMMs: ``gemm_efficiency`` (the burst share of the bf16 peak a large, well-quantised GEMM
  reaches) and ``gemm_k_overhead`` (the per-tile prologue, in elements of k), forward and backward
  (``compute.backward_gemms``);
- attention: ``attention_efficiency`` and ``attention_backward_efficiency`` of a kernel written for
  the part (cuDNN's fused attention: what Transformer Engine and, on Hopper, PyTorch's SDPA run),
  then ``legacy_attention_share``, the rate of FlashAttention-2 (written for sm80: SDPA's
  ``flash`` backend) relative to it.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from costmodels.assumptions import Assumptions, UNCALIBRATED
from costmodels.compute import Rates, backward_gemms
from costmodels.flops import Gemm
from hardware_specs.loader import load_node

from .device_records import DeviceRecord, LayerCase, SustainedRecord

GEMM_AXES: dict[str, tuple[float, ...]] = {
    "gemm_efficiency": tuple(round(0.60 + 0.005 * i, 3) for i in range(61)),
    "gemm_k_overhead": (0.0, 32.0, 64.0, 128.0, 192.0, 256.0, 384.0),
}
"""Grid of the GEMM fit: efficiency 0.60-0.90 of the bf16 peak (cuBLAS on H100 reaches about 0.75
in a burst); the prologue 0-384 elements of k (2-3 stages of 32-128, CUTLASS's pipelined mainloop)."""
ATTENTION_AXES: dict[str, tuple[float, ...]] = {
    "attention_efficiency": tuple(round(0.40 + 0.01 * i, 2) for i in range(41)),
    "attention_backward_efficiency": tuple(round(0.60 + 0.05 * i, 2) for i in range(9)),
}
"""Grid of the native attention fit: 0.40-0.80 of the peak forward (FlashAttention-3 reaches 0.75 on
H100, Shah et al. 2024), backward at 0.60-1.00 of the forward rate."""
LEGACY_AXIS: tuple[float, ...] = tuple(round(0.30 + 0.01 * i, 2) for i in range(51))
"""Grid of FlashAttention-2's share of the native rate on a newer part: 0.30-0.80."""
NATIVE_BACKEND, LEGACY_BACKEND = "cudnn", "flash"
"""SDPA backends of the records: cuDNN's fused attention (Hopper-native) and FlashAttention-2 (sm80)."""
ACCUMULATE_BYTES_PER_ELEMENT = 6
"""``.grad += g`` in bf16: read both, write one, 2 bytes each."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Residual:
    """One timed call: the model's time (host time included) against the measured one."""

    device: str
    case: str
    """``<shape> s<seq> <kernel>``."""
    call: str
    """``forward`` or ``forward+backward``."""
    predicted_s: float
    measured_s: float

    @property
    def log_error(self) -> float:
        return math.log(self.predicted_s / self.measured_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelFit:
    """The constants of one fit, their residuals, and the host time of each kind of call."""

    constants: dict[str, float]
    residuals: tuple[Residual, ...]
    host_s: dict[str, float]
    """Median host time per ``<device> <call>``: the measurement's, not the model's."""

    @property
    def rms_log_error(self) -> float:
        return math.sqrt(statistics.fmean(r.log_error ** 2 for r in self.residuals))

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(math.exp(r.log_error) - 1) for r in self.residuals)


def burst_rates(record: DeviceRecord, assumptions: Assumptions, *, kernel_capability: float = 0.0) -> Rates:
    """The cost model's bf16 rates on the record's device in a short burst (no sustained-load loss);
    ``kernel_capability``: the attention kernel's architecture (0 = written for the part)."""
    hardware = replace(load_node(record.preset).hardware, sustained_rate_share=1.0)
    return Rates(hardware, "bf16", None, assumptions, attention_kernel_capability=kernel_capability)


def _with_host_time(pairs: list[tuple[str, str, str, float, float]]) -> tuple[tuple[Residual, ...], dict[str, float]]:
    """Residuals of (device, case, call, model s, measured s) with each (device, call)'s host time
    (the median of measured - model, at least 0) added to the model."""
    groups: dict[str, list[float]] = {}
    for device, _, call, model_s, measured_s in pairs:
        groups.setdefault(f"{device} {call}", []).append(measured_s - model_s)
    host = {k: max(0.0, statistics.median(v)) for k, v in groups.items()}
    residuals = tuple(Residual(device=d, case=c, call=call, predicted_s=m + host[f"{d} {call}"], measured_s=meas)
                      for d, c, call, m, meas in pairs)
    return residuals, host


def gemm_pairs(records: Iterable[DeviceRecord], assumptions: Assumptions) -> list[tuple[str, str, str, float, float]]:
    """(device, case, call, model s, measured s) of every GEMM call: forward, and forward + backward
    with the measurement's gradient accumulation."""
    out = []
    for record in records:
        rates = burst_rates(record, assumptions)
        for case in record.cases:
            for name, g in case.shape.gemms(case.tokens).items():
                forward = rates.gemm_time_s(g)
                backward = sum(rates.gemm_time_s(x) for x in backward_gemms(g))
                accumulate = rates.memory_time_s(ACCUMULATE_BYTES_PER_ELEMENT * (g.m * g.k + g.n * g.k))
                measured = case.gemms[name]
                label = f"{case.name} s{case.seq_len} {name}"
                out.append((record.device, label, "forward", forward, measured.forward_s))
                out.append((record.device, label, "forward+backward", forward + backward + accumulate,
                            measured.forward_backward_s))
    return out


def attention_pairs(records: Iterable[DeviceRecord], assumptions: Assumptions,
                    backend: str) -> list[tuple[str, str, str, float, float]]:
    """(device, case, call, model s, measured s) of causal SDPA on ``backend``: the cuDNN kernel is
    native to the part; FlashAttention-2 is an sm80 kernel (``attention_kernel_share``)."""
    out = []
    for record in records:
        legacy = 8.0 if backend == LEGACY_BACKEND else 0.0
        rates = burst_rates(record, assumptions, kernel_capability=legacy)
        for case in record.cases:
            if backend not in case.attention:
                continue
            forward_s = _attention_forward_s(rates, case)
            backward_s = rates.attention_backward_s(forward_s, "datasheet", fused=True)
            measured = case.attention[backend]
            label = f"{case.name} s{case.seq_len} attention/{backend}"
            out.append((record.device, label, f"{backend} forward", forward_s, measured.forward_s))
            out.append((record.device, label, f"{backend} forward+backward", forward_s + backward_s,
                        measured.forward_backward_s))
    return out


def _attention_forward_s(rates: Rates, case: LayerCase) -> float:
    """The cost model's causal attention core forward for one case (scores over the full s x s, half
    of them executed)."""
    x, b, s = case.shape, case.micro_batch, case.seq_len
    flops = 4.0 * b * s * s * x.q_heads * x.head_dim
    return rates.attention_time_and_source(flops, b=b, s=s, heads=x.q_heads, head_dim=x.head_dim,
                                           s_kv_block=s, executed_fraction=0.5)[0]


def _fit(axes: dict[str, tuple[float, ...]], base: Assumptions,
         pairs_at: Callable[[Assumptions], list[tuple[str, str, str, float, float]]]) -> KernelFit:
    """The grid point of ``axes`` over ``base`` with the least squared log error."""
    best: KernelFit | None = None
    names = sorted(axes)
    for values in itertools.product(*(axes[n] for n in names)):
        constants = dict(zip(names, values))
        residuals, host = _with_host_time(pairs_at(replace(base, **constants)))
        fit = KernelFit(constants=constants, residuals=residuals, host_s=host)
        if best is None or fit.rms_log_error < best.rms_log_error:
            best = fit
    assert best is not None
    return best


def fit_gemm(records: list[DeviceRecord], base: Assumptions = UNCALIBRATED) -> KernelFit:
    """``gemm_efficiency`` and ``gemm_k_overhead`` on every GEMM call of ``records``."""
    return _fit(GEMM_AXES, base, lambda a: gemm_pairs(records, a))


def fit_attention(records: list[DeviceRecord], base: Assumptions = UNCALIBRATED) -> tuple[KernelFit, KernelFit]:
    """(the native kernel's ``attention_efficiency`` and ``attention_backward_efficiency``; then
    FlashAttention-2's ``legacy_attention_share`` at those)."""
    native = _fit(ATTENTION_AXES, base, lambda a: attention_pairs(records, a, NATIVE_BACKEND))
    at_native = replace(base, **native.constants)
    legacy = _fit({"legacy_attention_share": LEGACY_AXIS}, at_native,
                  lambda a: attention_pairs(records, a, LEGACY_BACKEND))
    return native, legacy


def sustained_share(sustained: SustainedRecord, record: DeviceRecord) -> float:
    """Share of the burst GEMM rate the device sustains: the minute-long 8192^3 loop's median over
    the short burst of the same GEMM (``HardwareSpec.sustained_rate_share``)."""
    return sustained.gemm_flops_per_s / record.square_gemm_flops_per_s


def on_edge(constants: dict[str, float], axes: dict[str, tuple[float, ...]]) -> list[str]:
    """The constants that sit on an end of their grid."""
    return [k for k, v in constants.items() if k in axes and v in (axes[k][0], axes[k][-1])]
