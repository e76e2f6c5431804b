"""``autoplan launch --scheduler kubernetes``: JobSet and PyTorchJob manifests.

They validate against the published CRD schemas (tests/data/k8s/README.md names the releases),
with unknown fields refused as ``kubectl apply --validate=strict`` would; their pod templates
deserialize into the ``kubernetes`` client's ``V1PodTemplateSpec`` and serialize back unchanged;
pods x processes per pod equals the plan's GPU count; bad options are one line and exit 2; a
framework runtime's pods (the README's default plan: megatron) run the job's launch.sh with the
controller's node rank; and the container command of a 2-process CPU plan (the torch runtime)
trains under torchrun on this machine.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from planner.cli import main
from planner.launch.kubernetes import MANIFEST_FILES, K8sOptions, manifest
from planner.launch.yaml_text import yaml_text
from planner.plan.plan_file import read_plan_file

DATA = Path(__file__).resolve().parent / "data" / "k8s"
CRDS = {"jobset": ("jobset.x-k8s.io_jobsets.yaml", "v1alpha2"), "pytorchjob": ("kubeflow.org_pytorchjobs.yaml", "v1")}
README_PLAN = ["--model", "llama3-70b", "--hardware", "h100-sxm-80gb", "--gpus", "64", "--global-batch", "512",
               "--seq-len", "8192"]
"""The README's first command (the default runtime, megatron)."""
CPU_PLAN = ["--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "4", "--seq-len", "32",
            "--precision", "fp32", "--runtime", "torch"]


