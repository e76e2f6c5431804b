"""Datasheet numbers for accelerators, nodes and clusters (no measurements here).

``load_node("h100-sxm-80gb")`` reads ``data/h100-sxm-80gb.toml``; ``make_cluster``
sizes a cluster of such nodes. Importing this package reads no file.
"""

from .errors import AutoplanError, SpecError
from .loader import list_hardware, load_node, parse_node
from .schema import ClusterSpec, HardwareSpec, LinkSpec, NetworkSpec, NodeSpec


def make_cluster(node: NodeSpec, num_gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
    """A cluster of ``num_gpus`` devices on nodes of type ``node``.

    ``gpus_per_node`` overrides the node type's count (for partially used nodes).
    """
    from dataclasses import replace

    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise SpecError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
        node = replace(node, gpus_per_node=gpus_per_node)
    if num_gpus < 1:
        raise SpecError(f"--gpus must be at least 1, got {num_gpus}")
    per_node = node.gpus_per_node
    if num_gpus < per_node:
        node = replace(node, gpus_per_node=num_gpus)
        per_node = num_gpus
    if num_gpus % per_node:
        raise SpecError(
            f"--gpus {num_gpus} is not a multiple of {per_node} GPUs per node; "
            f"use a multiple or set --gpus-per-node"
        )
    return ClusterSpec(node=node, num_nodes=num_gpus // per_node)


__all__ = [
    "AutoplanError", "SpecError", "ClusterSpec", "HardwareSpec", "LinkSpec", "NetworkSpec",
    "NodeSpec", "list_hardware", "load_node", "make_cluster", "parse_node",
]
