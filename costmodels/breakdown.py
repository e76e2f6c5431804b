"""``CostBreakdown``: the cost model's answer for one layout. Named terms sum to the totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hardware_specs.units import GIB

from .goodput import Goodput
from .layout import Layout

if TYPE_CHECKING:
    from .process_groups import Placement

TIME_TERMS: tuple[str, ...] = (
    "compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "dp_comm_s", "pp_comm_s",
    "bubble_s", "optimizer_s", "offload_s", "overhead_s",
)
MEMORY_TERMS: tuple[str, ...] = (
    "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes", "overhead_bytes",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Device memory of one pipeline rank, by component (bytes)."""

    params_bytes: float
    grads_bytes: float
    """Gradients live at the rank's peak (``rank_memory.grads_live_at_peak``)."""
    optimizer_bytes: float
    activations_bytes: float
    """Saved for backward at the schedule's peak (in-flight micro-batches), plus recompute working set;
    under eager activations, what is live of them in the phase that sets the peak
    (``peak_phase``; ``backward_peak.peak_phase``), its working tensors included."""
    buffers_bytes: float
    """Communication buffers: DP buckets, ZeRO-3 prefetched params, TP gathers, pipeline send/recv."""
    overhead_bytes: float
    """What the process holds outside its tensors: the sum of ``overhead_parts``."""
    host_bytes: float = 0.0
    """Host RAM of this rank's offloaded optimizer states; not device memory, not in ``total_bytes``."""
    grads_freed_bytes: float = 0.0
    """Gradients the rank allocates during backward that are not live at its peak (a runtime that
    frees them every step, running one micro-batch): its gradients in all are ``grads_bytes`` +
    ``grads_freed_bytes``. Not in ``total_bytes``."""
    overhead_parts: tuple[tuple[str, float], ...] = ()
    """``overhead_bytes`` by named term (``costmodels.reserved``): cuda_context, nccl_buffers,
    workspaces, fragmentation."""
    buffer_parts: tuple[tuple[str, float], ...] = ()
    """``buffers_bytes`` by parallelism (``rank_memory.rank_buffer_parts``): data_parallel,
    tensor_parallel, pipeline; only the non-zero ones."""
    schedule_activations_bytes: float = 0.0
    """Activations at the schedule's peak, saved and working (what ``activations_bytes`` is unless
    another phase sets the peak): what the job's saved-tensor probe compares with. Not in
    ``total_bytes``."""
    peak_phase: str = "loss"
    """The step phase that sets the peak (``backward_peak.PeakPhase.name``): loss, first layer
    backward, last layer backward, optimizer step or clip; loss where activations and held
    gradients peak together."""

    @property
    def total_bytes(self) -> float:
        """The sum of the ``MEMORY_TERMS``."""
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.buffers_bytes + self.overhead_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class CostBreakdown:
    """Per-GPU memory, step time and traffic of one layout. ``fits`` is a value, not an exception."""

    layout: Layout
    stages: tuple[StageMemory, ...]
    """Memory of each pipeline rank, rank 0 first."""
    memory_capacity_bytes: float
    """The cap the point peak must stay under: usable device memory (--memory-fraction × device
    memory) over 1 + ``memory_band_upper``."""
    compute_s: float
    """GEMMs, attention, memory-bound kernels and host time to issue them (``Assumptions.
    layer_overhead_s``), forward and backward, on the critical path."""
    recompute_s: float
    """Forward work repeated in backward (activation recomputation)."""
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    dp_comm_s: float
    """Data-parallel / ZeRO traffic not hidden behind compute."""
    pp_comm_s: float
    """Pipeline send/recv on the critical path."""
    bubble_s: float
    optimizer_s: float
    offload_s: float
    """Optimizer offload: host transfers and the CPU optimizer step."""
    overhead_s: float
    """Fixed per-step overhead (calibrated; 0 by default)."""
    comm_bytes_per_gpu: dict[str, float] = field(default_factory=dict)
    """Bytes sent per GPU per step, by collective (e.g. ``tp_all_reduce``)."""
    model_flops_per_step: float
    """Model FLOPs of one step over the whole job (PaLM definition)."""
    hardware_flops_per_step: float
    """Model FLOPs plus recomputation."""
    tokens_per_step: int
    num_gpus: int
    peak_flops_per_gpu: float
    """The 16-bit dense peak MFU is quoted against, even for low-precision training."""
    low_precision_peak_flops_per_gpu: float = 0.0
    """The dense peak of a low-precision recipe's GEMMs (fp8, MXFP8, NVFP4); 0 = 16/32-bit training."""
    sources: dict[str, str] = field(default_factory=dict)
    """Per term, ``datasheet``, ``profile`` (measured by ``autoplan profile``) or ``profile (SOURCE)``
    for a profile curve imported from SOURCE (``nccl-tests``, ``trace``; ``profiles.schema.CURVE_SOURCES``)."""
    peak_stage_index: int = -1
    """Index of the rank with the most memory; -1 = found on construction."""
    memory_band_upper: float = 0.0
    """The memory band's upper edge folded into ``memory_capacity_bytes`` (measured / predicted - 1
    at its quantile, the runtime's: ``Assumptions.memory_band_upper_for``)."""
    host_memory_capacity_bytes: float = float("inf")
    """Host RAM of one node (``NodeSpec.host_memory_bytes``)."""
    ranks_per_node: int = 1
    """Ranks that share one node's host RAM."""
    goodput: Goodput | None = None
    """Checkpoint interval and expected goodput after failures (``costmodels.goodput``)."""
    placement: "Placement | None" = None
    """Where the ranks sit on multi-node NVLink domains (``process_groups.describe``); None where a
    node is its own NVLink domain."""

    def __post_init__(self) -> None:
        if self.peak_stage_index < 0:
            totals = [st.total_bytes for st in self.stages]
            object.__setattr__(self, "peak_stage_index", totals.index(max(totals)))

    @property
    def step_time_s(self) -> float:
        """The sum of the ``TIME_TERMS``."""
        return (self.compute_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s
                + self.dp_comm_s + self.pp_comm_s + self.bubble_s + self.optimizer_s + self.offload_s
                + self.overhead_s)

    @property
    def peak_stage(self) -> StageMemory:
        """The pipeline rank with the most memory (the first such rank)."""
        return self.stages[self.peak_stage_index]

    @property
    def peak_memory_bytes(self) -> float:
        return self.peak_stage.total_bytes

    @property
    def host_memory_bytes_per_node(self) -> float:
        """Offloaded states one node's host RAM holds: ranks per node × the largest rank's share
        (exact when a node holds one pipeline stage, an upper bound when it mixes stages)."""
        return self.ranks_per_node * max(st.host_bytes for st in self.stages)

    @property
    def memory_usable_bytes(self) -> float:
        """Usable device memory, before the band: ``memory_capacity_bytes`` × (1 + ``memory_band_upper``)."""
        return self.memory_capacity_bytes * (1 + self.memory_band_upper)

    @property
    def host_fits(self) -> bool:
        """The offloaded optimizer states fit in the node's host RAM."""
        return self.host_memory_bytes_per_node <= self.host_memory_capacity_bytes

    @property
    def fits(self) -> bool:
        """Device memory and, with optimizer offload, host RAM both hold what the layout keeps."""
        return self.peak_memory_bytes <= self.memory_capacity_bytes and self.host_fits

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (PaLM): model FLOPs/s over the job's peak FLOP/s."""
        return self.model_flops_per_step / self.step_time_s / (self.num_gpus * self.peak_flops_per_gpu)

    @property
    def mfu_low_precision(self) -> float:
        """MFU against the low-precision dense peak (0 for 16/32-bit training): the figure some
        fp8 reports quote beside the bf16-peak MFU."""
        if not self.low_precision_peak_flops_per_gpu:
            return 0.0
        return self.model_flops_per_step / self.step_time_s / (self.num_gpus * self.low_precision_peak_flops_per_gpu)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: counts recomputation too."""
        return self.hardware_flops_per_step / self.step_time_s / (self.num_gpus * self.peak_flops_per_gpu)

    @property
    def bubble_fraction(self) -> float:
        """Share of the step spent idle in the pipeline bubble."""
        return self.bubble_s / self.step_time_s

    def predicted_dict(self) -> dict[str, Any]:
        """The ``predicted`` object of a plan file (GiB and seconds, rounded for stable bytes). ``mfu``
        is against the bf16 dense peak; a low-precision plan adds ``mfu_low_precision_peak``."""
        peak = self.peak_stage
        low = {"mfu_low_precision_peak": _r(self.mfu_low_precision)} if self.low_precision_peak_flops_per_gpu else {}
        return {
            "step_time_s": _r(self.step_time_s),
            "tokens_per_s": _r(self.tokens_per_s),
            "tokens_per_s_per_gpu": _r(self.tokens_per_s / self.num_gpus),
            "mfu": _r(self.mfu),
            **low,
            "hfu": _r(self.hfu),
            "fits": self.fits,
            "peak_memory_gib": _r(peak.total_bytes / GIB),
            "memory_capacity_gib": _r(self.memory_capacity_bytes / GIB),
            "memory_usable_gib": _r(self.memory_usable_bytes / GIB),
            "memory_band_upper": _r(self.memory_band_upper),
            "memory_gib": {name.removesuffix("_bytes"): _r(getattr(peak, name) / GIB) for name in MEMORY_TERMS},
            **({"grads_freed_gib": _r(peak.grads_freed_bytes / GIB)} if peak.grads_freed_bytes else {}),
            "overhead_gib": {name: _r(value / GIB) for name, value in peak.overhead_parts},
            **({"buffers_gib": {name: _r(value / GIB) for name, value in peak.buffer_parts}}
               if peak.buffer_parts else {}),
            "memory_gib_per_stage": [_r(st.total_bytes / GIB) for st in self.stages],
            "time_s": {name.removesuffix("_s"): _r(getattr(self, name)) for name in TIME_TERMS},
            "comm_gib_per_gpu": {k: _r(v / GIB) for k, v in sorted(self.comm_bytes_per_gpu.items())},
            "bubble_fraction": _r(self.bubble_fraction),
            "sources": dict(sorted(self.sources.items())),
            **(self._host_dict() if self.layout.optimizer_offload else {}),
            **({} if self.goodput is None else {"goodput": goodput_dict(self.goodput)}),
            **({} if self.placement is None else {"placement": self.placement.to_dict()}),
        }

    def _host_dict(self) -> dict[str, Any]:
        """Host RAM of an offloading layout: per node, against the node's RAM."""
        return {"host_memory_gib_per_node": _r(self.host_memory_bytes_per_node / GIB),
                "host_memory_capacity_gib": _r(self.host_memory_capacity_bytes / GIB), "host_fits": self.host_fits}


def goodput_dict(g: Goodput) -> dict[str, Any]:
    """The ``predicted.goodput`` object: checkpoint size (GiB), δ, R, M and τ (s), the interval in
    steps, the useful share of wall time and the goodput in tokens/s."""
    return {"checkpoint_gib": _r(g.checkpoint_bytes / GIB), "checkpoint_write_s": _r(g.checkpoint_write_s),
            "restart_s": _r(g.restart_s), "mtbf_h": _r(g.mtbf_s / 3600.0), "interval_s": _r(g.interval_s),
            "checkpoint_every_steps": g.interval_steps, "useful_fraction": _r(g.useful_fraction),
            "tokens_per_s": _r(g.tokens_per_s)}


def _r(value: float) -> float:
    """Six significant digits: enough for any report, and stable across platforms."""
    return float(f"{value:.6g}")
