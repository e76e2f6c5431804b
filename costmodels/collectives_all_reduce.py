"""All-reduce by NCCL's algorithms: ring, tree, NVLS (NVLink SHARP) and CollNet (InfiniBand SHARP),
the fastest chosen as NCCL's tuner chooses it.

NCCL predicts each (algorithm, protocol)'s time as latency + bytes / bandwidth and runs the least
(``src/graph/tuning.cc``, ``ncclTopoTuneModel``; ``src/enqueue.cc`` picks the minimum; Hu et al.
2025, "Demystifying NCCL", Sec. 4-5, describe the algorithms). The latency terms below are that
file's, per algorithm, with nRanks = n = k·N (k ranks on each of N nodes), intraLat = α_intra and
interLat = α_inter. The bandwidth terms follow the same file: busBw is the slower of the intra-node
link and the node's network share (every phase of an algorithm is pipelined over chunks and
channels, so the slowest link bounds it, not the sum of the phases), and the bytes moved per rank
are NCCL's bus-bandwidth factors (nccl-tests ``doc/PERFORMANCE.md``): a ring all-reduce moves
2(n − 1)/n·S per rank; a tree or an in-switch reduction moves S up and S down (tuning.cc's ratio 0.5
between algorithm and bus bandwidth).

Links (``AllReduceLinks``): β_intra the per-device intra-node bandwidth, β_net the network
bandwidth the group's k ranks of one node share (k × the per-device NIC share), both already
derated by ``Assumptions.link_efficiency`` (intra-node) and ``network_efficiency`` (NICs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TREE_BANDWIDTH_FACTOR = 0.92
"""NCCL's tree all-reduce bus bandwidth relative to the ring's (tuning.cc: ``busBw * .92`` for
``NCCL_ALGO_TREE`` all-reduce)."""
COLLNET_ARITY_LATENCY_S = 0.4e-6
"""CollNet Direct's per-local-rank serialisation latency (tuning.cc: "0.4 us arity serialization")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduceLinks:
    """The links one all-reduce runs over (rates already derated by link efficiency)."""

    alpha_intra_s: float
    beta_intra_bytes_per_s: float
    alpha_inter_s: float
    beta_net_bytes_per_s: float
    """Network bandwidth the group's ranks on one node share, per direction."""
    nvls_efficiency: float = 0.0
    """``LinkSpec.nvls_efficiency``: 0 = no NVLink SHARP."""
    sharp: bool = False
    """``NetworkSpec.sharp``: in-network reduction across nodes."""


def _bus_bandwidth(k: int, num_nodes: int, links: AllReduceLinks) -> float:
    """The slowest link a pipelined all-reduce crosses: NVLink within a node, the node's share of
    the network across nodes, both when it spans several nodes with several ranks on each."""
    if num_nodes == 1:
        return links.beta_intra_bytes_per_s
    if k == 1:
        return links.beta_net_bytes_per_s
    return min(links.beta_intra_bytes_per_s, links.beta_net_bytes_per_s)


def ring_all_reduce_s(size_bytes: float, k: int, num_nodes: int, links: AllReduceLinks) -> float:
    """Ring: 2(n − 1) steps, 2(N − 1) of them across nodes (tuning.cc: (nsteps − nInterSteps)·intraLat
    + nInterSteps·interLat), each rank moving 2(n − 1)/n·S at the bus bandwidth.

    t = 2(n − N)·α_intra + 2(N − 1)·α_inter + 2(n − 1)/n · S / β_bus."""
    n = k * num_nodes
    if n <= 1 or size_bytes <= 0:
        return 0.0
    S, N = size_bytes, num_nodes
    latency = 2 * (n - N) * links.alpha_intra_s + 2 * (N - 1) * links.alpha_inter_s
    return latency + 2 * (n - 1) / n * S / _bus_bandwidth(k, N, links)


