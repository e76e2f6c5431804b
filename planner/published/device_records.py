"""One device's kernel and layer times, as measured on a lent GPU (``benchmarks/data/gpu/device``).

A layer-times record (``layer_truth-<device>-<date>.json``) holds, for Llama layers sliced as tensor
parallelism slices them (``LAYER_SHAPES``), micro-batch 1: each weight GEMM of the layer timed alone
(``F.linear`` under autograd, forward and forward + backward), causal SDPA alone per backend, the
sum of the fastest of those (``kernel_floor_ms``), a whole eager layer and, for some shapes, the
same layer under ``torch.compile``. All times are medians of CUDA-event timings of short bursts.
A sustained record (``sustained-<device>-<date>.json``) holds one-second samples of a minute-long
8192^3 GEMM loop and of four stacked eager layers: rate, SM clock, power.

This module reads them into typed cases; ``device_kernels`` fits the kernel constants on them and
``device_layers`` holds the cost model's layers against them. Pure Python, no torch.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from autoplan_base.errors import SpecError
from costmodels.flops import Gemm

DEVICE_DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "gpu" / "device"
"""Where the measured records are kept."""
DEVICE_PRESETS: dict[str, str] = {"NVIDIA H100 80GB HBM3": "h100-sxm-80gb", "NVIDIA H200": "h200-sxm-141gb"}
"""Hardware preset of each device name the records carry."""
DEVICE_RECORD_NAMES: tuple[str, ...] = ("h100-2026-11-28", "h200-2026-11-28")
"""The device-date tags of the shipped records (``layer_truth-<tag>.json``, ``sustained-<tag>.json``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerShape:
    """A Llama layer as one tensor-parallel rank holds it (widths local to the rank)."""

    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    """Local FFN width f/t (the gate and up projections are each this wide)."""

    def gemms(self, tokens: int) -> dict[str, Gemm]:
        """The layer's forward weight GEMMs by name, as the measuring script ran them: fused QKV,
        output projection, fused gate/up, down projection."""
        h, d = self.hidden, self.head_dim
        return {"qkv": Gemm(m=tokens, n=(self.q_heads + 2 * self.kv_heads) * d, k=h),
                "o": Gemm(m=tokens, n=h, k=self.q_heads * d),
                "gate_up": Gemm(m=tokens, n=2 * self.ffn, k=h),
                "down": Gemm(m=tokens, n=h, k=self.ffn)}


LAYER_SHAPES: dict[str, LayerShape] = {
    "l70-tp8": LayerShape(hidden=8192, q_heads=8, kv_heads=1, head_dim=128, ffn=3584),
    "l70-tp4": LayerShape(hidden=8192, q_heads=16, kv_heads=2, head_dim=128, ffn=7168),
    "l70-tp2": LayerShape(hidden=8192, q_heads=32, kv_heads=4, head_dim=128, ffn=14336),
    "l8-tp1": LayerShape(hidden=4096, q_heads=32, kv_heads=8, head_dim=128, ffn=14336),
    "l8-tp2": LayerShape(hidden=4096, q_heads=16, kv_heads=4, head_dim=128, ffn=7168),
}
"""The measured shapes: Llama 3 70B (h 8192, 64 q / 8 kv heads, f 28672) at tp 8, 4, 2 and Llama 3
8B (h 4096, 32 / 8, f 14336) at tp 1, 2 (``shared/gpu/layer_truth.py``'s table)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelTime:
    """One kernel (or kernel pair) timed alone: forward, and forward + backward, in seconds."""

    forward_s: float
    forward_backward_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCase:
    """One measured shape at one sequence length."""

    name: str
    """``LAYER_SHAPES`` key."""
    shape: LayerShape
    seq_len: int
    micro_batch: int
    gemms: dict[str, KernelTime]
    """Each weight GEMM of ``shape.gemms`` timed alone."""
    attention: dict[str, KernelTime]
    """Causal SDPA alone by backend (``default``, ``flash``, ``cudnn``), where it ran."""
    kernel_floor_s: float
    """The GEMMs' forward + backward plus the fastest attention backend's."""
    eager_layer_s: float
    """A whole eager layer's forward + backward (of four stacked)."""
    compiled_layer_s: float | None
    """The same layer under ``torch.compile``; None where not measured."""

    @property
    def tokens(self) -> int:
        return self.seq_len * self.micro_batch

    @property
    def fastest_layer_s(self) -> float:
        """The fastest way the device ran this layer: the bare kernels or the fused layer."""
        return min(self.kernel_floor_s, self.compiled_layer_s or self.kernel_floor_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRecord:
    """One device's layer-times record."""

    device: str
    preset: str
    """Hardware preset of the device (``DEVICE_PRESETS``)."""
    torch_version: str
    square_gemm_flops_per_s: float
    """A short burst of 8192^3 bf16 GEMMs: the device's reachable rate in that run."""
    cases: tuple[LayerCase, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SustainedRecord:
    """Medians of one device's minute-long loads."""

    device: str
    gemm_flops_per_s: float
    """8192^3 bf16 GEMM loop, median of the one-second samples."""
    gemm_sm_clock_mhz: float
    layer_flops_per_s: float
    """Forward + backward of four stacked eager Llama-70B tp-8 layers (sequence 8192)."""
    layer_sm_clock_mhz: float


def _ms(value: object, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise SpecError(f"{where}: expected a positive time in ms, got {value!r}")
    return float(value) / 1e3


def _kernel(raw: dict, where: str) -> KernelTime:
    return KernelTime(forward_s=_ms(raw.get("fwd_ms"), f"{where}.fwd_ms"),
                      forward_backward_s=_ms(raw.get("fwdbwd_ms"), f"{where}.fwdbwd_ms"))


def _case(raw: dict, where: str) -> LayerCase:
    name = raw.get("shape")
    if name not in LAYER_SHAPES:
        raise SpecError(f"{where}.shape: {name!r} is not one of {', '.join(LAYER_SHAPES)}")
    shape = LAYER_SHAPES[name]
    gemms = {g: _kernel(raw["gemm"][g], f"{where}.gemm.{g}") for g in shape.gemms(1)}
    attention = {b: _kernel(v, f"{where}.attn.{b}") for b, v in raw["attn"].items() if v.get("fwd_ms")}
    compiled = raw.get("compiled_layer_ms")
    return LayerCase(name=name, shape=shape, seq_len=int(raw["seq"]), micro_batch=int(raw["mb"]), gemms=gemms,
                     attention=attention, kernel_floor_s=_ms(raw["kernel_floor_ms"], f"{where}.kernel_floor_ms"),
                     eager_layer_s=_ms(raw["eager_layer_ms"], f"{where}.eager_layer_ms"),
                     compiled_layer_s=None if compiled is None else _ms(compiled, f"{where}.compiled_layer_ms"))


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SpecError(f"{path}: cannot read a device record ({err})") from None


def load_device_record(tag: str, directory: Path = DEVICE_DATA) -> DeviceRecord:
    """The layer-times record ``layer_truth-<tag>.json``."""
    path = directory / f"layer_truth-{tag}.json"
    raw = _load(path)
    device = raw.get("device")
    if device not in DEVICE_PRESETS:
        raise SpecError(f"{path}: device {device!r} has no hardware preset; known: {', '.join(DEVICE_PRESETS)}")
    cases = tuple(_case(row, f"{path.name}: rows[{i}]") for i, row in enumerate(raw["rows"]))
    return DeviceRecord(device=device, preset=DEVICE_PRESETS[device], torch_version=str(raw.get("torch")),
                        square_gemm_flops_per_s=float(raw["square_8192_tflops"]) * 1e12, cases=cases)


def load_sustained_record(tag: str, directory: Path = DEVICE_DATA) -> SustainedRecord:
    """The sustained-load record ``sustained-<tag>.json``: medians of its one-second samples."""
    raw = _load(directory / f"sustained-{tag}.json")
    med = lambda rows, key: statistics.median(float(r[key]) for r in rows)  # noqa: E731
    return SustainedRecord(device=raw["device"], gemm_flops_per_s=med(raw["gemm"], "tflops") * 1e12,
                           gemm_sm_clock_mhz=med(raw["gemm"], "sm_mhz"),
                           layer_flops_per_s=med(raw["layers"], "tflops") * 1e12,
                           layer_sm_clock_mhz=med(raw["layers"], "sm_mhz"))
