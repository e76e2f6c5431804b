"""Kubernetes manifests for a plan: a JobSet (default) or a Kubeflow PyTorchJob.

One pod per node of the plan's cluster (``inputs.gpus`` over ``inputs.gpus_per_node``). For the
torch runtime each pod runs ``torchrun`` with ``nproc_per_node`` processes on the job's
``train.py`` with the arguments ``launch.sh`` gives it (``--checkpoint-every K``, the plan's
Young/Daly interval); for a framework runtime it runs the job's own ``launch.sh`` with the pod's
node rank (``_command``). The rendezvous is torchrun's static one: node rank 0 hosts the TCPStore, the others connect to it,
so no pod needs to resolve its own name. Under each controller:

- JobSet (``jobset.x-k8s.io/v1alpha2``, kubernetes-sigs/jobset v0.12.0): one replicated Job of
  ``nodes`` Indexed pods. With ``spec.network.enableDNSHostnames`` JobSet creates a headless
  service named after the JobSet and pod ``p`` of Job ``j`` is reachable as
  ``<jobset>-<replicatedJob>-<j>-<p>.<subdomain>`` (the CRD's own description of the field,
  config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml; ``CoordinatorEndpoint`` in
  pkg/controllers/jobset_controller.go); ``publishNotReadyAddresses`` defaults to true
  (pkg/webhooks/jobset_webhook.go), so pod 0's record exists before it is ready. The node rank
  is the Job controller's ``JOB_COMPLETION_INDEX`` (Indexed completion mode).
- PyTorchJob (``kubeflow.org/v1``, kubeflow/training-operator v1.9.0): a Master and
  ``nodes - 1`` Workers; the operator injects ``MASTER_ADDR`` (``<name>-master-0``),
  ``MASTER_PORT`` (the container port named ``pytorchjob-port``), ``PET_NODE_RANK`` (= ``RANK``:
  0 for the master, index + 1 for workers), ``PET_NNODES``, ``PET_NPROC_PER_NODE`` and
  ``WORLD_SIZE`` = replicas x nprocPerNode (pkg/controller.v1/pytorch/envvar.go, master.go);
  its container must be named ``pytorch`` (pkg/webhooks/pytorch/pytorchjob_webhook.go).

The torch job's container arguments use Kubernetes' own ``$(VAR)`` expansion of the container's
environment, so no shell runs inside its pods. The job directory (``plan.json`` and the job's files)
is read from the checkpoint volume, where checkpoints and logs also go (``train.py``'s
defaults, under the job directory). Importing this module imports neither torch nor yaml.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from autoplan_base.errors import AutoplanError
from planner.plan.plan_file import PlanFile, PlanFileError

from .k8s_network import (EXCLUSIVE_TOPOLOGY, K8sNetwork, container_parts, needs_lines, pod_placement,
                          shm_volume)
from .scripts import checkpoint_every

KINDS = ("jobset", "pytorchjob")
K8sKind = Literal["jobset", "pytorchjob"]
MANIFEST_FILES = {"jobset": "jobset.yaml", "pytorchjob": "pytorchjob.yaml"}
REPLICATED_JOB = "node"
"""The JobSet's one replicated Job; it appears in every pod's DNS name."""
JOBSET_PORT = 29500
"""torchrun's default master port, used for the JobSet rendezvous."""
PYTORCHJOB_PORT = 23456
"""``PyTorchJobDefaultPort`` (pkg/apis/kubeflow.org/v1/pytorch_types.go, training-operator v1.9.0)."""
PYTORCHJOB_PORT_NAME = "pytorchjob-port"
PYTORCHJOB_CONTAINER = "pytorch"
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises."""
SHM_PATH = "/dev/shm"
DEFAULT_NAMESPACE = "default"
DEFAULT_CLAIM = "autoplan"
DEFAULT_MOUNT = "/workspace"
IMAGE_REPOSITORY = "pytorch/pytorch"
IMAGE_TAG_SUFFIX = "-cuda13.0-cudnn9-runtime"
"""Docker Hub's ``pytorch/pytorch`` tags read ``<torch>-cuda<X.Y>-cudnn9-runtime``; the CUDA part
for a given torch release is an assumption (not checked from this machine): pass --k8s-image."""
POD_NAME_SUFFIX = len("-abcde")
"""The random suffix the Job controller appends to a pod name; JobSet's webhook counts it
(``longestPodName`` in pkg/webhooks/jobset_webhook.go) when it checks names against 63 characters."""

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = ("MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED")
"""Container variables the manifest sets itself (the rendezvous), which ``--k8s-env`` may not override."""
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class KubernetesOptionError(AutoplanError):
    """A Kubernetes option (name, namespace, image, volume) the API server would refuse."""


@dataclass(frozen=True, slots=True, kw_only=True)
class K8sOptions:
    """Where and how the job runs on the cluster (``autoplan launch --scheduler kubernetes``)."""

    kind: K8sKind = "jobset"
    """``jobset`` (jobset.x-k8s.io/v1alpha2) or ``pytorchjob`` (kubeflow.org/v1)."""
    name: str
    """metadata.name: a DNS-1035 label (JobSet and the training operator both require one)."""
    namespace: str = DEFAULT_NAMESPACE
    """metadata.namespace: a DNS-1123 label."""
    image: str
    """Container image with Python and torch (the job directory brings the rest)."""
    claim_name: str = DEFAULT_CLAIM
    """PersistentVolumeClaim holding the job directory, checkpoints and logs (ReadWriteMany for several nodes)."""
    mount_path: str = DEFAULT_MOUNT
    """Where the claim is mounted in each pod (absolute)."""
    job_dir: str
    """The job directory inside the pod (absolute): ``train.py`` is run from here."""
    env: tuple[tuple[str, str], ...] = ()
    """More container environment, (name, value) pairs (``--k8s-env NAME=VALUE``): a framework job's
    checkout variables (``framework_scripts.FRAMEWORK_VARIABLES``), NCCL settings."""
    network: K8sNetwork = K8sNetwork()
    """RDMA devices, IPC_LOCK, /dev/shm size and placement (``planner.launch.k8s_network``)."""


def default_name(model: str) -> str:
    """A DNS-1035 label from the plan's model name (as slurm.sbatch's job name comes from it)."""
    text = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")[:40].rstrip("-")
    return text if _DNS1035.fullmatch(text) else f"autoplan-{text}".rstrip("-")


def default_image() -> str:
    """``pytorch/pytorch`` for the torch release autoplan runs with (read from its metadata, not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch").split("+", 1)[0]
    except PackageNotFoundError:
        return f"{IMAGE_REPOSITORY}:latest"
    return f"{IMAGE_REPOSITORY}:{torch_version}{IMAGE_TAG_SUFFIX}"


def _label(value: str, field: str, pattern: re.Pattern, what: str) -> None:
    if len(value) > 63 or not pattern.fullmatch(value):
        raise KubernetesOptionError(f"{field} {value!r}: not a {what} (lower-case letters, digits and '-', "
                                    f"starting with a {'letter' if pattern is _DNS1035 else 'letter or digit'}, "
                                    "ending with a letter or digit, at most 63 characters)")


def _absolute(value: str, field: str) -> None:
    if not value.startswith("/") or "\x00" in value or any(p == ".." for p in value.split("/")):
        raise KubernetesOptionError(f"{field} {value!r}: expected an absolute path inside the pod, without '..'")


def check_options(options: K8sOptions, nodes: int) -> None:
    """Refuse, in one line naming the option, what the API server or the controller would refuse."""
    if options.kind not in KINDS:
        raise KubernetesOptionError(f"--k8s-kind {options.kind!r}: expected one of {', '.join(KINDS)}")
    _label(options.name, "--k8s-name", _DNS1035, "DNS-1035 label")
    _label(options.namespace, "--k8s-namespace", _DNS1123, "DNS-1123 label")
    _label(options.claim_name, "--k8s-claim", _DNS1123, "DNS-1123 label")
    if not options.image.strip() or options.image != options.image.strip() or any(c.isspace() for c in options.image):
        raise KubernetesOptionError(f"--k8s-image {options.image!r}: expected an image reference such as "
                                    f"{IMAGE_REPOSITORY}:TAG (not empty, no spaces)")
    for name, _ in options.env:
        if not _ENV_NAME.fullmatch(name) or name in RESERVED_ENV:
            raise KubernetesOptionError(f"--k8s-env {name!r}: expected NAME=VALUE with NAME a C identifier (letters, "
                                        f"digits, '_', not starting with a digit), not one of {', '.join(RESERVED_ENV)}")
    _absolute(options.mount_path, "--k8s-mount")
    _absolute(options.job_dir, "--k8s-job-dir")
    if options.network.topology_key and options.kind != "jobset":
        raise KubernetesOptionError("--k8s-topology-key: a JobSet annotation; use --k8s-kind jobset or drop it")
    longest_pod = len(f"{options.name}-{REPLICATED_JOB}-0-{nodes - 1}") + POD_NAME_SUFFIX
    if options.kind == "jobset" and longest_pod > 63:
        raise KubernetesOptionError(f"--k8s-name {options.name!r}: too long for a JobSet of {nodes} pods (its pod "
                                    f"names would have {longest_pod} characters, more than 63); shorten it")


def node_shape(plan: PlanFile) -> tuple[int, int]:
    """(nodes, processes per node) of the plan's cluster; their product is ``inputs.gpus``."""
    inputs = plan.inputs
    nodes = -(-inputs.gpus // inputs.gpus_per_node)
    per_node = inputs.gpus // nodes
    if nodes * per_node != inputs.gpus:
        raise PlanFileError(f"inputs.gpus = {inputs.gpus} does not fill whole nodes of inputs.gpus_per_node = "
                            f"{inputs.gpus_per_node}; a Kubernetes job needs the same process count on every pod")
    if plan.best is not None and plan.best.layout.world_size != inputs.gpus:
        raise PlanFileError(f"best.layout: its world size {plan.best.layout.world_size} is not inputs.gpus = "
                            f"{inputs.gpus}")
    return nodes, per_node


def _command(options: K8sOptions, *, runtime: str, nodes: int, per_node: int, node_rank: str,
             every: int) -> list[str]:
    """What each pod runs. The torch runtime: ``python -m torch.distributed.run`` (torchrun) with a
    static rendezvous on ``$(MASTER_ADDR)``, then ``train.py`` with launch.sh's arguments. A framework
    runtime (megatron, megatron-bridge, torchtitan, deepspeed): the job's own ``launch.sh``, which runs
    torchrun over ``NNODES`` x ``GPUS_PER_NODE`` with ``NODE_RANK``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` from the environment (``framework_scripts.framework_launch_sh``); the node rank
    is read by the shell, since the controller's variable is set when the pod starts."""
    if runtime != "torch":
        script = (f'export NNODES={nodes} GPUS_PER_NODE={per_node} NODE_RANK="${{{node_rank}}}"; '
                  f'exec bash {options.job_dir}/launch.sh')
        return ["bash", "-c", script]
    return ["python", "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
            "--node-rank", f"$({node_rank})", "--master-addr", "$(MASTER_ADDR)", "--master-port", "$(MASTER_PORT)",
            f"{options.job_dir}/train.py", "--checkpoint-every", str(every)]


def _container(options: K8sOptions, *, name: str, command: list[str], env: list[dict], port: dict,
               per_node: int, on_gpus: bool) -> dict[str, Any]:
    rdma, security = container_parts(options.network, on_gpus)
    resources = ({"limits": {GPU_RESOURCE: str(per_node), **rdma}} if on_gpus
                 else {"requests": {"cpu": str(per_node)}})
    return {"name": name, "image": options.image, "command": command,
            "env": [*env, {"name": "PYTHONUNBUFFERED", "value": "1"},
                    *({"name": name, "value": value} for name, value in options.env)],
            "ports": [port], "resources": resources, **({"securityContext": security} if security else {}),
            "volumeMounts": [{"name": "job", "mountPath": options.mount_path},
                             {"name": "dshm", "mountPath": SHM_PATH}]}


def _pod_spec(options: K8sOptions, container: dict[str, Any]) -> dict[str, Any]:
    """One container, the claim, a memory-backed /dev/shm of ``network.shm_gib`` (PyTorch's dataloader
    workers and NCCL's shared-memory transport outgrow the container runtime's 64 MiB default), and
    the node selector."""
    return {"restartPolicy": "Never", "containers": [container], **pod_placement(options.network),
            "volumes": [{"name": "job", "persistentVolumeClaim": {"claimName": options.claim_name}},
                        shm_volume(options.network)]}


def jobset(options: K8sOptions, *, runtime: str, nodes: int, per_node: int, on_gpus: bool, every: int) -> dict[str, Any]:
    """A JobSet: one replicated Job of ``nodes`` Indexed pods; rendezvous on pod 0's DNS name."""
    master = f"{options.name}-{REPLICATED_JOB}-0-0.{options.name}"  # the subdomain defaults to the JobSet name
    command = _command(options, runtime=runtime, nodes=nodes, per_node=per_node, node_rank="JOB_COMPLETION_INDEX", every=every)
    env = [{"name": "MASTER_ADDR", "value": master}, {"name": "MASTER_PORT", "value": str(JOBSET_PORT)}]
    container = _container(options, name="trainer", command=command, env=env, per_node=per_node, on_gpus=on_gpus,
                           port={"name": "rendezvous", "containerPort": JOBSET_PORT})
    job = {"parallelism": nodes, "completions": nodes, "completionMode": "Indexed", "backoffLimit": 0,
           "template": {"spec": _pod_spec(options, container)}}
    topology = options.network.topology_key
    replicated = {"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job}}
    if topology:
        replicated["template"]["metadata"] = {"annotations": {EXCLUSIVE_TOPOLOGY: topology}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": options.name, "namespace": options.namespace},
            "spec": {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                     "replicatedJobs": [replicated]}}


def pytorchjob(options: K8sOptions, *, runtime: str, nodes: int, per_node: int, on_gpus: bool, every: int) -> dict[str, Any]:
    """A PyTorchJob: Master + ``nodes - 1`` Workers; the operator injects the rendezvous variables."""
    command = _command(options, runtime=runtime, nodes=nodes, per_node=per_node, node_rank="PET_NODE_RANK", every=every)
    container = _container(options, name=PYTORCHJOB_CONTAINER, command=command, env=[], per_node=per_node,
                           on_gpus=on_gpus, port={"name": PYTORCHJOB_PORT_NAME, "containerPort": PYTORCHJOB_PORT})
    replica = {"restartPolicy": "Never", "template": {"spec": _pod_spec(options, container)}}
    replicas = {"Master": {"replicas": 1, **replica}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, **replica}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": options.name, "namespace": options.namespace},
            "spec": {"nprocPerNode": str(per_node), "pytorchReplicaSpecs": replicas}}


def job_runtime(plan: PlanFile) -> str:
    """The runtime whose job ``launch`` writes: the plan's, except that a user model
    (``inputs.module``) only autoplan's own torch job can build."""
    return "torch" if plan.inputs.module is not None else plan.inputs.training.runtime


def manifest(plan: PlanFile, options: K8sOptions, *, on_gpus: bool) -> dict[str, Any]:
    """The manifest of ``options.kind`` for ``plan``; refuses bad options in one line."""
    if plan.best is None:
        raise PlanFileError("best: null (no layout fits); there is nothing to launch")
    nodes, per_node = node_shape(plan)
    check_options(options, nodes)
    build = jobset if options.kind == "jobset" else pytorchjob
    return build(options, runtime=job_runtime(plan), nodes=nodes, per_node=per_node, on_gpus=on_gpus,
                 every=checkpoint_every(plan.best.predicted))


def header(plan: PlanFile, options: K8sOptions, summary: str, *, file: str, on_gpus: bool = True) -> tuple[str, ...]:
    """The comment lines above the manifest: what it runs, what it needs, the one command that starts it."""
    nodes, per_node = node_shape(plan)
    lines = [f"Generated by autoplan launch: {summary}",
             f"{nodes} pod(s) x {per_node} process(es) = {plan.inputs.gpus} (plan inputs.gpus)",
             f"Needs: PersistentVolumeClaim {options.claim_name!r} in namespace {options.namespace!r}"
             f"{' (ReadWriteMany: every pod writes checkpoints)' if nodes > 1 else ''}, holding this job",
             f"  directory at {options.job_dir} (mounted at {options.mount_path}); checkpoints and logs go under it.",
             "Needs: the JobSet controller (jobset.x-k8s.io/v1alpha2)" if options.kind == "jobset"
             else "Needs: the Kubeflow training operator (kubeflow.org/v1 PyTorchJob)",
             *needs_lines(options.network, on_gpus),
             *_framework_needs(plan, options),
             f"Start: kubectl apply -f {file}"]
    return tuple(lines)


def _framework_needs(plan: PlanFile, options: K8sOptions) -> list[str]:
    """For a framework runtime: the image must hold the framework, and launch.sh's variables
    (``FRAMEWORK_VARIABLES``) must be set, with ``--k8s-env`` or by the image."""
    from .framework_scripts import FRAMEWORK_VARIABLES

    runtime = job_runtime(plan)
    if runtime == "torch":
        return []
    lines = [f"Needs: an image (--k8s-image {options.image}) that runs the {runtime} job: the framework and its "
             "dependencies installed"]
    given = {name for name, _ in options.env}
    missing = [v for v in FRAMEWORK_VARIABLES[runtime] if v not in given]
    if missing:
        lines.append(f"Needs: {', '.join(missing)} set in the container (launch.sh requires "
                     f"{'them' if len(missing) > 1 else 'it'}): --k8s-env {missing[0]}=... or the image's environment")
    return lines


def write_manifest(plan: PlanFile, out: str | Path, options: K8sOptions) -> Path:
    """Write ``out/jobset.yaml`` or ``out/pytorchjob.yaml`` atomically; returns its path."""
    from .job import runs_on_gpus, job_summary, write_job_file
    from .yaml_text import yaml_text

    on_gpus = runs_on_gpus(plan.inputs.hardware)
    document = manifest(plan, options, on_gpus=on_gpus)
    path = Path(out) / MANIFEST_FILES[options.kind]
    lines = header(plan, options, job_summary(plan, plan.best.layout), file=str(path), on_gpus=on_gpus)
    write_job_file(path, yaml_text(document, lines))
    return path
