"""``PlanReport``: the planner's answer to a request (what ``api.plan`` returns, built from a solver's
``SolverResult``); its plan-file form is ``PlanFile``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from costmodels.breakdown import CostBreakdown
from costmodels.layout import Layout
from hardware_specs.units import GIB

from .bands import JobBands
from .plan_file import MissEntry, NoFit, PlanEntry, PlanFile, PlanInputs, SearchStats


def plan_entry(breakdown: CostBreakdown, bands: JobBands | None = None) -> PlanEntry:
    """One plan of a plan file: the layout and what the cost model predicts for it, with its
    error bands (``predicted.band``) when ``bands`` is given."""
    predicted = breakdown.predicted_dict()
    if bands is not None:
        predicted["band"] = bands.band_dict(breakdown)
    return PlanEntry(layout=breakdown.layout, predicted=predicted)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClosestMiss:
    """A layout that came closest to fitting, and what would make it fit."""

    breakdown: CostBreakdown
    suggestions: tuple[str, ...]

    @property
    def needed_gib(self) -> float:
        return self.breakdown.peak_memory_bytes / GIB

    @property
    def available_gib(self) -> float:
        return self.breakdown.memory_capacity_bytes / GIB


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanReport:
    """Best plan, ranked alternatives (best plan of each of the next-best meshes), search statistics."""

    inputs: PlanInputs
    """What was asked: model, hardware, GPUs, training spec, options."""
    best: CostBreakdown | None
    """The fastest layout that fits, or None when nothing fits."""
    candidates: tuple[CostBreakdown, ...]
    """Ranked alternatives after ``best`` (each the best layout of a distinct dp/tp/pp/cp/ep mesh)."""
    rejected: dict[str, int] = field(default_factory=dict)
    closest_misses: tuple[ClosestMiss, ...] = ()
    search: dict[str, Any] = field(default_factory=lambda: {"solver": "evaluate", "space_size": 1, "evaluated": 1})
    """How the plans were found (``SearchStats`` fields); default: one layout costed as given."""
    """Solver name, candidates in the space, candidates evaluated (and, outside plan files, seconds)."""
    bands: JobBands | None = None
    """Error bands of the predictions (``planner.plan.bands.job_bands``); None: the plan file has none."""
    no_fit: NoFit | None = None
    """When ``best`` is None (``api.plan``): why, and the smallest GPU count that fits; else None."""
    warnings: tuple[str, ...] = ()
    """What the request asks that the model was not built for (``api.Job.warnings``), one line each."""

    @property
    def feasible(self) -> bool:
        return self.best is not None

    def to_plan_file(self, *, with_timing: bool = False) -> PlanFile:
        """The plan file of this report (``with_timing``: also the search's wall time, which the
        file leaves out so that it is byte-identical for the same inputs)."""
        search = SearchStats(solver=self.search["solver"], space_size=self.search["space_size"],
                             evaluated=self.search["evaluated"], rejected=dict(self.rejected),
                             seconds=self.search.get("seconds") if with_timing else None,
                             tie_band=self.search.get("tie_band"), num_tied=self.search.get("num_tied"),
                             tie_band_source=self.search.get("tie_band_source"),
                             tie_reason=self.search.get("tie_reason"), recipe=self.search.get("recipe"))
        misses = tuple(MissEntry(entry=plan_entry(m.breakdown, self.bands), needed_gib=round(m.needed_gib, 3),
                                 available_gib=round(m.available_gib, 3), suggestions=m.suggestions)
                       for m in self.closest_misses)
        no_fit = None if self.no_fit is None else \
            replace(self.no_fit, model_state_gib=round(self.no_fit.model_state_gib, 3))
        return PlanFile(inputs=self.inputs, inputs_digest=self.inputs.digest(),
                        best=plan_entry(self.best, self.bands) if self.best else None,
                        candidates=tuple(plan_entry(c, self.bands) for c in self.candidates), search=search,
                        closest_misses=misses, no_fit=no_fit, warnings=self.warnings)

    def to_dict(self, *, with_timing: bool = False) -> dict[str, Any]:
        return self.to_plan_file(with_timing=with_timing).to_dict()

    def to_json(self, *, with_timing: bool = False) -> str:
        """Stable JSON: sorted keys, fixed indentation; byte-identical for the same inputs."""
        return self.to_plan_file(with_timing=with_timing).to_json()
