"""``autoplan launch plan.json --out DIR``: write a job that trains the plan under torchrun."""

from __future__ import annotations

import click

from .common import run_command


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
def launch_command(plan_file: str, out_dir: str, force: bool, python: str | None, exports_only: bool) -> None:
    """Write a self-contained job for PLAN_FILE; run it with DIR/launch.sh.

    \b
    The job applies the plan's best layout with FSDP2, TP/SP, pipelining, context and expert
    parallelism, recomputation, optimizer offload and LoRA, on CUDA with NCCL when present, else on
    CPU with gloo. Plans with parts the job cannot apply (low-precision recipes, DualPipe, ...) are
    refused with a line naming the field; --exports-only writes their framework configs without the job.
    """
    from planner.launch.job import write_exports_only, write_job
    from planner.plan.plan_file import read_plan_file

    def work() -> None:
        from .places import check_output_dir

        check_output_dir(out_dir, "--out", job=True, force=force)
        if exports_only:
            files = write_exports_only(read_plan_file(plan_file), out_dir)
            click.echo(f"wrote {len(files)} files to {out_dir}: plan.json and exports/ (see exports/NOTES.md)")
            return
        files = write_job(read_plan_file(plan_file), out_dir, python=python)
        click.echo(f"wrote {len(files)} files to {out_dir}; run: {out_dir}/launch.sh --steps 20")

    run_command(work)
