"""``autoplan shard --attach``: put the ILP's tensor-parallel plan into a plan file for ``launch``.

The new plan file is the old one (schema_version 1) with optional fields added:
``best.tp_plan`` ({module fqn: style}) and, for a user's model, ``inputs.module``
("pkg.mod:factory") and ``inputs.input_shape`` ([B, S], the shape the ILP saw). The job then
trains that model with that plan instead of autoplan's model and its fixed Megatron plan.
Pure Python (no torch).
"""

from __future__ import annotations

import json
from dataclasses import replace

from costmodels.layout import Layout
from costmodels.model_spec import model_to_dict
from autoplan_base.errors import AutoplanError
from planner.launch.torchjob import user_model
from planner.plan.plan_file import PlanFile, read_plan_file


def read_target(path: str) -> tuple[PlanFile, Layout]:
    """(plan, best layout) of the plan file ``--attach`` names; one-line errors for anything else."""
    plan = read_plan_file(path)
    if plan.best is None:
        raise AutoplanError(f"--attach {path}: the plan has no best layout (nothing fit); re-plan first")
    return plan, plan.best.layout


def check_degrees(path: str, layout: Layout, *, tp: int, dp: int | None) -> int:
    """The dp degree to solve for (the plan's unless given); tp must be the plan's."""
    if tp != layout.tp:
        raise AutoplanError(f"--tp {tp}: the plan in {path} has tp {layout.tp} (best.layout.tp); "
                            f"shard with --tp {layout.tp}, or re-plan with tp {tp}")
    if dp is not None and dp != layout.dp:
        raise AutoplanError(f"--dp {dp}: the plan in {path} has dp {layout.dp} (best.layout.dp); "
                            f"leave --dp out with --attach, or re-plan with dp {dp}")
    return layout.dp


def check_target(path: str, plan: PlanFile, layout: Layout, *, module: str | None, model_dict: dict | None) -> None:
    """Refuse a plan the chosen model cannot be launched with (before tracing and solving)."""
    if model_dict is not None and model_dict != json.loads(json.dumps(model_to_dict(plan.inputs.model_spec))):
        raise AutoplanError(f"--model: the plan in {path} is for {plan.inputs.model!r}, a different "
                            "model; shard that model, or attach to a plan made for this one")
    if module is not None:
        problems = user_model.layout_problems(layout, has_tp_plan=True)
        if problems:
            raise AutoplanError(f"--attach {path}: {problems[0]}")


def attached(plan: PlanFile, tp_plan: dict, *, module: str | None, input_shape: tuple[int, ...] | None) -> PlanFile:
    """A new plan file: ``plan`` with ``best.tp_plan`` (and the user's model) set; ``plan`` is unchanged."""
    inputs = replace(plan.inputs, module=module, input_shape=None if module is None else tuple(input_shape))
    best = replace(plan.best, tp_plan=dict(sorted(tp_plan.items())))
    return replace(plan, inputs=inputs, inputs_digest=inputs.digest(), best=best)
