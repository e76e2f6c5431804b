"""``autoplan validate plan.json``: run plans, compare predicted with measured, calibrate."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from .common import output_console, run_command

MIB = 2**20


@click.command("validate")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--candidates", "num_candidates", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also run the next K candidates of the plan file.")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True, help="Timed steps per plan.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed steps first.")
@click.option("--nproc", type=click.IntRange(min=1), default=None,
              help="Processes torchrun starts; plans of another world size are skipped (default: each plan's own).")
@click.option("--dry-run", is_flag=True, help="Fake tensors and a fake process group: memory at full size, no time.")
@click.option("--calibrate", is_flag=True, help="Fit correction factors from the runs and write them into --profile.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), default=None,
              help="Profile to predict with and, with --calibrate, to write (default: the plan's own).")
@click.option("--from-log", "from_log", type=click.Path(dir_okay=False), default=None,
              help="With --calibrate: fit to a table of layouts and measured step times (CSV/TSV, or rows naming "
                   "Megatron-LM / torchtitan logs) instead of running jobs here; see docs/validate.md.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where job directories and logs go (default: a new temporary directory, removed at the end).")
@click.option("--keep", is_flag=True, help="Keep the temporary directory of job directories and logs.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def validate_command(plan_file: str, num_candidates: int, steps: int, warmup: int, nproc: int | None,
                     dry_run: bool, calibrate: bool, profile_path: str | None, from_log: str | None,
                     workdir: str | None, keep: bool, fmt: str) -> None:
    """Run PLAN_FILE's plan (and K candidates) on this machine; print predicted vs measured.

    \b
    Real runs: torchrun on this node, the generated job's own code; step time (median of the
    timed steps, slowest rank), tokens/s, and memory per pipeline rank by component (exact
    tensor bytes of parameters, gradients, optimizer states; activations saved for backward).
    --dry-run: the same step on fake tensors at the plan's real size, memory only.
    --calibrate --from-log TABLE: no runs; fit to step times measured elsewhere, leave-one-out.
    """
    def work() -> None:
        from .places import check_output_dir, check_output_file
        from planner.validate.workflow import calibrate_from_log, run_validation

        if workdir is not None:
            check_output_dir(workdir, "--workdir")
        if calibrate and profile_path is not None:
            check_output_file(profile_path, "--profile")
        if from_log:
            report = calibrate_from_log(Path(plan_file), from_log, calibrate=calibrate, profile_path=profile_path)
            if fmt == "json":
                click.echo(json.dumps(report, indent=2, sort_keys=True, allow_nan=False))
            else:
                print_log_report(report)
            return
        if dry_run:
            _say_dry_run_cost(plan_file, num_candidates)
        with _progress_bar() as progress:
            report = run_validation(Path(plan_file), num_candidates=num_candidates, steps=steps, warmup=warmup,
                                    nproc=nproc, dry_run=dry_run, calibrate=calibrate, profile_path=profile_path,
                                    workdir=workdir, keep=keep, progress=progress)
        if fmt == "json":
            click.echo(json.dumps(report, indent=2, sort_keys=True, allow_nan=False))
        else:
            print_report(report)

    run_command(work)


def _say_dry_run_cost(plan_file: str, num_candidates: int) -> None:
    """One line on stderr before a dry run starts: how many ranks and micro-batches it will step."""
    from planner.plan.plan_file import read_plan_file
    from planner.validate.runner import dry_run_cost

    cost = dry_run_cost(read_plan_file(plan_file), num_candidates)
    if cost:
        click.echo(cost, err=True)


def print_log_report(report: dict[str, Any]) -> None:
    """Per row: measured, fitted and leave-one-out step time; peak memory; the factors written."""
    from rich.table import Table

    table = Table(title="Calibration from measured runs", header_style="bold")
    for col in ("layout", "from", "measured s", "fitted s", "leave-one-out s", "error", "peak GiB meas/pred"):
        table.add_column(col, justify="left" if col in ("layout", "from") else "right")
    for row in report["rows"]:
        L, loo = row["layout"], row["leave_one_out_s"]
        peak = f"{row['measured_peak_gib']:.1f} / {row['predicted_peak_gib']:.1f}" if row["measured_peak_gib"] else \
            f"- / {row['predicted_peak_gib']:.1f}"
        table.add_row(f"dp {L['dp']} tp {L['tp']} pp {L['pp']} zero {L['zero_stage']} mb {L['micro_batch_size']}",
                      row["origin"], f"{row['measured_s']:.4g}", f"{row['fitted_s']:.4g}",
                      "-" if loo is None else f"{loo:.4g}",
                      "-" if loo is None else f"{100 * (loo / row['measured_s'] - 1):+.1f}%", peak)
    console = output_console()
    console.print(table)
    console.print(f"calibration written to {report['profile']}: "
                  + ", ".join(f"{k} {v:.4g}" for k, v in sorted(report["factors"].items())))
    loo = report["median_abs_error_pct_leave_one_out"]
    console.print(f"median |step time error|: {report['median_abs_error_pct_before']:.1f}% before, "
                  f"{report['median_abs_error_pct_after']:.1f}% after (in-sample), "
                  + ("-" if loo is None else f"{loo:.1f}%") + " leave-one-out")


@contextmanager
def _progress_bar():
    """A rich progress bar on stderr, fed as ``progress(done, total, what)``; started on the first
    call, so a command that fails before running anything prints only its error line."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:  # a pipe or a log file gets no bar (and no stray blank line)
        yield lambda done, total, what: None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True)
    task = None

    def update(done: int, total: int, what: str) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("validate", total=total)
        bar.update(task, completed=done, total=total, description=f"validate: {what}")

    try:
        yield update
    finally:
        if task is not None:
            bar.stop()


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def print_report(report: dict[str, Any]) -> None:
    """Side by side per plan: step time, tokens/s, memory by component per pipeline rank."""
    from rich.table import Table

    console = output_console()
    if "note" in report:
        console.print(f"note: {report['note']}")
    for plan in report["plans"]:
        L = plan["layout"]
        console.print(f"[bold]{plan['name']}[/bold]: dp {L['dp']} tp {L['tp']} pp {L['pp']} zero {L['zero_stage']} "
                      f"mb {L['micro_batch_size']}x{L['num_microbatches']} {L['schedule']} recompute {L['recompute']}"
                      f"  (job: {plan['job_dir']})")
        if "skipped" in plan:
            console.print(f"  skipped: {plan['skipped']}")
            continue
        table = Table(box=None, header_style="bold", padding=(0, 2))
        for col in ("quantity", "predicted", "measured", "error"):
            table.add_column(col, justify="left" if col == "quantity" else "right")
        if "step_time_s" in plan:
            t, k = plan["step_time_s"], plan["tokens_per_s"]
            table.add_row("step time (s)", f"{t['predicted']:.4f}", f"{t['measured']:.4f}", _pct(t["error_pct"]))
            table.add_row("tokens/s", f"{k['predicted']:.0f}", f"{k['measured']:.0f}", "")
        for row in plan["memory_bytes"]:
            table.add_row(f"pp rank {row['pp_rank']} {row['component']} (MiB)", f"{row['predicted'] / MIB:.2f}",
                          f"{row['measured'] / MIB:.2f}", _pct(row["error_pct"]))
        console.print(table)
    cal = report.get("calibration")
    if cal:
        console.print(f"calibration written to {cal['profile']}: "
                      + ", ".join(f"{k} {v:.4g}" for k, v in sorted(cal["factors"].items())))
        console.print(f"median |step time error|: {cal['median_abs_error_pct_before']:.1f}% before, "
                      f"{cal['median_abs_error_pct_after']:.1f}% after; 95% interval x/÷ "
                      f"{__import__('math').exp(1.96 * cal['step_time_log_sd']):.3f}")
