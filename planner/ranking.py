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


TIE_BAND = 0.01
"""Relative step-time band within which layouts count as tied: the cost model exposes no error band
yet, so 1%. Among tied layouts the simplest is picked (``simplicity_key``)."""


TIE_POOL = 8
"""How many meshes' best plans (at least) the planner compares for ties, whatever ``--top`` is."""


def simplicity_key(layout: Layout) -> tuple:
    """How unusual a layout is, least first, for breaking ties inside ``TIE_BAND``:

    1. how many of context parallel, expert parallel and optimizer offload it uses (each only when needed);
    2. how many parallel axes (dp, tp, pp, cp, ep) have degree > 1;
    3. the ZeRO stage;
    4. the number of micro-batches;
    then ``layout_key`` so the order is total and deterministic."""
    exotic = (layout.cp > 1) + (layout.ep > 1) + bool(layout.optimizer_offload)
    axes = sum(d > 1 for d in (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep))
    return (exotic, axes, layout.zero_stage, layout.num_microbatches, layout_key(layout))


def prefer_simplest(ranked: tuple[CostBreakdown, ...], band: float = TIE_BAND) -> tuple[tuple[CostBreakdown, ...], int]:
    """``ranked`` (fastest first) with the simplest plan within ``band`` of the fastest moved to the
    front, and how many plans were within the band (1 when there was no tie)."""
    if not ranked:
        return ranked, 0
    limit_s = ranked[0].step_time_s * (1 + band)
    tied = [b for b in ranked if b.step_time_s <= limit_s]
    pick = min(tied, key=lambda b: simplicity_key(b.layout))
    return (pick,) + tuple(b for b in ranked if b is not pick), len(tied)
