"""``autoplan profile`` argument handling, and bad profiles given to plan/evaluate (exit 2, one line)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from profiles.harness import pool_medians

PLAN_ARGS = ["--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "8", "--seq-len", "256"]


def _cuda_available() -> bool:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", code]).returncode == 0


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.skipif(_cuda_available(), reason="this machine has CUDA; the no-CUDA message cannot show")
def test_cuda_without_cuda_is_one_line_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["profile", "--device", "cuda", "--nproc", "1", "--out", str(out)])
    _one_line_error(result, "--device cuda", "no CUDA device")
    assert not out.exists()


def test_more_cpu_processes_than_cores_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["profile", "--device", "cpu", "--nproc", "100000",
                                       "--out", str(tmp_path / "p.json")])
    _one_line_error(result, "--nproc 100000", "CPU cores")


def test_unknown_device_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["profile", "--device", "tpu", "--nproc", "1", "--out", str(tmp_path / "p")])
    assert result.exit_code == 2 and "tpu" in result.output


@pytest.mark.parametrize("command", ["plan", "evaluate"])
@pytest.mark.parametrize(("content", "needle"), [
    ('{"schema_version": 1, "kind": "autoplan-hardware-profile", "device_ty', "not valid JSON"),
    ('{"hello": "world"}', "not an autoplan profile"),
    ('{"schema_version": 99, "kind": "autoplan-hardware-profile"}', "schema_version"),
])
def test_plan_and_evaluate_reject_bad_profiles_cleanly(tmp_path: Path, command: str, content: str,
                                                        needle: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    layout = ["--dp", "2", "--tp", "1", "--pp", "1"] if command == "evaluate" else []
    result = CliRunner().invoke(main, [command, *PLAN_ARGS, *layout, "--profile", str(bad)])
    _one_line_error(result, str(bad), needle)


def test_pool_medians_merges_rounds_and_ranks_by_point() -> None:
    records = [{"m": 1, "time_s": 3.0}, {"m": 2, "time_s": 1.0}, {"m": 1, "time_s": 1.0}, {"m": 1, "time_s": 2.0}]
    assert pool_medians(records) == [{"m": 1, "time_s": 2.0}, {"m": 2, "time_s": 1.0}]


def test_measuring_without_out_names_the_missing_option(tmp_path: Path) -> None:
    """``profile`` is also a group (import-nccl-tests, import-trace, show), so its measuring options
    are checked by hand: a missing one is still one usage line, exit 2."""
    result = CliRunner().invoke(main, ["profile", "--device", "cpu", "--nproc", "1"])
    _one_line_error(result, "Missing option '--out'")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_stops_the_torchrun_it_started(tmp_path: Path) -> None:
    # torchrun runs in its own session, which a SIGTERM to autoplan (a cancelled job, `timeout`) does not reach
    exe = str(Path(sys.executable).parent / "autoplan")
    proc = subprocess.Popen([exe, "profile", "--device", "cpu", "--nproc", "1", "--quick", "--out",
                             str(tmp_path / "p.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _children(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    started = _children(proc.pid)
    assert started, "autoplan profile started no torchrun"
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted"
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in started)
    assert not (tmp_path / "p.json").exists()
