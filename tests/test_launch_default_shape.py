"""A shrunk default-shaped job: ``plan`` (no --launchable) -> ``launch`` -> ``launch.sh`` runs.

The README's default job (llama3-70b on 64 H100s) planned dp 1 · tp 1 · pp 8 · cp 8 · ZeRO-2 until
TP communication overlap was costed; it now plans dp 4 · tp 4 · pp 2 · cp 2 with TP overlap, which
``launch`` refuses in one line (no symmetric memory in the generated job; tests/test_tp_overlap.py).
This test keeps the plan -> launch -> kill -> resume chain on the shrunk pipeline x context job:
tiny-llama on 4 CPU processes with the pipeline split pinned to two stages and the search narrowed
to tp 1 and cp 2 (``--tp 1 --cp 2``; inside the measured tie band it would otherwise take tp 2),
where ``plan`` picks dp 1 · tp 1 · pp 2 · cp 2. Where the generated job cannot run
context parallelism (the branch without it), the same shape is launched with the cp ranks as
data-parallel ranks (dp 2 · pp 2, the same ZeRO group of 2), with optimizer offload. The run is
killed after step 2 and resumed: it loses no step and its losses match a single-process run of the
same batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_launch_resume import REFERENCE

REPO = Path(__file__).resolve().parent.parent
AUTOPLAN = str(Path(sys.executable).parent / "autoplan")
JOB = ["--model", "tiny-llama", "--hardware", "cpu", "--gpus", "4", "--global-batch", "8", "--seq-len", "32",
       "--precision", "fp32", "--runtime", "torch", "--layers-per-chunk", "2,2"]
STEPS = 3


def _autoplan(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([AUTOPLAN, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def _launchable_plan(tmp: Path) -> Path:
    """The plan file to launch: ``plan``'s own, or its shape with cp folded into dp plus offload."""
    from planner.plan.plan_file import read_plan_file
    from planner.launch.job import unsupported

    plan = tmp / "plan.json"
    _autoplan("plan", *JOB, "--tp", "1", "--cp", "2", "--out", str(plan))  # the shape, narrowed to it
    best = read_plan_file(str(plan)).best.layout
    assert (best.tp, best.pp, best.dp * best.cp) == (1, 2, 2)  # pipeline x context
    if not unsupported(read_plan_file(str(plan))):
        return plan
    stand_in = tmp / "stand-in.json"
    _autoplan("evaluate", *JOB, "--dp", "2", "--tp", "1", "--pp", "2", "--zero", str(max(1, best.zero_stage)),
              "--micro-batch", "1", "--schedule", best.schedule, "--offload", "--out", str(stand_in))
    return stand_in


def launch_cases() -> list[dict]:
    return [REFERENCE]


@pytest.mark.torchrun
def test_default_job_shape_plans_launches_and_resumes(tmp_path, case_results):
    plan = _launchable_plan(tmp_path)
    job = tmp_path / "job"
    _autoplan("launch", str(plan), "--out", str(job))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["--steps", str(STEPS), "--checkpoint-every", "1", "--lr", "1e-3"]
    killed = subprocess.run([str(job / "launch.sh"), *args, "--simulate-failure-at-step", "2"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0
    resumed = subprocess.run([str(job / "launch.sh"), *args], env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 2)" in resumed.stdout
    records = [json.loads(line) for line in (job / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    reference = [step["loss"] for step in case_results.of([REFERENCE])["reference"][:STEPS]]  # same batches, lr, seed
    assert [r["loss"] for r in records] == pytest.approx(reference, rel=2e-5)
