"""``autoplan launch plan.json --out DIR``: write the job of the plan's runtime, which trains it under torchrun
(``--scheduler kubernetes``: also a JobSet or PyTorchJob manifest, ``planner/launch/kubernetes.py``)."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click

from planner.launch.kubernetes import (DEFAULT_CLAIM, DEFAULT_MOUNT, DEFAULT_NAMESPACE, IMAGE_REPOSITORY, IMAGE_TAG_SUFFIX,
                               KINDS)
from planner.launch.slurm import SlurmOptions, submit_line
from .common import EXIT_INFEASIBLE, FiniteFloat, run_command
from .k8s_options import SCHEDULERS, kubernetes_options


@click.command("launch")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="directory to write the job in: launch.sh, slurm.sbatch, plan.json and the runtime's files")
@click.option("--force", is_flag=True,
              help="write into DIR even if it is a non-empty directory that is not an earlier autoplan job")
@click.option("--python", "python", default=None,
              help="interpreter launch.sh uses by default (default: the one running autoplan)")
@click.option("--scheduler", type=click.Choice(SCHEDULERS), default="torchrun", show_default=True,
              help="torchrun and slurm: launch.sh and slurm.sbatch, which every job has; kubernetes: also "
                   "DIR/jobset.yaml or DIR/pytorchjob.yaml (--k8s-kind), one pod per node, started by kubectl apply -f")
@click.option("--k8s-kind", type=click.Choice(KINDS), default=None,
              help="manifest kind with --scheduler kubernetes: jobset (jobset.x-k8s.io/v1alpha2, default) or "
                   "pytorchjob (Kubeflow kubeflow.org/v1)")
@click.option("--k8s-image", default=None,
              help=f"container image with Python and torch (default: {IMAGE_REPOSITORY}:<this torch>"
                   f"{IMAGE_TAG_SUFFIX}, "
                   "a tag not verified against Docker Hub from here)")
@click.option("--k8s-namespace", default=None, help=f"namespace, a DNS-1123 label (default: {DEFAULT_NAMESPACE})")
@click.option("--k8s-name", default=None, help="job name, a DNS-1035 label (default: from the plan's model name)")
@click.option("--k8s-claim", default=None,
              help=f"PersistentVolumeClaim holding the job directory, checkpoints and logs (default: {DEFAULT_CLAIM})")
@click.option("--k8s-mount", default=None, help=f"where the claim is mounted in each pod (default: {DEFAULT_MOUNT})")
@click.option("--k8s-job-dir", default=None,
              help="this job directory's path inside the pods (default: the mount path / DIR's name)")
@click.option("--allow-no-fit", is_flag=True,
              help="write the job even when the plan's layout is predicted not to fit in memory (it would run "
                   "out of memory as costed; exit 1 without this flag)")
@click.option("--k8s-env", multiple=True, metavar="NAME=VALUE",
              help="container environment variable, repeatable: a framework job's checkout (MEGATRON_LM=..., "
                   "MEGATRON_BRIDGE=... with RECIPE=..., MEGATRON_DEEPSPEED=...) or NCCL settings")
@click.option("--k8s-rdma-resource", default=None,
              help="RDMA device-plugin resource each pod requests for NCCL (default: rdma/ib; e.g. "
                   "nvidia.com/hostdev; 'none': TCP only)")
@click.option("--k8s-rdma-count", type=int, default=None, help="how many of it each pod requests (default: 1)")
@click.option("--k8s-ipc-lock/--no-k8s-ipc-lock", default=None,
              help="add the IPC_LOCK capability NCCL needs to pin memory for RDMA (default: on)")
@click.option("--k8s-shm-gib", type=int, default=None, help="size of each pod's memory-backed /dev/shm (default: 64)")
@click.option("--k8s-node-selector", multiple=True, metavar="KEY=VALUE",
              help="node label each pod requires, repeatable (e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3)")
@click.option("--k8s-topology-key", default=None,
              help="JobSet: node label whose domain holds all pods (exclusive-topology annotation)")
@click.option("--steps", type=int, default=None,
              help="framework jobs: optimizer steps to train (default: 1000; Megatron's --train-iters)")
@click.option("--lr", type=FiniteFloat(), default=None, help="framework jobs: peak learning rate (default: 3e-4)")
@click.option("--warmup-steps", type=int, default=None,
              help="framework jobs: linear warm-up steps before the cosine decay (default: 100; below --steps "
                   "for megatron and deepspeed, whose schedulers stop otherwise)")
@click.option("--min-lr-ratio", type=FiniteFloat(), default=None,
              help="framework jobs: the decay's final rate as a fraction of --lr (default: 0.1)")
@click.option("--slurm-time", default="24:00:00", show_default=True,
              help="slurm.sbatch's wall-clock limit (#SBATCH --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                   "D-HH:MM:SS; hours after days 0-23, minutes and seconds after another field 0-59)")
@click.option("--slurm-exclusive/--no-slurm-exclusive", default=True, show_default=True,
              help="slurm.sbatch asks for whole nodes (#SBATCH --exclusive), as the plan assumes")
@click.option("--slurm-partition", default=None, help="slurm.sbatch's #SBATCH --partition (default: the cluster's)")
@click.option("--slurm-account", default=None, help="slurm.sbatch's #SBATCH --account (default: the user's)")
def launch_command(plan_file: str, out_dir: str, force: bool, python: str | None,
                   scheduler: str, allow_no_fit: bool, slurm_time: str, slurm_exclusive: bool,
                   slurm_partition: str | None, slurm_account: str | None, steps: int | None, lr: float | None,
                   warmup_steps: int | None, min_lr_ratio: float | None, **k8s: Any) -> None:
    """Write the job of PLAN_FILE's runtime; run it with DIR/launch.sh.

    \b
    megatron: Megatron-LM pretrain_gpt.py arguments (megatron_args.sh); megatron-bridge: recipe
    overrides (bridge_overrides.txt); torchtitan: its command line (torchtitan_args.sh; a plan made
    with --runtime-version v0.2.2: torchtitan.toml); deepspeed: deepspeed.json and Megatron-DeepSpeed
    arguments. Each with launch.sh (torchrun) and slurm.sbatch, every costed option written; their
    checkpoints and logs go under DIR, whatever directory launch.sh is started from. torch:
    autoplan's own job (train.py, FSDP2, TP/SP, pipelining, cp, ep), on CUDA with NCCL when present,
    else on CPU with gloo. A layout the runtime cannot run as costed is refused with one line naming
    the field. --scheduler kubernetes also writes the manifest that runs DIR/launch.sh's command on
    each node.
    """
    from planner.launch.export_problems import require_exportable
    from planner.launch.job import write_job
    from planner.launch.kubernetes import write_manifest
    from planner.plan.plan_file import read_plan_file

    def work() -> None:
        from .places import check_output_dir

        check_output_dir(out_dir, "--out", job=True, force=force)
        plan = read_plan_file(plan_file)
        if plan.best is not None and plan.inputs.module is None:  # what the runtime cannot run: exit 2, first
            require_exportable(plan.inputs.training.runtime, plan.inputs.model_spec, plan.inputs.training,
                               plan.best.layout, plan.inputs.runtime_version)
        _refuse_no_fit(plan_file, plan, allow_no_fit)
        options = kubernetes_options(plan, out_dir, scheduler, k8s)
        slurm = SlurmOptions(time=slurm_time, exclusive=slurm_exclusive, partition=slurm_partition,
                             account=slurm_account)
        files = write_job(plan, out_dir, python=python, slurm=slurm,
                          settings=training_settings(steps=steps, lr=lr, warmup_steps=warmup_steps,
                                                     min_lr_ratio=min_lr_ratio))
        run = shlex.quote(f"{out_dir}/launch.sh") + (" --steps 20" if plan.inputs.training.runtime == "torch"
                                                      or plan.inputs.module is not None else "")
        if options is not None:
            path = write_manifest(plan, out_dir, options)
            click.echo(f"wrote {len(files) + 1} files to {out_dir}; run: kubectl apply -f {shlex.quote(str(path))}")
            return
        if scheduler == "slurm":
            run = submit_line(out_dir)
        click.echo(f"wrote {len(files)} files to {out_dir}; run: {run}")

    run_command(work)


def training_settings(**given: Any):
    """``TrainingSettings`` with the options given (the rest at their defaults), or None when none is."""
    from dataclasses import replace

    from planner.launch.training_settings import DEFAULT_SETTINGS

    given = {key: value for key, value in given.items() if value is not None}
    return replace(DEFAULT_SETTINGS, **given) if given else None


def _refuse_no_fit(plan_file: str, plan: Any, allow: bool) -> None:
    """Exit 1 (valid, but it does not fit) for a plan whose layout is predicted not to fit in memory:
    ``evaluate --out`` writes such a plan, marked ``"fits": false``, and its job would run out of memory."""
    predicted = plan.best.predicted if plan.best is not None else {}
    if allow or predicted.get("fits", True):
        return
    click.echo(f"error: {plan_file}: its layout is predicted not to fit ({predicted.get('peak_memory_gib', 0):.1f} GiB "
               f"per GPU against a cap of {predicted.get('memory_capacity_gib', 0):.1f}), so its job would run out of "
               "memory; plan or evaluate a layout that fits, or pass --allow-no-fit", err=True)
    sys.exit(EXIT_INFEASIBLE)
