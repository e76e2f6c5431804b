"""The MoE token exchange of Megatron-Core's flex dispatcher: DeepEP and HybridEP.

The ``alltoall`` dispatcher sends each of a token's k' routed copies to the rank of its expert with
one NCCL all-to-all over the ep group (``collectives``): a copy for a rank in another NVLink domain
crosses the NICs even when the same token goes to several experts there. DeepEP (DeepSeek-V3
report, arXiv 2412.19437, Sec. 3.2.2: each token crosses InfiniBand once per destination node, then
NVLink forwards it to the experts there; ``deepseek-ai/DeepEP`` README, "normal kernels") and
HybridEP (the same two-level scheme, with TMA copies and the whole multi-node NVLink domain as its
first level; Megatron-LM ``megatron/core/transformer/moe/README.md``, "Token Dispatching") send a
token once to each remote domain its experts are in, in one kernel that also fans the copies out
over NVLink. So across domains they move

    T·h·B · E[distinct remote domains of a token] = T·h·B · (D − 1)·(1 − (1 − 1/D)^k')

bytes per rank over its NIC share instead of the all-to-all's k'·T·h·B·(n − n_d)/n, with D domains
of n_d ranks each holding an equal share of the experts and balanced routing (each copy's domain
uniform and independent: the expected count of distinct values among k' draws from D). Inside one
domain nothing is deduplicated and all three move the same copies over NVLink, so there a flex
dispatcher costs what the all-to-all costs (``dispatch``), which the search uses to offer the flex
backends only where an ep group spans domains (``planner.search.space``).

Where each runs (``available_dispatchers``): DeepEP's NVLink level reaches at most 8 GPUs
(``NUM_MAX_NVL_PEERS``), so Megatron-Bridge applies it on 8-GPU NVLink nodes only (Ampere, Hopper,
B200, B300) and HybridEP on GB200/GB300 NVL72 racks too (``src/megatron/bridge/training/
flex_dispatcher_backend.py`` at NVIDIA-NeMo/Megatron-Bridge 067f987d); both are CUDA kernels for
compute capability 8.0 and up.
"""

from __future__ import annotations

from typing import Callable

from hardware_specs.schema import ClusterSpec, NodeSpec

from .assumptions import Assumptions
from .collectives import ring_time_s

DEEPEP_MAX_NVLINK_PEERS = 8
"""GPUs DeepEP's NVLink level reaches (``NUM_MAX_NVL_PEERS`` in ``deepseek-ai/DeepEP`` csrc/kernels/configs.cuh)."""
FLEX_MIN_COMPUTE_CAPABILITY = 8.0
"""DeepEP and HybridEP are CUDA kernels for Ampere and newer (Megatron-Bridge ``apply_flex_dispatcher_backend``)."""

Collective = Callable[[str, float, int, int], tuple[float, float, str]]
"""``LayerCosts.collective``: (op, bytes, degree, stride) -> (seconds, bytes sent per rank, source)."""


def remote_domains_per_token(copies: float, domains: int) -> float:
    """Expected NVLink domains other than its own that a token's ``copies`` routed copies reach,
    each copy's domain uniform over ``domains``: (D − 1)·(1 − (1 − 1/D)^k') (module docstring)."""
    if domains <= 1:
        return 0.0
    return (domains - 1) * (1 - (1 - 1 / domains) ** copies)


def dispatch(dispatcher: str, size_bytes: float, copies: float, degree: int, stride: int, cluster: ClusterSpec,
             assumptions: Assumptions, collective: Collective) -> tuple[float, float, str]:
    """(seconds, bytes sent per rank, rate source) of one dispatch or combine of ``size_bytes`` per
    rank (``copies`` routed copies per token) over the ep group of ``degree`` ranks ``stride`` apart.

    ``alltoall``, or a group inside one NVLink domain: the all-to-all (``collective``, a measured
    curve where the profile has one). Otherwise the flex kernels (datasheet rates): the deduplicated
    bytes over the NIC share, s_r = (S/k')·E[remote domains], and the fan-out inside the domain, an
    all-to-all of S over its n_d ranks, run in one kernel, so the slower of the two sets the time:
    max(s_r/β_nic + (D − 1)·α_nic, ring all-to-all of S over n_d on NVLink), each leg at the link
    efficiency and calibration scale ``collectives`` gives its links (``network_efficiency`` and
    ``inter_node_comm_scale`` for the NICs, ``link_efficiency`` and ``intra_node_comm_scale`` for
    NVLink). Bytes sent: s_r plus the NVLink share (n_d − 1)/n_d·S."""
    per_domain, domains = cluster.group_placement(degree, stride)
    if dispatcher == "alltoall" or domains == 1:
        return collective("all_to_all", size_bytes, degree, stride)
    a, node = assumptions, cluster.node
    nic_share = node.inter_node.node_bandwidth_bytes_per_s / node.gpus_per_node * a.network_efficiency
    remote = size_bytes / copies * remote_domains_per_token(copies, domains)
    nic_s = (remote / nic_share + (domains - 1) * node.inter_node.latency_s) * a.inter_node_comm_scale
    nvlink_s = ring_time_s("all_to_all", size_bytes, per_domain, node.intra_node.latency_s,
                           node.intra_node.bandwidth_bytes_per_s * a.link_efficiency) * a.intra_node_comm_scale
    sent = remote + size_bytes * (per_domain - 1) / per_domain
    return max(nic_s, nvlink_s) * a.communication_scale, sent, "datasheet"


def ep_group_stride(*, tp: int, cp: int, etp: int, gathers_sequence: bool) -> int:
    """Rank distance between the members of an ep group: the expert ranks fold into the tp · cp · dp
    ranks with the expert-tp ranks innermost, so ``etp`` apart (Megatron-Core's parallel folding,
    ``RankGenerator`` order tp-ep-dp for experts); where the MoE input is gathered over tp and every
    tp rank routes the whole sequence (``RuntimeConvention.moe_gathers_sequence``), the ep ranks
    are dp ranks, tp · cp apart."""
    return tp * cp if gathers_sequence else etp


def available_dispatchers(node: NodeSpec) -> tuple[str, ...]:
    """The dispatchers that run on ``node`` (module docstring): alltoall everywhere; HybridEP on
    CUDA devices of compute capability 8.0 and up (or not given: B300 and GB300 files leave it out);
    DeepEP there too where one NVLink domain is at most ``DEEPEP_MAX_NVLINK_PEERS`` GPUs."""
    hw = node.hardware
    if hw.device_type != "cuda" or 0 < hw.compute_capability < FLEX_MIN_COMPUTE_CAPABILITY:
        return ("alltoall",)
    if node.nvlink_domain_gpus <= DEEPEP_MAX_NVLINK_PEERS:
        return ("alltoall", "deepep", "hybridep")
    return ("alltoall", "hybridep")
