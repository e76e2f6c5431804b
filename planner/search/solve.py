"""Exact search over the layout space by branch and bound.

The cost model's step time is bounded below in two parts (``costmodels.bounds``): for each mesh
(dp, tp, pp, cp, ep) and schedule choice (micro-batch, schedule, virtual stages, recomputation,
sequence parallel) the pipeline's time without data-parallel sync, optimizer and offload
(``pipeline_floor_s``); for each way of holding model states (ZeRO stage, HSDP, offload) the
data-parallel time per micro-batch and the per-step tail at their least over any compute they hide
behind (``state_floor_s``). Their sum bounds every layout of that (schedule group, state) pair, for
every schedule (states only add to a rank's B pass, which every bubble form is non-decreasing in;
``costmodels.bounds``, facts 1-3). A dense mesh with cp > 1 is first bounded by what its ring (or
all-gather) exchanges alone take (``context_parallel_floor_s``, at most its mean floor), so a mesh
of many CP ranks is cut before any layer of it is costed. Before its groups are built, a mesh is
bounded by its mean floor (``mean_floor_s``: the ranks' mean core without p2p, no bubble,
DualPipe's most hidden time off), which is at most every group's pipeline floor; a group waits for
its pipeline floor on its bubble floor (``bubble_floor_s``: the mean floor plus a floor on its
schedule's bubble).

Prunes, each of which never cuts the answer:
- Memory: model states alone (no activations) bound memory from below, cutting (mesh, state)
  pairs that cannot fit whatever the schedule (``groups.states_that_may_fit``), first over every
  split the mesh's pipeline choices make, before the mesh's floor (a mesh none of whose states
  fits costs no layer), then over its groups' splits; a micro-batch size under which rank 0's
  model states and activations alone pass the capacity, whatever the state, schedule and
  recomputation, is left out of the mesh before its floor too
  (``floors.micro_batch_sizes_that_may_fit``); inside a
  visit, a member whose model states and activations alone (no buffers) pass the capacity is cut
  before its step time or peak is costed, and, where its pipeline floor is not known yet, before
  that floor is summed (``floors.MemoryFloors``, ``costmodels.memory_bounds``); a (group, state)
  pair none of whose members passes that floor is passed over before its group takes its pipeline
  floor (``groups.pairs``).
- Dominance: GPipe and layouts without sequence parallelism (datasheet rates) are never better
  than a twin that is kept, never simpler and never lighter in memory (``_undominated``,
  ``ranking.tie_key``).
- Time: schedule choices are grouped so that one bound covers the group (the recomputation modes
  only add time; GPipe and 1F1B share their step time); a mesh on its mean floor, then on its
  groups' least pipeline floor, then on its least (group, state) bound, a pair, and then each
  member, is cut when its bound exceeds (1 + band) × the smaller of the mesh's fastest plan
  so far and the threshold (the K-th fastest mesh's, or the tie band's edge above the fastest of
  all where that is larger, ``standings.Standings.cutoff_s``): it can then be neither the mesh's
  fastest, nor within the band of the fastest of a mesh the result holds (where the simplest plan
  is picked, ``ranking.MeshBand``). A bound that covers every plan of the mesh not yet found (the
  mesh's floors before its visit, and a pair's bound in the visit, which takes pairs best bound
  first) is held to the threshold itself where the mesh has no plan at or below it and no
  placement or dispatcher twin shares its band (``Standings.whole_cutoff_s``): a mesh none of whose
  plans reaches the threshold is returned neither among the first K nor as tied, so the band above
  the threshold is of no use to it. That
  cutoff only falls while a mesh waits for its visit, so a group whose bubble floor passes it keeps
  that floor (``groups.schedule_groups``; a group on its bubble floor takes its pipeline floor
  when a pair of it is visited, as when the visit's first plans widen the cutoff to their band).
  Meshes are taken best floor first, so the K-th plan is known early and whole meshes are cut on a
  floor without a full evaluation.
- TP-overlap twins (a layout with overlap on and off; ``bounds.tp_overlap_sign``, proof there): the
  twin whose layers spend more TP time has the larger or equal floors, so the mesh floor takes
  the other, and a group of it waits on its faster twin's pipeline floor; one twin's costed peak
  memory gives the other's, and outside DualPipe a faster twin's exact step time past the cutoff
  cuts the slower (``overlap_twins``). The answer is unchanged; only counts of evaluated layouts move.
A layout that passes every cut is offered with its exact step time as the bounds sum it, and costed
in full only where the result reads it (``standings``). Bounds sum the estimate's terms in another
order, so every cut keeps a relative slack of ``BOUND_SLACK``. The result equals
``brute_force.solve_brute_force`` exactly.
"""

