"""How candidates are ordered: one total order shared by every solver, so results are exact and
deterministic (ties in step time go to less memory, then to the layout's fields in order)."""

from __future__ import annotations

from costmodels.breakdown import CostBreakdown
from costmodels.layout import Layout


_FIELDS = tuple(Layout.__dataclass_fields__)


def layout_key(layout: Layout) -> tuple:
    """The layout's fields in declaration order, for tie-breaking."""
    return tuple(getattr(layout, name) for name in _FIELDS)


def rank_key(breakdown: CostBreakdown) -> tuple:
    """Faster first; then lower peak memory; then the layout's fields."""
    return (round(breakdown.step_time_s, 12), round(breakdown.peak_memory_bytes), layout_key(breakdown.layout))


def mesh_of(layout: Layout) -> tuple[int, int, int, int, int]:
    """The parallel degrees (dp, tp, pp, cp, ep): alternatives are the best plan of distinct meshes."""
    return (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep)
