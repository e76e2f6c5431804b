"""The development set's sweeps as teams' logs: how well a calibration from each would have done.

Each family of the published runs on one GPU type (``group_runs``: at least ``MIN_RUNS`` measured
runs) is taken as one team's logs of one cluster. ``score_group`` fits the factors on it and reports
leave-one-out step error before (the shipped model) and after, the factors with their spread, and,
over its sweeps (runs of one job, model and GPU count, that vary the layout; ``MappedRun.sweep_key``),
how often the layout with the least leave-one-out predicted step is the one measured fastest, before
and after calibration.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from planner.published.runs import MappedRun
from planner.published.scoring import map_rows

from .fit import fit_steps
from .runs import LoggedRun
from .terms import run_terms

MIN_RUNS = 8
"""Measured runs a group needs to count as a team's logs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupScore:
    """One group's calibration, judged leave-one-out."""

    family: str
    hardware: str
    runs: int
    loo_before: float
    """Median |step error| of the shipped model (no fit, so held out by construction)."""
    loo_after: float
    factors: dict[str, dict[str, Any]]
    sweeps: int
    """Sweeps of two or more layouts in the group."""
    best_picked_before: int
    best_picked_after: int
    """Sweeps whose least predicted step (leave-one-out) is the measured fastest layout."""


def logged(run: MappedRun) -> LoggedRun:
    """A published run as a logged one: its job, layout and step time (from tokens/s per GPU)."""
    request = {k: v for k, v in run.evaluate_kwargs().items() if k != "layout"}
    tokens = run.global_batch * run.seq_len
    step = tokens / (run.measured_tokens_per_s_per_gpu * run.num_gpus) if run.measured_tokens_per_s_per_gpu else None
    return LoggedRun(request=request, layout=run.layout, step_time_s=step, out_of_memory=run.status == "oom",
                     origin=run.row_id)


def costable(run: MappedRun) -> bool:
    """Whether ``evaluate`` takes the run's layout on its job (``planner.api.Job.check_layout``), as
    ``autoplan calibrate`` requires of a logged run; the published scoring drops the others too
    ("layout rejected", ``planner.published.scoring.score_mapped``)."""
    from planner.api import resolve_job

    kwargs = run.evaluate_kwargs()
    layout = kwargs.pop("layout")
    try:
        resolve_job(**kwargs).check_layout(layout)
    except ValueError:
        return False
    return True


def group_runs(rows: list[dict]) -> dict[tuple[str, str], list[MappedRun]]:
    """Measured runs ``evaluate`` can cost (``costable``) by (family, GPU preset), groups of at
    least ``MIN_RUNS``, one run per repeated configuration (the first)."""
    mapped, _ = map_rows(rows)
    groups: dict[tuple[str, str], dict[tuple, MappedRun]] = defaultdict(dict)
    for run in mapped:
        if run.status == "ok" and run.measured_tokens_per_s_per_gpu and costable(run):
            groups[(run.family, run.hardware_name)].setdefault(run.config_key, run)
    return {key: list(runs.values()) for key, runs in sorted(groups.items()) if len(runs) >= MIN_RUNS}


def _picks(runs: list[MappedRun], predicted: list[float], measured: list[float]) -> tuple[int, int]:
    """(sweeps of two or more layouts, those whose least predicted step is the measured least)."""
    sweeps: dict[tuple, list[int]] = defaultdict(list)
    for i, run in enumerate(runs):
        sweeps[run.sweep_key].append(i)
    counted = right = 0
    for members in sweeps.values():
        if len({runs[i].layout for i in members}) < 2:
            continue
        counted += 1
        right += min(members, key=lambda i: predicted[i]) == min(members, key=lambda i: measured[i])
    return counted, right


def score_group(family: str, hardware: str, runs: list[MappedRun]) -> GroupScore:
    """Calibrate on ``runs`` and judge it leave-one-out."""
    logged_runs = [logged(r) for r in runs]
    fit = fit_steps(run_terms(logged_runs))
    measured = [r.step_time_s for r in logged_runs]
    before = [m * (1 + e) for m, e in zip(measured, fit.errors_before)]
    after = [m * (1 + e) for m, e in zip(measured, fit.errors_leave_one_out)]
    sweeps, right_before = _picks(runs, before, measured)
    _, right_after = _picks(runs, after, measured)
    return GroupScore(family=family, hardware=hardware, runs=len(runs),
                      loo_before=statistics.median(abs(e) for e in fit.errors_before),
                      loo_after=statistics.median(abs(e) for e in fit.errors_leave_one_out),
                      factors={f.name: f.to_dict() for f in fit.factors}, sweeps=sweeps,
                      best_picked_before=right_before, best_picked_after=right_after)