def tree_all_reduce_s(size_bytes: float, k: int, num_nodes: int, links: AllReduceLinks) -> float:
    """Double binary tree across nodes, a chain inside each (NCCL 2.4+; tuning.cc latency
    2·((n/N − 1)·intraLat + log2i(N)·interLat), bus bandwidth 0.92 of the ring's, algorithm
    bandwidth half of it: S up the trees and S down).

    t = 2·((k − 1)·α_intra + ⌊log2 N⌋·α_inter) + 2·S / (0.92·β_bus)."""
    if k * num_nodes <= 1 or size_bytes <= 0:
        return 0.0
    depth = int(math.log2(num_nodes))
    latency = 2 * ((k - 1) * links.alpha_intra_s + depth * links.alpha_inter_s)
    return latency + 2 * size_bytes / (TREE_BANDWIDTH_FACTOR * _bus_bandwidth(k, num_nodes, links))


def nvls_all_reduce_s(size_bytes: float, k: int, num_nodes: int, links: AllReduceLinks) -> float:
    """NVLink SHARP: the NVSwitch reduces what the k GPUs of a node send and multicasts the result
    (NCCL ``NVLS``; across nodes ``NVLS_TREE``, a tree between the nodes' NVLS groups). tuning.cc:
    intra bus bandwidth 2·e·β_intra (e = ``nvls_efficiency``; all-reduce pipelines its reduce and
    its multicast), across nodes at most β_net (2·β_net for two nodes), algorithm bandwidth half of
    it; latency intraLat (one node) or intraLat + 2·log2i(N)·interLat.

    t = latency + 2·S / min(2·e·β_intra, β_net'), inf where the switch has no NVLS or k = 1."""
    if k * num_nodes <= 1 or size_bytes <= 0:
        return 0.0
    e = links.nvls_efficiency
    if e <= 0 or k == 1:
        return math.inf
    bus = 2 * e * links.beta_intra_bytes_per_s
    latency = links.alpha_intra_s
    if num_nodes > 1:
        bus = min(bus, links.beta_net_bytes_per_s * (2 if num_nodes <= 2 else 1))
        latency += 2 * int(math.log2(num_nodes)) * links.alpha_inter_s
    return latency + 2 * size_bytes / bus


def sharp_all_reduce_s(size_bytes: float, k: int, num_nodes: int, links: AllReduceLinks) -> float:
    """InfiniBand SHARP (NCCL ``COLLNET_DIRECT``): the k ranks of a node reduce-scatter over NVLink,
    each sends its 1/k share to the switches, which reduce across nodes and return the result, then
    the node all-gathers; pipelined, so the slower of the NVLink part (2(k − 1)/k·S/β_intra) and the
    network part (S/β_net: the node's data once each way) bounds it. Latency (tuning.cc):
    2·(min(1, k − 1)·intraLat + (k − 1)·0.4 µs) + interLat. inf without SHARP or on one node."""
    if k * num_nodes <= 1 or size_bytes <= 0:
        return 0.0
    if not links.sharp or num_nodes == 1:
        return math.inf
    S = size_bytes
    latency = 2 * (min(1, k - 1) * links.alpha_intra_s + (k - 1) * COLLNET_ARITY_LATENCY_S) + links.alpha_inter_s
    intra = 2 * (k - 1) / k * S / links.beta_intra_bytes_per_s
    return latency + max(intra, S / links.beta_net_bytes_per_s)


ALGORITHMS = {"ring": ring_all_reduce_s, "tree": tree_all_reduce_s, "nvls": nvls_all_reduce_s,
              "collnet": sharp_all_reduce_s}
"""NCCL's all-reduce algorithms by the name ``NCCL_ALGO`` gives them (lower case)."""


def all_reduce_s(size_bytes: float, k: int, num_nodes: int, links: AllReduceLinks) -> tuple[float, str]:
    """(seconds, algorithm) of the fastest algorithm, as NCCL's tuner picks it; ties go to the
    first in ``ALGORITHMS`` order (ring)."""
    return min(((f(size_bytes, k, num_nodes, links), name) for name, f in ALGORITHMS.items()),
               key=lambda pair: pair[0])
