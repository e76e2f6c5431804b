"""A mesh's schedule choices in groups, their floors, and their (group, state) pairs for the
exact search (``planner.search.solve``): which choices one bound covers, and in what order the visit
takes them. Every floor here is a lower bound (``costmodels.bounds``); why each never cuts the
answer is in ``planner.search.solve`` and the docstrings below."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

from costmodels.assignment import schedule_placement
from costmodels.bounds import (CoreSums, bubble_floor_from_sums, bubble_floor_s, core_sums, pipeline_floor_s,
                               state_floor_s, tp_overlap_sign)
from costmodels.estimate import CostModel
from costmodels.memo import memoised
from costmodels.layout import RECOMPUTE_MODES

from .space import MeshChoice, PipelineChoice, ScheduleChoice, StateChoice, make_layout


@dataclass(frozen=True, slots=True)
class Pair:
    """One schedule group with one way of holding model states, and the bound that covers it."""

    bound_s: float
    group: "Group"
    state: StateChoice
    per_microbatch_s: float
    """``state_floor_s``: data-parallel time per micro-batch ..."""
    tail_s: float
    """... and per step, at their least."""
    too_big: bool = False
    """Whether no member fits with the state (its memory floor passes the capacity, ``pairs``): then
    the group may be on its bubble floor, and the pair holds no plan."""

    @property
    def members(self) -> tuple[ScheduleChoice, ...]:
        return self.group.members


@dataclass(frozen=True, slots=True)
class Group:
    """Schedule choices one bound covers, with the state floors of the mesh's states."""

    floor_s: float
    """``pipeline_floor_s`` of the member without recomputation, or its bubble floor, a lower bound
    on it (``schedule_groups``)."""
    exact: bool
    """Whether ``floor_s`` is the pipeline floor."""
    lowest: ScheduleChoice
    members: tuple[ScheduleChoice, ...]
    state_floors: tuple[tuple[float, float], ...]
    """``state_floor_s`` per state of the mesh, in the mesh's state order (() until needed)."""

    def bound_s(self, state_index: int) -> float:
        """Pipeline floor plus the state floors: a lower bound for every schedule (``costmodels.bounds``,
        facts 1 to 3)."""
        per_mb_s, tail_s = self.state_floors[state_index]
        return self.floor_s + self.lowest.num_microbatches * per_mb_s + tail_s


def schedule_groups(cost_model: CostModel, mesh: MeshChoice, state: StateChoice, scheds: list[ScheduleChoice],
                     cutoff_s: float) -> list[Group]:
    """The schedule choices in groups, each with its mean floor raised by a bubble floor
    (``bubble_floor_s``, at most the group's pipeline floor), and with its pipeline floor instead
    (``Group.exact``) in order of that floor while it is below both the least pipeline floor so far
    and ``cutoff_s`` (the mesh's cutoff for a bound over all its plans, ``Standings.whole_cutoff_s``,
    less the overhead every state adds; it only falls until the mesh is visited, so a group past it
    passes only if its mesh's visit finds a plan that widens the cutoff to its band). The least floor is then
    the least pipeline floor, as if every group had its own; a group left on its bubble floor takes
    its pipeline floor when a pair of it is visited (``pairs``). Which groups take their pipeline
    floor here changes no pair's bound, so neither the visit nor the answer: the bubble floor only
    spares the pipeline floors of groups, such as those of few large micro-batches, whose mean
    floor is low and whose bubble is large.

    A group holds the schedule choices that differ only in recomputation or in GPipe against 1F1B
    (the EP overlap on and off are groups apart):
    recomputation only adds time (recompute and its communication are non-negative terms, and the
    compute that data-parallel traffic hides behind is the same), and GPipe and 1F1B have the same
    step time (they differ in memory), so the bound of the group's 'none' member bounds it all.
    Every other schedule (interleaved, and each new one) is its own family, bounded with its own
    bubble. Members follow in the order none, selective, op-sac, full.
    """
    members_of = _members_of(scheds)
    lowest_of, cheap, shared, sums_of = {}, {}, {}, {}
    for key, members in members_of.items():
        lowest = lowest_of[key] = _lowest(members)
        # what ``bubble_floor_s`` reads of a choice: not its split
        floor_key = (lowest.micro_batch_size, lowest.num_microbatches, lowest.sequence_parallel,
                     lowest.tp_comm_overlap, lowest.schedule, lowest.virtual_stages, lowest.ep_comm_overlap)
        if floor_key not in shared:
            shared[floor_key] = _bubble_floor_s(cost_model, mesh, state, lowest, sums_of)
        cheap[key] = shared[floor_key]
    floors: dict[tuple, float] = {}
    least_s = float("inf")
    slower = _slower_overlap_twins(cost_model, mesh, state, lowest_of)
    for key in sorted(cheap, key=cheap.__getitem__):  # until no bubble floor is below the least floor
        if cheap[key] > cutoff_s or cheap[key] >= least_s:
            break
        if slower.get(key) in floors:  # its faster twin's floor, at least the least floor
            cheap[key] = max(cheap[key], floors[slower[key]])
            continue
        floors[key] = pipeline_floor_s(cost_model, make_layout(mesh, state, lowest_of[key]))
        least_s = min(least_s, floors[key])
    return [Group(floor_s=floors.get(key, cheap[key]), exact=key in floors, lowest=lowest_of[key],
                   members=tuple(members), state_floors=()) for key, members in members_of.items()]


