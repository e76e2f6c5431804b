"""Exact search over the layout space by branch and bound.

For each mesh (dp, tp, pp, cp, ep) and each schedule choice (micro-batch, schedule, virtual stages,
recomputation, sequence parallel) the cost model gives the pipeline's step time without
data-parallel sync and optimizer: ``CostModel.pipeline_lower_bound_s``. Every way of holding model
states (ZeRO stage, HSDP, offload) only adds time to it, so it bounds the whole subtree below.
Schedule choices are visited best bound first, grouped so that one bound (without recomputation,
which only adds time) covers the three recomputation modes; a subtree is cut when its bound exceeds
the smaller of the mesh's best plan so far and the K-th best mesh's plan (it can change neither). Model-state
memory alone (no activations) bounds memory from below, cutting (mesh, ZeRO) pairs that cannot fit.
The pruning is admissible, so the result equals ``brute_force.solve_brute_force`` exactly.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import replace

from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel

from .ranking import rank_key
from .solver_result import SolverResult, count, overshoot_key
from .space import (MeshChoice, ScheduleChoice, SearchOptions, StateChoice, make_layout, mesh_choices,
                    schedule_choices, state_choices)


class _Ranking:
    """The best plan per mesh, and the bound a new mesh must beat to enter the top K."""

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self.best: dict[MeshChoice, tuple] = {}
        self._threshold_s = float("inf")

    def threshold_s(self) -> float:
        """Step time of the K-th best mesh (inf while fewer than K meshes have a plan)."""
        return self._threshold_s

    def offer(self, mesh: MeshChoice, breakdown: CostBreakdown) -> None:
        key = rank_key(breakdown)
        if mesh not in self.best or key < self.best[mesh][0]:
            self.best[mesh] = (key, breakdown)
            if len(self.best) >= self.top_k:
                self._threshold_s = heapq.nsmallest(self.top_k, (k[0] for k, _ in self.best.values()))[-1]

    def ranked(self) -> tuple[CostBreakdown, ...]:
        return tuple(b for _, b in sorted(self.best.values(), key=lambda kb: kb[0])[: self.top_k])


class _Tally:
    """Counts and closest misses gathered while searching."""

    def __init__(self, num_misses: int) -> None:
        self.rejected: Counter = Counter()
        self.misses: list[CostBreakdown] = []
        self.num_misses = num_misses
        self.evaluated = 0

    def miss(self, breakdown: CostBreakdown, ranking: _Ranking) -> None:
        self.rejected["memory"] += 1
        if ranking.best:
            return  # closest misses are reported only when nothing fits
        self.misses.append(breakdown)
        if len(self.misses) > 64:
            self.misses = heapq.nsmallest(self.num_misses, self.misses, key=overshoot_key)

    def closest(self) -> tuple[CostBreakdown, ...]:
        return tuple(heapq.nsmallest(self.num_misses, self.misses, key=overshoot_key))


def solve(cost_model: CostModel, num_gpus: int, gpus_per_node: int, options: SearchOptions, top_k: int,
          num_misses: int = 3) -> SolverResult:
    """The top-K meshes' best plans under the cost model, found by branch and bound.

    Pass 1 bounds every schedule group of every mesh; pass 2 visits meshes best floor first, so
    the K-th best plan is known early and whole meshes are cut without a full evaluation."""
    model, training = cost_model.model, cost_model.training
    ranking, tally = _Ranking(top_k), _Tally(num_misses)
    total = 0
    work = []
    for order, mesh in enumerate(mesh_choices(model, training, num_gpus, gpus_per_node, options)):
        scheds = schedule_choices(mesh, model, training, options)
        states = state_choices(mesh, gpus_per_node, options, model, training)
        total += len(scheds) * len(states)
        if not scheds:
            continue
        fitting = _states_that_may_fit(cost_model, mesh, states, scheds[0])
        count(tally.rejected, "memory", (len(states) - len(fitting)) * len(scheds))
        if not fitting:
            tally.misses.append(cost_model.estimate(make_layout(mesh, states[0], scheds[0])))
            continue
        kept = _undominated(cost_model, scheds)
        count(tally.rejected, "slower", (len(scheds) - len(kept)) * len(fitting))
        groups = _groups_by_bound(cost_model, mesh, fitting[0], kept)
        work.append((groups[0][0], order, mesh, fitting, groups))
    for _, _, mesh, fitting, groups in sorted(work, key=lambda w: (w[0], w[1])):
        _visit_mesh(cost_model, mesh, fitting, groups, ranking, tally)
    ranked = ranking.ranked()
    tally.rejected["slower"] -= len(ranked)
    return SolverResult(ranked=ranked, rejected={k: v for k, v in tally.rejected.items() if v},
                        closest_misses=() if ranked else tally.closest(), num_candidates=total,
                        num_evaluated=tally.evaluated)


def _visit_mesh(cost_model: CostModel, mesh: MeshChoice, fitting: list[StateChoice],
                groups: list[tuple[float, list[ScheduleChoice]]], ranking: _Ranking, tally: _Tally) -> None:
    """Evaluate a mesh's schedule groups best bound first until the bound passes the cutoff."""
    for visited, (bound, members) in enumerate(groups):
        if bound > _cutoff(ranking, mesh):
            count(tally.rejected, "slower", sum(len(m) for _, m in groups[visited:]) * len(fitting))
            return
        for member_index, sched in enumerate(members):
            if member_index and cost_model.pipeline_lower_bound_s(make_layout(mesh, fitting[0], sched)) \
                    > _cutoff(ranking, mesh):
                count(tally.rejected, "slower", len(fitting))
                continue
            for state in fitting:
                layout = make_layout(mesh, state, sched)
                tally.evaluated += 1
                if ranking.best and cost_model.peak_memory_bytes(layout) > cost_model.capacity_bytes:
                    tally.rejected["memory"] += 1  # misses matter only while nothing fits
                    continue
                breakdown = cost_model.estimate(layout)
                if breakdown.fits:
                    ranking.offer(mesh, breakdown)
                    tally.rejected["slower"] += 1
                else:
                    tally.miss(breakdown, ranking)


