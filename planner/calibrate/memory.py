"""Fit the memory factor to logged peaks and out-of-memory runs, apart from the step time.

One factor: the caching allocator's fragmentation share (``Assumptions.allocator_fragmentation``:
extra memory held over the live activations and buffers), the term that differs most between
clusters of one device (allocator settings, library versions). With p_i(f) = p_i + f·a_i the run's
peak on its terms (``terms``), the fit minimises over f in ``BOUNDS``

    sum over measured peaks (ln p_i(f) - ln measured_i)^2 + sum over OOM runs max(0, ln(capacity_i / p_i(f)))^2

(a run that died out of memory should be predicted at or above its device's memory). Solved on a
grid fine enough for the figure it reports (``GRID_STEP``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .terms import RunTerms

BOUNDS = (0.0, 0.5)
"""Fragmentation share: none, up to half again of the activations and buffers."""
GRID_STEP = 0.005


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryFit:
    """The fitted fragmentation share, or None when no run measured memory or died of it."""

    fragmentation: float | None
    measured_runs: int
    oom_runs: int
    errors_before: tuple[float, ...]
    errors_after: tuple[float, ...]
    """Predicted / measured peak - 1, in sample, for the runs that measured their peak."""
    oom_predicted: int
    """Out-of-memory runs whose fitted peak reaches their device's memory."""
    on_bound: bool

    def to_dict(self) -> dict:
        return {"fragmentation": self.fragmentation, "measured_runs": self.measured_runs, "oom_runs": self.oom_runs,
                "oom_predicted": self.oom_predicted, "on_bound": self.on_bound}


def _loss(f: float, measured: list[RunTerms], ooms: list[RunTerms]) -> float:
    loss = sum(math.log((t.peak_bytes + f * t.fragmentation_slope_bytes) / t.run.peak_memory_bytes) ** 2
               for t in measured)
    return loss + sum(max(0.0, math.log(t.capacity_bytes / (t.peak_bytes + f * t.fragmentation_slope_bytes))) ** 2
                      for t in ooms)


def fit_memory(terms: list[RunTerms], base_fragmentation: float) -> MemoryFit:
    """The fragmentation share that best explains the measured peaks and the OOM runs."""
    measured = [t for t in terms if t.run.peak_memory_bytes and not t.run.out_of_memory]
    ooms = [t for t in terms if t.run.out_of_memory]
    before = tuple(t.peak_bytes / t.run.peak_memory_bytes - 1 for t in measured)
    if not measured and not ooms:
        return MemoryFit(fragmentation=None, measured_runs=0, oom_runs=0, errors_before=(), errors_after=(),
                         oom_predicted=0, on_bound=False)
    steps = int(round((BOUNDS[1] - BOUNDS[0]) / GRID_STEP))
    # the terms were costed at base_fragmentation: the grid is of the change from it
    grid = [BOUNDS[0] + GRID_STEP * i - base_fragmentation for i in range(steps + 1)]
    best = min(grid, key=lambda f: (_loss(f, measured, ooms), abs(f)))
    peak = lambda t: t.peak_bytes + best * t.fragmentation_slope_bytes  # noqa: E731
    value = round(base_fragmentation + best, 6)
    return MemoryFit(fragmentation=value, measured_runs=len(measured), oom_runs=len(ooms),
                     errors_before=before, errors_after=tuple(peak(t) / t.run.peak_memory_bytes - 1 for t in measured),
                     oom_predicted=sum(peak(t) >= t.capacity_bytes for t in ooms),
                     on_bound=value in BOUNDS)
