"""Memory floors of one mesh's layouts during a search visit (``planner.search.solve._visit_mesh``):
``costmodels.memory_bounds``' S + (1 + φ)·A + reserve, at most a layout's peak, so a layout whose
floor passes the capacity is never a plan and is cut before its step time or its peak is costed.
The floor's two parts are kept by the choices they read (the held states by the state and what
picks the ranks that can hold the peak, the activations by the schedule choice), so a layout asks
two dict lookups once its state and its schedule choice have been seen. A layout that floor lets
through is then held to the tighter floor with its buffers added (``memory_bounds.buffer_vector``),
which under FSDP's gathered copies and per-micro-batch receive buffers cuts most of what the first
floor misses, before the exact peak is costed."""

from __future__ import annotations

from costmodels.estimate import CostModel
from costmodels.memory_bounds import (activation_vector, buffer_vector, first_rank, first_rank_activation_bytes,
                                      first_rank_held_bytes, floor_from_vectors, held_vector)
from costmodels.pipeline import chunks_per_rank, in_flight_microbatches
from costmodels.ranks import RankLayers

from .groups import chunk_placement
from .space import MeshChoice, PipelineChoice, ScheduleChoice, StateChoice, make_layout, schedule_choice

BOUND_SLACK = 1e-9
"""Relative margin by which the floor, summed in another order than the peak, must pass the capacity."""


class MemoryFloors:
    """Memory floors of the layouts of one mesh."""

    def __init__(self, cost_model: CostModel, mesh: MeshChoice) -> None:
        self.cost_model, self.mesh = cost_model, mesh
        self.held: dict[tuple, tuple[float, ...]] = {}
        self.acts: dict[tuple, tuple[float, ...]] = {}
        """By ``_acts_key``: TP-overlap twins share their activations."""
        self.buffers: dict[tuple, tuple[float, ...]] = {}
        """By the state and ``_buffers_key``: a group's members, which differ in recomputation alone,
        share their buffers."""

    def too_big(self, state: StateChoice, sched: ScheduleChoice) -> bool:
        """Whether the memory floor of (mesh, state, sched) passes the capacity (with ``BOUND_SLACK``)."""
        cm = self.cost_model
        key = (state, sched.schedule, sched.virtual_stages, sched.layers_per_chunk, sched.num_microbatches)
        acts_key = _acts_key(sched)
        held, acts = self.held.get(key), self.acts.get(acts_key)
        layout = None
        if held is None or acts is None:
            layout = make_layout(self.mesh, state, sched)
            held = self.held[key] = held if held is not None else held_vector(cm, layout)
            acts = self.acts[acts_key] = acts if acts is not None else activation_vector(cm, layout)
        cap = cm.capacity_bytes * (1 + BOUND_SLACK)
        if floor_from_vectors(cm, held, acts) > cap:
            return True
        # the tighter floor, with the layout's buffers (``memory_bounds.buffer_vector``): it reads the
        # state and the schedule choice together, so it is asked only of a layout the first floor passes
        buffers_key = (state, _buffers_key(sched))
        buffers = self.buffers.get(buffers_key)
        if buffers is None:
            buffers = self.buffers[buffers_key] = buffer_vector(cm, layout or make_layout(self.mesh, state, sched))
        return floor_from_vectors(cm, held, acts, buffers) > cap


def _acts_key(sched: ScheduleChoice) -> tuple:
    """The fields of a schedule choice that ``activation_vector`` reads: all but TP overlap, which
    changes a layer's TP time and the buffers only (``rank_memory.rank_activation_parts`` is memoised
    without it)."""
    return (sched.micro_batch_size, sched.num_microbatches, sched.schedule, sched.virtual_stages, sched.recompute,
            sched.sequence_parallel, sched.layers_per_chunk, sched.ep_comm_overlap)


def _buffers_key(sched: ScheduleChoice) -> tuple:
    """The fields of a schedule choice that ``buffer_vector`` reads: all but recomputation (the buffers,
    NCCL's buffers and the workspaces read no recomputation field, ``rank_memory.rank_buffer_parts``,
    ``reserved``)."""
    return (sched.micro_batch_size, sched.num_microbatches, sched.schedule, sched.virtual_stages,
            sched.sequence_parallel, sched.layers_per_chunk, sched.tp_comm_overlap, sched.ep_comm_overlap)


