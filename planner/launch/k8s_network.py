"""What a multi-node NCCL job's pods need beyond GPUs: RDMA devices, the right to pin memory, a sized
``/dev/shm``, and a place on the right nodes.

- RDMA: NCCL's InfiniBand/RoCE transport opens the host's HCAs, which a pod sees only when a device
  plugin hands them over as an extended resource: ``rdma/ib`` (Mellanox k8s-rdma-shared-dev-plugin's
  example resource) or ``nvidia.com/hostdev`` (NVIDIA Network Operator's SR-IOV host devices).
  Without one, NCCL falls back to TCP sockets, far below the inter-node bandwidth the plan costs.
- ``IPC_LOCK``: registering memory with the HCA pins it (``mlock``), which a container may do past
  its small default limit only with this capability.
- ``/dev/shm``: NCCL's shared-memory transport between GPUs of a node and PyTorch's data-loader
  workers use it; a memory-backed ``emptyDir`` with a ``sizeLimit`` replaces the runtime's 64 MiB.
- placement: ``nodeSelector`` labels (GPU product, fabric), and for a JobSet its exclusive-topology
  annotation (``alpha.jobset.sigs.k8s.io/exclusive-topology``, kubernetes-sigs/jobset v0.12.0
  ``pkg/constants``), which keeps the Job's pods in one topology domain (a rack or block label).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from autoplan_base.errors import AutoplanError

DEFAULT_RDMA_RESOURCE = "rdma/ib"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
_RESOURCE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
"""A qualified name: optional DNS-1123 prefix and '/', then a name (Kubernetes' resource names)."""
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class K8sNetwork:
    """RDMA, memory pinning, shared memory and placement of each pod (``launch --k8s-*``)."""

    rdma_resource: str | None = DEFAULT_RDMA_RESOURCE
    """Extended resource of the RDMA device plugin (None: request none, NCCL uses TCP)."""
    rdma_count: int = 1
    """How many of ``rdma_resource`` each pod requests (a shared device: 1; SR-IOV: one per NIC)."""
    ipc_lock: bool = True
    """Add the ``IPC_LOCK`` capability (memory registration for RDMA)."""
    shm_gib: int = 64
    """``sizeLimit`` of the memory-backed ``/dev/shm``, GiB."""
    node_selector: tuple[tuple[str, str], ...] = ()
    """``nodeSelector`` labels, (key, value) pairs."""
    topology_key: str | None = None
    """JobSet only: the node label whose domain holds all the Job's pods (exclusive topology)."""

    def __post_init__(self) -> None:
        if self.rdma_resource is not None and not _RESOURCE.match(self.rdma_resource):
            raise AutoplanError(f"--k8s-rdma-resource {self.rdma_resource!r}: expected a resource name such as "
                                f"{DEFAULT_RDMA_RESOURCE} or nvidia.com/hostdev, or none")
        if not isinstance(self.rdma_count, int) or self.rdma_count < 1:
            raise AutoplanError(f"--k8s-rdma-count {self.rdma_count!r}: expected a positive integer")
        if not isinstance(self.shm_gib, int) or self.shm_gib < 1:
            raise AutoplanError(f"--k8s-shm-gib {self.shm_gib!r}: expected a positive integer")
        for key, value in self.node_selector:
            if not _RESOURCE.match(key) or not _LABEL_VALUE.match(value) or len(value) > 63:
                raise AutoplanError(f"--k8s-node-selector {key}={value}: expected KEY=VALUE with a label key and a "
                                    "label value (letters, digits, '-', '_', '.', at most 63)")
        if self.topology_key is not None and not _RESOURCE.match(self.topology_key):
            raise AutoplanError(f"--k8s-topology-key {self.topology_key!r}: expected a node label key")


def container_parts(network: K8sNetwork, on_gpus: bool) -> tuple[dict[str, str], dict[str, Any]]:
    """(extra resource limits, securityContext) of the training container; a CPU plan needs neither."""
    if not on_gpus:
        return {}, {}
    limits = {network.rdma_resource: str(network.rdma_count)} if network.rdma_resource else {}
    security = {"capabilities": {"add": ["IPC_LOCK"]}} if network.ipc_lock else {}
    return limits, security


def shm_volume(network: K8sNetwork) -> dict[str, Any]:
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{network.shm_gib}Gi"}}


def pod_placement(network: K8sNetwork) -> dict[str, Any]:
    """The pod spec's ``nodeSelector``, if any labels are given."""
    return {"nodeSelector": dict(network.node_selector)} if network.node_selector else {}


def needs_lines(network: K8sNetwork, on_gpus: bool) -> list[str]:
    """The manifest header's ``Needs:`` lines for the network."""
    if not on_gpus:
        return []
    lines = []
    if network.rdma_resource:
        lines.append(f"Needs: a device plugin advertising {network.rdma_resource} (RDMA for NCCL; "
                     "--k8s-rdma-resource names another, none for TCP only)")
    if network.ipc_lock:
        lines.append("Needs: pods allowed the IPC_LOCK capability (NCCL pins memory for RDMA; a restricted "
                     "Pod Security level refuses it)")
    lines.append("Needs: NCCL told the cluster's interfaces where they are not found by default: --k8s-env "
                 "NCCL_SOCKET_IFNAME=..., NCCL_IB_HCA=...")
    return lines
