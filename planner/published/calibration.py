"""Fit a handful of physically meaningful cost-model constants on published runs, never per family.

The fitting half of the shipped calibration (``costmodels.calibration`` keeps, applies and writes
what is fitted here; ``benchmarks/calibrate.py`` and ``benchmarks/memory_fit.py`` drive the fits and
print them). Step time:

``fit_constants(rows, grid)`` tries every point of ``grid`` (each a dict of ``Assumptions`` field
values) on ``rows`` and keeps the one with the smallest mean over families of median |error| of
tokens/s per GPU, then the smallest median over families of it. The mean lets every family count
once; the median alone is flat over most of the grid, since the middle families barely move, and
left the leave-one-family-out folds choosing far apart (13.6% LOFO median against 11% with the
mean, on the grid of ``benchmarks/calibrate.py``); ``make_fit(grid)`` wraps it for ``cross_validate_by_family``. Evaluations are
memoised by (grid point, run), so the leave-one-family-out driver costs each run once per point, and
the rows of a fit are mapped once (``scoring.mapped_rows``), not once per point.

Peak memory: ``fit_memory(rows, axes)`` keeps the grid point with the smallest mean over families of
median |memory error| on the rows that measured peak memory (``memory_rows``), and ``memory_lofo``
scores each such family with the point fitted on the others (or on the pool a caller names).
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping

from costmodels.assumptions import UNCALIBRATED
from costmodels.breakdown import CostBreakdown
from costmodels.estimate import estimate

from .runs import MappedRun
from .scoring import EvaluateFn, MappedRows, RunResult, mapped_rows, overall_median, score_mapped
from .stats import median

Point = tuple[tuple[str, float], ...]


def grid_points(axes: Mapping[str, tuple[float, ...]]) -> list[Point]:
    """Every combination of the values on ``axes`` (field name -> candidate values), sorted."""
    names = sorted(axes)
    return [tuple(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


class Evaluator:
    """``planner.evaluate`` of a mapped run with the assumptions of one grid point, memoised."""

    def __init__(self) -> None:
        self._memo: dict[tuple[Point, str], CostBreakdown] = {}

    def at(self, point: Point) -> EvaluateFn:
        def evaluate_fn(run: MappedRun) -> CostBreakdown:
            key = (point, run.row_id)
            if key not in self._memo:
                self._memo[key] = _evaluate(run, point)
            return self._memo[key]
        return evaluate_fn


def _evaluate(run: MappedRun, point: Point) -> CostBreakdown:
    from planner.api import resolve_job
    from costmodels.layout import check_layout

    kwargs = run.evaluate_kwargs()
    layout = kwargs.pop("layout")
    job = resolve_job(**kwargs)
    check_layout(layout, job.model, job.training, kwargs["gpus"], job.cluster.gpus_per_node)
    return estimate(job.cost_job(UNCALIBRATED.with_calibration(dict(point))), layout)


def fit_constants(rows: list[dict], points: list[Point], evaluator: Evaluator) -> tuple[Point, float]:
    """The grid point with the smallest (mean, median) over families of median |error| on ``rows``,
    and that mean (ties: the first point in ``points``)."""
    best: tuple[Point, tuple[float, float]] | None = None
    mapped = mapped_rows(rows)
    for point in points:
        scores = score_mapped(mapped, evaluator.at(point))
        medians = [s.abs_median for s in scores if s.abs_median is not None]
        if not medians:
            continue
        figure = (round(sum(medians) / len(medians), 3), overall_median(scores) or 0.0)
        if best is None or figure < best[1]:
            best = (point, figure)
    if best is None:
        raise ValueError("no family could be scored on the training rows")
    return best[0], best[1][0]


def make_fit(points: list[Point], evaluator: Evaluator, chosen: dict[str, Point]) -> Callable[[list[dict]], EvaluateFn]:
    """A ``fit(train_rows) -> evaluate_fn`` for ``cross_validate_by_family``; records each fold's
    point in ``chosen`` under the held-out families' names (those absent from the training rows)."""
    def fit(train_rows: list[dict]) -> EvaluateFn:
        point, _ = fit_constants(train_rows, points, evaluator)
        chosen[",".join(sorted({r["source_family"] for r in train_rows}))] = point
        return evaluator.at(point)
    return fit


def memory_rows(rows: list[dict]) -> list[dict]:
    """Rows that measured peak memory or recorded running out of it."""
    return [r for r in rows if r["memory"]["peak_mem_gb"] or r["status"] == "oom"]


def memory_results(rows: MappedRows, evaluator: Evaluator, point: Point) -> list[RunResult]:
    """The scored runs of ``rows`` (mapped once, ``scoring.mapped_rows``) at ``point``."""
    return [r for s in score_mapped(rows, evaluator.at(point)) for r in s.results]


def family_memory_errors(results: list[RunResult]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in results:
        if r.memory_error is not None:
            out.setdefault(r.family, []).append(r.memory_error)
    return out


def fit_memory(rows: list[dict], axes: Mapping[str, tuple[float, ...]], evaluator: Evaluator) -> Point:
    """The point of ``axes`` with the smallest mean over families of median |memory error| (then the first)."""
    best: tuple[float, Point] | None = None
    mapped = mapped_rows(rows)
    for point in grid_points(axes):
        errors = family_memory_errors(memory_results(mapped, evaluator, point))
        if not errors:
            continue
        figure = sum(median([abs(e) for e in v]) for v in errors.values()) / len(errors)
        if best is None or figure < best[0] - 1e-12:
            best = (figure, point)
    if best is None:
        raise ValueError("no family measured memory")
    return best[1]


def memory_lofo(rows: list[dict], axes: Mapping[str, tuple[float, ...]], evaluator: Evaluator,
                pool: Callable[[str], list[dict]] | None = None) -> tuple[list[dict], dict[str, Point]]:
    """Held-out residuals (measured / predicted - 1) of every family that measured memory, each
    scored with the point fitted without it, and those points by family. ``pool(family)``: the
    rows a fold fits on (default: every other family's)."""
    families = sorted({r["source_family"] for r in rows if r["memory"]["peak_mem_gb"]})
    residuals, chosen = [], {}
    for family in families:
        training = pool(family) if pool else [r for r in rows if r["source_family"] != family]
        point = fit_memory(training, axes, evaluator)
        chosen[family] = point
        for r in memory_results(mapped_rows(r for r in rows if r["source_family"] == family), evaluator, point):
            if r.memory_error is not None:
                residuals.append({"family": family, "rows": list(r.row_ids),
                                  "measured_over_predicted": round(1 / (1 + r.memory_error) - 1, 6)})
    return residuals, chosen
