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

from .common import output_console, run_command

if TYPE_CHECKING:
    from rich.table import Table

    from profiles import HardwareProfile

LOG_TAIL_LINES = 20


@click.group("profile", invoke_without_command=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="cpu: one single-threaded process per core, gloo; cuda: one process per GPU, NCCL.  "
                   "[required to measure]")
@click.option("--nproc", type=click.IntRange(min=1), default=None,
              help="Processes (devices) to profile.  [required to measure]")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Profile JSON to write, e.g. profiles/data/NAME.json.  [required to measure]")
@click.option("--quick", is_flag=True, help="Fewer shapes and sizes (under a minute on a small CPU box).")
@click.option("--only", type=click.Choice(["compute", "collectives"]), default=None,
              help="Measure one phase only (default: both).")
@click.pass_context
def profile_command(ctx: click.Context, device: str | None, nproc: int | None, out: str | None, quick: bool,
                    only: str | None) -> None:
    """Measure GEMM, attention, memory bandwidth and collectives on this node; write a profile.

    \b
    Use it with:  autoplan plan ... --profile profiles/data/NAME.json
    Several nodes: run 'torchrun ... -m profiles.harness' on each (see docs/profiling.md).
    From what a cluster already measured: the import-nccl-tests and import-trace commands.
    """
    if ctx.invoked_subcommand is not None:
        return
    for name, value, hint in (("--device", device, " Choose from: cpu, cuda."), ("--nproc", nproc, ""),
                              ("--out", out, "")):
        if value is None:
            raise click.UsageError(f"Missing option '{name}'.{hint}")
    assert device is not None and nproc is not None and out is not None
    argv = ["autoplan", "profile", "--device", device, "--nproc", str(nproc), "--out", out]
    argv += ["--quick"] * quick + (["--only", only] if only else [])
    run_command(lambda: _profile(device, nproc, Path(out), quick, only, shlex.join(argv)))


@profile_command.command("import-nccl-tests")
@click.argument("logs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Profile JSON to write.")
@click.option("--in-place", is_flag=True, help="Use the in-place columns (default: out-of-place).")
@click.option("--dtype", default=None, help="The type to keep when a log holds several (fp32, bf16, fp16, fp8).")
def import_nccl_tests_command(logs: tuple[str, ...], out: str, in_place: bool, dtype: str | None) -> None:
    """Turn nccl-tests stdout (all_reduce_perf, all_gather_perf, reduce_scatter_perf,
    alltoall_perf, sendrecv_perf, broadcast_perf) into a profile of collective curves.

    \b
    One curve per collective, group size and placement (one node or several, from the
    '#  Rank ... on HOST' lines); each is fitted with the segmented alpha-beta model.
    """
    from profiles.nccl_tests import import_logs

    command = shlex.join(["autoplan", "profile", "import-nccl-tests", *logs, "--out", out]
                         + ["--in-place"] * in_place + (["--dtype", dtype] if dtype else []))
    run_command(lambda: _write_and_show(out, import_logs(list(logs), in_place=in_place, dtype=dtype,
                                                           command=command, date=_now())))


@profile_command.command("import-trace")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--layout", default="", help="Parallel degrees of the traced job, e.g. 'dp=2,tp=4': the group size "
              "of collectives the trace does not name.")
@click.option("--model", default=None, help="Model of the traced job (preset or config.json), recorded in the profile.")
@click.option("--spans-nodes", is_flag=True, help="The traced job's collective groups spanned nodes.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Profile JSON to write.")
def import_trace_command(trace: str, layout: str, model: str | None, spans_nodes: bool, out: str | None) -> None:
    """Turn a PyTorch profiler Chrome trace of one training step (export_chrome_trace) into
    measured rates: GEMM FLOP/s by shape, attention, collective curves; print the overlap of
    communication with compute the step achieved.

    \b
    Trace the generated job's own step:
      torchrun --standalone --nproc-per-node N -m planner.launch.torchjob.trace_step --plan plan.json --out step.json
    """
    from profiles.trace_import import import_trace, parse_degrees

    command = shlex.join(["autoplan", "profile", "import-trace", trace] + (["--layout", layout] if layout else [])
                         + (["--model", model] if model else []) + ["--spans-nodes"] * spans_nodes
                         + (["--out", out] if out else []))

    def work() -> None:
        result = import_trace(trace, degrees=parse_degrees(layout), spans_nodes=spans_nodes,
                              provenance={"model": model, "layout": layout, "command": command, "date": _now()})
        print_trace_report(result)
        if out:
            _write_and_show(out, result.profile)

    run_command(work)


