"""Error bands of a prediction, taken from how far the model missed on runs it was not fitted to.

Step time. A held-out published run's residual is ``e = predicted / measured - 1`` on tokens/s
per GPU (``planner.published.scoring.RunResult.signed_error``), scored with the constants fitted
on the other families (leave-one-family-out). Since step time is tokens per step over tokens/s, the
measured step is ``predicted step × (1 + e)``: the band of a step time t is
``t × (1 + lo, 1 + hi)`` with lo and hi the ``(100 - Q) / 2`` and ``(100 + Q) / 2`` percentiles of
e, and its half-width is the Q-th percentile of |e| (``BAND_QUANTILE``). Every run counts once,
whatever its family (so a large sweep weighs more than a single published run; the record says
how many runs and families).

Peak memory. A run's memory residual is ``measured / predicted - 1`` of peak device memory, over
the development set's rows that measured it (the BLOOM sweep, torchtitan, the GPU truth records),
each scored with the allocator constant fitted without its family (``benchmarks/memory_fit.py``,
recorded in ``data/memory_calibration.json``; the bands file's memory residuals, scored in sample,
are only a fallback). A job's band is made from the residuals of its runtime's group
(``memory_band_group``: the deepspeed runtime's own, else the shared ones) and spans their
5th-95th percentiles; its upper edge is folded into the memory cap
(``Assumptions.memory_band_upper_for``), so a layout fits only when ``peak × (1 + hi)`` is under the
usable memory. A layout whose ``peak × (1 + memory hi)`` exceeds the usable memory is a *memory
risk* (with the shipped records no fitting layout is one: the cap already holds the margin).

Sources, in order: the calibration record's ``provenance.lofo_residuals`` (written by
``benchmarks/calibrate.py --write``) if present, else ``data/bands.json`` (``benchmarks/bands.py
--write``, the same leave-one-family-out loop). A profile's ``validate --calibrate`` fit, which
stores ``step_time_log_sd``, gives the step band instead (its 95% interval, ``exp(±1.96·sd)``);
a profile without it has no step band (the published runs measure the datasheet model, not the
profile). Pure: reading a record happens when a band is asked for, never at import.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from .assumptions import OWN_MEMORY_BAND_RUNTIME
from .calibration import CALIBRATION_FILE, MEMORY_CALIBRATION_FILE

BANDS_FILE = Path(__file__).parent / "data" / "bands.json"
"""Residual record written by ``benchmarks/bands.py --write``."""
MEMORY_BAND_COVERAGE = 90.0
"""The memory band covers the 5th-95th percentiles of its held-out residuals: its upper edge is the
fit rule's (``benchmarks/memory_fit.py``, ``MEMORY_BAND_QUANTILE``)."""
BAND_QUANTILE = 80.0
"""Share of held-out runs (percent) a band covers: the 80th percentile of |residual|."""
PROFILE_BAND_Z = 1.96
"""Two-sided 95% normal quantile, as ``planner.validate.calibrate.interval_s`` uses."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between order statistics (Hyndman and Fan 1996,
    definition 7; numpy's default): position (n - 1)·q/100 in the sorted list."""
    if not values:
        raise ValueError("percentile of an empty list")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """A relative band around a prediction: the truth lies in ``x × (1 + low_rel, 1 + high_rel)``."""

    low_rel: float
    """Lower edge relative to the prediction (≤ 0)."""
    high_rel: float
    """Upper edge relative to the prediction (≥ 0)."""
    half_width_rel: float
    """The symmetric figure shown as ``± h``: the quantile of |residual|."""
    basis: str
    """How it was derived, in one phrase (quantile, residual kind, counts)."""
    record: str
    """Where the residuals are recorded (a repository path or the profile)."""

    def bounds(self, value: float) -> tuple[float, float]:
        return value * (1 + self.low_rel), value * (1 + self.high_rel)

    def to_dict(self, value: float) -> dict[str, Any]:
        low, high = self.bounds(value)
        return {"low": _r(low), "high": _r(high), "half_width_rel": _r(self.half_width_rel),
                "basis": self.basis, "record": self.record}


