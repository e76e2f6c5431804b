"""Run a list of training cases through ``planner.runtime.case_runner``: in one plain process
(``nproc`` 1, the single-process reference) or in one ``torchrun --standalone`` launch of
``nproc`` processes. Shared by the loss-parity tests, so each world size costs one launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_cases(cases: list[dict], tmp: Path, nproc: int, timeout_s: int = 600) -> dict:
    """{case name: per-step results} of every case that runs at world size ``nproc``."""
    path, out = tmp / f"cases-{nproc}.json", tmp / f"results-{nproc}.json"
    path.write_text(json.dumps(cases), encoding="utf-8")
    harness = ["-m", "planner.runtime.case_runner", str(path), str(out)]
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    proc = subprocess.run([sys.executable, *launcher, *harness], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))
