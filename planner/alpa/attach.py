"""``autoplan shard --attach``: put the ILP's tensor-parallel plan into a plan file for ``launch``.

The new plan file is the old one (schema_version 1) with optional fields added:
``best.tp_plan`` ({module fqn: style}) and, for a user's model, ``inputs.module``
("pkg.mod:factory") and ``inputs.input_shape`` ([B, S], the shape the ILP saw). The job then
trains that model with that plan instead of autoplan's model and its fixed Megatron plan.
Pure Python (no torch).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from costmodels.layout import Layout
from hardware_specs.errors import AutoplanError
from planner.plan_file import read_plan_file
from planner.report import inputs_digest
from planner.runtime import user_model


def read_target(path: str) -> tuple[dict, Layout]:
    """(plan, best layout) of the plan file ``--attach`` names; one-line errors for anything else."""
    plan = read_plan_file(Path(path))
    best = plan["best"]
    if not isinstance(best, dict) or not isinstance(best.get("layout"), dict):
        raise AutoplanError(f"--attach {path}: the plan has no best layout (nothing fit); re-plan first")
    try:
        layout = Layout.from_dict(best["layout"])
    except (KeyError, TypeError, ValueError) as err:
        raise AutoplanError(f"--attach {path}: best.layout is malformed ({err})") from None
    return plan, layout


def check_degrees(path: str, layout: Layout, *, tp: int, dp: int | None) -> int:
    """The dp degree to solve for (the plan's unless given); tp must be the plan's."""
    if tp != layout.tp:
        raise AutoplanError(f"--tp {tp}: the plan in {path} has tp {layout.tp} (best.layout.tp); "
                            f"shard with --tp {layout.tp}, or re-plan with tp {tp}")
    if dp is not None and dp != layout.dp:
        raise AutoplanError(f"--dp {dp}: the plan in {path} has dp {layout.dp} (best.layout.dp); "
                            f"leave --dp out with --attach, or re-plan with dp {dp}")
    return layout.dp


def check_target(path: str, plan: dict, layout: Layout, *, module: str | None, model_dict: dict | None) -> None:
    """Refuse a plan the chosen model cannot be launched with (before tracing and solving)."""
    if model_dict is not None and model_dict != plan["inputs"].get("model_spec"):
        raise AutoplanError(f"--model: the plan in {path} is for {plan['inputs'].get('model')!r}, a different "
                            "model; shard that model, or attach to a plan made for this one")
    if module is not None:
        problems = user_model.layout_problems(layout, has_tp_plan=True)
        if problems:
            raise AutoplanError(f"--attach {path}: {problems[0]}")


def attached(plan: dict, tp_plan: dict, *, module: str | None, input_shape: tuple[int, ...] | None) -> dict:
    """A new plan dict: ``plan`` with ``best.tp_plan`` (and the user's model) set; ``plan`` is unchanged."""
    out = copy.deepcopy(plan)
    out["best"]["tp_plan"] = dict(sorted(tp_plan.items()))
    out["inputs"].pop("module", None)
    out["inputs"].pop("input_shape", None)
    if module is not None:
        out["inputs"]["module"] = module
        out["inputs"]["input_shape"] = list(input_shape)
    if "inputs_digest" in out:
        out["inputs_digest"] = inputs_digest(out["inputs"])
    return out


def plan_text(plan: dict) -> str:
    """The plan file's bytes (as ``autoplan plan --out`` writes them: sorted keys, indent 2)."""
    return json.dumps(plan, indent=2, sort_keys=True) + "\n"
