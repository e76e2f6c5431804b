"""Named, documented constants of the cost model that no datasheet gives.

Each is an assumption stated once; ``DEFAULT_ASSUMPTIONS`` applies the shipped calibration
(``calibration.SHIPPED_CALIBRATION``: the constants fitted on the published runs, with their
provenance records) over them. A measured profile replaces the rates it covers;
``autoplan validate --calibrate`` fits the multiplicative factors from real runs and
stores them in the profile's ``calibration`` table (keys are these field names).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

from hardware_specs.units import MIB

from .calibration import SHIPPED_CALIBRATION


OWN_MEMORY_BAND_RUNTIME = "deepspeed"
"""The runtime whose memory band is made from the residuals of the families that ran it alone
(``Assumptions.deepspeed_memory_band_upper``). Its only measured family is the BLOOM sweep
(Megatron-DeepSpeed and PyTorch of early 2022, read with ``nvidia-smi``), whose peaks the model
under-predicts by a median 24% (``docs/published.md``); pooled, its residuals would refuse runs of
the other runtimes that ran (29 of 32 torchtitan runs, 55 of 93 NeMo configurations). The other
runtimes share one band, made from the residuals of the other families (``benchmarks/memory_fit.py``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Assumptions:
    """Efficiencies, overheads and buffer sizes the analytic model uses."""

    gemm_efficiency: float = 0.75
    """Achieved share of datasheet peak FLOP/s for large, well-quantised dense GEMMs; smaller
    shapes lose tile/wave quantisation and depth on top (``kernel_efficiency``). (cuBLAS on
    A100/H100 typically reaches 70-80% on transformer shapes; Megatron-LM reports 163 of 312 TFLOP/s,
    52% MFU, end to end on A100 - Narayanan et al. SC'21, Table 1)."""
    gemm_k_overhead: float = 128.0
    """Fixed per-tile prologue and epilogue of a GEMM, in elements of the reduction dim k it costs
    as much time as (``kernel_efficiency.depth_efficiency``: k / (k + k₀)); a multistage
    mainloop fills 2-3 slices of 32-64 k before its first MMA (CUTLASS docs, "Efficient GEMM")."""
    attention_efficiency: float = 0.72
    """Achieved share of the 16-bit peak of a fused attention kernel at head dim 128 and long key
    blocks: FlashAttention-2 reaches up to 73% of A100 peak forward (Dao 2023, abstract) and
    FlashAttention-3 75% of H100 (Shah et al. 2024, abstract). Backward has 2.5x the FLOPs
    (``flops.attention_backward_ratio``) at ``attention_backward_efficiency`` of this rate."""
    attention_backward_efficiency: float = 0.75
    """FLOP rate of a fused attention kernel's backward relative to its forward: FlashAttention-3
    reaches up to 740 TFLOP/s forward and about 550 backward at head dim 128 on H100 (Shah et al.
    2024, abstract and Fig. 5-6), FlashAttention-2 on A100 a similar ratio (Dao 2023, Fig. 4-6)."""
    attention_block_half_tokens: float = 256.0
    """Key-block length at which the attention kernel runs at half its ceiling
    (``kernel_efficiency.attention_block_efficiency``; FlashAttention-2, Dao 2023, Fig. 4-6)."""
    attention_head_dim_half: float = 32.0
    """Head dim at which the attention kernel's matmul share is one half
    (``kernel_efficiency.attention_head_dim_efficiency``; FlashAttention-2 Fig. 4-6: head dim 64 at
    about 0.85x the rate of 128)."""
    legacy_attention_share: float = 0.5
    """Rate of an attention kernel written for an older GPU architecture relative to one written
    for the part it runs on (``kernel_efficiency.attention_kernel_share``): FlashAttention-2 (sm80)
    on H100 reaches 35% of peak against FlashAttention-3's 75% (Shah et al. 2024, abstract), and
    cuDNN attention runs 1.7-2.3x faster than it on Hopper training shapes."""
    fp8_gemm_efficiency: float = 0.75
    """Achieved share of the datasheet fp8 peak for large fp8 GEMMs; 0.75 = the bf16 figure until
    calibrated (``costmodels/calibration_data.py``)."""
    memory_bandwidth_efficiency: float = 0.8
    """Achieved share of datasheet memory bandwidth for memory-bound kernels (norms, activations,
    optimizer step); STREAM-style copies reach 80-90% on HBM."""
    link_efficiency: float = 0.8
    """Achieved share of the intra-node link bandwidth for collectives (NCCL bus bandwidth vs the
    NVLink / NVSwitch rate; nccl-tests on 8-GPU H100 nodes read about 360 of 450 GB/s)."""
    network_efficiency: float = 0.8
    """Achieved share of the NICs' line rate for collectives that cross nodes (NCCL bus bandwidth
    over InfiniBand or RoCE); fitted on the published runs (``benchmarks/calibrate.py``). nccl-tests
    on 400 Gb/s NDR read 40-48 GB/s of each NIC's 50."""
    compute_scale: float = 1.0
    """Calibration factor multiplying every GEMM time (1.0 = uncalibrated)."""
    attention_scale: float = 1.0
    """Calibration factor multiplying every attention-core time."""
    communication_scale: float = 1.0
    """Calibration factor multiplying every collective time."""
    intra_node_comm_scale: float = 1.0
    """Calibration factor multiplying the time of collectives whose group stays inside a node
    (NVLink), on top of ``communication_scale``."""
    inter_node_comm_scale: float = 1.0
    """Calibration factor multiplying the time of collectives whose group spans nodes (the NICs),
    on top of ``communication_scale``."""
    memory_bound_scale: float = 1.0
    """Calibration factor multiplying memory-bound kernel times."""
    overlap_fraction: float = 1.0
    """Share of backward compute that data-parallel communication can hide behind (1 = all)."""
    overlap_slowdown: float = 0.1
    """Fraction by which compute slows while a collective runs beside it (``costmodels.overlap``):
    NCCL takes one SM per channel, and 8-16 channels are about 7-15% of an A100's 108 or an
    H100 SXM's 132 SMs (NVIDIA A100 / H100 architecture whitepapers; NCCL_MAX_NCHANNELS). Set
    here, not fitted: the published runs do not determine it (``benchmarks/calibrate.py``)."""
    step_overhead_s: float = 0.0
    """Fixed per-step time not modelled elsewhere (Python, launch latency); calibrated."""
    layer_overhead_s: float = 2.4e-3
    """Host time to issue one eager layer's forward for one micro-batch (Python, autograd, kernel
    launches), ``backward_host_ratio`` times that in backward; a floor under the layer's kernel time
    (``layer_costs.issue_bound_s``), charged to eager runtimes only (``LayerCosts._host_s``). The
    H100 step trace of the generated job reads 2.3-2.5 ms of host time per layer forward (60.7 ms
    for Qwen2.5-0.5B's 24 layers, 36.1 ms for Llama 3.2 1B's 16;
    ``benchmarks/data/gpu/trace/h100-2026-11-26-step-trace.json``)."""
    backward_host_ratio: float = 1.3
    """Host time to issue one layer's backward over its forward's: the autograd engine runs the
    backward's operators from C++, so it issues about twice the kernels in not much more time. The
    H100 step trace of the generated job (``benchmarks/data/gpu/trace/h100-2026-11-26-step-trace.json``,
    host ms per phase) reads 84.6 / 60.7 = 1.39 (Qwen2.5-0.5B), 41.3 / 36.1 = 1.14 (Llama 3.2 1B),
    15.9 / 12.3 = 1.29 (Llama 3 8B, 4 layers): 1.3, their median rounded."""
    moe_sync_overhead_s: float = 0.0
    """Device idle time per MoE layer forward after the dispatcher's device-to-host sync of the
    per-expert token counts (``layer_costs.moe_sync_s``); calibrated (0 = uncalibrated)."""
    tp_layer_overhead_s: float = 0.0
    """Extra host time per layer forward when it is tensor-parallel under the torch runtime (DTensor
    dispatch and sharding propagation in PyTorch's TP), twice that in backward; calibrated like
    ``layer_overhead_s``."""
    expert_gemm_min_s: float = 33e-6
    """Least time of one expert's GEMM where a runtime runs one kernel per local expert
    (``RuntimeConvention.kernel_per_expert``): 0.267 ms for 8 experts of 128 tokens at N = K =
    2048 on SM100 through Transformer Engine's multi-stream cuBLASLt path, a few µs of FLOPs
    (TransformerEngine PR #3134, "TN (fprop)" table, kernel time only; ``moe_costs.per_expert_kernels_s``)."""
    allocator_fragmentation: float = 0.05
    """Extra memory the caching allocator holds over live activations and buffers (fraction), beside
    one block of the largest transient (``reserved.fragmentation_bytes``); fitted on the measured
    peak memory of the published runs (``benchmarks/memory_fit.py``)."""
    nccl_channels: float = 16.0
    """NCCL channels per communicator (``reserved.nccl_buffer_bytes``): an assumption, NCCL picks
    them per topology (up to 32, ``MAXCHANNELS``; 16 is typical of an 8-GPU NVSwitch node)."""
    memory_band_upper: float = 0.0
    """Upper edge of the memory band, as measured / predicted peak - 1 at ``MEMORY_BAND_QUANTILE``
    of the leave-one-family-out residuals (``benchmarks/memory_fit.py``): a layout fits only when
    its peak × (1 + this) is under the memory cap (``CostModel.capacity_bytes``). Every runtime but
    ``OWN_MEMORY_BAND_RUNTIME`` takes it (``memory_band_upper_for``)."""
    deepspeed_memory_band_upper: float = 0.0
    """The same edge for the deepspeed runtime, from the residuals of the families that ran it alone
    (``OWN_MEMORY_BAND_RUNTIME``)."""
    dp_bucket_bytes: float = 25 * MIB
    """Gradient bucket size for DDP / ZeRO-1/2 reduction (PyTorch DDP default bucket_cap_mb=25);
    two buckets are in flight."""

    def memory_band_upper_for(self, runtime: str) -> float:
        """The memory band's upper edge for a job that ``runtime`` runs (``OWN_MEMORY_BAND_RUNTIME``)."""
        return self.deepspeed_memory_band_upper if runtime == OWN_MEMORY_BAND_RUNTIME else self.memory_band_upper

    def with_calibration(self, calibration: Mapping[str, float]) -> "Assumptions":
        """A copy with the fields named in ``calibration`` replaced; unknown keys are ignored."""
        names = {f.name for f in fields(self)}
        return replace(self, **{k: float(v) for k, v in calibration.items() if k in names})


UNCALIBRATED = Assumptions()
"""The documented defaults above, before the shipped calibration."""
DEFAULT_ASSUMPTIONS = UNCALIBRATED.with_calibration(SHIPPED_CALIBRATION)
"""What the cost model uses unless told otherwise: the shipped calibration over the defaults; a
profile's ``calibration`` (``--profile``, ``validate --calibrate``) overrides it field by field."""
