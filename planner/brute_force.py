"""The brute-force twin of the search: evaluate every layout of the space with the cost model.

Slow and obviously correct; tests check that ``search.solve`` returns exactly what this returns.
"""

from __future__ import annotations

from collections import Counter

from costmodels.estimate import CostModel

from .ranking import mesh_of, rank_key
from .solver_result import SolverResult, overshoot_key
from .space import SearchOptions, all_layouts


def solve_brute_force(cost_model: CostModel, num_gpus: int, gpus_per_node: int, options: SearchOptions,
                      top_k: int, num_misses: int = 3) -> SolverResult:
    best: dict[tuple, tuple] = {}
    rejected: Counter = Counter()
    misses = []
    total = 0
    for layout in all_layouts(cost_model.model, cost_model.training, num_gpus, gpus_per_node, options):
        total += 1
        breakdown = cost_model.estimate(layout)
        if not breakdown.fits:
            rejected["memory"] += 1
            misses.append(breakdown)
            continue
        key = rank_key(breakdown)
        mesh = mesh_of(layout)
        if mesh not in best or key < best[mesh][0]:
            best[mesh] = (key, breakdown)
    ranked = sorted(best.values(), key=lambda kb: kb[0])
    feasible = sum(1 for _ in ranked)
    rejected["slower"] = total - rejected["memory"] - min(top_k, feasible)
    closest = tuple(sorted(misses, key=overshoot_key)[:num_misses]) if not ranked else ()
    return SolverResult(ranked=tuple(b for _, b in ranked[:top_k]), rejected=dict(rejected),
                        closest_misses=closest, num_candidates=total, num_evaluated=total)
