"""Each logged run costed once, as a sum of terms the factors scale.

The fit never re-costs a layout: for each run the cost model gives the step time at the prior
(every factor 1) and, per factor, the secant slope of the step time over a probe interval
around 1 (``PROBE``, inside the factor's bounds). The fit then predicts

    t_i(m) = t_i(1) + sum_k s_ik (m_k - 1)

for any multipliers m: linear in each mechanism's time, so GEMM, attention, memory-bound and
communication time add as the model adds them, and a term the model hides behind compute (an
overlapped collective) carries the slope the hiding leaves it. The probes cost 2 + 2K estimates per
run (the prior, two for each of K factors, one for fragmentation), once. Memory: the peak at the prior and its slope in the allocator's
fragmentation share (``memory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan_base.errors import file_wording
from costmodels.assumptions import DEFAULT_ASSUMPTIONS, Assumptions
from costmodels.calibration_factors import FACTORS, assumptions_at

from .runs import CalibrationError, LoggedRun

PROBE = (0.8, 1.25)
"""Multipliers each factor is probed at (clipped into its bounds)."""
FRAGMENTATION_PROBE = 0.2
"""Allocator fragmentation share the peak's slope is taken at (from 0)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTerms:
    """One run's predicted step and peak at the prior, and their slopes."""

    run: LoggedRun
    step_s: float
    slopes_s: tuple[float, ...]
    """d step / d multiplier, per factor of ``FACTORS`` (seconds per unit multiplier)."""
    peak_bytes: float
    fragmentation_slope_bytes: float
    """d peak / d fragmentation share."""
    capacity_bytes: float
    """The device memory the run had (for a run that died out of memory)."""

    def share(self, k: int) -> float:
        """How much of the predicted step factor ``k`` moves: |slope| / step."""
        return abs(self.slopes_s[k]) / self.step_s if self.step_s > 0 else 0.0


def _model_at(job: Any, assumptions: Assumptions, models: dict) -> Any:
    key = (id(job), assumptions)
    if key not in models:
        models[key] = job.cost_model(assumptions)
    return models[key]


def _checked_job(run: LoggedRun, jobs: dict[tuple, Any], profile: Any) -> Any:
    """The run's job (one per distinct job), with the run's layout checked on it as ``evaluate``
    checks a layout (``planner.api.Job.check_layout``); errors name the run's file and its fields."""
    from planner.api import resolve_job

    key = run.job_key()
    with file_wording(dict(run.fields)):
        if key not in jobs:
            try:
                jobs[key] = resolve_job(**run.request, profile=profile)
            except (ValueError, TypeError) as err:
                raise CalibrationError(f"{run.origin}: the job it trained cannot be costed ({err})") from None
        try:
            jobs[key].check_layout(run.layout)
        except ValueError as err:
            raise CalibrationError(f"{run.origin}: {err}") from None
    return jobs[key]


def run_terms(runs: list[LoggedRun], base: Assumptions = DEFAULT_ASSUMPTIONS, profile: Any = None) -> list[RunTerms]:
    """``RunTerms`` of each run (``profile``: measured rates the factors correct on top of)."""
    jobs: dict[tuple, Any] = {}
    models: dict = {}
    out = []
    for run in runs:
        job = _checked_job(run, jobs, profile)
        try:
            prior = _model_at(job, base, models).estimate(run.layout)
        except ValueError as err:
            raise CalibrationError(f"{run.origin}: its layout cannot be costed ({err})") from None
        slopes = []
        for factor in FACTORS:
            low, high = max(PROBE[0], factor.low), min(PROBE[1], factor.high)
            t_low, t_high = (_model_at(job, assumptions_at(base, {factor.name: m}), models).estimate(run.layout)
                             .step_time_s for m in (low, high))
            slopes.append((t_high - t_low) / (high - low))
        fragmented = _model_at(job, base.with_calibration({"allocator_fragmentation": base.allocator_fragmentation
                                                           + FRAGMENTATION_PROBE}), models).estimate(run.layout)
        out.append(RunTerms(run=run, step_s=prior.step_time_s, slopes_s=tuple(slopes),
                            peak_bytes=prior.peak_memory_bytes,
                            fragmentation_slope_bytes=(fragmented.peak_memory_bytes - prior.peak_memory_bytes)
                            / FRAGMENTATION_PROBE,
                            capacity_bytes=job.cluster.hardware.memory_bytes))
    return out