@functools.cache
def crd_schema(kind: str) -> dict:
    file, version = CRDS[kind]
    crd = yaml.load((DATA / file).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return entry["schema"]["openAPIV3Schema"]


def unknown_fields(value, schema: dict, path: str = "") -> list[str]:
    """Keys of ``value`` the structural schema does not declare (what the API server prunes and
    ``kubectl --validate=strict`` refuses): every object whose schema lists ``properties`` without
    ``additionalProperties`` or ``x-kubernetes-preserve-unknown-fields``."""
    out = []
    if isinstance(value, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                out += unknown_fields(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(item, extra, f"{path}.{key}")
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                out.append(f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def pod_templates(document: dict) -> list[dict]:
    if document["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in document["spec"]["replicatedJobs"]]
    return [r["template"] for r in document["spec"]["pytorchReplicaSpecs"].values()]


FRAMEWORK_SCRIPT = re.compile(r'export NNODES=(\d+) GPUS_PER_NODE=(\d+) NODE_RANK="\$\{(\w+)\}"; '
                              r'exec bash (/\S+)/launch\.sh')
"""A framework runtime's container script (``kubernetes._command``): the node shape, the node rank's
variable, the job directory."""
NODE_RANK_VARIABLE = {"JobSet": "JOB_COMPLETION_INDEX", "PyTorchJob": "PET_NODE_RANK"}


def command_shape(command: list[str]) -> tuple[int, int]:
    """(nodes, processes per node) the container command starts: torchrun's ``--nnodes`` and
    ``--nproc-per-node`` (torch runtime), or the ``NNODES`` and ``GPUS_PER_NODE`` it exports for the
    job's launch.sh (a framework runtime)."""
    if command[:2] == ["bash", "-c"]:
        match = FRAMEWORK_SCRIPT.fullmatch(command[2])
        assert match is not None and len(command) == 3, command
        return int(match[1]), int(match[2])
    return int(command[command.index("--nnodes") + 1]), int(command[command.index("--nproc-per-node") + 1])


def pods_and_processes(document: dict) -> tuple[int, int]:
    """(pods, processes per pod) as the controller would start them."""
    if document["kind"] == "JobSet":
        (rjob,) = document["spec"]["replicatedJobs"]
        job = rjob["template"]["spec"]
        assert job["parallelism"] == job["completions"] and job["completionMode"] == "Indexed"
        pods = rjob["replicas"] * job["completions"]
    else:
        pods = sum(r["replicas"] for r in document["spec"]["pytorchReplicaSpecs"].values())
    nodes, per_pod = command_shape(pod_templates(document)[0]["spec"]["containers"][0]["command"])
    if document["kind"] == "PyTorchJob":
        assert document["spec"]["nprocPerNode"] == str(per_pod)
    assert nodes == pods
    return pods, per_pod


def check_against_api(document: dict, kind: str) -> None:
    """The CRD's schema, strict fields, and the core/v1 pod template through the kubernetes client."""
    from kubernetes.client import ApiClient

    schema = crd_schema(kind)
    jsonschema.Draft7Validator(schema).validate(document)
    assert unknown_fields(document, schema) == []
    client = ApiClient()
    for template in pod_templates(document):
        model = client.deserialize(json.dumps(template), "V1PodTemplateSpec", "application/json")
        assert client.sanitize_for_serialization(model) == template  # nothing dropped as unknown


@pytest.fixture(scope="module")
def readme_plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("readme") / "plan.json"
    result = CliRunner().invoke(main, ["plan", *README_PLAN, "--out", str(path)])
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize("kind", ["jobset", "pytorchjob"])
def test_readme_plan_renders_a_valid_manifest_of_the_plan_size(readme_plan, tmp_path, kind):
    """``launch`` writes the plan's Megatron job and, beside it, the manifest that runs it."""
    out = tmp_path / "job"
    result = CliRunner().invoke(main, ["launch", str(readme_plan), "--out", str(out),
                                       "--scheduler", "kubernetes", "--k8s-kind", kind])
    assert result.exit_code == 0, result.output
    text = (out / MANIFEST_FILES[kind]).read_text()
    document = yaml.safe_load(text)
    check_against_api(document, kind)
    pods, per_pod = pods_and_processes(document)
    assert (pods, per_pod) == (8, 8) and pods * per_pod == read_plan_file(readme_plan).inputs.gpus == 64
    spec = pod_templates(document)[0]["spec"]
    container = spec["containers"][0]
    # multi-node NCCL: an RDMA device, the right to pin memory, a sized /dev/shm; the header says each
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8", "rdma/ib": "1"}}
    assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in spec["volumes"]
    assert "Needs: a device plugin advertising rdma/ib" in text and "IPC_LOCK capability" in text
    assert "8 pod(s) x 8 process(es) = 64 (plan inputs.gpus)" in text  # the header says the shape
    assert (out / "launch.sh").is_file() and (out / "megatron_args.sh").is_file()  # the job the pods run


@pytest.mark.parametrize("kind", ["jobset", "pytorchjob"])
def test_k8s_network_options_set_rdma_shm_and_placement_and_still_validate(readme_plan, tmp_path, kind):
    out = tmp_path / "job"
    topology = ["--k8s-topology-key", "cloud.google.com/gce-topology-block"] if kind == "jobset" else []
    result = CliRunner().invoke(main, ["launch", str(readme_plan), "--out", str(out), "--scheduler", "kubernetes",
                                       "--k8s-kind", kind, "--k8s-rdma-resource", "nvidia.com/hostdev",
                                       "--k8s-rdma-count", "8", "--k8s-shm-gib", "128", "--no-k8s-ipc-lock",
                                       "--k8s-node-selector", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
                                       *topology])
    assert result.exit_code == 0, result.output
    document = yaml.safe_load((out / MANIFEST_FILES[kind]).read_text())
    check_against_api(document, kind)
    spec = pod_templates(document)[0]["spec"]
    container = spec["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/hostdev"] == "8" and "securityContext" not in container
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "128Gi"}} in spec["volumes"]
    if kind == "jobset":
        template = document["spec"]["replicatedJobs"][0]["template"]
        assert template["metadata"]["annotations"] == {
            "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gce-topology-block"}
    none = CliRunner().invoke(main, ["launch", str(readme_plan), "--out", str(tmp_path / "tcp"), "--scheduler",
                                     "kubernetes", "--k8s-kind", kind, "--k8s-rdma-resource", "none"])
    assert none.exit_code == 0, none.output
    tcp = yaml.safe_load((tmp_path / "tcp" / MANIFEST_FILES[kind]).read_text())
    assert pod_templates(tcp)[0]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "8"}}


@pytest.mark.parametrize("kind", ["jobset", "pytorchjob"])
def test_framework_runtime_pods_run_launch_sh_with_the_node_rank(readme_plan, tmp_path, kind):
    """A framework runtime's pods (the README's default plan: megatron) run the job's own launch.sh,
    exporting NNODES x GPUS_PER_NODE = the plan's GPUs and the controller's node rank; run as the
    pod would (this directory for the job directory, a stand-in torchrun that records its
    arguments), launch.sh passes them on to torchrun."""
    out = tmp_path / "job"
    result = CliRunner().invoke(main, ["launch", str(readme_plan), "--out", str(out), "--scheduler", "kubernetes",
                                       "--k8s-kind", kind, "--k8s-job-dir", "/workspace/job"])
    assert result.exit_code == 0, result.output
    plan = read_plan_file(readme_plan)
    assert plan.inputs.training.runtime == "megatron"
    document = yaml.safe_load((out / MANIFEST_FILES[kind]).read_text())
    check_against_api(document, kind)
    (container,) = pod_templates(document)[0]["spec"]["containers"]
    command = container["command"]
    match = FRAMEWORK_SCRIPT.fullmatch(command[2]) if command[:2] == ["bash", "-c"] else None
    assert match is not None, command
    nnodes, gpus_per_node, rank_variable, job_dir = int(match[1]), int(match[2]), match[3], match[4]
    assert rank_variable == NODE_RANK_VARIABLE[document["kind"]] and job_dir == "/workspace/job"
    assert nnodes * gpus_per_node == plan.inputs.gpus == 64
    assert pods_and_processes(document) == (nnodes, gpus_per_node)
    assert "train.py" not in command[2] and not (out / "train.py").exists()  # torchrun's job is the torch runtime's

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$TORCHRUN_ARGS"\n')
    (bin_dir / "torchrun").chmod(0o755)
    recorded = tmp_path / "torchrun-args"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TORCHRUN_ARGS": str(recorded),
           "MEGATRON_LM": "/opt/megatron-lm", rank_variable: "3", "MASTER_ADDR": "pod-0", "MASTER_PORT": "29500"}
    script = command[2].replace("/workspace/job", str(out))
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    args = recorded.read_text().splitlines()
    given = {flag: args[args.index(flag) + 1] for flag in ("--nnodes", "--nproc-per-node", "--node-rank",
                                                            "--master-addr", "--master-port")}
    assert given == {"--nnodes": str(nnodes), "--nproc-per-node": str(gpus_per_node), "--node-rank": "3",
                     "--master-addr": "pod-0", "--master-port": "29500"}
    assert "/opt/megatron-lm/pretrain_gpt.py" in args
    # as the header says ("checkpoints and logs go under it"), whatever the image's working directory
    assert "checkpoints and logs go under it" in (out / MANIFEST_FILES[kind]).read_text()
    places = {flag: args[args.index(flag) + 1] for flag in ("--save", "--load", "--tensorboard-dir")}
    assert places == {"--save": f"{out}/checkpoints", "--load": f"{out}/checkpoints", "--tensorboard-dir": f"{out}/logs"}


