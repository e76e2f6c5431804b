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
from costmodels.memory_bounds import activation_vector, buffer_vector, floor_from_vectors, held_vector

from .space import MeshChoice, ScheduleChoice, StateChoice, make_layout

BOUND_SLACK = 1e-9
"""Relative margin by which the floor, summed in another order than the peak, must pass the capacity."""


class MemoryFloors:
    """Memory floors of the layouts of one mesh."""

    def __init__(self, cost_model: CostModel, mesh: MeshChoice) -> None:
        self.cost_model, self.mesh = cost_model, mesh
        self.held: dict[tuple, tuple[float, ...]] = {}
        self.acts: dict[tuple, tuple[float, ...]] = {}
        """By ``_acts_key``: TP-overlap twins share their activations."""

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
        layout = layout or make_layout(self.mesh, state, sched)
        return floor_from_vectors(cm, held, acts, buffer_vector(cm, layout)) > cap


def _acts_key(sched: ScheduleChoice) -> tuple:
    """The fields of a schedule choice that ``activation_vector`` reads: all but TP overlap, which
    changes a layer's TP time and the buffers only (``rank_memory.rank_activation_parts`` is memoised
    without it)."""
    return (sched.micro_batch_size, sched.num_microbatches, sched.schedule, sched.virtual_stages, sched.recompute,
            sched.sequence_parallel, sched.layers_per_chunk, sched.ep_comm_overlap)
