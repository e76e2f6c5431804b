"""Non-uniform pipeline stages: Alpa's stage-slicing DP applied to the planner's plans.

The search costs balanced splits. For a pipelined plan (1F1B or GPipe), ``refine_stages`` asks
``planner.alpa.slice_stages`` (Zheng et al. OSDI'22, eq. 2-3, with their B written m, the micro-
batch count: minimise Σ_i t_i + (m − 1)·max_j t_j under a memory cap per stage) for layers per
stage, with per-layer costs from the same cost model; the first and last stages carry the embedding
and the head. The split replaces the balanced one when the cost model prices it faster and it fits.
Both solvers pass their results through this, so they still agree. Interleaved plans keep equal
chunks (Megatron requires them).
"""

from __future__ import annotations

from dataclasses import replace

from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel
from costmodels.stage_inputs import stage_slicing_inputs

from .alpa.stage_dp import slice_stages
from .ranking import rank_key


def refine_stages(cost_model: CostModel, breakdown: CostBreakdown) -> CostBreakdown:
    """``breakdown``, or the same layout with the DP's layers per stage when that is better."""
    layout = breakdown.layout
    if layout.pp == 1 or layout.virtual_stages > 1:
        return breakdown
    split = slice_stages(**stage_slicing_inputs(cost_model, layout))
    if split is None or split == layout.stage_layers(cost_model.model.num_layers):
        return breakdown
    candidate = cost_model.estimate(replace(layout, layers_per_stage=tuple(split)))
    if candidate.fits and rank_key(candidate) < rank_key(breakdown):
        return candidate
    return breakdown
