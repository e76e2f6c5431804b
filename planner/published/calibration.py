"""Fit a handful of physically meaningful cost-model constants on published runs, never per family.

``fit_constants(rows, grid)`` tries every point of ``grid`` (each a dict of ``Assumptions`` field
values) on ``rows`` and keeps the one with the smallest mean over families of median |error| of
tokens/s per GPU, then the smallest median over families of it. The mean lets every family count
once; the median alone is flat over most of the grid, since the middle families barely move, and
left the leave-one-family-out folds choosing far apart (13.6% LOFO median against 11% with the
mean, on the grid of ``benchmarks/calibrate.py``); ``make_fit(grid)`` wraps it for ``cross_validate_by_family``. Evaluations are
memoised by (grid point, run), so the leave-one-family-out driver costs each run once per point.
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping

from costmodels.assumptions import UNCALIBRATED
from costmodels.breakdown import CostBreakdown
from costmodels.estimate import estimate

from .runs import MappedRun
from .scoring import EvaluateFn, overall_median, score

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
    for point in points:
        scores = score(rows, evaluator.at(point))
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