def _members_of(scheds: list[ScheduleChoice]) -> dict[tuple, list[ScheduleChoice]]:
    """``schedule_groups``' groups by key, in the order of their first member in ``scheds``, each's members
    in the order none, selective, op-sac, full (1F1B before GPipe)."""
    order = {mode: i for i, mode in enumerate(RECOMPUTE_MODES)}
    members_of: dict[tuple, list[ScheduleChoice]] = {}
    for sched in scheds:
        family = "1f1b" if sched.schedule == "gpipe" else sched.schedule  # GPipe and 1F1B: same time
        key = (sched.micro_batch_size, family, sched.virtual_stages, sched.sequence_parallel, sched.tp_comm_overlap,
               sched.layers_per_chunk, sched.ep_comm_overlap)
        members_of.setdefault(key, []).append(sched)
    for members in members_of.values():
        members.sort(key=lambda sc: (order[sc.recompute], sc.schedule))
    return members_of


def _lowest(members: list[ScheduleChoice]) -> ScheduleChoice:
    """A group's member without recomputation (``Group.lowest``), made where the job rules left none."""
    return members[0] if members[0].recompute == "none" else replace(members[0], recompute="none")


def first_group_lowest(scheds: list[ScheduleChoice]) -> ScheduleChoice:
    """``Group.lowest`` of the first group ``schedule_groups`` returns for ``scheds``, without its floors."""
    return _lowest(next(iter(_members_of(scheds).values())))


def _bubble_floor_s(cost_model: CostModel, mesh: MeshChoice, state: StateChoice, lowest: ScheduleChoice,
                    sums_of: dict[tuple, CoreSums]) -> float:
    """``bubble_floor_s`` of (mesh, state, lowest). A dense model's cores have no EP time to hide, so
    its floor reads their sums (``bounds.core_sums``), which of a mesh's choices read only the
    micro-batch size, SP, TP overlap and DualPipe's halving: they are kept in ``sums_of`` by those,
    and a choice whose sums are there builds no layout."""
    if cost_model.model.moe is not None:
        return bubble_floor_s(cost_model, make_layout(mesh, state, lowest))
    key = (lowest.micro_batch_size, lowest.sequence_parallel, lowest.tp_comm_overlap, lowest.schedule == "dualpipe")
    if key not in sums_of:
        sums_of[key] = dense_core_sums(cost_model, mesh, state, lowest)
    return bubble_floor_from_sums(sums_of[key], lowest.num_microbatches, mesh.pp, lowest.virtual_stages,
                                  lowest.schedule)


def dense_core_sums(cost_model: CostModel, mesh: MeshChoice, state: StateChoice, sched: ScheduleChoice) -> CoreSums:
    """``bounds.core_sums`` of a dense model's (mesh, state, sched) without recomputation, kept by what
    it reads of them: the layer pieces' inputs (the mesh's tp, cp, ep, placement and dispatcher, the
    micro-batch size, SP and TP overlap; every other field of a search's layout is a default) and
    DualPipe's halving, with pp where halved; no dp, m, placement of the chunks or state. The mesh
    floor (``solve._dense_core_totals``) and the groups' bubble floors of every mesh of one shape
    share them, and build no layout for them."""
    halved = sched.schedule == "dualpipe"
    key = ("dense core sums", mesh.tp, mesh.cp, mesh.ep, mesh.gpus_per_nvlink_domain, mesh.moe_dispatcher,
           sched.micro_batch_size, sched.sequence_parallel, sched.tp_comm_overlap, halved, mesh.pp if halved else 0)
    return memoised(cost_model.bound_memo, key, lambda: core_sums(cost_model, make_layout(
        mesh, state, sched if sched.recompute == "none" else replace(sched, recompute="none"))))


def _slower_overlap_twins(cost_model: CostModel, mesh: MeshChoice, state: StateChoice,
                          lowest_of: dict[tuple, ScheduleChoice]) -> dict[tuple, tuple]:
    """Group keys (``schedule_groups``) whose TP-overlap twin group is present and has no larger
    pipeline floor (``bounds.tp_overlap_sign``), each with that twin's key."""
    out, signs = {}, {}  # the sign reads the micro-batch size alone of a mesh's choices
    for key, lowest in lowest_of.items():
        twin = key[:4] + (not key[4],) + key[5:]  # key[0]: micro-batch size, key[3]: SP, key[4]: overlap
        if key[3] and twin in lowest_of:
            if key[0] not in signs:
                signs[key[0]] = tp_overlap_sign(cost_model, make_layout(mesh, state, lowest))
            if signs[key[0]] and (signs[key[0]] > 0) == key[4]:
                out[key] = twin
    return out


