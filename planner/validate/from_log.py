"""Calibrate from step times a cluster already measured: a table of layouts and step times.

``autoplan validate PLAN --calibrate --from-log TABLE --profile P.json``. The plan file gives the
job (model, hardware, GPUs, batch, sequence length, precision); TABLE gives one measured layout
per row, as CSV or TSV with a header:

    dp,tp,pp,zero,micro_batch,step_time_s,peak_memory_gib
    8,1,1,1,1,2.41,61.2
    4,2,1,1,1,,,megatron-run3.log        <- or a 'log' column instead of step_time_s

Layout columns: ``dp``, ``tp``, ``pp`` (required); ``cp``, ``ep``, ``zero``, ``micro_batch``,
``schedule``, ``virtual_stages``, ``recompute``, ``sequence_parallel``, ``tp_comm_overlap``
(optional, the ``autoplan evaluate`` defaults; read as ``autoplan calibrate``'s tables are,
``planner.calibrate.table.row_layout``). Measurement: ``step_time_s`` or ``step_time_ms``, or ``log``, a
Megatron-LM or torchtitan training log (path relative to the table) whose per-iteration lines give
the step time and peak memory, read as ``autoplan calibrate`` reads a log (the median past the
warm-up; the peak reserved memory); optional ``peak_memory_gib`` overrides the log's. The factors are fitted by ``calibrate.fit`` (the same
constants and search as ``validate --calibrate`` on runs made here) and judged leave-one-out.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autoplan_base.errors import file_wording
from costmodels.assumptions import DEFAULT_ASSUMPTIONS
from costmodels.layout import Layout, LayoutError
from planner.api import Job
from planner.calibrate import megatron_log, torchtitan_log
from planner.calibrate.table import row_layout
from planner.plan.plan_file import PlanInputs

from .calibrate import Run, fit, predict_all
from .runner import ValidateError

GIB = 2**30
FIELDS = {"micro_batch_size": "micro_batch", "zero_stage": "zero", "gpus": "the plan's inputs.gpus",
          "global_batch": "the plan's inputs.training.global_batch_size", "seq_len": "the plan's inputs.training.seq_len"}
"""How errors name an input: a row's column, or the plan file's field for the job's own inputs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRun:
    """One row of the table: a layout and what was measured for it."""

    layout: Layout
    step_time_s: float
    peak_memory_bytes: float | None
    origin: str
    """Where the step time came from: ``table row N`` or the log file and its format."""