def band_from_residuals(residuals: Sequence[float], *, quantile: float = BAND_QUANTILE, what: str,
                        record: str, num_families: int | None = None) -> Band:
    """The band covering ``quantile`` percent of ``residuals`` (each ``truth / prediction - 1``):
    edges at the (100 ∓ quantile)/2 percentiles, half-width the ``quantile`` percentile of |r|.
    ``what`` names the runs in the basis phrase (``held-out runs (LOFO)``)."""
    tail = (100 - quantile) / 2
    families = f", {num_families} {'family' if num_families == 1 else 'families'}" if num_families else ""
    return Band(low_rel=min(0.0, percentile(residuals, tail)), high_rel=max(0.0, percentile(residuals, 100 - tail)),
                half_width_rel=percentile([abs(r) for r in residuals], quantile),
                basis=f"covers {quantile:g}% of {len(residuals)} {what}{families}", record=record)


def band_from_log_sd(log_sd: float, *, num_runs: int | None, record: str,
                     fit: str = "the validate --calibrate fit") -> Band:
    """A profile's calibration interval: ``exp(±z·sd)`` of its residual log errors (of ``fit``)."""
    z = PROFILE_BAND_Z
    runs = f", {num_runs} runs" if num_runs else ""
    return Band(low_rel=math.exp(-z * log_sd) - 1, high_rel=math.exp(z * log_sd) - 1,
                half_width_rel=math.exp(z * log_sd) - 1,
                basis=f"95% interval exp(±{z}·sd) of {fit}{runs}", record=record)


def step_residuals(throughput_errors: Sequence[float]) -> list[float]:
    """Measured / predicted step time - 1 of each run, from its throughput error
    ``e = predicted / measured tokens/s - 1``: the step is tokens over tokens/s, so it is e itself."""
    return [float(e) for e in throughput_errors]


def memory_residuals(memory_errors: Sequence[float]) -> list[float]:
    """Measured / predicted peak memory - 1 of each run, from ``e = predicted / measured - 1``."""
    return [1 / (1 + e) - 1 for e in memory_errors]


def residual_values(entries: Any) -> tuple[list[float], int]:
    """(signed errors, number of families) from a residual list in either record's form: a list of
    numbers, a list of objects with ``signed_error`` (and ``family``), or ``{family: [numbers or
    objects]}``. Unknown shapes give ([], 0)."""
    if isinstance(entries, Mapping):
        values = [v for family in entries.values() for v in residual_values(family)[0]]
        return values, sum(1 for family in entries.values() if residual_values(family)[0])
    if not isinstance(entries, list):
        return [], 0
    values, families = [], set()
    for item in entries:
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            values.append(float(item))
        elif isinstance(item, Mapping) and isinstance(item.get("signed_error"), (int, float)):
            values.append(float(item["signed_error"]))
            families.add(item.get("family"))
    return values, len(families - {None})


