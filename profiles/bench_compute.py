"""Timing of compute and memory-bound kernels on one device (imports torch).

Imported only from ``profiles.harness.main`` (under torchrun), never by ``import profiles``.
The same code runs on CPU and CUDA; only the ``Timer`` differs (CUDA events on GPU).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from .shapes import MeasurePlan

TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NORM_WIDTH = 1024
"""Row width of the layer-norm, RMSNorm and softmax buffers (a hidden size / sequence length)."""


class Timer:
    """Seconds of one call: wall clock on CPU, CUDA events around the call on GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        """Wait for queued device work (no-op on CPU, where calls are synchronous)."""
        if self.cuda:
            torch.cuda.synchronize()

    def time_s(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        begin = time.perf_counter()
        fn()
        return time.perf_counter() - begin


def median_time_s(fn: Callable[[], object], timer: Timer, plan: MeasurePlan) -> float:
    """Median seconds of ``fn`` after one warm-up, repeated until ``plan.time_budget_s`` is spent
    (at least ``min_repeats``, at most ``max_repeats`` times)."""
    timer.sync()
    timer.time_s(fn)
    times: list[float] = []
    while len(times) < plan.max_repeats and (len(times) < plan.min_repeats or sum(times) < plan.time_budget_s):
        times.append(timer.time_s(fn))
    return statistics.median(times)


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


def gemm_call(m: int, n: int, k: int, dtype: str, device: torch.device) -> Callable[[], object]:
    """A no-allocation (m×k)·(k×n) matmul in ``dtype`` (fp8 through ``torch._scaled_mm``)."""
    if dtype == "fp8":
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt needs
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    dt = TORCH_DTYPES[dtype]
    a, b = torch.randn(m, k, device=device, dtype=dt), torch.randn(k, n, device=device, dtype=dt)
    c = torch.empty(m, n, device=device, dtype=dt)
    return lambda: torch.mm(a, b, out=c)


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


def memory_call(kernel: str, size_bytes: int, device: torch.device) -> Callable[[], object]:
    """A memory-bound kernel reading and writing ``size_bytes`` of fp32: copy (into a
    preallocated buffer), layer norm, RMSNorm or softmax over rows of ``NORM_WIDTH``."""
    numel = size_bytes // 4
    x = torch.randn(numel // NORM_WIDTH, NORM_WIDTH, device=device)
    if kernel == "copy":
        y = torch.empty_like(x)
        return lambda: y.copy_(x)
    if kernel == "layer_norm":
        return lambda: F.layer_norm(x, (NORM_WIDTH,))
    if kernel == "rms_norm":
        return lambda: F.rms_norm(x, (NORM_WIDTH,))
    if kernel == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    raise ValueError(f"unknown memory kernel {kernel!r}")