@pytest.mark.parametrize("kind", ["jobset", "pytorchjob"])
def test_k8s_env_reaches_the_container_and_the_header_names_what_launch_sh_still_needs(readme_plan, tmp_path, kind):
    """--k8s-env sets container variables (a framework's checkout, NCCL settings); the header's
    Needs lines name the framework image and each variable the megatron job's launch.sh requires
    (MEGATRON_LM) that the manifest does not set."""
    texts = {}
    for name, env in (("bare", []), ("set", ["--k8s-env", "MEGATRON_LM=/opt/megatron-lm",
                                             "--k8s-env", "NCCL_IB_QPS_PER_CONNECTION=4"])):
        result = CliRunner().invoke(main, ["launch", str(readme_plan), "--out", str(tmp_path / name),
                                           "--scheduler", "kubernetes", "--k8s-kind", kind, *env])
        assert result.exit_code == 0, result.output
        texts[name] = (tmp_path / name / MANIFEST_FILES[kind]).read_text()
        document = yaml.safe_load(texts[name])
        check_against_api(document, kind)
        for template in pod_templates(document):
            variables = {e["name"]: e["value"] for e in template["spec"]["containers"][0]["env"]}
            assert ("MEGATRON_LM" in variables) == (name == "set")
            if name == "set":
                assert variables["MEGATRON_LM"] == "/opt/megatron-lm" and variables["NCCL_IB_QPS_PER_CONNECTION"] == "4"
    needs = {name: [line for line in text.splitlines() if line.startswith("# Needs:")] for name, text in texts.items()}
    assert any("runs the megatron job" in line for line in needs["bare"])
    assert any("MEGATRON_LM set in the container" in line for line in needs["bare"])
    assert not any("MEGATRON_LM" in line for line in needs["set"])


