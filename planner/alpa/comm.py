"""Collective times for the intra-operator ILP: one adapter, one place to switch.

``collective_time_s`` uses the project's cost model (``costmodels.collectives``) when it is
importable, and otherwise the ring alpha-beta model below, so switching is automatic and the
ILP never calls anything else for communication times.
"""

from __future__ import annotations

from typing import Literal

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"]


def collective_time_s(op: Collective, size_bytes: float, degree: int, stride: int, cluster) -> float:
    """Seconds for one collective of ``size_bytes`` (the full buffer, NCCL-tests convention)
    over ``degree`` ranks spaced ``stride`` apart on ``cluster`` (a ``ClusterSpec``)."""
    if degree <= 1 or size_bytes <= 0:
        return 0.0
    try:
        from costmodels.collectives import collective_time_s as model_time_s
    except ImportError:
        return ring_time_s(op, size_bytes, degree, stride, cluster)
    return model_time_s(op, size_bytes, degree, stride, cluster)


def _link(degree: int, stride: int, cluster) -> tuple[float, float]:
    """(bandwidth bytes/s per rank, latency s) of the slowest link a group crosses."""
    per_node, num_nodes = cluster.group_placement(degree, stride)
    intra = cluster.node.intra_node
    if num_nodes <= 1:
        return intra.bandwidth_bytes_per_s, intra.latency_s
    inter = cluster.node.inter_node
    share = inter.node_bandwidth_bytes_per_s / max(1, per_node)
    return min(intra.bandwidth_bytes_per_s, share), inter.latency_s


def ring_time_s(op: Collective, size_bytes: float, degree: int, stride: int, cluster) -> float:
    """Ring algorithms (REFERENCE.md, "Collectives"; Thakur et al. 2005).

    all-reduce: 2(n-1)·alpha + 2(n-1)/n · S/beta; all-gather, reduce-scatter, broadcast:
    (n-1)·alpha + (n-1)/n · S/beta; all-to-all: (n-1)·alpha + (n-1)/n · S/beta with S the
    per-rank buffer; send/recv: alpha + S/beta.
    """
    n = degree
    beta, alpha = _link(degree, stride, cluster)
    if op == "all_reduce":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size_bytes / beta
    if op == "send_recv":
        return alpha + size_bytes / beta
    return (n - 1) * alpha + (n - 1) / n * size_bytes / beta