def print_trace_report(result) -> None:
    """Per kind: the step's time in the trace and as the imported rates reproduce it; the overlap."""
    from rich.table import Table

    table = Table(title="Step time by kind: trace vs imported rates")
    for name in ("kind", "trace", "reproduced", "error"):
        table.add_column(name, justify="left" if name == "kind" else "right")
    for kind, seconds in result.trace_time_s.items():
        again = result.reproduced_time_s.get(kind)
        error = f"{(again - seconds) / seconds:+.1%}" if seconds and again is not None else "-"
        table.add_row(kind, f"{seconds * 1e3:.3f} ms", "no rate" if again is None else f"{again * 1e3:.3f} ms", error)
    console = output_console()
    console.print(table)
    rates = Table(title="GEMM rate by shape (mean over the step's calls)")
    for name in ("dtype", "m x n x k", "calls", "mean time", "achieved"):
        rates.add_column(name, justify="left" if name in ("dtype", "m x n x k") else "right")
    for r in result.gemm_rates:
        rates.add_row(r["dtype"], f"{r['m']} x {r['n']} x {r['k']}", str(r["calls"]), f"{r['mean_time_s'] * 1e6:.1f} us",
                      f"{r['flops_per_s'] / 1e9:.3g} GFLOP/s")
    console.print(rates)
    o = result.overlap
    console.print(f"communication {o['comm_s'] * 1e3:.3f} ms, of which {o['overlapped_s'] * 1e3:.3f} ms overlapped "
                  f"by compute: overlap {o['fraction']:.1%}")
    for line in result.skipped:
        console.print(f"skipped: {line}")


@profile_command.command("show")
@click.argument("profile_path", type=click.Path(dir_okay=False))
def show_command(profile_path: str) -> None:
    """Print a profile: compute rates, collectives with their source, and every fitted regime."""
    from profiles import load_profile

    run_command(lambda: print_summary(load_profile(profile_path)))


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_and_show(out: str, profile: "HardwareProfile") -> None:
    from profiles import write_profile

    try:
        write_profile(out, profile)
    except OSError as err:
        raise click.ClickException(f"--out: cannot write {out} ({err.strerror})") from None
    print_summary(profile)
    click.echo(f"wrote {out} ({len(profile.collectives)} collective curves)")


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


def _profile(device: str, nproc: int, out: Path, quick: bool, only: str | None, command: str) -> None:
    from profiles import load_profile

    from .places import check_output_file

    check_output_file(out, "--out")
    _check_devices(device, nproc)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="autoplan-profile-") as tmp:
        progress_file, log_file = Path(tmp) / "progress.jsonl", Path(tmp) / "torchrun.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "profiles.harness", "--device", device, "--out", str(out.resolve()),
               "--progress-file", str(progress_file), "--command", command] + ["--quick"] * quick
        cmd += ["--only", only] if only else []
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
        # torchrun runs in its own session (a terminal's Ctrl-C reaches this process alone), so a
        # SIGTERM (a scheduler cancelling the job, ``timeout``) is turned into the interrupt that
        # stops its process group below, where Python's default would leave it running
        previous = signal.signal(signal.SIGTERM, _interrupt)
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
        finally:
            signal.signal(signal.SIGTERM, previous)
        return proc.returncode


def _interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: stop as Ctrl-C stops (``KeyboardInterrupt``)."""
    raise KeyboardInterrupt


def print_summary(profile: "HardwareProfile") -> None:
    """Two tables: achieved compute and memory rates; collective latency and bus bandwidth."""

    console = output_console()
    if profile.gemm or profile.attention or profile.memory:
        console.print(_compute_table(profile))
    if profile.collectives:
        console.print(_collective_table(profile))
        console.print(_regime_table(profile))


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
    for name in ("op", "ranks", "placement", "source", "latency", "busbw fit", "busbw peak", "fit err"):
        table.add_column(name, justify="left" if name in ("op", "placement", "source") else "right", no_wrap=True)
    for c in profile.collectives:
        table.add_row(c.op, str(c.num_ranks), f"{c.ranks_per_node}/node x {c.num_nodes}", c.source,
                      f"{c.latency_s * 1e6:.0f} us", _gbps(c.bus_bandwidth_bytes_per_s),
                      _gbps(c.peak_bus_bandwidth_bytes_per_s()), f"{c.rms_relative_error:.0%}")
    return table


def _regime_table(profile: "HardwareProfile") -> "Table":
    """Every regime of the segmented fit: its measured size range, the measured size after which
    it starts (the break lies between that size and the regime's first), alpha, beta and error."""
    from rich.table import Table

    table = Table(title="Regimes of the segmented alpha-beta fit (t = alpha + factor * S / beta)")
    for name in ("op", "ranks", "placement", "sizes", "break after", "alpha", "beta (busbw)", "rms err"):
        table.add_column(name, justify="left" if name in ("op", "placement", "sizes", "break after") else "right",
                         no_wrap=True)
    for c in profile.collectives:
        for k, seg in enumerate(c.segments):
            head = (c.op, str(c.num_ranks), f"{c.ranks_per_node}/node x {c.num_nodes}") if k == 0 else ("", "", "")
            after = _size(c.segments[k - 1].last_size_bytes) if k else "-"
            table.add_row(*head, f"{_size(seg.first_size_bytes)} - {_size(seg.last_size_bytes)}", after,
                          f"{seg.latency_s * 1e6:.1f} us", _gbps(seg.bus_bandwidth_bytes_per_s),
                          f"{seg.rms_relative_error:.0%}")
    return table


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3g} GB/s"


def _size(size_bytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size_bytes >= 1 << shift:
            return f"{size_bytes / (1 << shift):.4g} {unit}"
    return f"{size_bytes} B"