from __future__ import annotations

import gc
import heapq
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterator

from costmodels.bands import shipped_memory_band
from costmodels.bounds import context_parallel_floor_s, mean_floor_s, pipeline_floor_s, tp_overlap_sign
from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel
from costmodels.memo import memoised
from costmodels.pipeline import DUALPIPE

from .floors import MemoryFloors, micro_batch_sizes_that_may_fit
from .twins import OverlapTwins
from costmodels.tie_band import TieBand

from .ranking import tie_band
from .standings import Offer, Standings
from .groups import (Group, chunk_placement, dense_core_sums, first_group_lowest, least_bound_s, pairs,
                     schedule_groups, states_that_may_fit, with_state_floors)
from .result import SolverResult, count, overshoot_key
from .schedule_rules import RuleCheck, SharedRuleChecks, num_runnable_schedules, runnable_schedules
from .space import (MeshChoice, PipelineChoice, ScheduleChoice, SearchOptions, StateChoice, ep_overlap_values,
                    make_layout, mesh_choices, pipeline_choices, schedule_choice, sequence_parallel_values,
                    state_choices, tp_overlap_values)

BOUND_SLACK = 1e-9
"""Relative margin by which a bound must exceed a cutoff to cut: a bound adds the same terms as
``estimate`` in another order, so it may lie a few units in the last place above the estimate."""


class _Tally:
    """Counts and closest misses gathered while searching."""

    def __init__(self, num_misses: int) -> None:
        self.rejected: Counter = Counter()
        self.misses: list[CostBreakdown] = []
        self.num_misses = num_misses
        self.evaluated = 0

    def miss(self, breakdown: CostBreakdown, ranking: Standings) -> None:
        self.rejected["memory"] += 1
        if ranking:
            return  # closest misses are reported only when nothing fits
        self.misses.append(breakdown)
        if len(self.misses) > 64:
            self.misses = heapq.nsmallest(self.num_misses, self.misses, key=overshoot_key)

    def closest(self) -> tuple[CostBreakdown, ...]:
        return tuple(heapq.nsmallest(self.num_misses, self.misses, key=overshoot_key))


