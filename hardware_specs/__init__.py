"""Datasheet numbers for accelerators, nodes and clusters (no measurements here).

``load_node("h100-sxm-80gb")`` reads ``data/h100-sxm-80gb.toml``; ``make_cluster``
sizes a cluster of such nodes. Importing this package reads no file.
"""

from autoplan_base.errors import AutoplanError, SpecError, field
from .loader import list_hardware, load_node, parse_node
from .schema import ClusterSpec, HardwareSpec, LinkSpec, NetworkSpec, NodeSpec


def make_cluster(node: NodeSpec, num_gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
    """A cluster of ``num_gpus`` devices on nodes of type ``node``.

    ``gpus_per_node`` overrides the node type's count (for partially used nodes).
    """
    from dataclasses import replace

    from .checks import MAX_DEVICES_PER_NODE, MAX_GPUS, whole

    if not isinstance(node, NodeSpec):
        raise SpecError(f"node must be a NodeSpec, got {node!r}")
    if gpus_per_node is not None:
        if isinstance(gpus_per_node, float) or whole(field("gpus_per_node"), gpus_per_node, high=MAX_DEVICES_PER_NODE) < 1:
            raise SpecError(f"{field('gpus_per_node')} must be a whole number, got {gpus_per_node!r}")
        node = replace(node, gpus_per_node=gpus_per_node)
    if isinstance(num_gpus, float) or whole(field("gpus"), num_gpus, high=MAX_GPUS) < 1:
        raise SpecError(f"{field('gpus')} must be a whole number, got {num_gpus!r}")
    per_node = node.gpus_per_node
    if num_gpus < per_node:
        node = replace(node, gpus_per_node=num_gpus)
        per_node = num_gpus
    if num_gpus % per_node:
        raise SpecError(
            f"{field('gpus', num_gpus)} is not a multiple of {per_node} GPUs per node; "
            f"use a multiple or set {field('gpus_per_node')}"
        )
    return ClusterSpec(node=node, num_nodes=num_gpus // per_node)


__all__ = [
    "AutoplanError", "SpecError", "ClusterSpec", "HardwareSpec", "LinkSpec", "NetworkSpec",
    "NodeSpec", "list_hardware", "load_node", "make_cluster", "parse_node",
]
