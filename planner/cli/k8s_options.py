"""``launch --scheduler`` and the ``--k8s-*`` options, turned into ``K8sOptions`` (or None)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan_base.errors import AutoplanError

SCHEDULERS = ("torchrun", "slurm", "kubernetes")
"""torchrun and slurm name the files every job has (launch.sh, slurm.sbatch); kubernetes adds a manifest."""


def _env_pair(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of ``--k8s-env`` as (name, value); the name is checked with the other options."""
    name, sep, value = text.partition("=")
    if not sep:
        raise AutoplanError(f"--k8s-env {text!r}: expected NAME=VALUE")
    return name, value


def _network(given: dict[str, Any]):
    """``K8sNetwork`` from the ``--k8s-*`` network options, each left out taking its default."""
    from planner.launch.k8s_network import K8sNetwork

    defaults = K8sNetwork()
    resource = given["k8s_rdma_resource"]
    pairs = []
    for text in given["k8s_node_selector"]:
        key, sep, value = text.partition("=")
        if not sep:
            raise AutoplanError(f"--k8s-node-selector {text!r}: expected KEY=VALUE")
        pairs.append((key, value))
    pick = lambda key, default: default if given[key] is None else given[key]  # noqa: E731
    return K8sNetwork(rdma_resource=defaults.rdma_resource if resource is None else None if resource == "none"
                      else resource, rdma_count=pick("k8s_rdma_count", defaults.rdma_count),
                      ipc_lock=pick("k8s_ipc_lock", defaults.ipc_lock), shm_gib=pick("k8s_shm_gib", defaults.shm_gib),
                      node_selector=tuple(pairs), topology_key=given["k8s_topology_key"])


def kubernetes_options(plan: Any, out_dir: str, scheduler: str, given: dict[str, str | None]):
    """``K8sOptions`` from the ``--k8s-*`` values (``given``, keyed ``k8s_kind`` ...) with their
    defaults, or None when ``scheduler`` is not kubernetes; a ``--k8s-*`` option without
    ``--scheduler kubernetes`` is refused rather than ignored."""
    from planner.launch.job import model_name
    from planner.launch.kubernetes import (DEFAULT_CLAIM, DEFAULT_MOUNT, DEFAULT_NAMESPACE, K8sOptions, check_options,
                                         default_image, default_name, node_shape)

    if scheduler != "kubernetes":
        named = sorted(f"--{key.replace('_', '-')}" for key, value in given.items() if value not in (None, ()))
        if named:
            raise AutoplanError(f"{named[0]}: only used with --scheduler kubernetes (got --scheduler {scheduler})")
        return None
    mount = given["k8s_mount"] if given["k8s_mount"] is not None else DEFAULT_MOUNT
    job_dir = given["k8s_job_dir"]
    if job_dir is None:
        job_dir = f"{mount.rstrip('/')}/{Path(out_dir).resolve().name}"
    options = K8sOptions(kind=given["k8s_kind"] or "jobset",
                         name=given["k8s_name"] if given["k8s_name"] is not None else default_name(model_name(plan)),
                         namespace=given["k8s_namespace"] if given["k8s_namespace"] is not None else DEFAULT_NAMESPACE,
                         image=given["k8s_image"] if given["k8s_image"] is not None else default_image(),
                         claim_name=given["k8s_claim"] if given["k8s_claim"] is not None else DEFAULT_CLAIM,
                         mount_path=mount, job_dir=job_dir, env=tuple(_env_pair(text) for text in given["k8s_env"]),
                         network=_network(given))
    check_options(options, node_shape(plan)[0])
    return options