def with_state_floors(cost_model: CostModel, mesh: MeshChoice, states: list[StateChoice],
                       groups: list[Group]) -> list[Group]:
    """``groups`` with ``state_floor_s`` of each state (shared by groups of one placement)."""
    floors: dict[tuple, tuple[tuple[float, float], ...]] = {}
    out = []
    for group in groups:
        where = chunk_placement(group.lowest)
        if where not in floors:
            floors[where] = tuple(state_floor_s(cost_model, make_layout(mesh, state, group.lowest)) for state in states)
        out.append(Group(floor_s=group.floor_s, exact=group.exact, lowest=group.lowest, members=group.members,
                          state_floors=floors[where]))  # not ``replace``: thousands per search
    return out


def least_bound_s(cost_model: CostModel, mesh: MeshChoice, states: list[StateChoice], groups: list[Group]) -> float:
    """The least bound over the (group, state) pairs, each group whose pair is least on its bubble floor
    first taking its pipeline floor (in ``groups``), so the least is that of every group's pipeline floor."""
    while True:
        bound_s, g = min((group.bound_s(index), g) for g, group in enumerate(groups) for index in range(len(states)))
        if groups[g].exact:
            return bound_s
        groups[g] = _exact(cost_model, mesh, states[0], groups[g])


def _exact(cost_model: CostModel, mesh: MeshChoice, state: StateChoice, group: Group) -> Group:
    """``group`` with its pipeline floor (which reads no field of ``state``)."""
    return replace(group, exact=True, floor_s=pipeline_floor_s(cost_model, make_layout(mesh, state, group.lowest)))


def pairs(cost_model: CostModel, mesh: MeshChoice, states: list[StateChoice], groups: list[Group],
          too_big: Callable[[StateChoice, ScheduleChoice], bool] | None = None) -> Iterator[Pair]:
    """Every (schedule group, state) pair of a mesh with its bound, best bound first (a heap, so the
    pairs past the cutoff are never sorted or built). A group on its bubble floor takes its pipeline
    floor when one of its pairs comes first, and its pairs go back with their larger bounds; but
    where ``too_big`` (a memory floor, ``floors.MemoryFloors.too_big``) says that no member of the
    pair fits with its state, the pair comes as it is, marked ``Pair.too_big``, without that floor
    (it holds no plan)."""
    groups = list(groups)
    heap = []
    for g, group in enumerate(groups):  # each pair's ``Group.bound_s``, the group's parts taken once
        floor_s, m, key = group.floor_s, group.lowest.num_microbatches, _sched_key(group.lowest)
        heap += [(floor_s + m * per_mb_s + tail_s, key, index, g)
                 for index, (per_mb_s, tail_s) in enumerate(group.state_floors)]
    heapq.heapify(heap)
    while heap:
        bound_s, key, index, g = heapq.heappop(heap)
        group = groups[g]
        if not group.exact:
            if too_big is not None and all(too_big(states[index], sched) for sched in reversed(group.members)):
                yield Pair(bound_s=bound_s, group=group, state=states[index], per_microbatch_s=0.0, tail_s=0.0,
                           too_big=True)
                continue
            group = groups[g] = _exact(cost_model, mesh, states[index], group)
        per_mb_s, tail_s = group.state_floors[index]
        refined_s = group.floor_s + group.lowest.num_microbatches * per_mb_s + tail_s
        if refined_s > bound_s:
            heapq.heappush(heap, (refined_s, key, index, g))
            continue
        yield Pair(bound_s=bound_s, group=group, state=states[index], per_microbatch_s=per_mb_s, tail_s=tail_s)


def chunk_placement(sched: ScheduleChoice | PipelineChoice) -> tuple:
    """What decides which layers each rank holds under ``sched``: placement, v and split."""
    return schedule_placement(sched.schedule), sched.virtual_stages, sched.layers_per_chunk


def _sched_key(sched: ScheduleChoice) -> tuple:
    return (sched.micro_batch_size, sched.schedule, sched.virtual_stages, sched.sequence_parallel,
            sched.tp_comm_overlap, sched.recompute, sched.ep_comm_overlap)


def states_that_may_fit(cost_model: CostModel, mesh: MeshChoice, states: list[StateChoice],
                         scheds: Iterable[ScheduleChoice]) -> list[StateChoice]:
    """States whose parameters, gradients and optimizer states alone fit on every rank under some
    pipeline split of ``scheds`` (a lower bound on memory: activations, buffers and overhead only
    add, and the split, one per placement of the chunks, virtual stage count and layer split,
    decides which layers each rank holds; no other field of a schedule choice is read)."""
    splits = list({chunk_placement(sched): sched for sched in scheds}.values())
    return [state for state in states
            if any(cost_model.model_state_peak_bytes(make_layout(mesh, state, sched)) <= cost_model.capacity_bytes
                   for sched in splits)]