def solve(cost_model: CostModel, num_gpus: int, domain_gpus: int, options: SearchOptions, top_k: int,
          num_misses: int = 3, band: TieBand | None = None) -> SolverResult:
    """The top-K meshes' plans under the cost model, found by branch and bound.

    Pass 1 bounds every mesh some of whose states' model states may fit by its mean floor
    (``_mesh_floor_s``; a dense mesh with cp > 1 by its CP floor first, ``_cp_floor_s``, and by its
    mean floor when it comes back); the rest are counted as memory, and costed for a miss only where
    nothing fits. Pass 2 takes meshes best floor
    first from a heap: a mesh comes back with its schedule groups' pipeline floors, then with its
    states' floors added (the least bound over its (group, state) pairs), then is visited, so the
    K-th best plan is known early and whole meshes are cut on a floor without a full evaluation
    (what a later stage needs is never computed for meshes cut at an earlier one). The cyclic
    garbage collector is paused meanwhile (``collector_paused``). ``band``: the tie band
    (default: the shipped, measured one for the job's runtime, ``ranking.tie_band``). ``num_misses``:
    closest misses kept for when nothing fits; with 0, layouts are cut by their memory floors before
    anything fits too (the same plans and counts, no misses)."""
    with collector_paused():
        return _solve(cost_model, num_gpus, domain_gpus, options, top_k, num_misses, band)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off, and back on after if it was on. The search makes
    hundreds of thousands of short-lived objects (choices, layouts, memo keys and values) that
    reference counting frees, and each collection walks every tracked object, the growing memos
    among them: about 8% of the search's CPU time on ``benchmarks/search_speed.py``'s cases. A
    reference cycle made meanwhile is collected once the collector is back. As a decorator
    (``planner.api.plan``) it keeps the collector off until the function's frame, and with it the
    cost model's memos (freed by reference counting, ``costmodels.context``), is gone, so the first
    collection after it walks what the function returned, not every memo value."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _solve(cost_model: CostModel, num_gpus: int, domain_gpus: int, options: SearchOptions, top_k: int,
           num_misses: int, band: TieBand | None) -> SolverResult:
    model, training = cost_model.model, cost_model.training
    band = band or tie_band(training.runtime)
    ranking = Standings(cost_model, top_k, band, shipped_memory_band(training.runtime))
    tally = _Tally(num_misses)
    total = 0
    work: list[tuple] = []
    pipes_of: dict[tuple[int, int], list[PipelineChoice]] = {}  # they read the mesh's dp and pp only
    counts: dict[MeshChoice, int] = {}  # no rule reads the placement: its variants share the count
    checks: dict[MeshChoice, RuleCheck | None] = {}  # and the rules' answers, shared where they read alike
    shared_checks = SharedRuleChecks(options, model, training)
    unfit: list[tuple] = []  # meshes with no layout that may fit (by model states, then micro-batch size)
    variants: Counter = Counter()  # meshes of each degrees searched (placements and dispatchers share a band)
    for order, mesh in enumerate(mesh_choices(model, training, num_gpus, domain_gpus, options)):
        cm = cost_model.placed(mesh.gpus_per_nvlink_domain)  # the mesh's collectives on its placement
        if (mesh.dp, mesh.pp) not in pipes_of:
            pipes_of[mesh.dp, mesh.pp] = pipeline_choices(mesh, model, training, options)
        pipes = pipes_of[mesh.dp, mesh.pp]
        states = state_choices(mesh, domain_gpus, options, model, training)
        unplaced = replace(mesh, gpus_per_nvlink_domain=0)
        if unplaced not in counts:
            checks[unplaced] = shared_checks.of(mesh)
            counts[unplaced] = num_runnable_schedules(checks[unplaced], mesh, model, training, options, pipes)
        num_scheds = counts[unplaced]
        total += num_scheds * len(states)
        if not (num_scheds and states):
            continue
        splits = _splits(pipes)
        fitting = states_that_may_fit(cm, mesh, states, splits)  # before any layer is costed
        count(tally.rejected, "memory", (len(states) - len(fitting)) * num_scheds)
        kept = pipes
        if fitting:  # and the micro-batch sizes none of whose layouts fits
            sizes = micro_batch_sizes_that_may_fit(cm, mesh, fitting, pipes, options.recompute_modes,
                                                   sequence_parallel_values(mesh, training),
                                                   ep_overlap_values(mesh, model, options))
            kept = [pipe for pipe in pipes if pipe.micro_batch_size in sizes]
            if len(kept) < len(pipes):
                dropped = num_scheds - num_runnable_schedules(checks[unplaced], mesh, model, training, options, kept)
                count(tally.rejected, "memory", dropped * len(fitting))
                num_scheds -= dropped
        if not (fitting and num_scheds):
            unfit.append((mesh, states[0], checks[unplaced], pipes, cm))
            continue
        pipes = kept
        variants[mesh.degrees] += 1
        placements = {chunk_placement(sched) for sched in splits}
        entry = (fitting, num_scheds, checks[unplaced], placements)
        if cm.model.moe is None and mesh.cp > 1:  # stage -1: a dense mesh's CP floor, before its mean floor
            floor_s = _cp_floor_s(cm, mesh, fitting[0], pipes) + cm.assumptions.step_overhead_s
            heapq.heappush(work, (floor_s, order, -1, mesh, entry, pipes, cm))
            continue
        # stage 0: the mean floor; a state adds at least the per-step overhead
        floor_s = _mesh_floor_s(cm, mesh, fitting[0], pipes, options) + cm.assumptions.step_overhead_s
        heapq.heappush(work, (floor_s, order, 0, mesh, entry, pipes, cm))
    def whole_cutoff_s(mesh: MeshChoice) -> float:
        """The cutoff of a bound over all of a mesh's plans not yet found: ``Standings.whole_cutoff_s``
        where the mesh is alone in its band, else ``cutoff_s`` (a placement or dispatcher twin that
        shares its band may still bring it a plan at or below the threshold, and then the band)."""
        if variants[mesh.degrees] == 1:
            return ranking.whole_cutoff_s(mesh.degrees, BOUND_SLACK)
        return ranking.cutoff_s(mesh.degrees, BOUND_SLACK)

    while work:
        floor_s, order, stage, mesh, states, groups, cm = heapq.heappop(work)
        if stage < 2:
            states, num_scheds, check, placements = states
        if floor_s > whole_cutoff_s(mesh):  # the mesh's floor: no pair of it can pass
            count(tally.rejected, "slower", (num_scheds if stage < 2 else sum(len(g.members) for g in groups))
                  * len(states))
        elif stage == -1:  # stage 0: the mean floor
            floor_s = _mesh_floor_s(cm, mesh, states[0], groups, options) + cm.assumptions.step_overhead_s
            heapq.heappush(work, (floor_s, order, 0, mesh, (states, num_scheds, check, placements), groups, cm))
        elif stage == 0:  # stage 1: the schedule groups, each with its pipeline floor
            scheds = runnable_schedules(check, mesh, model, training, options, groups,
                                        _kept_sp_values(cm, mesh, options))
            groups = schedule_groups(cm, mesh, states[0], _undominated(cm, mesh, scheds),
                                      whole_cutoff_s(mesh) - cm.assumptions.step_overhead_s)
            floor_s = min(group.floor_s for group in groups) + cm.assumptions.step_overhead_s
            heapq.heappush(work, (floor_s, order, 1, mesh, (states, num_scheds, check, placements), groups, cm))
        elif stage == 1:  # stage 2: with each state that may fit, its floor added
            fitting = states  # asked again only where the groups make fewer splits than the pipes did
            if {chunk_placement(group.lowest) for group in groups} != placements:
                fitting = states_that_may_fit(cm, mesh, states, (group.lowest for group in groups))
            count(tally.rejected, "memory", (len(states) - len(fitting)) * num_scheds)
            if not fitting:
                if tally.num_misses:
                    tally.misses.append(cm.estimate(make_layout(mesh, states[0], groups[0].lowest)))
                continue
            count(tally.rejected, "slower", (num_scheds - sum(len(g.members) for g in groups)) * len(fitting))
            groups = with_state_floors(cm, mesh, fitting, groups)
            floor_s = least_bound_s(cm, mesh, fitting, groups)
            heapq.heappush(work, (floor_s, order, 2, mesh, fitting, groups, cm))
        else:
            _visit_mesh(cm, mesh, states, groups, ranking, tally, whole_cutoff_s)
    ranked, tied = ranking.result()
    if not ranked and tally.num_misses:  # nothing fits: each unfit mesh's miss, as stage 2 would have costed it
        for mesh, state, check, pipes, cm in unfit:
            scheds = _undominated(cm, mesh, runnable_schedules(check, mesh, model, training, options, pipes,
                                                               _kept_sp_values(cm, mesh, options)))
            tally.misses.append(cm.estimate(make_layout(mesh, state, first_group_lowest(scheds))))
    tally.rejected["slower"] -= len(ranked)
    return SolverResult(ranked=ranked, tied_in_mesh=tied, rejected={k: v for k, v in tally.rejected.items() if v},
                        closest_misses=() if ranked else tally.closest(), num_candidates=total,
                        num_evaluated=tally.evaluated)


