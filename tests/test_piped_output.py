"""Output written to a pipe or a log file keeps whole names and lines (rich alone wraps at 80)."""

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from planner.cli.common import PIPE_WIDTH

AUTOPLAN = str(Path(sys.executable).parent / "autoplan")
REPO = Path(__file__).resolve().parent.parent


def _piped(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run([AUTOPLAN, *args], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_piped_plan_keeps_each_layout_on_one_line():
    out = _piped("plan", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "16",
                 "--global-batch", "64", "--seq-len", "8192")
    rows = [line for line in out.splitlines() if re.match(r"\s+[2-6]\s+dp \d", line)]
    assert len(rows) == 5 and all(re.search(r"recompute \w+.*\d%", row) for row in rows), out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= PIPE_WIDTH
    # a rich console at 80 columns wraps these rows: the width is what keeps them whole
    assert max(len(row.rstrip()) for row in rows) > 80


def test_an_exported_columns_still_sets_the_width(monkeypatch):
    from planner.cli.common import output_console

    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a pipe, not a terminal
    monkeypatch.setenv("COLUMNS", "90")
    assert output_console().width == 90
    monkeypatch.delenv("COLUMNS")
    assert output_console().width == PIPE_WIDTH
