"""Non-uniform pipeline stages: Alpa's stage-slicing DP applied to the planner's plans.

The search costs balanced splits. For a pipelined plan (1F1B or GPipe), ``refine_stages`` asks
``planner.alpa.slice_stages`` (Zheng et al. OSDI'22, eq. 2-3, with their B written m, the micro-
batch count: minimise Σ_i t_i + (m − 1)·max_j t_j under a memory cap per stage) for layers per
stage, with per-layer costs from the same cost model; the first and last stages carry the embedding
and the head. The split replaces the balanced one when the cost model prices it faster and it fits.
Both solvers pass their results through this, so they still agree.

Interleaved plans: a rank's chunks are not contiguous, so eq. 2-3 do not apply. The candidates are
torchtitan's weighted splits (``costmodels.stage_split.weighted_split``: the embedding and the head
count as 0-2 layers on the first and last chunk, the rest balanced), each priced by the cost model
itself (a split whose step time as the bounds sum it already loses to the best so far is not costed
in full); the fastest that fits replaces the balanced split.
"""

from __future__ import annotations

from dataclasses import replace

from costmodels.bounds import step_time_s
from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel
from costmodels.stage_inputs import stage_slicing_inputs
from costmodels.stage_split import weighted_split

from planner.search.stage_dp import slice_stages
from .ranking import rank_key
from .standings import RANK_ROUNDING_S, SUMMED_SLACK

MAX_END_WEIGHT = 2
"""Largest layer-equivalent weight tried for the embedding or the head on an interleaved pipeline."""


def refine_stages(cost_model: CostModel, breakdown: CostBreakdown) -> CostBreakdown:
    """``breakdown``, or the same layout with the DP's layers per stage when that is better."""
    layout = breakdown.layout
    if layout.pp == 1:
        return breakdown
    if layout.virtual_stages > 1 or layout.schedule == "dualpipe":  # chunks of a rank not contiguous
        splits = interleaved_candidates(cost_model.model.num_layers, layout.num_chunks)
    else:
        split = slice_stages(**stage_slicing_inputs(cost_model, layout))
        splits = [] if split is None else [tuple(split)]
    best = breakdown
    for split in splits:
        if split == layout.chunk_layers(cost_model.model.num_layers):
            continue
        refined = replace(layout, layers_per_chunk=split)
        # its step time as the bounds sum it (the estimate's up to SUMMED_SLACK): past the best's by
        # more than that and the rounding of ``rank_key``, it cannot rank first, so it is not costed
        if step_time_s(cost_model, refined) * (1 - SUMMED_SLACK) > best.step_time_s + RANK_ROUNDING_S:
            continue
        candidate = cost_model.estimate(refined)
        if candidate.fits and rank_key(candidate) < rank_key(best):
            best = candidate
    return best


def interleaved_candidates(num_layers: int, num_chunks: int) -> list[tuple[int, ...]]:
    """torchtitan-style weighted splits with the embedding and head worth 0-2 layers each, in a fixed
    order (first-chunk weight, then last-chunk weight), without repeats."""
    out: list[tuple[int, ...]] = []
    for first_less in range(MAX_END_WEIGHT + 1):
        for last_less in range(MAX_END_WEIGHT + 1):
            split = weighted_split(num_layers, num_chunks, first_less, last_less)
            if split is not None and split not in out:
                out.append(split)
    return out