def _visit_mesh(cost_model: CostModel, mesh: MeshChoice, states: list[StateChoice], groups: list["Group"],
                ranking: Standings, tally: _Tally, whole_cutoff_s: Callable[[MeshChoice], float]) -> None:
    """Evaluate a mesh's (group, state) pairs best bound first (``pairs``) until the bound passes the
    cutoff, passing over pairs none of whose members fits (``Pair.too_big``, asked before a group on its
    bubble floor takes its pipeline floor: in a memory-bound search most such groups hold no layout that
    fits, and a memory floor costs less than a pipeline floor); inside a pair, each member is bounded on
    its own first, in time and in memory: a member whose pipeline floor is not known yet (one with
    recomputation, the first time it is met) is bounded in memory first, which most such members in a
    memory-bound search fail, so their pipeline floor is never summed; the exact step time of the
    group's lowest member, a floor for every member (recomputation only adds time; GPipe has 1F1B's), is
    summed once a member of the pair passes its memory floor, and cuts the rest of the pair where it
    passes the cutoff (no cut changes the answer; only the counts of evaluated layouts and of each
    reason move)."""
    floors: dict[ScheduleChoice, float] = {}
    twins, heavy = OverlapTwins(cost_model), MemoryFloors(cost_model, mesh)
    left = sum(len(g.members) for g in groups) * len(states)  # schedule choices of the pairs not yet taken
    prune = bool(ranking) or not tally.num_misses  # misses matter only while nothing fits
    for pair in pairs(cost_model, mesh, states, groups, heavy.too_big if prune else None):
        if pair.bound_s > whole_cutoff_s(mesh):  # this pair and every later one
            count(tally.rejected, "slower", left)
            return
        left -= len(pair.members)
        if pair.too_big:  # no member's states and activations alone fit
            tally.rejected["memory"] += len(pair.members)
            continue
        lowest_s = None  # the exact step time of the group's lowest member, a floor for every member
        for position, sched in enumerate(pair.members):
            cutoff_s = ranking.cutoff_s(mesh.degrees, BOUND_SLACK)
            prune = bool(ranking) or not tally.num_misses  # misses matter only while nothing fits
            known = sched.recompute == "none" or sched in floors  # its pipeline floor
            if not known and prune and heavy.too_big(pair.state, sched):
                tally.rejected["memory"] += 1  # its states and activations alone pass the capacity
                continue
            if not known:  # it reads no state field
                floors[sched] = pipeline_floor_s(cost_model, make_layout(mesh, pair.state, sched))
            bound_s = (pair.group.floor_s if sched.recompute == "none" else floors[sched]) \
                + sched.num_microbatches * pair.per_microbatch_s + pair.tail_s
            if bound_s > cutoff_s:
                tally.rejected["slower"] += 1
                continue
            layout = make_layout(mesh, pair.state, sched)  # built only past the time bound
            tally.evaluated += 1
            if known and prune and heavy.too_big(pair.state, sched):
                tally.rejected["memory"] += 1  # its states and activations alone pass the capacity
                continue
            fits = twins.fits_from_twin(layout) if prune else None  # cheap where its twin was costed
            if fits is False:
                tally.rejected["memory"] += 1
                continue
            if ranking and lowest_s is None and len(pair.members) > 1:  # once a member passes its memory floor
                lowest_s = twins.step_s(make_layout(mesh, pair.state, pair.group.lowest), cutoff_s)
            if lowest_s is not None and lowest_s > cutoff_s:
                count(tally.rejected, "slower", len(pair.members) - position)  # the group's floor, now exact
                break
            summed_s = None
            if ranking:  # its exact time, summed without memory and traffic
                summed_s = (lowest_s if lowest_s is not None and sched == pair.group.lowest else
                            twins.step_s(layout, cutoff_s))
                if summed_s > cutoff_s:
                    tally.rejected["slower"] += 1
                    continue
            peak = twins.peak_bytes(layout) if prune and fits is None else None  # kept for the result
            if peak is not None and peak > cost_model.capacity_bytes:
                tally.rejected["memory"] += 1
                continue
            if summed_s is not None and not layout.optimizer_offload:  # it fits (host RAM: the estimate's word)
                ranking.offer(mesh.degrees, Offer(layout=layout, step_time_s=summed_s, peak_memory_bytes=peak))
                tally.rejected["slower"] += 1
                continue
            breakdown = cost_model.estimate(layout)
            if breakdown.fits:
                ranking.offer(mesh.degrees, Offer(layout=layout, step_time_s=breakdown.step_time_s, breakdown=breakdown))
                tally.rejected["slower"] += 1
            else:
                tally.miss(breakdown, ranking)


