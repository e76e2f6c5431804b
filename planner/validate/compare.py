"""Predicted vs measured, per plan and per pipeline rank (pure Python; no torch).

Memory is compared per component on the rank that holds each pipeline stage:
``states`` = params + grads + optimizer (as the plan's runtime holds them, against the exact
tensor bytes the probe counts as resident: the optimizer's parameters, their gradients, its
states), ``states_peak`` = states + the model's buffers (gathered copies, buckets, and also the
TP and pipeline buffers, which the probe does not see) against every parameter/gradient storage
alive at once (FSDP2's unsharded copies included), and ``activations`` = what is saved for
backward at the schedule's peak, pipeline receive buffers left out on both sides. The cost model's activation term also holds the working set of one layer
being recomputed or of the loss's backward (``recompute_working``), which backward allocates
where saved-tensor hooks do not see it; it is reported beside the comparison, not in it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from costmodels.assumptions import DEFAULT_ASSUMPTIONS, Assumptions
from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel
from planner.plan.plan_file import PlanInputs
from costmodels import rank_memory
from costmodels.assignment import rank_layers

MEMORY_COMPONENTS = ("params", "grads", "optimizer", "states", "states_peak", "activations")


def error_pct(predicted: float, measured: float) -> float | None:
    """(predicted − measured) / measured in percent; None when nothing was measured."""
    if not measured:
        return None
    return 100.0 * (predicted - measured) / measured


def cost_model(inputs: PlanInputs, *, profile=None, assumptions: Assumptions | None = None) -> CostModel:
    """The cost model of a plan file's inputs. ``assumptions`` given: used as they are (the
    profile's own calibration is not applied on top); else the profile's calibration applies."""
    return job_of(inputs, profile=profile, calibrated=assumptions is None).cost_model(assumptions or DEFAULT_ASSUMPTIONS)


def job_of(inputs: PlanInputs, *, profile=None, calibrated: bool = True):
    """The ``planner.api.Job`` of a plan file's inputs, costed with ``profile``; ``calibrated``
    False drops the profile's own calibration (for costing under given assumptions). One job
    serves the cost models of many assumptions (``Job.cost_model``)."""
    from planner.api import Job

    if not calibrated and profile is not None and profile.calibration:
        from dataclasses import replace

        profile = replace(profile, calibration={})
    return Job.from_inputs(inputs, profile=profile)


def predicted_memory(cm: CostModel, breakdown: CostBreakdown) -> list[dict[str, float]]:
    """Per pipeline rank: params, grads, optimizer, states, activations (saved, at the schedule's
    peak whatever phase sets the rank's peak: ``StageMemory.schedule_activations_bytes``) and the
    rest; the working set backward allocates outside the saved tensors
    (``rank_memory.unsaved_working_bytes``: a layer being recomputed, the loss's backward) is
    reported beside them."""
    out = []
    for stage, rank in zip(breakdown.stages, rank_layers(cm, breakdown.layout)):
        working = rank_memory.unsaved_working_bytes(cm, breakdown.layout, rank)
        grads = stage.grads_bytes + stage.grads_freed_bytes  # as allocated, as the probe measures them
        states = stage.params_bytes + grads + stage.optimizer_bytes
        out.append({"params": stage.params_bytes, "grads": grads, "optimizer": stage.optimizer_bytes,
                    "states": states, "states_peak": states + stage.buffers_bytes, "activations": stage.schedule_activations_bytes - working,
                    "recompute_working": working, "buffers": stage.buffers_bytes,
                    "overhead": stage.overhead_bytes, "total": stage.total_bytes})
    return out


def measured_by_stage(ranks: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Largest measured value of each component over the ranks of each pipeline stage."""
    out: dict[int, dict[str, float]] = {}
    for r in ranks:
        row = out.setdefault(int(r["pp_rank"]), {})
        for key, value in r.items():
            if isinstance(value, (int, float)) and key not in ("rank", "pp_rank"):
                row[key] = max(row.get(key, 0), value)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRow:
    """One component on one pipeline rank."""

    pp_rank: int
    component: str
    predicted_bytes: float
    measured_bytes: float

    @property
    def error_pct(self) -> float | None:
        return error_pct(self.predicted_bytes, self.measured_bytes)


def memory_rows(predicted: list[dict[str, float]], measured: dict[int, dict[str, float]],
                components: tuple[str, ...] = MEMORY_COMPONENTS) -> list[MemoryRow]:
    rows = []
    for pp_rank, values in sorted(measured.items()):
        for name in components:
            if name in values and pp_rank < len(predicted):
                rows.append(MemoryRow(pp_rank=pp_rank, component=name, predicted_bytes=predicted[pp_rank][name],
                                      measured_bytes=values[name]))
    return rows


def measured_step_time_s(step_times: list[float]) -> float:
    """Median of the timed steps (slowest rank per step): robust to one noisy step."""
    return statistics.median(step_times)


def worst_error(rows: list[MemoryRow], component: str) -> float | None:
    """Largest absolute error of ``component`` over the pipeline ranks (percent)."""
    errors = [abs(r.error_pct) for r in rows if r.component == component and r.error_pct is not None]
    return max(errors) if errors else None
