"""``PlanReport``: the planner's answer, and its JSON form (the plan file)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from costmodels.breakdown import CostBreakdown
from hardware_specs.units import GIB

SCHEMA_VERSION = 1


def plan_dict(breakdown: CostBreakdown) -> dict[str, Any]:
    """One plan: ``{"layout": {...}, "predicted": {...}}``."""
    return {"layout": breakdown.layout.to_dict(), "predicted": breakdown.predicted_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClosestMiss:
    """A layout that came closest to fitting, and what would make it fit."""

    breakdown: CostBreakdown
    suggestions: tuple[str, ...]

    @property
    def needed_gib(self) -> float:
        return self.breakdown.peak_memory_bytes / GIB

    @property
    def available_gib(self) -> float:
        return self.breakdown.memory_capacity_bytes / GIB


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanReport:
    """Best plan, ranked alternatives (best plan of each of the next-best meshes), search statistics."""

    inputs: dict[str, Any]
    """What was asked: model, hardware, GPUs, training spec, options."""
    best: CostBreakdown | None
    """The fastest layout that fits, or None when nothing fits."""
    candidates: tuple[CostBreakdown, ...]
    """Ranked alternatives after ``best`` (each the best layout of a distinct dp/tp/pp/cp/ep mesh)."""
    rejected: dict[str, int] = field(default_factory=dict)
    closest_misses: tuple[ClosestMiss, ...] = ()
    search: dict[str, Any] = field(default_factory=dict)
    """Solver name, candidates in the space, candidates evaluated (and, outside plan files, seconds)."""

    @property
    def feasible(self) -> bool:
        return self.best is not None

    def to_dict(self, *, with_timing: bool = False) -> dict[str, Any]:
        search = dict(self.search)
        if not with_timing:
            search.pop("seconds", None)
        search["rejected"] = dict(sorted(self.rejected.items()))
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "inputs": self.inputs,
            "inputs_digest": inputs_digest(self.inputs),
            "best": plan_dict(self.best) if self.best else None,
            "candidates": [plan_dict(c) for c in self.candidates],
            "search": search,
        }
        if self.closest_misses:
            out["closest_misses"] = [
                {**plan_dict(m.breakdown), "needed_gib": round(m.needed_gib, 3),
                 "available_gib": round(m.available_gib, 3), "suggestions": list(m.suggestions)}
                for m in self.closest_misses]
        return out

    def to_json(self, *, with_timing: bool = False) -> str:
        """Stable JSON: sorted keys, fixed indentation; byte-identical for the same inputs."""
        return json.dumps(self.to_dict(with_timing=with_timing), indent=2, sort_keys=True) + "\n"


def inputs_digest(inputs: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the inputs: two plans with the same digest answer the same question."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
