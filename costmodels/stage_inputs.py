"""Inputs of Alpa's stage-slicing DP (``planner.alpa.slice_stages``) from the cost model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .layout import Layout
from .pipeline import in_flight_microbatches
from .rank_memory import fixed_overhead_bytes, rank_static
from .rank_time import rank_core_times
from .ranks import RankLayers, RankStatic, state_sum

if TYPE_CHECKING:
    from .estimate import CostModel


def held_bytes(static: RankStatic) -> float:
    """Model states plus buffers: what a rank holds whatever its micro-batches (the buffers grow
    with its layers when gathered copies are kept, as FSDP2's are)."""
    return state_sum(static) + static.buffers_bytes


def stage_slicing_inputs(cost_model: "CostModel", layout: Layout) -> dict:
    """Per-layer costs for Alpa's stage-slicing DP (``planner.alpa.slice_stages``), taken from this
    model: each layer's forward + backward time per micro-batch (recomputation and exposed
    TP/CP/EP communication included), its state and buffer bytes and activation bytes per micro-batch,
    the embedding's and head's extras on the first and last stage, and the memory left for
    layers once each rank's fixed buffers, runtime reserve and recompute working set are taken.
    Under the torch runtime a stage's first layer input is its receive buffer, already among the
    buffers; the per-layer bytes still count it, so the DP's memory check errs on the safe side."""
    model = cost_model.model
    empty = RankLayers(chunks=(), num_dense=0, num_moe=0, first=False, last=False)
    base_t = rank_core_times(cost_model, layout, empty).per_microbatch_s
    base = rank_static(cost_model, layout, empty)
    per_kind: dict[bool, tuple[float, float, float]] = {}
    for j in range(model.num_layers):
        kind = model.is_moe_layer(j)
        if kind not in per_kind:
            one = RankLayers(chunks=((j, j + 1),), num_dense=int(not kind), num_moe=int(kind), first=False, last=False)
            st = rank_static(cost_model, layout, one)
            per_kind[kind] = (rank_core_times(cost_model, layout, one).per_microbatch_s - base_t,
                              held_bytes(st) - held_bytes(base), st.stored_per_microbatch_bytes)
    ends = {}
    for name, first, last in (("first", True, False), ("last", False, True)):
        rank = RankLayers(chunks=(), num_dense=0, num_moe=0, first=first, last=last)
        st = rank_static(cost_model, layout, rank)
        ends[name] = (rank_core_times(cost_model, layout, rank).per_microbatch_s - base_t,
                      held_bytes(st) - held_bytes(base) + st.stored_per_microbatch_bytes * layout.pp)
    kinds = [per_kind[model.is_moe_layer(j)] for j in range(model.num_layers)]
    fixed = base.buffers_bytes + fixed_overhead_bytes(cost_model, layout) + base.working_bytes \
        + base.largest_block_bytes \
        + max(st[2] for st in per_kind.values())  # the recompute working set, at most one layer
    return {
        "layer_costs_s": [k[0] for k in kinds], "layer_memory_bytes": [k[1] for k in kinds],
        "layer_activation_bytes": [k[2] for k in kinds],
        "inflight_microbatches": [in_flight_microbatches(layout.schedule, layout.pp, i, layout.num_microbatches, 1)
                                  for i in range(layout.pp)],
        "num_stages": layout.pp, "num_microbatches": layout.num_microbatches,
        "memory_cap_bytes": (cost_model.capacity_bytes - fixed) / (1 + cost_model.assumptions.allocator_fragmentation),
        "first_extra_s": ends["first"][0], "last_extra_s": ends["last"][0],
        "first_extra_bytes": ends["first"][1], "last_extra_bytes": ends["last"][1],
    }
