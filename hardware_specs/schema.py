"""Typed, frozen records for devices, links and clusters (base units inside)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from autoplan_base.errors import SpecError
from .checks import MAX_DEVICES_PER_NODE, MAX_GPUS, MAX_LATENCY_S, MAX_MEMORY_BYTES, MAX_RATE, finite, whole

MAX_NUM_SMS = 1 << 16
"""Largest SM count accepted (today's GPUs have 80-304)."""

DeviceType = Literal["cuda", "rocm", "cpu"]
Dtype = Literal["fp32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4"]
LinkKind = Literal["nvswitch", "nvlink", "pcie", "infinity-fabric", "shared-memory", "ethernet", "infiniband"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSpec:
    """One accelerator (or, for ``cpu``, one core running one process)."""

    name: str
    """Preset name, e.g. ``h100-sxm-80gb``."""
    display_name: str
    """Vendor's product name."""
    device_type: DeviceType
    """Which torch device type runs on it: ``cuda`` (also ROCm builds), ``cpu``."""
    peak_flops_per_s: dict[str, float]
    """Dense peak FLOP/s per dtype (``fp32``, ``bf16``, ``fp16``, ``fp8``, and on Blackwell the
    block-scaled ``mxfp8`` and ``nvfp4``); missing dtype = unsupported."""
    memory_bytes: int
    """Device memory (bytes)."""
    memory_bandwidth_bytes_per_s: float
    """Device memory bandwidth (bytes/s)."""
    runtime_reserved_bytes: int
    """Memory the runtime holds before the model allocates (CUDA context, NCCL buffers), bytes."""
    num_sms: int = 0
    """Streaming multiprocessors (compute units) that run GEMM tiles in parallel; 0 = not given
    (no wave quantisation is charged)."""
    sustained_clock_hz: float = 0.0
    """Tensor-core clock the datasheet peak FLOP/s assume (Hz): peak = SMs x FLOPs/clock/SM x
    this clock; 0 = not given."""
    power_limited_clock_hz: float = 0.0
    """Clock the part sustains on dense tensor-core work under its power limit (Hz), where that
    limit is below the one the datasheet peak assumes (e.g. an H100 SXM capped at 500 W instead
    of 700 W); 0 = the datasheet clock (``sustained_clock_hz``). Rates scale by ``clock_share``;
    the peak that MFU is quoted against does not."""
    sustained_rate_share: float = 1.0
    """Share of its burst tensor-core rate the part keeps under a sustained dense load at its power
    limit: the median rate of a minute-long bf16 8192^3 GEMM loop over the rate of a short burst of
    the same GEMM (a training step is a sustained load). Measured by ``autoplan profile`` (its
    burn-in) or on a lent device (``benchmarks/data/gpu/device/sustained-*.json``); 1.0 = not
    measured. Scales the tensor-core rates (GEMMs, attention) with ``clock_share``, not the
    memory-bound ones nor the peak MFU is quoted against."""
    compute_capability: float = 0.0
    """CUDA compute capability (8.0 A100, 9.0 H100/H200, 10.0 B200); 0 = not given or not CUDA.
    Says whether a kernel written for an older architecture runs on a legacy path here
    (``costmodels.kernel_efficiency.attention_kernel_share``)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each number comes from, by TOML key."""

    def __post_init__(self) -> None:
        whole(f"{self.name}: num_sms", self.num_sms, low=0, high=MAX_NUM_SMS)
        finite(f"{self.name}: sustained_clock_hz", self.sustained_clock_hz, low_open=False, high=MAX_RATE)
        finite(f"{self.name}: power_limited_clock_hz", self.power_limited_clock_hz, low_open=False, high=MAX_RATE)
        finite(f"{self.name}: compute_capability", self.compute_capability, low_open=False, high=100.0)
        finite(f"{self.name}: sustained_rate_share", self.sustained_rate_share, high=1.0)
        if self.power_limited_clock_hz and not 0 < self.power_limited_clock_hz <= self.sustained_clock_hz:
            raise SpecError(f"{self.name}: power_limited_clock_mhz must be at most sustained_clock_mhz "
                            f"({self.sustained_clock_hz / 1e6:g}) and needs it; fix the hardware file")
        if not isinstance(self.peak_flops_per_s, dict) or not self.peak_flops_per_s:
            raise SpecError(f"{self.name}: peak_flops_per_s must map dtype names to FLOP/s")
        for dtype, rate in self.peak_flops_per_s.items():
            finite(f"{self.name}: peak_flops_per_s[{dtype!r}]", rate, high=MAX_RATE)
        memory = whole(f"{self.name}: memory_bytes", self.memory_bytes, high=MAX_MEMORY_BYTES)
        finite(f"{self.name}: memory_bandwidth_bytes_per_s", self.memory_bandwidth_bytes_per_s, high=MAX_RATE)
        whole(f"{self.name}: runtime_reserved_bytes", self.runtime_reserved_bytes, low=0, high=memory - 1)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (the caller checks ``supports`` first)."""
        return self.peak_flops_per_s[dtype]

    def clock_share(self) -> float:
        """Share of the datasheet peak's clock the part sustains under its power limit:
        f_limited / f_datasheet (1.0 when no limit is given). Tensor-core FLOP/s are SMs x
        FLOPs/clock/SM x clock (NVIDIA H100 whitepaper, Table 3), so every compute rate scales by it."""
        if self.power_limited_clock_hz <= 0 or self.sustained_clock_hz <= 0:
            return 1.0
        return self.power_limited_clock_hz / self.sustained_clock_hz

    def tensor_rate_share(self) -> float:
        """Share of the datasheet-clock tensor-core rate the part sustains through a training step:
        ``clock_share`` (a power limit below the datasheet's) times ``sustained_rate_share`` (the
        power cap's hold on a sustained load)."""
        return self.clock_share() * self.sustained_rate_share

    def supports(self, dtype: str) -> bool:
        """Whether the datasheet lists a rate for ``dtype``."""
        return dtype in self.peak_flops_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """The link between devices inside one node."""

    kind: LinkKind
    """Technology: NVSwitch, NVLink, PCIe, Infinity Fabric, shared memory."""
    bandwidth_bytes_per_s: float
    """Per-device, per-direction bandwidth (bytes/s)."""
    latency_s: float
    """One-message latency (the alpha of the alpha-beta model), seconds."""
    nvls_efficiency: float = 0.0
    """NVLink SHARP (NVLS): the switch reduces and multicasts, so an all-reduce moves each byte
    once each way at this share of the link rate; 0 = the switch has no NVLS (TOML
    ``intra_node.nvls_efficiency``, absent = 0)."""

    def __post_init__(self) -> None:
        finite("intra_node.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, high=MAX_RATE)
        finite("intra_node.latency_s", self.latency_s, low_open=False, high=MAX_LATENCY_S)
        finite("intra_node.nvls_efficiency", self.nvls_efficiency, low_open=False, high=1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkSpec:
    """The network between nodes."""

    kind: LinkKind
    """Fabric: InfiniBand, Ethernet (RoCE)."""
    nics_per_node: int
    """Compute NICs per node."""
    nic_bandwidth_bytes_per_s: float
    """Per-NIC, per-direction bandwidth (bytes/s)."""
    latency_s: float
    """One-message latency across the network, seconds."""
    sharp: bool = False
    """In-network reduction (InfiniBand SHARP, NCCL's CollNet with the SHARP plugin): the switches
    reduce across nodes, so each node's NICs carry the data once each way (TOML
    ``inter_node.sharp``, absent = false)."""

    def __post_init__(self) -> None:
        whole("inter_node.nics_per_node", self.nics_per_node, high=MAX_DEVICES_PER_NODE)
        finite("inter_node.nic_bandwidth_bytes_per_s", self.nic_bandwidth_bytes_per_s, high=MAX_RATE)
        finite("inter_node.latency_s", self.latency_s, low_open=False, high=MAX_LATENCY_S)

    @property
    def node_bandwidth_bytes_per_s(self) -> float:
        """All NICs of one node together, per direction (bytes/s)."""
        return self.nics_per_node * self.nic_bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """A node type: devices, their link, the network and the host link."""

    hardware: HardwareSpec
    gpus_per_node: int
    """Devices per node."""
    intra_node: LinkSpec
    inter_node: NetworkSpec
    host_link_bandwidth_bytes_per_s: float
    """Device-to-host bandwidth per device, per direction (bytes/s); used for optimizer offload."""
    host_memory_bandwidth_bytes_per_s: float
    """Host DRAM bandwidth available to one device's offloaded optimizer step (bytes/s)."""
    host_memory_bytes: int
    """Host RAM of one node (bytes), shared by its devices; offloaded optimizer states must fit in it."""
    storage_write_bandwidth_bytes_per_s: float
    """Sustained checkpoint write (and read) bandwidth of one node to its checkpoint storage
    (bytes/s); sizes the checkpoint interval (``costmodels.goodput``)."""
    nodes_per_nvlink_domain: int = 1
    """Nodes whose devices reach each other over ``intra_node`` (NVLink through NVSwitch): 1 = the
    node is the NVLink domain (DGX/HGX); 18 on GB200/GB300 NVL72, whose rack of 18 four-GPU compute
    trays is one 72-GPU domain. The loader converts TOML ``node.nvlink_domain_gpus`` into it."""

    def __post_init__(self) -> None:
        whole("gpus_per_node", self.gpus_per_node, high=MAX_DEVICES_PER_NODE)
        whole("nodes_per_nvlink_domain", self.nodes_per_nvlink_domain, high=MAX_DEVICES_PER_NODE)
        whole("host_memory_bytes", self.host_memory_bytes, high=MAX_DEVICES_PER_NODE * MAX_MEMORY_BYTES)
        finite("host_link_bandwidth_bytes_per_s", self.host_link_bandwidth_bytes_per_s, high=MAX_RATE)
        finite("host_memory_bandwidth_bytes_per_s", self.host_memory_bandwidth_bytes_per_s, high=MAX_RATE)
        finite("storage_write_bandwidth_bytes_per_s", self.storage_write_bandwidth_bytes_per_s, high=MAX_RATE)

    @property
    def nvlink_domain_gpus(self) -> int:
        """Devices of one NVLink domain: ``nodes_per_nvlink_domain`` nodes of ``gpus_per_node``."""
        return self.nodes_per_nvlink_domain * self.gpus_per_node


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """``num_nodes`` identical nodes."""

    node: NodeSpec
    num_nodes: int

    def __post_init__(self) -> None:
        if not isinstance(self.node, NodeSpec):
            raise SpecError(f"node must be a NodeSpec, got {type(self.node).__name__}")
        whole("num_nodes", self.num_nodes, high=MAX_GPUS // self.node.gpus_per_node)

    @property
    def hardware(self) -> HardwareSpec:
        return self.node.hardware

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    @property
    def nvlink_domain_gpus(self) -> int:
        """Devices of one NVLink domain in this cluster (at most the cluster's devices)."""
        return min(self.node.nvlink_domain_gpus, self.num_gpus)

    def group_placement(self, degree: int, stride: int) -> tuple[int, int]:
        """Ranks per NVLink domain and domains spanned by a process group, for its link choice.

        The group is ``{r, r + stride, ..., r + (degree - 1) * stride}``. Ranks fill the cluster domain
        by domain (rank // nvlink_domain_gpus is the domain), so with a partly filled last domain (256
        GPUs on 72-GPU domains: 72 + 72 + 72 + 40) or a group that does not tile a domain some groups
        straddle a domain boundary; every group runs the collective at once, so the worst one sets the
        time (``worst_group_placement``). Returns ``(ranks_per_domain, num_domains_spanned)``; their
        product is ``degree``.
        """
        if degree <= 1:
            return 1, 1
        d = self.nvlink_domain_gpus
        if self.node.nodes_per_nvlink_domain == 1 and self.num_gpus % d == 0:
            return _packed_placement(degree, stride, d)
        return worst_group_placement(degree, stride, d, self.num_gpus)


def _packed_placement(degree: int, stride: int, domain_gpus: int) -> tuple[int, int]:
    """Placement of a group packed into domains of ``domain_gpus``: ``domain_gpus // stride`` of its
    ranks in each (the rule for node-sized domains, exact when degree and stride tile the domain)."""
    if stride >= domain_gpus:
        return 1, degree
    per_domain = max(1, min(degree, domain_gpus // stride))
    return per_domain, -(-degree // per_domain)


@lru_cache(maxsize=4096)
def worst_group_placement(degree: int, stride: int, domain_gpus: int, num_gpus: int) -> tuple[int, int]:
    """``(ranks_per_domain, num_domains)`` of the worst group of ``degree`` ranks spaced ``stride``
    apart among ``num_gpus`` ranks filled domain by domain: N = the most domains any group touches,
    costed as spread evenly over the fewest domains, at least N, whose count divides ``degree``
    (k = degree / N' ranks in each). A group touching one domain stays on NVLink."""
    span = degree * stride
    most = 1
    for block in range(0, max(num_gpus, span), span):
        for first in range(block, block + stride):
            domains = {(first + i * stride) // domain_gpus for i in range(degree)}
            most = max(most, len(domains))
    spread = next(n for n in range(most, degree + 1) if degree % n == 0)
    return degree // spread, spread
