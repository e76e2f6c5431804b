"""The brute-force twin of the search: evaluate every layout of the space with the cost model.

Slow and obviously correct: every layout's memory is costed (``CostModel.peak_memory_bytes``,
checked equal to the estimate's in ``tests/test_bounds.py``), every layout that fits is costed in
full, and each mesh's plans go through the same
``ranking.MeshBand`` (the simplest plan within the band of the mesh's fastest) and ``ranking.
ranked_plans``; tests check that ``search.solve`` returns exactly what this returns.
"""

from __future__ import annotations

from collections import Counter

from costmodels.estimate import CostModel

from costmodels.bands import shipped_memory_band
from costmodels.tie_band import TieBand

from .ranking import MeshBand, layout_key, mesh_of, ranked_plans, tie_band
from .result import SolverResult, overshoot_key
from .space import SearchOptions, all_layouts


def solve_brute_force(cost_model: CostModel, num_gpus: int, domain_gpus: int, options: SearchOptions,
                      top_k: int, num_misses: int = 3, band: TieBand | None = None) -> SolverResult:
    band = band or tie_band(cost_model.training.runtime)
    bands: dict[tuple, MeshBand] = {}
    memory_band = shipped_memory_band(cost_model.training.runtime)
    rejected: Counter = Counter()
    misses = []
    total = 0
    for layout in all_layouts(cost_model.model, cost_model.training, num_gpus, domain_gpus, options):
        total += 1
        overshoot_bytes = cost_model.peak_memory_bytes(layout) - cost_model.capacity_bytes
        if overshoot_bytes > 0:  # what estimate(layout).fits would say, without costing time
            rejected["memory"] += 1
            misses.append((round(overshoot_bytes), layout_key(layout), layout))
            continue
        bands.setdefault(mesh_of(layout), MeshBand(band, memory_band)).offer(cost_model.estimate(layout))
    ranked, tied = ranked_plans(bands, top_k, band)
    rejected["slower"] = total - rejected["memory"] - len(ranked)
    closest = () if ranked else \
        tuple(sorted((cost_model.estimate(layout) for *_, layout in sorted(misses)[:num_misses]), key=overshoot_key))
    return SolverResult(ranked=ranked, tied_in_mesh=tied, rejected=dict(rejected), closest_misses=closest,
                        num_candidates=total, num_evaluated=total)
