"""``validate``: run a plan file's plans and compare what they do with what was predicted.

Pure Python on this side (no torch import): each plan is written as a job with ``write_job``
(refusals are the launcher's own), the plans of one world size are measured in one torchrun
launch of ``planner.validate.measure`` (the generated job's code), dry runs in a subprocess of
``planner.validate.dryrun``. Results come back as JSON lines and are compared with the cost
model re-evaluated from the plan's inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costmodels.layout import Layout
from autoplan_base.errors import AutoplanError
from planner.plan.plan_file import PlanFile, PlanFileError

from .compare import (MemoryRow, cost_model, error_pct, measured_by_stage, measured_step_time_s,
                      memory_rows, predicted_memory)


class ValidateError(AutoplanError):
    """A validation run that cannot start or whose job failed (the message names its log)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """Predicted vs measured for one plan."""

    name: str
    layout: Layout
    job_dir: str
    predicted_step_time_s: float | None = None
    measured_step_time_s: float | None = None
    tokens_per_step: int = 0
    memory: list[MemoryRow] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""

    @property
    def step_time_error_pct(self) -> float | None:
        if self.predicted_step_time_s is None or self.measured_step_time_s is None:
            return None
        return error_pct(self.predicted_step_time_s, self.measured_step_time_s)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "layout": self.layout.to_dict(), "job_dir": self.job_dir}
        if self.skipped:
            return {**out, "skipped": self.skipped}
        if self.measured_step_time_s is not None:
            out["step_time_s"] = {"predicted": self.predicted_step_time_s, "measured": self.measured_step_time_s,
                                  "error_pct": self.step_time_error_pct}
            out["tokens_per_s"] = {"predicted": self.tokens_per_step / self.predicted_step_time_s,
                                   "measured": self.tokens_per_step / self.measured_step_time_s}
        out["memory_bytes"] = [{"pp_rank": r.pp_rank, "component": r.component, "predicted": r.predicted_bytes,
                                "measured": r.measured_bytes, "error_pct": r.error_pct} for r in self.memory]
        return {**out, **self.extra}


def single_plans(plan: PlanFile, candidates: int) -> list[tuple[str, PlanFile]]:
    """(name, plan file with that plan as ``best``) for the best plan and the next K."""
    if plan.best is None:
        raise ValidateError("plan file: 'best' is null (no layout fits); nothing to validate")
    chosen = [plan.best, *plan.candidates[:candidates]]
    return [(f"plan-{i}", plan.with_best(p)) for i, p in enumerate(chosen)]


DRY_RUN_MICROBATCHES = 3
"""Micro-batches a pp = 1 dry run steps (``dryrun.STEPPED_MICROBATCHES``, which a test checks
equal; spelled here so this side loads no torch)."""


def dry_run_cost(plan: PlanFile, candidates: int) -> str:
    """What ``validate --dry-run`` will do, said before it starts: one fake-tensor rank per pipeline
    stage of each plan, each stepped twice; "" when there is no plan to run."""
    if plan.best is None:
        return ""
    chosen = [plan.best, *plan.candidates[:candidates]]
    ranks = sum(p.layout.pp for p in chosen)
    passes = sum(p.layout.pp * (p.layout.num_microbatches if p.layout.pp > 1 else
                                min(p.layout.num_microbatches, DRY_RUN_MICROBATCHES)) for p in chosen)
    return (f"dry run: {len(chosen)} plan(s), {ranks} pipeline rank(s) in all, each built at full size on fake "
            f"tensors and stepped twice ({2 * passes} micro-batch passes in all); about a minute of CPU per "
            "rank of an 8B model with 32 layers (docs/validate.md), more with more layers per rank")


def prepare(plans: list[tuple[str, PlanFile]], workdir: Path) -> tuple[list[dict], list[PlanResult]]:
    """Write a job per launchable plan; plans the launcher refuses come back as skipped results."""
    from planner.launch.job import write_job

    jobs, skipped = [], []
    for name, plan in plans:
        layout = plan.best.layout
        job_dir = workdir / name
        try:
            write_job(plan, job_dir)
        except PlanFileError as err:
            skipped.append(PlanResult(name=name, layout=layout, job_dir=str(job_dir), skipped=str(err)))
            continue
        jobs.append({"name": name, "plan": plan, "layout": layout, "job_dir": str(job_dir)})
    return jobs, skipped


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def launch(jobs: list[dict], workdir: Path, *, steps: int, warmup: int, nproc: int) -> dict[str, dict]:
    """One torchrun launch of ``nproc`` processes measuring every job of that world size."""
    cases = [{"name": j["name"], "plan_file": f"{j['job_dir']}/plan.json", "log_dir": f"{j['job_dir']}/logs",
              "steps": steps, "warmup": warmup, "world_size": j["layout"].world_size} for j in jobs]
    cases_path, results_path = workdir / f"cases-{nproc}.json", workdir / f"results-{nproc}.jsonl"
    log_path = workdir / f"torchrun-{nproc}.log"
    cases_path.write_text(json.dumps(cases, indent=1, allow_nan=False), encoding="utf-8")
    results_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "planner.validate.measure", str(cases_path), str(results_path)]
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=_env())
    if proc.returncode != 0:
        raise ValidateError(f"validate: the job ({nproc} processes) failed with exit status {proc.returncode}; "
                            f"its log: {log_path}")
    lines = results_path.read_text(encoding="utf-8").splitlines() if results_path.exists() else []
    return {r["name"]: r for r in map(json.loads, lines)}


def dry_run(job: dict) -> dict:
    """Fake-tensor run of one plan at its real size, every pipeline rank (subprocess)."""
    out = Path(job["job_dir"]) / "dryrun.json"
    log_path = Path(job["job_dir"]) / "dryrun.log"
    command = [sys.executable, "-m", "planner.validate.dryrun", f"{job['job_dir']}/plan.json", str(out)]
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=_env())
    if proc.returncode != 0:
        raise ValidateError(f"validate --dry-run: the dry run of {job['name']} failed with exit status "
                            f"{proc.returncode}; its log: {log_path}")
    return json.loads(out.read_text(encoding="utf-8"))


def compare(job: dict, measured: dict, profile=None) -> PlanResult:
    """Predicted (cost model from the plan's inputs) vs measured for one job."""
    cm = cost_model(job["plan"].inputs, profile=profile)
    breakdown = cm.estimate(job["layout"])
    rows = memory_rows(predicted_memory(cm, breakdown), measured_by_stage(measured["ranks"]))
    times = measured.get("step_time_s")
    extra = {"ranks": measured["ranks"]}
    if times:
        extra["measured_step_times_s"] = times
    return PlanResult(name=job["name"], layout=job["layout"], job_dir=job["job_dir"],
                      predicted_step_time_s=breakdown.step_time_s,
                      measured_step_time_s=measured_step_time_s(times) if times else None,
                      tokens_per_step=int(measured.get("tokens_per_step", 0)), memory=rows, extra=extra)
