"""``SolverResult``: what a solver (search or brute force) returns, before ``api.plan`` turns it
into a ``PlanReport`` (planner/plan/report.py): the best plan per mesh, counts of rejected candidates,
closest misses."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from costmodels.breakdown import CostBreakdown


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverResult:
    """Ranked feasible plans (one per distinct mesh, best first) and what was rejected."""

    ranked: tuple[CostBreakdown, ...]
    """One plan of each of the ``top_k`` fastest meshes, fastest first: the simplest of the mesh's
    plans within the tie band (``ranking.tie_band``) of its fastest (``ranking.MeshBand``)."""
    tied_in_mesh: dict[tuple, int] = field(default_factory=dict)
    """Per mesh of ``ranked`` (``ranking.mesh_of``), how many simplicity classes were within the band."""
    rejected: dict[str, int] = field(default_factory=dict)
    """Candidates not chosen, by reason: ``memory`` (does not fit), ``slower`` (pruned by a time
    bound or beaten)."""
    closest_misses: tuple[CostBreakdown, ...] = ()
    """When nothing fits: the candidates that came closest to fitting, least overshoot first."""
    num_candidates: int = 0
    """Size of the space."""
    num_evaluated: int = 0
    """Candidates the cost model evaluated in full."""


def overshoot_key(breakdown: CostBreakdown) -> tuple:
    from .ranking import layout_key

    host_over = breakdown.host_memory_bytes_per_node - breakdown.host_memory_capacity_bytes
    return (round(max(breakdown.peak_memory_bytes - breakdown.memory_capacity_bytes, host_over)),
            layout_key(breakdown.layout))


def count(rejected: Counter, reason: str, n: int) -> None:
    if n:
        rejected[reason] += n
