"""Timing of compute and memory-bound kernels on one device (imports torch).

Imported only from ``profiles.harness.main`` (under torchrun), never by ``import profiles``.
The same code runs on CPU and CUDA; only the ``Timer``'s time stamps differ (CUDA events on GPU,
the wall clock on CPU). Calls are timed in batches of back-to-back calls between two stamps,
with one host synchronisation after the last batch (as nccl-tests times its iterations), so
the host's launch gap between calls is not counted as device time.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from .shapes import MeasurePlan

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NORM_WIDTH = 1024
"""Row width of the layer-norm, RMSNorm and softmax buffers (a hidden size / sequence length)."""
BATCH_TARGET_S = 0.005
"""Back-to-back calls per timed batch are chosen to last about this long (seconds)."""
BATCH_MAX_CALLS = 4096
"""At most this many calls per batch: a 4 KiB NCCL all-reduce (about 10 us) gets 500."""
WARMUP_CALLS = 3
"""Calls in the warm-up batch that sizes the timed batches."""
FP8_MAX = 448.0
"""Largest finite float8 e4m3 value (Micikevicius et al. 2022, "FP8 formats for deep learning")."""


class Timer:
    """Time stamps on the device's own clock: CUDA events on GPU, the wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        """Wait for queued device work (no-op on CPU, where calls are synchronous)."""
        if self.cuda:
            torch.cuda.synchronize()

    def stamp(self) -> object:
        """A point in the device's queue: a recorded event on GPU, ``perf_counter`` on CPU."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds_between(self, start: object, end: object) -> float:
        """Seconds between two stamps (read after ``sync``)."""
        if self.cuda:
            return start.elapsed_time(end) / 1e3  # type: ignore[attr-defined]
        return end - start  # type: ignore[operator]

    def batch_times_s(self, fn: Callable[[], object], calls: int, repeats: int) -> list[float]:
        """Seconds per call of ``repeats`` back-to-back batches of ``calls`` calls each: one stamp
        between batches, one sync after the last, each batch's time divided by ``calls``."""
        stamps = [self.stamp()]
        for _ in range(repeats):
            for _ in range(calls):
                fn()
            stamps.append(self.stamp())
        self.sync()
        return [self.seconds_between(a, b) / calls for a, b in zip(stamps, stamps[1:])]


def batch_counts(per_call_s: float, plan: MeasurePlan) -> tuple[int, int]:
    """(calls per batch, batches) for a call of ``per_call_s``: batches of about
    ``BATCH_TARGET_S`` (at most ``BATCH_MAX_CALLS`` calls), as many as ``plan.time_budget_s``
    pays for, within ``plan.min_repeats`` and ``plan.max_repeats``."""
    per_call_s = max(per_call_s, 1e-9)
    calls = min(BATCH_MAX_CALLS, max(1, math.ceil(BATCH_TARGET_S / per_call_s)))
    repeats = min(plan.max_repeats, max(plan.min_repeats, math.ceil(plan.time_budget_s / (per_call_s * calls))))
    return calls, repeats


def warmup_time_s(fn: Callable[[], object], timer: Timer) -> float:
    """Seconds per call of the warm-up batch that sizes the timed ones: ``WARMUP_CALLS`` calls
    back to back. On CPU, where a call returns when its work is done, the batch ends early once
    it has lasted ``BATCH_TARGET_S``: a call that slow is timed one per batch whatever the count
    (a bf16 GEMM without native bf16 instructions takes about a second)."""
    if timer.cuda:
        (warm,) = timer.batch_times_s(fn, WARMUP_CALLS, 1)
        return warm
    times: list[float] = []
    while len(times) < WARMUP_CALLS and sum(times) < BATCH_TARGET_S:
        times += timer.batch_times_s(fn, 1, 1)
    return statistics.fmean(times)


def median_time_s(fn: Callable[[], object], timer: Timer, plan: MeasurePlan) -> float:
    """Median seconds per call of ``fn`` over timed batches (``batch_counts``), after one call
    and the warm-up batch that sizes them (``warmup_time_s``)."""
    fn()
    timer.sync()
    return statistics.median(timer.batch_times_s(fn, *batch_counts(warmup_time_s(fn, timer), plan)))


def burn_in(fn: Callable[[], object], seconds: float, timer: Timer) -> None:
    """Run ``fn`` back to back for ``seconds`` of wall time, so clocks and power reach the state
    a training run holds them in before anything is timed."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        fn()
        timer.sync()


SUSTAINED_BATCHES = 5
"""Timed batches before and after the burn-in (their median is the rate)."""


def sustained_burn_in(fn: Callable[[], object], seconds: float, timer: Timer) -> dict[str, float]:
    """Burn in for ``seconds`` and measure what the load keeps: the median seconds per call of
    ``fn`` in a short burst before (after a warm-up batch), and again at the end of the burn-in,
    when a power-capped part has settled at its sustained clock (an H100 reaches it within about
    4 s of an 8192^3 GEMM loop: ``benchmarks/data/gpu/device/sustained-h100-2026-11-28.json``).
    ``burst_s / sustained_s`` is the part's sustained rate share (``HardwareSpec.sustained_rate_share``)."""
    calls = min(BATCH_MAX_CALLS, max(1, math.ceil(BATCH_TARGET_S / max(warmup_time_s(fn, timer), 1e-9))))
    burst = statistics.median(timer.batch_times_s(fn, calls, SUSTAINED_BATCHES))
    burn_in(fn, seconds, timer)
    sustained = statistics.median(timer.batch_times_s(fn, calls, SUSTAINED_BATCHES))
    return {"burst_s": burst, "sustained_s": sustained, "burn_in_s": seconds}


