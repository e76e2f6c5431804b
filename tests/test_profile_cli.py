"""``autoplan profile`` argument handling, and bad profiles given to plan/evaluate (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys
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
