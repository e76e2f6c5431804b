"""``autoplan profile``: measure this machine under torchrun and write a profile JSON.

The command launches ``python -m profiles.harness`` under ``torch.distributed.run`` (one process
per device; on CPU one single-threaded process per core), shows its progress, and prints a
summary of what it measured. torch is imported only inside the command, for the CUDA check.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .common import run_command

if TYPE_CHECKING:
    from rich.table import Table

    from profiles import HardwareProfile

LOG_TAIL_LINES = 20


@click.command("profile")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), required=True,
              help="cpu: one single-threaded process per core, gloo; cuda: one process per GPU, NCCL.")
@click.option("--nproc", type=click.IntRange(min=1), required=True, help="Processes (devices) to profile.")
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="Profile JSON to write, e.g. profiles/data/NAME.json.")
@click.option("--quick", is_flag=True, help="Fewer shapes and sizes (under a minute on a small CPU box).")
def profile_command(device: str, nproc: int, out: str, quick: bool) -> None:
    """Measure GEMM, attention, memory bandwidth and collectives on this node; write a profile.

    \b
    Use it with:  autoplan plan ... --profile profiles/data/NAME.json
    Several nodes: run 'torchrun ... -m profiles.harness' on each (see docs/profiling.md).
    """
    argv = ["autoplan", "profile", "--device", device, "--nproc", str(nproc), "--out", out]
    run_command(lambda: _profile(device, nproc, Path(out), quick, shlex.join(argv + ["--quick"] * quick)))


def _check_devices(device: str, nproc: int) -> None:
    """Refuse requests this machine cannot serve, in one line naming the option."""
    from profiles import ProfileError

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ProfileError(f"--device cuda: no CUDA device is available here (torch {torch.__version__}); "
                               f"profile a GPU node there, or use --device cpu")
        if nproc > torch.cuda.device_count():
            raise ProfileError(f"--nproc {nproc}: only {torch.cuda.device_count()} CUDA devices are visible; "
                               f"use --nproc {torch.cuda.device_count()} or fewer")
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if nproc > cores:
        raise ProfileError(f"--nproc {nproc}: this machine has {cores} CPU cores and the CPU profile runs one "
                           f"single-threaded process per core; use --nproc {cores} or fewer")


def _profile(device: str, nproc: int, out: Path, quick: bool, command: str) -> None:
    from profiles import load_profile

    from ..places import check_output_file

    check_output_file(out, "--out")
    _check_devices(device, nproc)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="autoplan-profile-") as tmp:
        progress_file, log_file = Path(tmp) / "progress.jsonl", Path(tmp) / "torchrun.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "profiles.harness", "--device", device, "--out", str(out.resolve()),
               "--progress-file", str(progress_file), "--command", command] + ["--quick"] * quick
        code = _run_with_progress(cmd, progress_file, log_file, _child_env(device))
        if code != 0:
            tail = log_file.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            click.echo("\n".join(tail), err=True)
            raise click.ClickException(f"profiling failed: torchrun exited with status {code} (log above)")
    print_summary(load_profile(out))
    click.echo(f"wrote {out} ({nproc} {device} processes, {'quick' if quick else 'full'} profile, "
               f"{time.perf_counter() - started:.0f} s)")


def _child_env(device: str) -> dict[str, str]:
    """The environment for torchrun: one math thread per process on CPU."""
    env = dict(os.environ)
    if device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    return env


def _run_with_progress(cmd: list[str], progress_file: Path, log_file: Path, env: dict[str, str]) -> int:
    """Run ``cmd`` (output to ``log_file``) while a progress bar follows ``progress_file``."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with open(log_file, "w") as log, Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("starting torchrun", total=None)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while proc.poll() is None:
                time.sleep(0.2)
                if progress_file.exists():
                    lines = progress_file.read_text().splitlines()
                    try:
                        last = json.loads(lines[-1]) if lines else None
                    except ValueError:  # a line caught half-written; the next poll reads it whole
                        continue
                    if last:
                        bar.update(task, completed=last["done"], total=last["total"], description=last["what"])
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
        return proc.returncode


def print_summary(profile: "HardwareProfile") -> None:
    """Two tables: achieved compute and memory rates; collective latency and bus bandwidth."""
    from rich.console import Console

    console = Console()
    console.print(_compute_table(profile))
    if profile.collectives:
        console.print(_collective_table(profile))


def _compute_table(profile: "HardwareProfile") -> "Table":
    from rich.table import Table

    table = Table(title=f"Measured compute: {profile.provenance.get('device_name', profile.device_type)}")
    for name in ("kernel", "dtype", "peak achieved", "fitted rate", "fit error"):
        table.add_column(name, justify="left" if name in ("kernel", "dtype") else "right")
    for family, tables in (("gemm", profile.gemm), ("attention", profile.attention)):
        for dtype, t in tables.items():
            rate = f"{t.fit.flops_per_s / 1e12:.4g} TFLOP/s" if t.fit.flops_per_s else "-"
            table.add_row(family, dtype, f"{t.peak_flops_per_s() / 1e12:.4g} TFLOP/s", rate,
                          f"{t.fit.rms_relative_error:.0%}")
    for kernel, points in profile.memory.items():
        best = max(p.bytes_per_s for p in points)
        table.add_row(kernel, "fp32", f"{best / 1e9:.4g} GB/s",
                      f"{points[-1].bytes_per_s / 1e9:.4g} GB/s @ {points[-1].size_bytes >> 20} MiB", "")
    return table


def _collective_table(profile: "HardwareProfile") -> "Table":
    from rich.table import Table

    table = Table(title="Measured collectives (bus bandwidth, nccl-tests convention)")
    for name in ("op", "ranks", "placement", "latency", "busbw fit", "busbw peak", "fit err"):
        table.add_column(name, justify="left" if name in ("op", "placement") else "right", no_wrap=True)
    for c in profile.collectives:
        beta = f"{c.bus_bandwidth_bytes_per_s / 1e9:.3g} GB/s" if c.bus_bandwidth_bytes_per_s else "-"
        table.add_row(c.op, str(c.num_ranks), f"{c.ranks_per_node}/node x {c.num_nodes}",
                      f"{c.latency_s * 1e6:.0f} us", beta, f"{c.peak_bus_bandwidth_bytes_per_s() / 1e9:.3g} GB/s",
                      f"{c.rms_relative_error:.0%}")
    return table