def _log_measurement(path: Path, inputs: PlanInputs) -> tuple[float, float | None, str]:
    """(median seconds per step, peak bytes or None, where) of a Megatron-LM or torchtitan log, read
    as ``autoplan calibrate`` reads one (``planner.calibrate.megatron_log``, ``torchtitan_log``: the
    same warm-up dropped, the same peak taken), so both commands measure a log alike."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise ValidateError(f"--from-log: cannot read the log {path} ({err.strerror})") from None
    lines = megatron_log.log_lines(text)
    times = megatron_log.step_times(lines)
    if times:
        return (statistics.median(times), megatron_log.peak_memory_bytes(lines),
                f"{path.name} (megatron, {len(times)} iterations)")
    lines = torchtitan_log.log_lines(text)
    tokens = float(inputs.training.global_batch_size) * float(inputs.training.seq_len)
    times = torchtitan_log.step_times(lines, tokens, inputs.gpus)
    if times:
        return (statistics.median(times), torchtitan_log.peak_memory_bytes(lines),
                f"{path.name} (torchtitan, {len(times)} steps)")
    raise ValidateError(f"--from-log: {path} has no Megatron-LM 'elapsed time per iteration (ms)' line and no "
                        "torchtitan 'step: N ... tps: T' line; give step_time_s in the table instead")


def _number(row: dict[str, str], key: str, where: str, kind=float, default=None):
    value = (row.get(key) or "").strip()
    if not value:
        return default
    try:
        number = kind(value)
    except ValueError:
        raise ValidateError(f"--from-log {where}: {key} is {value!r}, not a number") from None
    if not math.isfinite(number) or number <= 0 and key not in ("zero",):
        raise ValidateError(f"--from-log {where}: {key} must be positive, got {value}")
    return number


def _layout(row: dict[str, str], job: Job, where: str) -> Layout:
    """The row's layout on the plan's job, checked as ``evaluate`` checks one (``Job.check_layout``);
    errors name the row's columns and the plan's job fields."""
    dp, tp, pp = (_number(row, k, where, int) for k in ("dp", "tp", "pp"))
    if None in (dp, tp, pp):
        raise ValidateError(f"--from-log {where}: dp, tp and pp are required columns with a value in every row")
    try:
        with file_wording(FIELDS):
            layout = row_layout(row, job.training.global_batch_size,
                                lambda key, kind, default: _number(row, key, where, kind, default))
            job.check_layout(layout)
    except LayoutError as err:
        raise ValidateError(f"--from-log {where}: {err}") from None
    return layout


def read_table(path: str | Path, inputs: PlanInputs) -> list[LogRun]:
    """The table's rows as measured runs (see the module docstring for the columns)."""
    table = Path(path)
    try:
        text = table.read_text(encoding="utf-8")
    except OSError as err:
        raise ValidateError(f"--from-log: cannot read {path} ({err.strerror})") from None
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise ValidateError(f"--from-log {path}: empty; expected a header (dp,tp,pp,...,step_time_s) and rows")
    reader = csv.DictReader(lines, delimiter="\t" if "\t" in lines[0] else ",")
    header = [h.strip() for h in reader.fieldnames or []]
    reader.fieldnames = header
    if not {"dp", "tp", "pp"} <= set(header) or not {"step_time_s", "step_time_ms", "log"} & set(header):
        raise ValidateError(f"--from-log {path}: the header needs dp, tp, pp and one of step_time_s, step_time_ms, "
                            f"log; got {', '.join(header)}")
    job = Job.from_inputs(inputs)
    runs = []
    for i, row in enumerate(reader, start=1):
        where = f"{table.name} row {i}"
        seconds = _number(row, "step_time_s", where) or (_number(row, "step_time_ms", where) or 0) / 1e3 or None
        peak, origin = None, f"table row {i}"
        if seconds is None and (row.get("log") or "").strip():
            seconds, peak, origin = _log_measurement(table.parent / row["log"].strip(), inputs)
        if seconds is None:
            raise ValidateError(f"--from-log {where}: no step time (step_time_s, step_time_ms or log)")
        gib = _number(row, "peak_memory_gib", where)
        runs.append(LogRun(layout=_layout(row, job, where), step_time_s=seconds,
                           peak_memory_bytes=gib * GIB if gib else peak, origin=origin))
    return runs


def leave_one_out(runs: list[Run], profile=None, rounds: int = 8) -> list[float]:
    """Each run's step time predicted by factors fitted on all the other runs (needs >= 2 runs)."""
    out = []
    for i, run in enumerate(runs):
        cal = fit(runs[:i] + runs[i + 1:], profile=profile, rounds=rounds)
        out.append(predict_all([run], replace(DEFAULT_ASSUMPTIONS, **cal.factors), profile)[0])
    return out


def calibrate_from_table(inputs: PlanInputs, table: str, profile=None, rounds: int = 8) -> dict[str, Any]:
    """Fit on every row, predict each row leave-one-out; the report ``validate`` prints and the
    calibration to write (``calibration`` key holds the ``calibrate.Calibration``)."""
    from .compare import cost_model

    logged = read_table(table, inputs)
    runs = [Run(inputs=inputs, layout=r.layout, measured_step_time_s=r.step_time_s) for r in logged]
    cal = fit(runs, profile=profile, rounds=rounds)
    after = predict_all(runs, replace(DEFAULT_ASSUMPTIONS, **cal.factors), profile)
    held = leave_one_out(runs, profile, rounds) if len(runs) >= 2 else [math.nan] * len(runs)
    model = cost_model(inputs, profile=profile)
    rows = []
    for r, fitted, loo in zip(logged, after, held):
        peak = model.estimate(r.layout).peak_memory_bytes
        rows.append({"layout": r.layout.to_dict(), "origin": r.origin, "measured_s": r.step_time_s,
                     "fitted_s": fitted, "leave_one_out_s": None if math.isnan(loo) else loo,
                     "measured_peak_gib": r.peak_memory_bytes / GIB if r.peak_memory_bytes else None,
                     "predicted_peak_gib": peak / GIB})
    loo_errors = sorted(abs(x["leave_one_out_s"] / x["measured_s"] - 1) for x in rows if x["leave_one_out_s"])
    return {"calibration": cal, "rows": rows,
            "median_abs_error_pct_leave_one_out": 100 * statistics.median(loo_errors) if loo_errors else None}