def rotation_copies(footprint_bytes: int, flush_bytes: int) -> int:
    """Copies of a ``footprint_bytes`` operand set that together cover ``flush_bytes`` (at least 1)."""
    return max(1, math.ceil(flush_bytes / max(footprint_bytes, 1)))


def rotating(make: Callable[[int], Callable[[], object]], copies: int) -> Callable[[], object]:
    """A call that runs ``make(0)``, ``make(1)``, ... ``make(copies - 1)`` in turn."""
    calls = itertools.cycle([make(i) for i in range(copies)])
    return lambda: next(calls)()


def supported_gemm_dtypes(device: torch.device) -> tuple[list[str], dict[str, str]]:
    """Dtypes to profile on ``device`` and, for those skipped, why."""
    if device.type != "cuda":
        return ["fp32", "bf16"], {"fp16": "CPU fp16 matmul is emulated; not profiled", "fp8": "no CPU fp8 GEMM"}
    dtypes, skipped = ["fp32", "fp16"], {}
    if torch.cuda.is_bf16_supported():
        dtypes.insert(1, "bf16")
    else:
        skipped["bf16"] = "torch.cuda.is_bf16_supported() is False"
    if torch.cuda.get_device_capability(device) < (8, 9) or not hasattr(torch, "float8_e4m3fn"):
        skipped["fp8"] = "fp8 GEMMs need compute capability 8.9 or newer"
        return dtypes, skipped
    try:
        gemm_call(64, 64, 64, "fp8", device)()
        dtypes.append("fp8")
    except (RuntimeError, TypeError) as err:  # torch._scaled_mm's signature and support vary by release
        skipped["fp8"] = f"torch._scaled_mm failed: {str(err).splitlines()[0][:200]}"
    return dtypes, skipped


def tensorwise_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` cast to float8 e4m3 with one scale for the tensor, from its absolute maximum (the
    dynamic tensor-wise recipe of torchao's float8 training), and the inverse scale to undo it."""
    scale = FP8_MAX / x.abs().amax().float().clamp(min=1e-12)
    return (x.float() * scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale.reciprocal()


def scaled_fp8_matmul(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w.T`` as fp8 training runs it: amax, scale and cast of both operands each call,
    then ``torch._scaled_mm`` with the inverse scales and a bf16 output."""
    a8, inv_a = tensorwise_fp8(a)
    w8, inv_w = tensorwise_fp8(w)
    return torch._scaled_mm(a8, w8.t(), scale_a=inv_a, scale_b=inv_w, out_dtype=torch.bfloat16)


def gemm_call(m: int, n: int, k: int, dtype: str, device: torch.device, flush_bytes: int = 0) -> Callable[[], object]:
    """A no-allocation (m×k)·(k×n) matmul in ``dtype``, rotating through operand copies that
    cover ``flush_bytes`` so each call reads operands the last ones evicted. fp8 runs the
    tensor-wise scaled recipe (``scaled_fp8_matmul``) on bf16 operands (output bf16)."""
    fp8 = dtype == "fp8"
    dt = torch.bfloat16 if fp8 else TORCH_DTYPES[dtype]
    elem = torch.empty((), dtype=dt).element_size()
    copies = rotation_copies(elem * (m * k + k * n + m * n), flush_bytes)
    a = torch.randn(copies, m, k, device=device, dtype=dt)
    b = torch.randn(copies, n, k, device=device, dtype=dt) if fp8 else torch.randn(copies, k, n, device=device, dtype=dt)
    if fp8:
        return rotating(lambda i: (lambda x=a[i], w=b[i]: scaled_fp8_matmul(x, w)), copies)
    c = torch.empty(copies, m, n, device=device, dtype=dt)
    return rotating(lambda i: (lambda x=a[i], w=b[i], out=c[i]: torch.mm(x, w, out=out)), copies)


def attention_call(batch: int, seq_len: int, num_heads: int, head_dim: int, dtype: str,
                   device: torch.device) -> Callable[[], object]:
    """Causal scaled-dot-product attention, forward and backward (gradients of q, k, v)."""
    dt = TORCH_DTYPES[dtype]
    q, k, v = (torch.randn(batch, num_heads, seq_len, head_dim, device=device, dtype=dt, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(batch, num_heads, seq_len, head_dim, device=device, dtype=dt)

    def call() -> object:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(out, (q, k, v), grad)

    return call


def memory_call(kernel: str, size_bytes: int, device: torch.device, flush_bytes: int = 0) -> Callable[[], object]:
    """A memory-bound kernel reading and writing ``size_bytes`` of fp32: copy (into a
    preallocated buffer), layer norm, RMSNorm or softmax over rows of ``NORM_WIDTH``; inputs
    rotate through copies covering ``flush_bytes``."""
    if kernel not in ("copy", "layer_norm", "rms_norm", "softmax"):
        raise ValueError(f"unknown memory kernel {kernel!r}")
    copies = rotation_copies(2 * size_bytes, flush_bytes)
    x = torch.randn(copies, size_bytes // 4 // NORM_WIDTH, NORM_WIDTH, device=device)
    if kernel == "copy":
        y = torch.empty_like(x)
        return rotating(lambda i: (lambda src=x[i], dst=y[i]: dst.copy_(src)), copies)
    if kernel == "layer_norm":
        return rotating(lambda i: (lambda src=x[i]: F.layer_norm(src, (NORM_WIDTH,))), copies)
    if kernel == "rms_norm":
        return rotating(lambda i: (lambda src=x[i]: F.rms_norm(src, (NORM_WIDTH,))), copies)
    return rotating(lambda i: (lambda src=x[i]: torch.softmax(src, dim=-1)), copies)
