"""Time of one collective on a process group, by the alpha-beta model or a measured profile.

Ring algorithms (Thakur, Rabenseifner & Gropp, 2005; NCCL's bus-bandwidth convention), with S the
full buffer in bytes and n ranks:
- all-reduce: 2(n-1)·α + 2(n-1)/n · S/β
- all-gather, reduce-scatter, all-to-all: (n-1)·α + (n-1)/n · S/β
- send/recv (one hop), broadcast (pipelined): α + S/β
All-reduce runs as NCCL's fastest algorithm for its size and placement: ring, tree, NVLink SHARP
or InfiniBand SHARP where the hardware spec has them (``collectives_all_reduce``), its phases
pipelined. Groups that span nodes: all-gather, reduce-scatter and all-to-all take the slower of the
hierarchical (2-D) sum (across nodes on 1/k of the data, then inside the node; k ranks per node)
and the per-GPU NIC bound (``nic_bound_time_s``).
The inter-node bandwidth of a rank is the node's NIC bandwidth shared by every device of the node,
since in SPMD training all devices of a node run the same collective at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from hardware_specs.schema import ClusterSpec

from .assumptions import DEFAULT_ASSUMPTIONS, Assumptions
from .collectives_all_reduce import AllReduceLinks, all_reduce_s

if TYPE_CHECKING:
    from profiles import HardwareProfile

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"]
COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")


def ring_time_s(op: str, size_bytes: float, n: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Alpha-beta time of a ring collective of an ``S = size_bytes`` buffer over ``n`` ranks."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * size_bytes / beta_bytes_per_s
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) * alpha_s + (n - 1) / n * size_bytes / beta_bytes_per_s
    if op in ("send_recv", "broadcast"):
        return alpha_s + size_bytes / beta_bytes_per_s
    raise ValueError(f"unknown collective {op!r}")


def bytes_sent_per_rank(op: str, size_bytes: float, n: int) -> float:
    """Bytes each rank sends for one ring collective (2(n-1)/n·S for a ring all-reduce; Thakur et al. 2005)."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n * size_bytes
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * size_bytes
    return float(size_bytes)


def collective_time_s(op: str, size_bytes: float, degree: int, stride: int, cluster: ClusterSpec,
                      profile: "HardwareProfile | None" = None,
                      assumptions: Assumptions = DEFAULT_ASSUMPTIONS) -> float:
    """Seconds for ``op`` on the group of ``degree`` ranks spaced ``stride`` apart.

    A measured curve from ``profile`` wins when it covers (op, degree, ranks per node, nodes); else the
    alpha-beta model on the datasheet links.
    """
    return collective_time_and_source(op, size_bytes, degree, stride, cluster, profile, assumptions)[0]


def collective_time_and_source(op: str, size_bytes: float, degree: int, stride: int, cluster: ClusterSpec,
                               profile: "HardwareProfile | None" = None,
                               assumptions: Assumptions = DEFAULT_ASSUMPTIONS) -> tuple[float, str]:
    """``collective_time_s`` and where its rate came from: ``"datasheet"``, or the curve's
    ``source_label`` (``"profile"``, ``"profile (nccl-tests)"``, ...)."""
    if degree <= 1 or size_bytes <= 0:
        return 0.0, "datasheet"
    per_node, num_nodes = cluster.group_placement(degree, stride)
    scale = assumptions.communication_scale * (assumptions.inter_node_comm_scale if num_nodes > 1
                                               else assumptions.intra_node_comm_scale)
    if profile is not None:
        measured = profile.collective_time_s(op, degree, per_node, num_nodes, size_bytes)
        if measured is not None:
            return measured * scale, profile.collective_source(op, degree, per_node, num_nodes) or "profile"
    return _datasheet_time_s(op, size_bytes, per_node, num_nodes, cluster, assumptions) * scale, "datasheet"


def _datasheet_time_s(op: str, size_bytes: float, per_node: int, num_nodes: int, cluster: ClusterSpec,
                      assumptions: Assumptions) -> float:
    node = cluster.node
    intra_beta = node.intra_node.bandwidth_bytes_per_s * assumptions.link_efficiency
    inter_beta = node.inter_node.node_bandwidth_bytes_per_s / node.gpus_per_node * assumptions.network_efficiency
    intra_alpha, inter_alpha = node.intra_node.latency_s, node.inter_node.latency_s
    if op == "all_reduce":
        links = AllReduceLinks(alpha_intra_s=intra_alpha, beta_intra_bytes_per_s=intra_beta, alpha_inter_s=inter_alpha,
                               beta_net_bytes_per_s=per_node * inter_beta,
                               nvls_efficiency=node.intra_node.nvls_efficiency, sharp=node.inter_node.sharp)
        return all_reduce_s(size_bytes, per_node, num_nodes, links)[0]
    if num_nodes == 1:
        return ring_time_s(op, size_bytes, per_node, intra_alpha, intra_beta)
    if per_node == 1:
        return ring_time_s(op, size_bytes, num_nodes, inter_alpha, inter_beta)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        hierarchical = (ring_time_s(op, size_bytes / per_node, num_nodes, inter_alpha, inter_beta)
                        + ring_time_s(op, size_bytes, per_node, intra_alpha, intra_beta))
        return max(hierarchical, nic_bound_time_s(op, size_bytes, per_node, num_nodes, inter_beta))
    return ring_time_s(op, size_bytes, 2, inter_alpha, inter_beta)


def nic_bound_time_s(op: str, size_bytes: float, per_node: int, num_nodes: int,
                     nic_share_bytes_per_s: float) -> float:
    """Lower bound on a group spanning nodes: the bytes one GPU exchanges with other nodes over its
    share of the node's NICs (``per_node`` ranks on each of ``num_nodes`` nodes, n = their product).

    All-to-all: a GPU's 1/n slice for each of the n − per_node ranks on other nodes is distinct
    data, so S·(n − per_node)/n crosses the NIC whatever the algorithm (no node-level reuse).
    All-gather / reduce-scatter: NCCL runs them as flat rings only (no tree, no hierarchical
    variant; NCCL docs, "Collective Operations"), each rank sending (n − 1)/n·S, and a ring spanning
    nodes puts each GPU's traffic on the NIC next to it (NCCL pairs each GPU with its closest NIC).
    This is the per-GPU NIC bound that ZeRO-3 at scale measures (Narayanan et al. SC'21, Table 2:
    GPT-3 175B takes 66.7 s per step at both 768 and 1536 A100s, about 16-18 GB/s per GPU of
    gathers on 25 GB/s HDR NICs), not the node-aggregate rate of an ideal 2-D algorithm.
    """
    n = per_node * num_nodes
    if num_nodes <= 1 or size_bytes <= 0:
        return 0.0
    if op == "all_to_all":
        return size_bytes * (n - per_node) / n / nic_share_bytes_per_s
    if op in ("all_gather", "reduce_scatter"):
        return size_bytes * (n - 1) / n / nic_share_bytes_per_s
    raise ValueError(f"no NIC bound for collective {op!r}")