def _cutoff(ranking: _Ranking, mesh: MeshChoice) -> float:
    """A subtree whose bound exceeds this can change neither the mesh's best nor the top K."""
    mesh_best = ranking.best[mesh][0][0] if mesh in ranking.best else float("inf")
    return min(mesh_best, ranking.threshold_s())


def _undominated(cost_model: CostModel, scheds: list[ScheduleChoice]) -> list[ScheduleChoice]:
    """Drop schedule choices that a twin provably beats on every layout of the mesh.

    - GPipe has 1F1B's step time and holds at least as many micro-batches (``pipeline``), so its
      1F1B twin ranks first (less or equal memory, then '1f1b' < 'gpipe').
    - Without a measured profile, sequence parallelism costs the same TP traffic (ring all-reduce =
      reduce-scatter + all-gather in the alpha-beta model, also hierarchically) and less of
      everything else (norm and dropout traffic, activations, pipeline messages, embedding
      reduce), so the SP twin beats the layout without it.
    The brute-force twin evaluates them all and agrees (``tests/test_search.py``)."""
    present = {(sc.micro_batch_size, sc.schedule, sc.virtual_stages, sc.recompute, sc.sequence_parallel)
               for sc in scheds}
    measured = cost_model.rates.profile is not None
    kept = []
    for sc in scheds:
        key = (sc.micro_batch_size, sc.schedule, sc.virtual_stages, sc.recompute, sc.sequence_parallel)
        if sc.schedule == "gpipe" and (key[0], "1f1b") + key[2:] in present:
            continue
        if not measured and not sc.sequence_parallel and key[:4] + (True,) in present:
            continue
        kept.append(sc)
    return kept


def _groups_by_bound(cost_model: CostModel, mesh: MeshChoice, state: StateChoice,
                     scheds: list[ScheduleChoice]) -> list[tuple[float, list[ScheduleChoice]]]:
    """Schedule choices grouped by all but the recomputation mode, best bound first.

    Recomputation only adds time (recompute and its communication are non-negative terms), and
    GPipe and 1F1B have the same step time (they differ in memory), so the bound of the 'none'
    member bounds its whole group; members follow in the order none, selective, full.
    """
    order = {mode: i for i, mode in enumerate(("none", "selective", "full"))}
    groups: dict[tuple, list[ScheduleChoice]] = {}
    for sched in scheds:
        family = "flush" if sched.schedule in ("gpipe", "1f1b") else sched.schedule  # GPipe and 1F1B: same time
        key = (sched.micro_batch_size, family, sched.virtual_stages, sched.sequence_parallel)
        groups.setdefault(key, []).append(sched)
    out = []
    for members in groups.values():
        members.sort(key=lambda sc: (order[sc.recompute], sc.schedule))
        lowest = replace(members[0], recompute="none")
        out.append((cost_model.pipeline_lower_bound_s(make_layout(mesh, state, lowest)), members))
    out.sort(key=lambda item: (item[0], _sched_key(item[1][0])))
    return out


def _sched_key(sched: ScheduleChoice) -> tuple:
    return (sched.micro_batch_size, sched.schedule, sched.virtual_stages, sched.sequence_parallel, sched.recompute)


def _states_that_may_fit(cost_model: CostModel, mesh: MeshChoice, states: list[StateChoice],
                         sched) -> list[StateChoice]:
    """States whose parameters, gradients and optimizer states alone fit on every rank (a lower
    bound on memory: activations, buffers and overhead only add)."""
    out = []
    for state in states:
        layout = make_layout(mesh, state, sched)
        if cost_model.model_state_peak_bytes(layout) <= cost_model.capacity_bytes:
            out.append(state)
    return out
