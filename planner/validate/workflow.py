"""The ``autoplan validate`` workflow: write a job per plan, run or dry-run it, compare with the
prediction, and optionally fit calibration factors into a profile. Returns the JSON report; the
CLI (``planner.cli.validate``) only parses options and prints it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from planner.plan.plan_file import PlanFile, read_plan_file

from . import runner
from .calibrate import calibrate_from_results

Progress = Callable[[int, int, str], None] | None


def _load(profile_path: str | None, plan: PlanFile):
    path = profile_path or plan.inputs.profile
    if not path or not Path(path).exists():
        return path, None
    from profiles import load_profile

    return path, load_profile(Path(path))


def run_validation(plan_path: Path, *, num_candidates: int, steps: int, warmup: int, nproc: int | None,
                   dry_run: bool, calibrate: bool, profile_path: str | None, workdir: str | None,
                   keep: bool = False, progress: Progress = None) -> dict[str, Any]:
    """The whole command as a function: returns the JSON report. Without ``workdir`` the job
    directories go to a new temporary directory, removed at the end unless ``keep``. ``progress``:
    called as ``progress(done, total, what)`` before and after each plan is run (the CLI's bar)."""
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
                           nproc=nproc, dry_run=dry_run, profile=profile, progress=progress or _silent)
    finally:
        if not workdir and not keep:
            shutil.rmtree(base, ignore_errors=True)
    if not workdir and not keep:
        report["workdir"] = f"{base} (removed; --keep keeps it)"
    if calibrate and not any(r.measured_step_time_s for r in results):
        raise runner.ValidateError("--calibrate: no plan was measured (each was skipped: "
                                   + "; ".join(sorted({r.skipped for r in results if r.skipped})[:2])
                                   + "); give an --nproc that matches a plan, or drop --nproc")
    if calibrate:
        report["calibration"] = calibrate_from_results(plan.inputs, results, path, profile)
    return report


def _validate(plan, plan_path: Path, base: Path, *, num_candidates: int, steps: int, warmup: int,
              nproc: int | None, dry_run: bool, profile, progress: Callable[[int, int, str], None]
              ) -> tuple[dict[str, Any], list]:
    """Prepare the job directories under ``base``, run or dry-run them, compare with the plan."""
    jobs, results = runner.prepare(runner.single_plans(plan, num_candidates), base)
    if dry_run:
        for done, job in enumerate(jobs):
            progress(done, len(jobs), f"dry run {job['name']}")
            results.append(runner.compare(job, runner.dry_run(job), profile))
    else:
        results += _measure(jobs, base, steps=steps, warmup=warmup, nproc=nproc, profile=profile, progress=progress)
    progress(len(jobs), len(jobs), "done")
    results.sort(key=lambda r: r.name)
    report: dict[str, Any] = {"plan_file": str(plan_path), "workdir": str(base), "dry_run": dry_run,
                              "plans": [r.to_dict() for r in results]}
    runtime = plan.inputs.training.runtime
    if runtime != "torch":
        report["note"] = (f"the plan is costed for the {runtime} runtime, but the job runs on PyTorch (FSDP2, "
                          "PyTorch TP/SP), which holds memory differently; for a like-for-like comparison "
                          "re-plan with --launchable (or --runtime torch)")
    return report, results


def _silent(done: int, total: int, what: str) -> None:
    """No progress shown (the API's default)."""


def _measure(jobs: list[dict], base: Path, *, steps: int, warmup: int, nproc: int | None, profile,
             progress: Callable[[int, int, str], None]) -> list:
    out = []
    sizes = sorted({j["layout"].world_size for j in jobs})
    for size in sizes:
        group = [j for j in jobs if j["layout"].world_size == size]
        if nproc is not None and size != nproc:
            out += [runner.PlanResult(name=j["name"], layout=j["layout"], job_dir=j["job_dir"],
                                      skipped=f"needs {size} processes; --nproc is {nproc}") for j in group]
            continue
        progress(len(out), len(jobs), f"running {len(group)} plan(s) on {size} processes")
        measured = runner.launch(group, base, steps=steps, warmup=warmup, nproc=size)
        out += [runner.compare(j, measured[j["name"]], profile) for j in group if j["name"] in measured]
    return out


def calibrate_from_log(plan_path: Path, table: str, *, calibrate: bool, profile_path: str | None) -> dict[str, Any]:
    """``--calibrate --from-log``: fit the factors to the table's runs, write them into the profile."""
    import platform

    from .calibrate import write_calibration
    from .from_log import calibrate_from_table

    if not calibrate:
        raise runner.ValidateError("--from-log gives measured step times to calibrate from; add --calibrate")
    plan = read_plan_file(plan_path)
    path, profile = _load(profile_path, plan)
    if not path:
        raise runner.ValidateError("--calibrate: give --profile PATH, the profile file to write the factors into")
    result = calibrate_from_table(plan.inputs, table, profile)
    cal = result.pop("calibration")
    provenance = {"source": "autoplan validate --calibrate --from-log", "table": str(table), "runs": cal.num_runs,
                  "host": platform.node(), "plans": [row["layout"] for row in result["rows"]]}
    write_calibration(path, cal, provenance=provenance, device_type=profile.device_type if profile else "cuda")
    return {"profile": str(path), "factors": cal.factors, "step_time_log_sd": cal.step_time_log_sd,
            "median_abs_error_pct_before": 100 * cal.median_abs_error_before,
            "median_abs_error_pct_after": 100 * cal.median_abs_error_after, **result}
