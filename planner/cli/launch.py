"""``autoplan launch plan.json --out DIR``: write the job of the plan's runtime, which trains it under torchrun."""

from __future__ import annotations

import click

from .common import run_command


@click.command("launch")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="directory to write the job in: launch.sh, slurm.sbatch, plan.json and the runtime's files")
@click.option("--force", is_flag=True,
              help="write into DIR even if it is a non-empty directory that is not an earlier autoplan job")
@click.option("--python", "python", default=None,
              help="interpreter launch.sh uses by default (default: the one running autoplan)")
def launch_command(plan_file: str, out_dir: str, force: bool, python: str | None) -> None:
    """Write the job of PLAN_FILE's runtime; run it with DIR/launch.sh.

    \b
    megatron: Megatron-LM pretrain_gpt.py arguments (megatron_args.sh); megatron-bridge: recipe
    overrides (bridge_overrides.txt); torchtitan: torchtitan.toml; deepspeed: deepspeed.json and
    Megatron-DeepSpeed arguments. Each with launch.sh (torchrun) and slurm.sbatch, every costed
    option written. torch: autoplan's own job (train.py, FSDP2, TP/SP, pipelining, cp, ep), on CUDA
    with NCCL when present, else on CPU with gloo. A layout the runtime cannot run as costed is
    refused with one line naming the field.
    """
    from planner.launch.job import write_job
    from planner.plan.plan_file import read_plan_file

    def work() -> None:
        from .places import check_output_dir

        check_output_dir(out_dir, "--out", job=True, force=force)
        files = write_job(read_plan_file(plan_file), out_dir, python=python)
        click.echo(f"wrote {len(files)} files to {out_dir}; run: {out_dir}/launch.sh --steps 20")

    run_command(work)