def _splits(pipes: list[PipelineChoice]) -> list[ScheduleChoice]:
    """A schedule choice of each way ``pipes`` place the layers on the ranks (placement, v and split):
    every schedule choice of the mesh places its layers as one of them, and which layers a rank holds
    is all of a schedule choice that its model states read (``groups.states_that_may_fit``)."""
    placed = {chunk_placement(pipe): pipe for pipe in pipes}
    return [schedule_choice(pipe, "none", False, False, False) for pipe in placed.values()]


def _undominated(cost_model: CostModel, mesh: MeshChoice, scheds: list[ScheduleChoice]) -> list[ScheduleChoice]:
    """Drop schedule choices that a twin provably beats on every layout of the mesh.

    - GPipe has 1F1B's step time and holds at least as many micro-batches (``pipeline``), so its
      1F1B twin ranks first (less or equal memory, then '1f1b' < 'gpipe').
    - Where ``_sp_dominates`` (the TP all-reduce is a ring, exactly reduce-scatter + all-gather in the
      alpha-beta model, also hierarchically), sequence parallelism costs the same TP traffic and less
      of everything else (norm and dropout traffic, activations, pipeline messages, embedding
      reduce), so the SP twin (without TP overlap) beats the layout without it. With NVLink SHARP
      the all-reduce is faster than the two rings, so both are costed. TP overlap has no twin: its
      decomposition and exposed last chunk can cost more than it hides.
    The brute-force twin evaluates them all and agrees (``tests/test_search.py``)."""
    present = {(sc.micro_batch_size, sc.schedule, sc.virtual_stages, sc.recompute, sc.sequence_parallel,
                sc.tp_comm_overlap, sc.ep_comm_overlap) for sc in scheds}
    sp_dominates = _sp_dominates(cost_model, mesh)
    kept = []
    for sc in scheds:
        key = (sc.micro_batch_size, sc.schedule, sc.virtual_stages, sc.recompute, sc.sequence_parallel,
               sc.tp_comm_overlap, sc.ep_comm_overlap)
        if sc.schedule == "gpipe" and (key[0], "1f1b") + key[2:] in present:
            continue
        if sp_dominates and not sc.sequence_parallel and key[:4] + (True, False) + key[6:] in present:
            continue
        kept.append(sc)
    return kept


