"""A lower bound on a layout's peak device memory for the search (``planner.search.solve``): cheap, never
above what ``CostModel.peak_memory_bytes`` reports (up to float rounding, which the search's
``BOUND_SLACK`` absorbs).

A rank's total (``rank_memory.stage_memory``) is

    params + grads + optimizer + A + buffers + context + NCCL + workspaces + φ·(A + buffers) + block,

with A its activations at the schedule's peak, φ = ``allocator_fragmentation`` >= 0 and block the
largest transient tensor (``costmodels.reserved``). Buffers, NCCL's buffers, workspaces and the
block are non-negative, so leaving them (and φ on the buffers) out bounds the total from below:

    total >= S + (1 + φ)·A + context,

where S (params, grads, optimizer: ``rank_memory.held_states``; params and optimizer only under a
runtime that frees gradients every step, whose peak may hold max(A, G) rather than A + G,
``rank_memory.grads_live_at_peak``) reads how model states are held and
which layers the rank holds, but no micro-batching, recomputation or TP-overlap field, and A reads
those but no state field (``rank_memory.rank_activation_parts``, ``received_saved_bytes``,
``stage_activation_bytes``). Both are taken over the ranks that can hold the peak
(``CostModel.in_flight_extremes``), as vectors in one order, so that a caller can keep each for
the layouts that share it.

The buffers (data-parallel, TP and pipeline buffers, ``rank_memory.rank_buffer_parts``) with their
fragmentation, NCCL's buffers and the GEMM workspaces are terms of the total too, left out of that
floor because they read both how model states are held and the schedule choice; ``buffer_vector``
gives them per rank, and ``floor_from_vectors`` with it is the tighter floor

    total >= S + (1 + φ)·A + (1 + φ)·buffers + context + NCCL + workspaces,

which the search asks of a layout whose first floor fits (FSDP's gathered copies and torch's
per-micro-batch receive buffers can hold more than the activations).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .assignment import rank_layers, rank_params
from .layout import Layout
from .ranks import RankLayers
from .rank_memory import (fixed_overhead_parts, held_states, rank_activation_parts, rank_buffer_bytes,
                          received_saved_bytes, stage_activation_bytes)

if TYPE_CHECKING:
    from .estimate import CostModel


def memory_floor_bytes(cm: "CostModel", layout: Layout, *, with_buffers: bool = False) -> float:
    """The most, over the ranks that can hold the peak, of S + (1 + φ)·A, plus the runtime reserve;
    ``with_buffers``: with each rank's ``buffer_vector`` added. Either is at most
    ``CostModel.peak_memory_bytes(layout)`` (module docstring)."""
    return floor_from_vectors(cm, held_vector(cm, layout), activation_vector(cm, layout),
                              buffer_vector(cm, layout) if with_buffers else ())


def floor_from_vectors(cm: "CostModel", held: tuple[float, ...], acts: tuple[float, ...],
                       buffers: tuple[float, ...] = ()) -> float:
    """``memory_floor_bytes`` from a layout's ``held_vector`` and ``activation_vector``; with its
    ``buffer_vector``, the tighter floor (module docstring)."""
    if buffers:
        return max(s + a + b for s, a, b in zip(held, acts, buffers)) + cm.cluster.hardware.runtime_reserved_bytes
    return max(s + a for s, a in zip(held, acts)) + cm.cluster.hardware.runtime_reserved_bytes  # the CUDA context only


def buffer_vector(cm: "CostModel", layout: Layout) -> tuple[float, ...]:
    """(1 + φ)·buffers + NCCL's buffers + GEMM workspaces (bytes) of each (rank, index) of
    ``CostModel.in_flight_extremes``, in its order."""
    grow = 1 + cm.assumptions.allocator_fragmentation
    fixed = sum(v for name, v in fixed_overhead_parts(cm, layout) if name != "cuda_context")
    out = []
    for rank, indices in cm.in_flight_extremes(layout):
        buffers = rank_buffer_bytes(cm, layout, rank, rank_params(cm, layout, rank))
        out += [grow * buffers + fixed] * len(indices)
    return tuple(out)


def held_vector(cm: "CostModel", layout: Layout) -> tuple[float, ...]:
    """S of each (rank, index) of ``CostModel.in_flight_extremes``, in its order."""
    out = []
    for rank, indices in cm.in_flight_extremes(layout):
        out += [_held_bytes(cm, layout, rank)] * len(indices)
    return tuple(out)


def first_rank_held_bytes(cm: "CostModel", layout: Layout) -> float:
    """S of pipeline rank 0 (``held_vector``'s term of that rank)."""
    return _held_bytes(cm, layout, first_rank(cm, layout))


def _held_bytes(cm: "CostModel", layout: Layout, rank: RankLayers) -> float:
    """S of one rank: params + optimizer, + gradients unless the runtime frees them every step."""
    params, grads, optimizer = held_states(cm, layout, rank_params(cm, layout, rank))
    return params + optimizer + (0.0 if cm.convention.grads_freed_each_step else grads)


def first_rank_activation_bytes(cm: "CostModel", layout: Layout, in_flight_per_chunk: float) -> float:
    """(1 + φ)·A of pipeline rank 0 with ``in_flight_per_chunk`` chunk-micro-batches in flight per chunk
    (``rank_memory.stage_activation_bytes``: in-flight / chunks × stored + working), under a convention
    without receive buffers (``receive_buffer_per_microbatch``; rank 0 of a looped placement has none to
    subtract, but interleaved ranks do). With the layout's own in-flight count it is
    ``activation_vector``'s term of rank 0, and it grows with the count (stored bytes are >= 0)."""
    stored, working = rank_activation_parts(cm, layout, first_rank(cm, layout))
    return (1 + cm.assumptions.allocator_fragmentation) * (in_flight_per_chunk * stored + working)


def first_rank(cm: "CostModel", layout: Layout) -> RankLayers:
    """Pipeline rank 0: the one rank that holds the first chunk (so alone in its signature, and among
    ``CostModel.in_flight_extremes``: its S + (1 + φ)·A + reserve is at most ``memory_floor_bytes``)."""
    return rank_layers(cm, layout)[0]


def activation_vector(cm: "CostModel", layout: Layout) -> tuple[float, ...]:
    """(1 + φ)·A of each (rank, index) of ``CostModel.in_flight_extremes``, in its order."""
    grow = 1 + cm.assumptions.allocator_fragmentation
    out = []
    for rank, indices in cm.in_flight_extremes(layout):
        stored, working = rank_activation_parts(cm, layout, rank)
        received = received_saved_bytes(cm, layout, rank)
        out += [grow * stage_activation_bytes(layout, index, stored, working, received) for index in indices]
    return tuple(out)
