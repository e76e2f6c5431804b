"""``autoplan launch plan.json --out DIR``: write a job that trains the plan under torchrun
(``--scheduler kubernetes``: also a JobSet or PyTorchJob manifest, ``planner/launch/kubernetes.py``)."""

from __future__ import annotations

import click

from planner.launch.kubernetes import (DEFAULT_CLAIM, DEFAULT_MOUNT, DEFAULT_NAMESPACE, IMAGE_REPOSITORY, IMAGE_TAG_SUFFIX,
                               KINDS)
from .common import run_command
from .k8s_options import SCHEDULERS, kubernetes_options


@click.command("launch")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="directory to write train.py, launch.sh, slurm.sbatch, plan.json, exports/")
@click.option("--force", is_flag=True,
              help="write into DIR even if it is a non-empty directory that is not an earlier autoplan job")
@click.option("--python", "python", default=None,
              help="interpreter launch.sh uses by default (default: the one running autoplan)")
@click.option("--exports-only", is_flag=True,
              help="write only plan.json and exports/ (Megatron-LM, DeepSpeed, torchtitan configs), also for plans "
                   "the job cannot apply, such as fp8/MXFP8/NVFP4 recipes")
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
def launch_command(plan_file: str, out_dir: str, force: bool, python: str | None, exports_only: bool,
                   scheduler: str, **k8s: str | None) -> None:
    """Write a self-contained job for PLAN_FILE; run it with DIR/launch.sh.

    \b
    The job applies the plan's best layout with FSDP2, TP/SP, pipelining, context and expert
    parallelism, recomputation, optimizer offload and LoRA, on CUDA with NCCL when present, else on
    CPU with gloo. Plans with parts the job cannot apply (low-precision recipes, DualPipe, ...) are
    refused with a line naming the field; --exports-only writes their framework configs without the job.
    --scheduler kubernetes also writes the manifest, with --exports-only too.
    """
    from planner.launch.job import write_exports_only, write_job
    from planner.launch.kubernetes import write_manifest
    from planner.plan.plan_file import read_plan_file

    def work() -> None:
        from .places import check_output_dir

        check_output_dir(out_dir, "--out", job=True, force=force)
        plan = read_plan_file(plan_file)
        options = kubernetes_options(plan, out_dir, scheduler, k8s)
        if exports_only:
            files = write_exports_only(plan, out_dir)
            manifest = [] if options is None else [write_manifest(plan, out_dir, options, job_written=False)]
            click.echo(f"wrote {len(files) + len(manifest)} files to {out_dir}: plan.json and exports/ "
                       f"(see exports/NOTES.md){''.join(f', {m.name}' for m in manifest)}")
            return
        files = write_job(plan, out_dir, python=python)
        if options is not None:
            path = write_manifest(plan, out_dir, options, job_written=True)
            click.echo(f"wrote {len(files) + 1} files to {out_dir}; run: {out_dir}/launch.sh --steps 20, "
                       f"or on Kubernetes: kubectl apply -f {path}")
            return
        click.echo(f"wrote {len(files)} files to {out_dir}; run: {out_dir}/launch.sh --steps 20")

    run_command(work)
