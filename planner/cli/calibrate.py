"""``autoplan calibrate``: fit this cluster's mechanism factors from its own training logs."""

from __future__ import annotations

import json
import math
from typing import Any

import click

from .common import output_console, run_command


@click.command("calibrate")
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@click.option("--hardware", required=True, help="Hardware preset or TOML path of the cluster the runs ran on.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs per node of that cluster (default: the hardware's).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), default=None,
              help="A measured profile (autoplan profile) to correct instead of the datasheet rates; "
                   "its rates are kept in --out.")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Write the calibration here (a profile; plan --calibration OUT uses it).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def calibrate_command(sources: tuple[str, ...], hardware: str, gpus_per_node: int | None, profile_path: str | None,
                      out: str, fmt: str) -> None:
    """Fit the cost model to runs this cluster already measured: SOURCES are Megatron-LM logs,
    torchtitan run directories (the job's TOML and its log), tables of runs (.csv/.tsv), or
    directories of them.

    \b
    Each run is costed once as the terms of its step (GEMM, attention, memory-bound kernels,
    collectives in and across nodes, overlap, host issue); seven factors, one per mechanism,
    bounded around 1, are fitted by regularised least squares on log step time and judged
    leave-one-out; the allocator's fragmentation share is fitted on the logged peaks and the runs
    that died out of memory. A factor no run informs stays at 1 and is marked so.
    """
    def work() -> None:
        from hardware_specs.loader import hardware_name
        from planner.calibrate import calibrate, write_calibration_profile

        from .places import check_output_file

        check_output_file(out, "--out")
        name = hardware_name(hardware)
        report, table, base = calibrate(list(sources), hardware=name, gpus_per_node=gpus_per_node,
                                        profile=profile_path)
        write_calibration_profile(out, table, report, base, hardware=name, gpus_per_node=gpus_per_node)
        if fmt == "json":
            click.echo(json.dumps({"out": out, "calibration": table, **report}, indent=2, sort_keys=True,
                                  allow_nan=False))
        else:
            print_calibration(report, out)

    run_command(work)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_calibration(report: dict[str, Any], out: str) -> None:
    """The fit as a person reads it: factors with their spread and support, then the errors."""
    console = output_console()
    console.print(f"{report['runs']} runs ({report['timed_runs']} timed, {report['oom_runs']} out of memory); "
                  f"wrote {out}")
    console.print(f"  {'factor':13} {'x':>6} {'spread':>8} {'runs':>5}  mechanism")
    for name, f in report["factors"].items():
        spread = f"x/{math.exp(f['log_sd']):.2f}" if f["informed"] else "-"
        flag = " (on its bound)" if f["on_bound"] else "" if f["informed"] else " (no run informs it: held at 1)"
        console.print(f"  {name:13} {f['multiplier']:6.3f} {spread:>8} {f['informing_runs']:5}  {f['mechanism']}{flag}",
                      highlight=False)
    console.print(f"  step time |error|, median: {_pct(report['median_abs_error_before'])} as shipped, "
                  f"{_pct(report['median_abs_error_after'])} fitted, "
                  f"{_pct(report['median_abs_error_leave_one_out'])} leave-one-out", highlight=False)
    memory = report["memory"]
    if memory["fragmentation"] is not None:
        console.print(f"  memory: fragmentation share {memory['fragmentation']:.3f} on {memory['measured_runs']} peaks "
                      f"and {memory['oom_runs']} out-of-memory runs ({memory['oom_predicted']} of them predicted "
                      f"over the device); peak |error| median {_pct(memory['median_abs_error_before'])} -> "
                      f"{_pct(memory['median_abs_error_after'])}", highlight=False)
    for line in report["skipped"][:5]:
        console.print(f"  skipped: {line}", style="dim", highlight=False)
