"""Named, documented constants of the cost model that no datasheet gives.

Each is an assumption stated once; ``DEFAULT_ASSUMPTIONS`` applies the shipped calibration
(``data/calibration.json``) over them. A measured profile replaces the rates it covers;
``autoplan validate --calibrate`` fits the multiplicative factors from real runs and
stores them in the profile's ``calibration`` table (keys are these field names).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Mapping

from hardware_specs.units import MIB


@dataclass(frozen=True, slots=True, kw_only=True)
class Assumptions:
    """Efficiencies, overheads and buffer sizes the analytic model uses."""

    gemm_efficiency: float = 0.75
    """Achieved share of datasheet peak FLOP/s for large dense GEMMs (cuBLAS on A100/H100
    typically reaches 70-80% on transformer shapes; Megatron-LM reports 163 of 312 TFLOP/s,
    52% MFU, end to end on A100 - Narayanan et al. SC'21, Table 1)."""
    fp8_gemm_efficiency: float = 0.75
    """Achieved share of the datasheet fp8 peak for large fp8 GEMMs; 0.75 = the bf16 figure until
    calibrated (``costmodels/data/calibration.json``)."""
    memory_bandwidth_efficiency: float = 0.8
    """Achieved share of datasheet memory bandwidth for memory-bound kernels (norms, activations,
    optimizer step); STREAM-style copies reach 80-90% on HBM."""
    link_efficiency: float = 0.8
    """Achieved share of link bandwidth for collectives (NCCL bus bandwidth vs link rate)."""
    compute_scale: float = 1.0
    """Calibration factor multiplying every compute time (1.0 = uncalibrated)."""
    communication_scale: float = 1.0
    """Calibration factor multiplying every collective time."""
    memory_bound_scale: float = 1.0
    """Calibration factor multiplying memory-bound kernel times."""
    overlap_fraction: float = 1.0
    """Share of backward compute that data-parallel communication can hide behind (1 = all)."""
    overlap_slowdown: float = 0.1
    """Fraction by which compute slows while a collective runs beside it (``costmodels.overlap``):
    NCCL takes one SM per channel, and 8-16 channels are about 7-15% of an A100's 108 or an
    H100 SXM's 132 SMs (NVIDIA A100 / H100 architecture whitepapers; NCCL_MAX_NCHANNELS)."""
    step_overhead_s: float = 0.0
    """Fixed per-step time not modelled elsewhere (Python, launch latency); calibrated."""
    layer_overhead_s: float = 0.0
    """Host time to issue one layer's forward for one micro-batch (Python, autograd, kernel
    launches), twice that in backward. 0 by default: on a GPU the host runs ahead of the kernels
    and hides it unless the layer's kernels are tiny; calibrated where it is not hidden."""
    tp_layer_overhead_s: float = 0.0
    """Extra host time per layer forward when it is tensor-parallel under the torch runtime (DTensor
    dispatch and sharding propagation in PyTorch's TP), twice that in backward; calibrated like
    ``layer_overhead_s``."""
    allocator_fragmentation: float = 0.05
    """Extra memory the caching allocator holds over live activations and buffers (fraction)."""
    dp_bucket_bytes: float = 25 * MIB
    """Gradient bucket size for DDP / ZeRO-1/2 reduction (PyTorch DDP default bucket_cap_mb=25);
    two buckets are in flight."""

    def with_calibration(self, calibration: Mapping[str, float]) -> "Assumptions":
        """A copy with the fields named in ``calibration`` replaced; unknown keys are ignored."""
        names = {f.name for f in fields(self)}
        return replace(self, **{k: float(v) for k, v in calibration.items() if k in names})


CALIBRATION_FILE = Path(__file__).parent / "data" / "calibration.json"
"""The shipped default calibration: constants fitted on the published runs by
``benchmarks/calibrate.py --write``, with its command, date and leave-one-family-out figures."""


def shipped_calibration(path: Path = CALIBRATION_FILE) -> dict[str, float]:
    """The fitted constants of the shipped calibration file ({} if it is absent)."""
    if not path.is_file():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text(encoding="utf-8"))["constants"].items()}


UNCALIBRATED = Assumptions()
"""The documented defaults above, before the shipped calibration."""
DEFAULT_ASSUMPTIONS = UNCALIBRATED.with_calibration(shipped_calibration())
"""What the cost model uses unless told otherwise: the shipped calibration over the defaults; a
profile's ``calibration`` (``--profile``, ``validate --calibrate``) overrides it field by field."""