def _mesh_floor_s(cost_model: CostModel, mesh: MeshChoice, state: StateChoice, pipes: list[PipelineChoice],
                  options: SearchOptions) -> float:
    """At most the pipeline floor of every schedule group of the mesh: the least ``mean_floor_s``
    over the SP values ``_undominated`` keeps, each also with TP overlap where it is searched (of an
    overlap pair only the twin ``bounds.tp_overlap_sign`` finds faster: the mean floor, a sum of
    cores, orders as the pipeline floor does), for one pipeline choice of each micro-batch size and,
    where EP gives DualPipe something to hide, each DualPipe choice (``mean_floor_s`` covers every
    other placement and recomputation mode)."""
    hides = mesh.ep > 1 and cost_model.model.moe is not None
    chosen: dict[tuple, PipelineChoice] = {}
    for pipe in pipes:
        chosen.setdefault((pipe.micro_batch_size, pipe.schedule if pipe.schedule in DUALPIPE and hides else ""), pipe)
    values = tp_overlap_values(_kept_sp_values(cost_model, mesh, options), options)
    ep_values = ep_overlap_values(mesh, cost_model.model, options)
    floors = []
    for pipe in chosen.values():
        if cost_model.model.moe is None:  # m·Σ_i c_i / pp, the sums shared by meshes of one shape
            floors += [pipe.num_microbatches * total_s / mesh.pp
                       for total_s in _dense_core_totals(cost_model, mesh, state, pipe, values)]
            continue
        floors += [mean_floor_s(cost_model, layout) for layout in _floor_layouts(cost_model, mesh, state, pipe, values,
                                                                                 ep_values)]
    return min(floors)