def test_manifest_is_deterministic_and_reads_back_as_built(readme_plan, tmp_path):
    texts = []
    for name in ("a", "b"):
        result = CliRunner().invoke(main, ["launch", str(readme_plan), "--out", str(tmp_path / name),
                                           "--scheduler", "kubernetes", "--k8s-job-dir", "/workspace/job"])
        assert result.exit_code == 0, result.output
        texts.append((tmp_path / name / "jobset.yaml").read_text().replace(str(tmp_path / name), "DIR"))
    assert texts[0] == texts[1]
    plan = read_plan_file(readme_plan)
    options = K8sOptions(name="llama3-70b", image="pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
                         job_dir="/workspace/job")
    assert yaml.safe_load(texts[0]) == manifest(plan, options, on_gpus=True)


@pytest.mark.parametrize("gpus, per_node", [(1, 8), (8, 8), (16, 8), (12, 4)])
@pytest.mark.parametrize("kind", ["jobset", "pytorchjob"])
def test_pods_times_processes_is_the_plan_gpu_count(kind, gpus, per_node):
    from test_emit import make_plan
    from planner.plan.plan_file import PlanFile

    raw = make_plan(gpus=gpus, dp=gpus)
    raw["inputs"]["gpus_per_node"] = per_node
    plan = PlanFile.from_dict(raw)
    document = manifest(plan, K8sOptions(kind=kind, name="x", image="img", job_dir="/w/j"), on_gpus=False)
    check_against_api(document, kind)
    assert pods_and_processes(document) == (-(-gpus // per_node), min(gpus, per_node))
    container = pod_templates(document)[0]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": str(min(gpus, per_node))}}  # a CPU plan asks no GPUs
    if kind == "pytorchjob":
        assert ("Worker" in document["spec"]["pytorchReplicaSpecs"]) == (gpus > per_node)


NASTY_STRINGS = ["8", "no", "on", "null", "~", "1e3", "0x1f", "1:20", "-x", "a: b", "a #b", "$(X)", "'q'", '"d"',
                 "tab\there", "line\nbreak", "", " lead", "trail ", "ünï", "yes", "True", "- item", "*ref", "&anchor",
                 "!tag", "%dir", "@at", "`bt`", "{a}", "[b]", "nvidia.com/gpu", "/dev/shm", "pytorch/pytorch:2.1-x"]


def test_yaml_text_reads_back_as_the_same_values():
    document = {"strings": NASTY_STRINGS, "keys": {s: s for s in NASTY_STRINGS}, "ints": [0, -1, 2**40],
                "bools": [True, False], "empty": {"d": {}, "l": []}, "nested": [[1, [2]], [{"a": [{}]}]]}
    assert yaml.safe_load(yaml_text(document, ("head\nline",))) == document


BAD_OPTIONS = [
    (["--k8s-kind", "mpijob"], "--k8s-kind"),
    (["--k8s-image", ""], "--k8s-image"),
    (["--k8s-image", "a b"], "--k8s-image"),
    (["--k8s-namespace", "Bad_NS"], "--k8s-namespace"),
    (["--k8s-namespace", "x" * 64], "--k8s-namespace"),
    (["--k8s-name", "9lives"], "--k8s-name"),
    (["--k8s-name", "n" * 50], "--k8s-name"),  # its JobSet pod names would pass 63 characters
    (["--k8s-claim", "a/b"], "--k8s-claim"),
    (["--k8s-mount", "relative"], "--k8s-mount"),
    (["--k8s-env", "NO_VALUE"], "--k8s-env"),
    (["--k8s-env", "1X=a"], "--k8s-env"),
    (["--k8s-env", "MASTER_ADDR=a"], "--k8s-env"),  # the manifest's own rendezvous
    (["--k8s-rdma-resource", "rdma ib"], "--k8s-rdma-resource"),
    (["--k8s-rdma-count", "0"], "--k8s-rdma-count"),
    (["--k8s-shm-gib", "0"], "--k8s-shm-gib"),
    (["--k8s-node-selector", "novalue"], "--k8s-node-selector"),
    (["--k8s-kind", "pytorchjob", "--k8s-topology-key", "rack"], "--k8s-topology-key"),
]


@pytest.mark.parametrize("args, field", BAD_OPTIONS)
def test_bad_options_are_one_line_exit_2(readme_plan, tmp_path, args, field):
    result = CliRunner().invoke(main, ["launch", str(readme_plan), "--out", str(tmp_path / "job"),
                                       "--scheduler", "kubernetes", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], result.output
    assert not (tmp_path / "job").exists()  # refused before anything was written


def test_k8s_options_need_the_kubernetes_scheduler(readme_plan, tmp_path):
    result = CliRunner().invoke(main, ["launch", str(readme_plan), "--out", str(tmp_path / "job"),
                                       "--k8s-namespace", "ml"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --k8s-namespace: only used with --scheduler kubernetes "
                                     "(got --scheduler torchrun)")


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of container arguments (an undefined variable stays as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.torchrun
def test_cpu_plan_manifest_command_trains_under_torchrun(tmp_path):
    """The JobSet's container command, with pod 0's values for what the cluster provides (the node
    index, pod 0's address) and this directory for the volume's job directory, trains 2 steps."""
    plan, job = tmp_path / "plan.json", tmp_path / "job"
    assert CliRunner().invoke(main, ["plan", *CPU_PLAN, "--out", str(plan)]).exit_code == 0
    result = CliRunner().invoke(main, ["launch", str(plan), "--out", str(job), "--scheduler", "kubernetes",
                                       "--k8s-job-dir", "/workspace/job"])
    assert result.exit_code == 0, result.output
    documents = {"jobset": yaml.safe_load((job / "jobset.yaml").read_text())}
    assert CliRunner().invoke(main, ["launch", str(plan), "--out", str(job), "--scheduler", "kubernetes",
                                     "--k8s-kind", "pytorchjob", "--k8s-job-dir", "/workspace/job"]).exit_code == 0
    documents["pytorchjob"] = yaml.safe_load((job / "pytorchjob.yaml").read_text())
    for kind, document in documents.items():
        check_against_api(document, kind)
        assert pods_and_processes(document) == (1, 2)
    (container,) = pod_templates(documents["jobset"])[0]["spec"]["containers"]
    (torch_container,) = pod_templates(documents["pytorchjob"])[0]["spec"]["containers"]
    assert [a.replace("PET_NODE_RANK", "JOB_COMPLETION_INDEX") for a in torch_container["command"]] == \
        container["command"]  # the same command; only the node rank's source differs
    pod_env = {e["name"]: e["value"] for e in container["env"]}
    pod_env.update(JOB_COMPLETION_INDEX="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    command = [expand(a, pod_env).replace("/workspace/job", str(job)) for a in container["command"]]
    assert command[0] == "python"
    env = {**os.environ, **pod_env, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *command[1:], "--steps", "2"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (job / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] > 0 for r in records)
    assert (job / "checkpoints" / "step-00000002").is_dir()
