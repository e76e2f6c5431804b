"""``autoplan calibrate``: a cluster's logs in, mechanism factors out, written as a profile.

The runs are read (``sources``), each costed once as its terms (``terms``), the step-time factors
fitted on log step time with leave-one-out (``fit``), the memory factor on measured peaks and
out-of-memory runs (``memory``). The result is a profile (``profiles.HardwareProfile``): the base
profile's measured rates, if one was given, with a ``calibration`` table of the fitted
``Assumptions`` fields and ``step_time_log_sd``, the standard deviation of the leave-one-out log
errors, which ``plan --profile`` (or ``--calibration``) turns into its step band; its provenance
holds the fit's report. ``plan`` then costs with the factors and says in its header how many runs
of the cluster calibrated it.
"""

from __future__ import annotations

import datetime
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from costmodels.assumptions import DEFAULT_ASSUMPTIONS
from costmodels.calibration_factors import FACTORS, assumptions_at
from profiles.schema import CALIBRATE_SOURCE

from .fit import StepFit, fit_steps
from .memory import MemoryFit, fit_memory
from .runs import CalibrationError, LoggedRun
from .sources import read_sources
from .terms import run_terms



def median_abs(errors: tuple[float, ...] | list[float]) -> float | None:
    return statistics.median(abs(e) for e in errors) if errors else None


def log_sd(errors: tuple[float, ...] | list[float]) -> float:
    """Standard deviation of ln(1 + error) about 0 (the band a plan shows)."""
    logs = [math.log1p(e) for e in errors]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else 0.0


def calibration_table(step: StepFit, memory: MemoryFit, base_assumptions: Any) -> dict[str, float]:
    """The profile's ``calibration``: each informed factor's ``Assumptions`` fields, the memory
    factor, and the leave-one-out spread."""
    multipliers = {f.name: f.multiplier for f in step.factors if f.informed}
    calibrated = assumptions_at(base_assumptions, multipliers)
    fields = {name for f in FACTORS if f.name in multipliers for name in f.fields}
    table = {name: float(getattr(calibrated, name)) for name in sorted(fields)}
    if memory.fragmentation is not None:
        table["allocator_fragmentation"] = memory.fragmentation
    if step.errors_leave_one_out:
        table["step_time_log_sd"] = log_sd(step.errors_leave_one_out)
    return table


def report(runs: tuple[LoggedRun, ...], step: StepFit, memory: MemoryFit, skipped: tuple[str, ...]) -> dict[str, Any]:
    """What ``calibrate`` prints and writes into the profile's provenance."""
    timed = [r for r in runs if r.step_time_s]
    return {
        "source": CALIBRATE_SOURCE, "date": datetime.date.today().isoformat(),
        "runs": len(runs), "timed_runs": len(timed), "oom_runs": sum(r.out_of_memory for r in runs),
        "factors": {f.name: {**f.to_dict(), "informed_by": [timed[i].origin for i in f.informing]}
                    for f in step.factors},
        "median_abs_error_before": median_abs(step.errors_before),
        "median_abs_error_after": median_abs(step.errors_after),
        "median_abs_error_leave_one_out": median_abs(step.errors_leave_one_out),
        "memory": {**memory.to_dict(), "median_abs_error_before": median_abs(memory.errors_before),
                   "median_abs_error_after": median_abs(memory.errors_after)},
        "run_errors": [{"origin": r.origin, "measured_s": r.step_time_s, "before": b, "leave_one_out": loo}
                       for r, b, loo in zip(timed, step.errors_before,
                                            step.errors_leave_one_out or [None] * len(timed))],
        "skipped": list(skipped),
    }


def calibrate(paths: list[str], *, hardware: str, gpus_per_node: int | None = None,
              profile: str | None = None) -> tuple[dict[str, Any], dict[str, float], Any]:
    """(report, calibration table, base profile or None) of the runs in ``paths``."""
    from profiles import load_profile

    base_profile = load_profile(Path(profile)) if profile else None
    sources = read_sources(paths, hardware=hardware, gpus_per_node=gpus_per_node)
    base = DEFAULT_ASSUMPTIONS.with_calibration(base_profile.calibration) if base_profile else DEFAULT_ASSUMPTIONS
    terms = run_terms(list(sources.runs), base, base_profile)
    step = fit_steps(terms)
    memory = fit_memory(terms, base.allocator_fragmentation)
    return report(sources.runs, step, memory, sources.skipped), calibration_table(step, memory, base), base_profile


def write_calibration_profile(out: str | Path, table: dict[str, float], provenance: dict[str, Any],
                              base_profile: Any, *, hardware: str, gpus_per_node: int | None) -> None:
    """The base profile (or an empty one for ``hardware``) with ``table`` over its calibration (the
    base's entries that no fitted factor replaces are kept: the fit ran on them), written
    atomically and read back."""
    from hardware_specs.loader import load_node
    from profiles import HardwareProfile, load_profile, write_profile

    if base_profile is None:
        node = load_node(hardware)
        base_profile = HardwareProfile(device_type=node.hardware.device_type if node.hardware.device_type != "rocm"
                                       else "cuda",
                                       provenance={"device_name": node.hardware.display_name,
                                                   "devices_per_node": gpus_per_node or node.gpus_per_node})
    history = {**base_profile.provenance, "calibration": provenance}
    # the base profile's own calibration is what the fit started from: kept where no factor replaces it
    merged = {**(base_profile.calibration or {}), **table}
    write_profile(out, replace(base_profile, calibration=merged, provenance=history))
    try:
        load_profile(Path(out))
    except ValueError as err:  # pragma: no cover - the writer and reader share one schema
        raise CalibrationError(f"{out}: the written calibration does not read back ({err})") from None