def _cp_floor_s(cost_model: CostModel, mesh: MeshChoice, state: StateChoice, pipes: list[PipelineChoice]) -> float:
    """At most ``_mesh_floor_s`` of a dense mesh: the least ``bounds.context_parallel_floor_s`` over its
    micro-batch sizes, from the CP collectives alone (it reads of a pipeline choice only its size and
    m, so one choice per size stands for all). Meshes of many CP ranks, whose ring exchanges swamp
    their layers, are cut on it before a layer of theirs is costed."""
    sizes = {pipe.micro_batch_size: pipe for pipe in pipes}
    return min(context_parallel_floor_s(cost_model, make_layout(mesh, state, schedule_choice(pipe, "none", False, False,
                                                                                              False)))
               for pipe in sizes.values())


def _floor_layouts(cost_model: CostModel, mesh: MeshChoice, state: StateChoice, pipe: PipelineChoice,
                   values: list[tuple[bool, bool]], ep_values: tuple[bool, ...]) -> list:
    """The layouts without recomputation ``_mesh_floor_s`` takes the mean floor of for ``pipe``: each
    (SP, TP overlap) value and EP overlap value, of an overlap pair only the faster twin."""
    scheds = [schedule_choice(pipe, "none", sp, overlap, ep_overlap)
              for sp, overlap in values for ep_overlap in ep_values]
    layouts = [make_layout(mesh, state, sched) for sched in scheds]
    if (True, True) in values and (True, False) in values:
        sign = tp_overlap_sign(cost_model, layouts[0])  # it reads no EP overlap field
        layouts = [L for L in layouts if not (L.sequence_parallel and sign and L.tp_comm_overlap == (sign > 0))]
    return layouts


def _dense_core_totals(cost_model: CostModel, mesh: MeshChoice, state: StateChoice, pipe: PipelineChoice,
                       values: list[tuple[bool, bool]]) -> tuple[float, ...]:
    """Σ_i c_i of each of ``_floor_layouts`` of a dense model, whose ``mean_floor_s`` is m·Σ_i c_i / pp
    (a dense model has no EP time for DualPipe to hide). The sums read no dp, m, pp, placement of the
    chunks or state, only the layer pieces' inputs (``bounds.core_sums``), and DualPipe's halved
    pieces, with pp; so they are kept by those (the mesh's shape and placement, the micro-batch
    size, the values), and the meshes that share them build no layout for them."""
    halved = pipe.schedule == "dualpipe"
    key = ("dense core totals", mesh.tp, mesh.cp, mesh.ep, mesh.gpus_per_nvlink_domain, mesh.moe_dispatcher,
           pipe.micro_batch_size, halved, mesh.pp if halved else 0, tuple(values))
    layouts = lambda: _floor_layouts(cost_model, mesh, state, pipe, values, (False,))  # no recomputation
    return memoised(cost_model.bound_memo, key, lambda: tuple(
        dense_core_sums(cost_model, mesh, state, schedule_choice(pipe, "none", L.sequence_parallel, L.tp_comm_overlap,
                                                                 False)).total_s for L in layouts()))


def _kept_sp_values(cost_model: CostModel, mesh: MeshChoice, options: SearchOptions) -> tuple[bool, ...]:
    """The SP values some schedule choice of the mesh keeps after ``_undominated``: without SP only where
    it is not dominated, or where a job rule may have dropped a choice's SP twin."""
    values = sequence_parallel_values(mesh, cost_model.training)
    return (True,) if True in values and _sp_dominates(cost_model, mesh) and not options.job_rules else values


def _sp_dominates(cost_model: CostModel, mesh: MeshChoice) -> bool:
    """Sequence parallelism beats its twin without it (``_undominated``) where a TP all-reduce costs
    exactly its reduce-scatter plus its all-gather: datasheet rates (no measured profile), TP groups
    inside one NVLink domain (where NCCL's tree never beats the ring,
    ``costmodels.collectives_all_reduce``) and no NVLink SHARP, whose in-switch all-reduce is faster than the two rings."""
    return (cost_model.rates.profile is None and cost_model.cluster.group_placement(mesh.tp, 1)[1] == 1
            and cost_model.cluster.node.intra_node.nvls_efficiency == 0)
