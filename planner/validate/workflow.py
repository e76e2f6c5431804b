"""The ``autoplan validate`` workflow: write a job per plan, run or dry-run it, compare with the
prediction, and optionally fit calibration factors into a profile. Returns the JSON report; the
CLI (``planner.cli.validate``) only parses options and prints it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from planner.runtime.plan_file import PlanFile, read_plan_file

from . import runner
from .calibrate import calibrate_from_results


def _load(profile_path: str | None, plan: PlanFile):
    path = profile_path or plan.inputs.profile
    if not path or not Path(path).exists():
        return path, None
    from profiles import load_profile

    return path, load_profile(Path(path))


def run_validation(plan_path: Path, *, num_candidates: int, steps: int, warmup: int, nproc: int | None,
                   dry_run: bool, calibrate: bool, profile_path: str | None, workdir: str | None,
                   keep: bool = False) -> dict[str, Any]:
    """The whole command as a function: returns the JSON report. Without ``workdir`` the job
    directories go to a new temporary directory, removed at the end unless ``keep``."""
    if calibrate and dry_run:
        raise runner.ValidateError("--calibrate needs measured step times; drop --dry-run")
    plan = read_plan_file(plan_path)
    path, profile = _load(profile_path, plan)
    if calibrate and not path:
        raise runner.ValidateError("--calibrate: give --profile PATH, the profile file to write the factors into")
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="autoplan-validate-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        report, results = _validate(plan, plan_path, base, num_candidates=num_candidates, steps=steps, warmup=warmup,
                           nproc=nproc, dry_run=dry_run, profile=profile)
    finally:
        if not workdir and not keep:
            shutil.rmtree(base, ignore_errors=True)
    if not workdir and not keep:
        report["workdir"] = f"{base} (removed; --keep keeps it)"
    if calibrate:
        report["calibration"] = calibrate_from_results(plan.inputs, results, path, profile)
    return report


def _validate(plan, plan_path: Path, base: Path, *, num_candidates: int, steps: int, warmup: int,
              nproc: int | None, dry_run: bool, profile) -> tuple[dict[str, Any], list]:
    """Prepare the job directories under ``base``, run or dry-run them, compare with the plan."""
    jobs, results = runner.prepare(runner.single_plans(plan, num_candidates), base)
    if dry_run:
        results += [runner.compare(job, runner.dry_run(job), profile) for job in jobs]
    else:
        results += _measure(jobs, base, steps=steps, warmup=warmup, nproc=nproc, profile=profile)
    results.sort(key=lambda r: r.name)
    report: dict[str, Any] = {"plan_file": str(plan_path), "workdir": str(base), "dry_run": dry_run,
                              "plans": [r.to_dict() for r in results]}
    runtime = plan.inputs.training.runtime
    if runtime != "torch":
        report["note"] = (f"the plan is costed for the {runtime} runtime, but the job runs on PyTorch (FSDP2, "
                          "PyTorch TP/SP), which holds memory differently; for a like-for-like comparison "
                          "re-plan with --launchable (or --runtime torch)")
    return report, results


def _measure(jobs: list[dict], base: Path, *, steps: int, warmup: int, nproc: int | None, profile) -> list:
    out = []
    sizes = sorted({j["layout"].world_size for j in jobs})
    for size in sizes:
        group = [j for j in jobs if j["layout"].world_size == size]
        if nproc is not None and size != nproc:
            out += [runner.PlanResult(name=j["name"], layout=j["layout"], job_dir=j["job_dir"],
                                      skipped=f"needs {size} processes; --nproc is {nproc}") for j in group]
            continue
        measured = runner.launch(group, base, steps=steps, warmup=warmup, nproc=size)
        out += [runner.compare(j, measured[j["name"]], profile) for j in group if j["name"] in measured]
    return out
