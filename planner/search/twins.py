"""What the search learns of a layout from its TP-overlap twin: the layout equal to it but in
``Layout.tp_comm_overlap`` (both with sequence parallelism and tp > 1), costed earlier in the same
mesh visit (``planner.search.solve._visit_mesh``).

- Memory: the twins' peaks differ by ``bounds.tp_overlap_extra_bytes`` (the userbuffers, the same on
  every rank), so one costed peak gives the other's; within ``MEMORY_MARGIN`` of the capacity, where
  rounding could decide, the layout's own peak is costed.
- Time: outside DualPipe the twin whose layers spend more TP time (``bounds.tp_overlap_sign``) has
  the larger or equal step time, so where the faster twin's exact step time passes the cutoff, the
  slower one's does too and is not summed.
Neither changes what the search returns (``tests/test_search.py`` against brute force).
"""

from __future__ import annotations

from operator import attrgetter

from costmodels.bounds import step_time_s, tp_overlap_extra_bytes, tp_overlap_sign
from costmodels.estimate import CostModel
from costmodels.layout import Layout
from costmodels.pipeline import DUALPIPE

MEMORY_MARGIN = 1e-6
"""Relative distance from the capacity inside which a twin-derived peak is not trusted."""

_twin_key = attrgetter(*(name for name in Layout.__dataclass_fields__ if name != "tp_comm_overlap"))
"""A layout's fields but the overlap: the key the two twins share."""


def _has_twin(layout: Layout) -> bool:
    return layout.tp > 1 and layout.sequence_parallel


class OverlapTwins:
    """Peaks (as without overlap) and exact step times of the layouts costed so far in one mesh."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self.peaks_off: dict[tuple, float] = {}
        self.steps: dict[tuple, tuple[bool, float]] = {}

    def fits_from_twin(self, layout: Layout) -> bool | None:
        """Whether ``layout`` fits, from its twin's peak; None where that is unknown or too close."""
        cm = self.cost_model
        off = self.peaks_off.get(_twin_key(layout)) if _has_twin(layout) else None
        if off is None:
            return None
        peak = off + (tp_overlap_extra_bytes(cm, layout) if layout.tp_comm_overlap else 0.0)
        if abs(peak - cm.capacity_bytes) <= MEMORY_MARGIN * cm.capacity_bytes:
            return None
        return peak <= cm.capacity_bytes

    def peak_bytes(self, layout: Layout) -> float:
        """``CostModel.peak_memory_bytes`` of ``layout``, costed (and kept for its twin)."""
        cm = self.cost_model
        peak = cm.peak_memory_bytes(layout)
        if _has_twin(layout):
            extra = tp_overlap_extra_bytes(cm, layout) if layout.tp_comm_overlap else 0.0
            self.peaks_off[_twin_key(layout)] = peak - extra
        return peak

    def step_s(self, layout: Layout, cutoff_s: float) -> float:
        """``bounds.step_time_s`` of ``layout``, or its faster twin's where that already passes
        ``cutoff_s`` (a lower bound on it, past the cutoff)."""
        if not _has_twin(layout) or layout.schedule in DUALPIPE:
            return step_time_s(self.cost_model, layout)
        key = _twin_key(layout)
        known = self.steps.get(key)
        if known is not None and known[0] != layout.tp_comm_overlap and known[1] > cutoff_s:
            sign = tp_overlap_sign(self.cost_model, layout)
            if sign and (sign > 0) == layout.tp_comm_overlap:  # this one is the slower twin
                return known[1]
        seconds = step_time_s(self.cost_model, layout)
        self.steps[key] = (layout.tp_comm_overlap, seconds)
        return seconds
