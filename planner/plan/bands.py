"""The error bands of one request's predictions (``costmodels.bands``), and their plan-file form.

Which band a plan gets follows the status label (``render.prediction_status``): datasheet
estimates under the shipped calibration get the leave-one-family-out band of the published runs;
a plan costed with a ``--profile`` gets the band of that profile's ``validate --calibrate`` fit,
or no step band at all (said so in the table and the JSON), since the published runs measure the
datasheet model, not the profile. The memory band does not depend on rates, so every plan gets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from costmodels.bands import Band, memory_risk, profile_step_band, shipped_memory_band, shipped_step_band
from costmodels.breakdown import CostBreakdown
from hardware_specs.units import GIB

if TYPE_CHECKING:
    from profiles import HardwareProfile

NO_PROFILE_BAND = ("no step-time band: costed with a profile that has no validate --calibrate fit "
                   "(the published-run band measures the datasheet model); run 'autoplan validate --calibrate'")
NO_LOGGED_RUNS_BAND = ("no step-time band: the calibration has no leave-one-out error (it takes 2 or more timed "
                       "runs; the published-run band measures the datasheet model); re-run 'autoplan calibrate' "
                       "with more of this cluster's runs")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobBands:
    """The step-time and peak-memory bands that apply to every layout of one request."""

    step: Band | None
    memory: Band | None
    step_note: str = ""
    """Why there is no step band, when there is none."""
    calibration: str = ""
    """What calibrated the rates, when a cluster's own runs did (``autoplan calibrate``)."""

    def band_dict(self, breakdown: CostBreakdown) -> dict[str, Any]:
        """The ``predicted.band`` object of a plan: bounds in seconds and GiB, and the memory risk."""
        out: dict[str, Any] = {}
        if self.step is not None:
            out["step_time_s"] = self.step.to_dict(breakdown.step_time_s)
        else:
            out["step_time_s"] = None
            out["step_time_note"] = self.step_note
        if self.memory is not None:
            out["peak_memory_gib"] = self.memory.to_dict(breakdown.peak_memory_bytes / GIB)
        out["memory_risk"] = memory_risk(breakdown.peak_memory_bytes, breakdown.memory_usable_bytes, self.memory)
        if self.calibration:
            out["calibration"] = self.calibration
        return out


def job_bands(profile: "HardwareProfile | None", profile_where: str | None, runtime: str) -> JobBands:
    """The bands of a request costed with ``profile`` (None: the shipped calibration) that
    ``runtime`` runs (its memory band, ``costmodels.bands.memory_band_group``)."""
    memory = shipped_memory_band(runtime)
    if profile is None:
        step = shipped_step_band()
        return JobBands(step=step, memory=memory,
                        step_note="" if step else "no step-time band: no residual record shipped")
    logged = profile.logged_runs_fit()
    if logged is not None:
        step = profile_step_band(profile.calibration, profile_where or "the profile", logged.get("timed_runs"),
                                 fit="the leave-one-out errors of this cluster's logged runs")
        return JobBands(step=step, memory=memory, step_note="" if step else NO_LOGGED_RUNS_BAND,
                        calibration=calibration_line(logged, profile_where))
    fit = profile.provenance.get("calibration")
    runs = fit.get("runs") if isinstance(fit, dict) else None
    step = profile_step_band(profile.calibration, profile_where or "the profile", runs)
    return JobBands(step=step, memory=memory, step_note="" if step else NO_PROFILE_BAND)


def calibration_line(fit: dict, where: str | None) -> str:
    """The header line of a plan calibrated by a cluster's own runs."""
    error = fit.get("median_abs_error_leave_one_out")
    held = f"; leave-one-out median error {error:.1%}" if isinstance(error, (int, float)) else ""
    moved = [name for name, f in (fit.get("factors") or {}).items()
             if isinstance(f, dict) and f.get("informed") and abs(f.get("multiplier", 1.0) - 1) >= 0.02]
    factors = f"; factors moved: {', '.join(moved)}" if moved else ""
    runs = fit.get("timed_runs", fit.get("runs"))
    return (f"rates calibrated by {runs} logged run{'' if runs == 1 else 's'} of this cluster "
            f"(autoplan calibrate{f', {where}' if where else ''}{held}{factors})")
