"""Fit the cost model's correction factors to measured step times, and store them in a profile.

The factors are ``Assumptions`` fields the cost model already applies: ``compute_scale``
(GEMM and attention time), ``memory_bound_scale`` (norms, activations, optimizer step),
``communication_scale`` (every collective), ``overlap_fraction`` (how much data-parallel
traffic hides behind backward), ``step_overhead_s`` (fixed time per step), and
``layer_overhead_s`` / ``tp_layer_overhead_s`` (host time to issue a layer, and its extra under
tensor parallelism, per micro-batch: what a small model on a CPU spends most time on). They are fitted
by coordinate descent on the mean squared log error log(predicted / measured) over the runs,
each factor on a log-spaced grid refined around the best point; the model is re-evaluated for
every trial, so its max/overlap non-linearities are respected. Pure Python and numpy.

Prediction intervals: the residual log errors after the fit give ``step_time_log_sd``; a step
time t is reported as t · exp(±1.96 · sd) (95% if the residuals are normal). It is stored in
the profile's calibration table beside the factors (the cost model ignores unknown keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from costmodels.assumptions import DEFAULT_ASSUMPTIONS, Assumptions
from costmodels.layout import Layout
from planner.plan.plan_file import PlanInputs
from profiles.io import ZERO_ALLOWED_CALIBRATION

from .compare import job_of

FACTORS: dict[str, tuple[float, float]] = {
    "compute_scale": (0.05, 20.0),
    "memory_bound_scale": (0.05, 20.0),
    "communication_scale": (0.05, 20.0),
    "overlap_fraction": (0.0, 1.0),
    "step_overhead_s": (0.0, 10.0),
    "layer_overhead_s": (0.0, 1.0),
    "tp_layer_overhead_s": (0.0, 1.0),
}
"""Fitted ``Assumptions`` fields and their allowed ranges."""
SCALES = ("compute_scale", "communication_scale", "memory_bound_scale")
"""Multiplicative factors on every time of their kind."""
ADDITIVE = ZERO_ALLOWED_CALIBRATION
"""Factors searched on a linear grid (a share, or seconds); the rest are multiplicative scales."""
SHRINK = 0.6
"""Grid width factor per round of coordinate descent."""
INTERVAL_Z = 1.96
"""Two-sided 95% quantile of the normal distribution."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One measured plan: its plan-file inputs, layout and measured step time."""

    inputs: PlanInputs
    layout: Layout
    measured_step_time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Fitted factors and the error before and after (fractions, not percent)."""

    factors: dict[str, float]
    step_time_log_sd: float
    median_abs_error_before: float
    median_abs_error_after: float
    num_runs: int


def predict_all(runs: list[Run], assumptions: Assumptions | None, profile=None, jobs: list | None = None) -> list[float]:
    """Predicted step time of each run under ``assumptions`` (None: the profile's own calibration).
    ``jobs``: ``jobs_of(runs, profile, calibrated=assumptions is None)``, made once for many calls."""
    if jobs is None:
        jobs = jobs_of(runs, profile, calibrated=assumptions is None)
    models: dict[int, Any] = {}
    out = []
    for run, job in zip(runs, jobs, strict=True):
        if id(job) not in models:
            models[id(job)] = job.cost_model(assumptions or DEFAULT_ASSUMPTIONS)
        out.append(models[id(job)].estimate(run.layout).step_time_s)
    return out


def jobs_of(runs: list[Run], profile=None, *, calibrated: bool) -> list:
    """Each run's ``planner.api.Job`` (``compare.job_of``), one per distinct plan inputs: the fit
    costs every run under thousands of trial assumptions, and building a job reads the hardware
    files."""
    by_inputs: dict[str, Any] = {}
    jobs = []
    for run in runs:
        key = run.inputs.digest()
        if key not in by_inputs:
            by_inputs[key] = job_of(run.inputs, profile=profile, calibrated=calibrated)
        jobs.append(by_inputs[key])
    return jobs


def _loss(runs: list[Run], predicted: list[float]) -> float:
    return sum(math.log(p / r.measured_step_time_s) ** 2 for p, r in zip(predicted, runs)) / len(runs)


def _grid(name: str, centre: float, width: float, time_scale_s: float) -> list[float]:
    """Nine trial values around ``centre``: additive for the overlap share and the overhead
    (spans of the whole range and of the typical step time), multiplicative (up to 8x) for scales."""
    low, high = FACTORS[name]
    if name in ADDITIVE:
        span = (high - low) * width if name == "overlap_fraction" else time_scale_s * width
        points = [centre + span * k / 4 for k in range(-4, 5)] + ([0.0] if name != "overlap_fraction" else [])
    else:
        points = [centre * math.exp(math.log(8.0) * width * k / 4) for k in range(-4, 5)]
    return sorted({min(high, max(low, p)) for p in points})


def _descend(start: dict[str, float], names: tuple[str, ...], evaluate: Callable[[dict[str, float]], float],
             rounds: int, time_scale_s: float) -> tuple[float, dict[str, float]]:
    """Coordinate descent from ``start``; each round narrows the grids. Returns (loss, point)."""
    current, best, width = dict(start), evaluate(start), 1.0
    for _ in range(rounds):
        for name in names:
            for value in _grid(name, current[name], width, time_scale_s):
                trial = {**current, name: value}
                loss = evaluate(trial)
                if loss < best - 1e-12:
                    best, current = loss, trial
        width *= SHRINK
    return best, current


def fit(runs: list[Run], *, base: Assumptions = DEFAULT_ASSUMPTIONS, profile=None, rounds: int = 8,
        names: tuple[str, ...] = tuple(FACTORS)) -> Calibration:
    """Coordinate descent over ``names`` from two starts (see ``_descend``). Needs at least one run."""
    if not runs:
        raise ValueError("calibration needs at least one measured run")
    before = predict_all(runs, None, profile)
    jobs = jobs_of(runs, profile, calibrated=False)
    evaluate: Callable[[dict[str, float]], float] = lambda c: _loss(  # noqa: E731
        runs, predict_all(runs, replace(base, **c), profile, jobs))
    time_scale_s = sorted(r.measured_step_time_s for r in runs)[len(runs) // 2]
    # Two starts: the model as it is, and the model uniformly slowed (or sped up) by the median
    # measured/predicted ratio, as a slower machine would be; the descent keeps the better end.
    ratio = sorted(r.measured_step_time_s / p for r, p in zip(runs, before))[len(runs) // 2]
    starts = [{n: getattr(base, n) for n in names},
              {n: getattr(base, n) * (ratio if n in SCALES else 1.0) for n in names}]
    best, current = min(((evaluate(s), s) for s in starts), key=lambda pair: pair[0])
    for start in starts:
        loss, point = _descend(start, names, evaluate, rounds, time_scale_s)
        if loss < best - 1e-12:
            best, current = loss, point
    after = predict_all(runs, replace(base, **current), profile, jobs)
    residuals = [math.log(p / r.measured_step_time_s) for p, r in zip(after, runs)]
    sd = math.sqrt(sum(x * x for x in residuals) / max(len(runs) - 1, 1)) if len(runs) > 1 else 0.0
    return Calibration(factors=current, step_time_log_sd=sd, num_runs=len(runs),
                       median_abs_error_before=_median_abs(before, runs), median_abs_error_after=_median_abs(after, runs))


def _median_abs(predicted: list[float], runs: list[Run]) -> float:
    errors = sorted(abs(p / r.measured_step_time_s - 1) for p, r in zip(predicted, runs))
    mid = len(errors) // 2
    return errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2


def interval_s(step_time_s: float, log_sd: float) -> tuple[float, float]:
    """95% prediction interval of a step time from the residual log standard deviation."""
    spread = math.exp(INTERVAL_Z * log_sd)
    return step_time_s / spread, step_time_s * spread


def calibration_table(cal: Calibration) -> dict[str, float]:
    """What goes into the profile's ``calibration``: the fitted factors (multiplicative ones > 0;
    additive ones, such as the overlap or an overhead, may be 0) and the residual spread."""
    table = {k: float(v) for k, v in cal.factors.items() if v > 0 or k in ADDITIVE and v == 0}
    if cal.step_time_log_sd > 0:
        table["step_time_log_sd"] = cal.step_time_log_sd
    return table


def write_calibration(path: str | Path, cal: Calibration, *, provenance: dict[str, Any], device_type: str) -> None:
    """Set the calibration (with provenance) in the profile at ``path``, atomically; a missing
    file becomes a profile with no measured tables (datasheet rates) and only the calibration.
    The result is read back with ``profiles.load_profile`` to check it."""
    from profiles import HardwareProfile, load_profile, write_profile

    target = Path(path)
    profile = load_profile(target) if target.exists() else HardwareProfile(device_type=device_type, provenance={})
    history = dict(profile.provenance)
    history["calibration"] = provenance
    write_profile(target, replace(profile, calibration=calibration_table(cal), provenance=history))
    load_profile(target)


def calibrate_from_results(inputs: PlanInputs, results: list, path: str, profile) -> dict[str, Any]:
    """``validate --calibrate``: fit factors to the measured results (``runner.PlanResult``),
    write them into the profile at ``path``, and report the fit with each run's new prediction."""
    import platform

    runs = [Run(inputs=inputs, layout=r.layout, measured_step_time_s=r.measured_step_time_s)
            for r in results if r.measured_step_time_s]
    cal = fit(runs, profile=profile)
    provenance = {"source": "autoplan validate --calibrate", "runs": len(runs), "host": platform.node(),
                  "plans": [r.layout.to_dict() for r in results if r.measured_step_time_s]}
    write_calibration(path, cal, provenance=provenance, device_type=profile.device_type if profile else "cpu")
    after = predict_all(runs, replace(DEFAULT_ASSUMPTIONS, **cal.factors), profile)
    return {"profile": str(path), "factors": cal.factors, "step_time_log_sd": cal.step_time_log_sd,
            "median_abs_error_pct_before": 100 * cal.median_abs_error_before,
            "median_abs_error_pct_after": 100 * cal.median_abs_error_after,
            "after": [{"layout": run.layout.to_dict(), "predicted_s": p, "interval_s": interval_s(p, cal.step_time_log_sd),
                       "measured_s": run.measured_step_time_s} for run, p in zip(runs, after)]}