def micro_batch_sizes_that_may_fit(cost_model: CostModel, mesh: MeshChoice, states: list[StateChoice],
                                   pipes: list[PipelineChoice], recompute_modes: tuple[str, ...],
                                   sp_values: tuple[bool, ...], ep_values: tuple[bool, ...]) -> set[int]:
    """The micro-batch sizes of ``pipes`` to search: every size some layout of which, with one of
    ``states``, may pass its memory floor (a layout of any other size is never a plan). Sizes are asked
    from the largest down, and once one may fit, the smaller ones are kept without being asked: keeping
    a size is always safe (only a size left out needs its proof), and activations grow with the size.

    A size is left out when, for every pipe of it, rank 0's S_0 + (1 + φ)·A_0 + reserve
    (``memory_bounds.first_rank``), at most the layout's memory floor, passes the capacity. For one size
    (so one m) that term is at least the least, over the signatures of the ranks 0 its pipes make (how
    many layers of each kind rank 0 holds, and whether it holds the head), of the least S_0 over the
    states and those ranks plus the least (1 + φ)·(k·stored_0 + working_0) over the recomputation modes,
    SP and EP overlap values, with k the least in-flight chunk-micro-batches per chunk of rank 0 over
    those pipes (``pipeline.in_flight_microbatches``; stored bytes are >= 0). Rank 0's parts read of a
    pipe only its rank's signature (``rank_memory.rank_activation_parts`` is memoised by it), the count
    of recomputed layers (all of a rank's under full recomputation in the search), and, where rank 0
    also holds the last layers, the head's micro-batches in flight, which read the schedule and m:
    those pipes are kept apart by schedule. TP overlap changes no activation
    (``rank_memory.rank_activation_parts``). Under a convention with receive buffers (counted apart
    from the activations, so subtracted from rank 0's on an interleaved schedule) every size is kept."""
    cm = cost_model
    by_size: dict[int, list[PipelineChoice]] = {}
    for pipe in pipes:
        by_size.setdefault(pipe.micro_batch_size, []).append(pipe)
    if cm.convention.receive_buffer_per_microbatch:
        return set(by_size)
    room = cm.capacity_bytes * (1 + BOUND_SLACK) - cm.cluster.hardware.runtime_reserved_bytes
    held: dict[RankLayers, float] = {}  # rank 0 -> its least S over the states
    rank_of: dict[tuple, RankLayers] = {}  # rank 0 of each placement of the chunks, v and split
    for b in sorted(by_size, reverse=True):
        # (rank 0's signature, the schedule if it holds the head) -> [least k, its pipe, least S over its ranks]
        least: dict[tuple, list] = {}
        for pipe in by_size[b]:
            where = chunk_placement(pipe)
            rank = rank_of.get(where)
            if rank is None:
                sched = schedule_choice(pipe, "none", sp_values[0], False, False)
                rank = rank_of[where] = first_rank(cm, make_layout(mesh, states[0], sched))
                if rank not in held:
                    held[rank] = min(first_rank_held_bytes(cm, make_layout(mesh, state, sched)) for state in states)
            k = (in_flight_microbatches(pipe.schedule, mesh.pp, 0, pipe.num_microbatches, pipe.virtual_stages)
                 / chunks_per_rank(pipe.schedule, pipe.virtual_stages))
            key = (rank.signature, pipe.schedule if rank.last else "")
            entry = least.setdefault(key, [k, pipe, held[rank]])
            if k < entry[0]:
                entry[:2] = k, pipe
            entry[2] = min(entry[2], held[rank])
        if any(first_rank_activation_bytes(cm, make_layout(mesh, states[0], schedule_choice(pipe, mode, sp, False, ep)),
                                           k) <= room - least_held
               for k, pipe, least_held in least.values()
               for mode in reversed(recompute_modes) for sp in sp_values for ep in ep_values):
            return {size for size in by_size if size <= b}
    return set()