def _read(path: str) -> dict[str, Any]:
    """The JSON object in ``path`` ({} if absent), read once per version of the file."""
    file = Path(path)
    if not file.is_file():
        return {}
    stat = file.stat()
    return _read_version(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _read_version(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    loaded = json.loads(Path(path).read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def _repo_path(path: Path) -> str:
    """``costmodels/data/NAME`` for a shipped record, the path as given otherwise."""
    here = Path(__file__).parent
    return str(path.relative_to(here.parent)) if path.is_relative_to(here) else str(path)


def shipped_step_band(calibration_file: Path = CALIBRATION_FILE, bands_file: Path = BANDS_FILE) -> Band | None:
    """The step-time band of the shipped model: the calibration record's ``lofo_residuals`` if it
    has them, else the throughput residuals of ``bands_file``; None when neither has any."""
    for path, doc in ((calibration_file, _read(str(calibration_file)).get("provenance", {})),
                      (bands_file, _read(str(bands_file)).get("throughput", {}))):
        key = "lofo_residuals" if path == calibration_file else "residuals"
        values, families = residual_values(doc.get(key) if isinstance(doc, Mapping) else None)
        if values:
            where = f"{_repo_path(path)} {'provenance.' if path == calibration_file else 'throughput.'}{key}"
            return band_from_residuals(step_residuals(values), what="held-out runs (LOFO)",
                                       record=where, num_families=families)
    return None


def memory_band_group(runtime: str) -> str:
    """Which residuals make the memory band of a job ``runtime`` runs: its own for
    ``OWN_MEMORY_BAND_RUNTIME``, else the shared ones."""
    return runtime if runtime == OWN_MEMORY_BAND_RUNTIME else "shared"


def shipped_memory_band(runtime: str = "megatron", bands_file: Path = BANDS_FILE,
                        memory_file: Path | None = None) -> Band | None:
    """The peak-memory band of a job ``runtime`` runs: from the leave-one-family-out residuals of
    ``MEMORY_CALIBRATION_FILE`` in its ``memory_band_group`` (``benchmarks/memory_fit.py --write``;
    the 5th-95th percentiles, the fit rule's quantile) if recorded, else the in-sample residuals of
    ``bands_file``'s memory section."""
    memory_file = MEMORY_CALIBRATION_FILE if memory_file is None else memory_file
    lofo = _read(str(memory_file)).get("lofo_residuals")
    if isinstance(lofo, list):
        group = memory_band_group(runtime)
        mine = [d for d in lofo if isinstance(d, Mapping) and d.get("band_group", group) == group]
        values = [float(d["measured_over_predicted"]) for d in mine
                  if isinstance(d.get("measured_over_predicted"), (int, float))]
        families = len({d.get("family") for d in mine})
        if values:
            return band_from_residuals(values, quantile=MEMORY_BAND_COVERAGE, what="held-out runs (LOFO)",
                                       record=f"{_repo_path(memory_file)} lofo_residuals", num_families=families)
    doc = _read(str(bands_file)).get("memory", {})
    values, families = residual_values(doc.get("residuals") if isinstance(doc, Mapping) else None)
    if not values:
        return None
    return band_from_residuals(memory_residuals(values), what="runs that measured memory",
                               record=f"{_repo_path(bands_file)} memory.residuals", num_families=families)


def profile_step_band(calibration: Mapping[str, Any] | None, where: str, num_runs: Any = None,
                      fit: str = "the validate --calibrate fit") -> Band | None:
    """The step band of a profile: from its calibration's residual spread (``fit`` names it: the
    ``validate --calibrate`` fit's in-sample residuals, or ``autoplan calibrate``'s leave-one-out
    errors; over ``num_runs`` runs, if the profile's provenance says), or None without one."""
    log_sd = (calibration or {}).get("step_time_log_sd")
    if not isinstance(log_sd, (int, float)) or isinstance(log_sd, bool) or not log_sd > 0:
        return None
    runs = num_runs if isinstance(num_runs, int) and not isinstance(num_runs, bool) and num_runs > 0 else None
    return band_from_log_sd(float(log_sd), num_runs=runs, record=f"{where} calibration.step_time_log_sd", fit=fit)


def memory_risk(peak_bytes: float, capacity_bytes: float, band: Band | None) -> bool:
    """Fits by the point prediction, but the band's upper edge crosses the cap."""
    if band is None or peak_bytes > capacity_bytes:
        return False
    return peak_bytes * (1 + band.high_rel) > capacity_bytes


def _r(value: float) -> float:
    """Six significant digits, as ``breakdown.predicted_dict`` rounds."""
    return float(f"{value:.6g}")
