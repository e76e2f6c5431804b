"""``write_job``: turn a plan file into a self-contained job directory.

DIR/train.py, DIR/launch.sh, DIR/slurm.sbatch, DIR/plan.json (a copy), DIR/runtime/ (the
runtime modules and the spec modules they import, so the job runs without autoplan installed)
and DIR/exports/ (Megatron-LM, DeepSpeed, torchtitan). Importing this module does not import torch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from costmodels.layout import Layout, layout_problems
from costmodels.model_spec import ModelSpec, model_from_dict
from costmodels.training import TrainingSpec
from hardware_specs.errors import AutoplanError
from planner.launchable import launch_problems, runtime_problems
from planner.runtime import user_model
from planner.runtime.tp_styles import parse_style

from . import frameworks, scripts

RUNTIME_MODULES = ("__init__", "model", "init", "parallel", "pipelining", "clip", "data", "trainer",
                   "checkpoint", "main", "tp_styles", "user_model")
SPEC_MODULES = {"costmodels": ("model_spec", "layout", "training"), "hardware_specs": ("errors",)}


class PlanFileError(AutoplanError):
    """A plan file that cannot be read, or a plan the generated job cannot apply."""


def read_plan(path: str | Path) -> dict:
    """The plan JSON at ``path`` (a plan file or a single {"layout", "predicted"} plan is rejected)."""
    try:
        with open(path, encoding="utf-8") as handle:
            plan = json.load(handle)
    except OSError as err:
        raise PlanFileError(f"plan: cannot read {path} ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise PlanFileError(f"plan: {path} is not JSON ({err.msg} at line {err.lineno})") from None
    for key in ("inputs", "best"):
        if not isinstance(plan, dict) or key not in plan:
            raise PlanFileError(f"plan: {path} has no {key!r}; write it with 'autoplan plan --out plan.json'")
    return plan


def plan_parts(plan: dict) -> tuple[ModelSpec, TrainingSpec, Layout]:
    """(model, training, layout) of the plan's best candidate, validated."""
    inputs = plan["inputs"]
    try:
        model = model_from_dict(inputs["model_spec"])
        raw = dict(inputs["training"])
        if "lora_targets" in raw:
            raw["lora_targets"] = tuple(raw["lora_targets"])
        training = TrainingSpec(**raw)
        layout = Layout.from_dict(plan["best"]["layout"])
    except (KeyError, TypeError) as err:
        raise PlanFileError(f"plan: missing or malformed field {err}") from None
    return model, training, layout


def tp_plan_problems(plan: dict, layout: Layout) -> list[str]:
    """What is wrong with the plan's ``best.tp_plan`` (from ``autoplan shard --attach``), if anything."""
    tp_plan = plan["best"].get("tp_plan")
    if tp_plan is None:
        return []
    if not isinstance(tp_plan, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tp_plan.items()):
        return ["best.tp_plan: expected {module fqn: style}; write it with 'autoplan shard ... --attach'"]
    if layout.tp == 1:
        return ["best.tp_plan is given but layout.tp = 1, so nothing would apply it; drop it or re-plan with tp > 1"]
    problems = []
    for value in tp_plan.values():
        try:
            parse_style(value)
        except AutoplanError as err:
            problems.append(f"best.{err}")
    return problems


def unsupported(model: ModelSpec, training: TrainingSpec, layout: Layout, plan: dict | None = None) -> list[str]:
    """Parts of the plan the generated job cannot apply, one sentence each naming the field.

    ``launch_problems`` decides for autoplan's own model (the same rule ``plan --launchable``
    searches with); with ``inputs.module`` (a user's model) its model checks are replaced by
    ``user_model.layout_problems``."""
    plan = plan or {"inputs": {}, "best": {}}
    out = tp_plan_problems(plan, layout)
    user = plan["inputs"].get("module")
    if user is None:
        return out + launch_problems(model, training, layout)
    out += runtime_problems(training, layout)
    if not isinstance(user, str) or ":" not in user:
        out.append(f"inputs.module = {json.dumps(user)}: expected 'pkg.mod:factory'")
    return out + user_model.layout_problems(layout, has_tp_plan="tp_plan" in plan["best"])


def check_plan(plan: dict) -> tuple[ModelSpec, TrainingSpec, Layout]:
    """Validate a plan for launching; raise ``PlanFileError`` with the first problem."""
    model, training, layout = plan_parts(plan)
    gpus = int(plan["inputs"].get("gpus", layout.world_size))
    per_node = int(plan["inputs"].get("gpus_per_node") or gpus)
    problems = layout_problems(layout, model, training, gpus, per_node) + unsupported(model, training, layout, plan)
    if problems:
        raise PlanFileError(problems[0])
    return model, training, layout


def _copy_runtime(out: Path) -> None:
    runtime = out / "runtime"
    package = runtime / "planner_runtime"
    package.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).resolve().parent.parent / "runtime"
    for name in RUNTIME_MODULES:
        shutil.copyfile(source / f"{name}.py", package / f"{name}.py")
    root = Path(__file__).resolve().parent.parent.parent
    for pkg, modules in SPEC_MODULES.items():
        (runtime / pkg).mkdir(exist_ok=True)
        (runtime / pkg / "__init__.py").write_text('"""Copied by autoplan launch (specs only)."""\n', encoding="utf-8")
        for name in modules:
            shutil.copyfile(root / pkg / f"{name}.py", runtime / pkg / f"{name}.py")


def _write(path: Path, text: str, executable: bool = False) -> None:
    from planner.cli_common import write_atomic

    write_atomic(path, text)
    if executable:
        os.chmod(path, 0o755)


def _summary(plan: dict, layout: Layout) -> str:
    L, inputs = layout, plan["inputs"]
    model = f"user model {inputs['module']}" if "module" in inputs else f"model {inputs.get('model')}"
    tp_plan = f" ({len(plan['best']['tp_plan'])}-entry tp_plan)" if "tp_plan" in plan["best"] else ""
    return (f"{model} on {inputs.get('hardware')}: dp {L.dp} tp {L.tp}{tp_plan} pp {L.pp} "
            f"zero {L.zero_stage} schedule {L.schedule} recompute {L.recompute}")


def write_job(plan: dict, out: str | Path, *, python: str | None = None) -> list[Path]:
    """Write the job directory for ``plan``; returns the files written. Refuses unsupported plans."""
    model, training, layout = check_plan(plan)
    out = Path(out)
    name = str(plan["inputs"].get("model", model.name))
    summary = _summary(plan, layout)
    _copy_runtime(out)
    _write(out / "plan.json", json.dumps(plan, indent=2, sort_keys=True) + "\n")
    _write(out / "train.py", scripts.TRAIN_PY)
    user = plan["inputs"].get("module")
    _write(out / "launch.sh", scripts.launch_sh(world_size=layout.world_size, summary=summary,
                                                python=python or sys.executable, user_module=user), executable=True)
    per_node = int(plan["inputs"].get("gpus_per_node") or layout.world_size)
    _write(out / "slurm.sbatch", scripts.slurm_sbatch(world_size=layout.world_size, gpus_per_node=per_node,
                                                       name=name, summary=summary))
    if user is None:
        _write_exports(out / "exports", name, model, training, layout)
    else:
        _write(out / "exports" / "NOTES.md", "No framework exports: the plan trains a user model (inputs.module), "
                                             "which Megatron-LM, DeepSpeed and torchtitan configs cannot name.\n")
    return sorted(p for p in out.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _write_exports(out: Path, name: str, model: ModelSpec, training: TrainingSpec, layout: Layout) -> None:
    seq_len = training.seq_len
    args, m_notes = frameworks.megatron_args(model, training, layout, seq_len)
    _write(out / "megatron_args.sh", frameworks.megatron_script(args, m_notes))
    ds, d_notes = frameworks.deepspeed_config(training, layout)
    _write(out / "deepspeed.json", json.dumps(ds, indent=2, sort_keys=True) + "\n")
    tt, t_notes = frameworks.torchtitan_config(name, model, training, layout, seq_len)
    _write(out / "torchtitan.toml", frameworks.toml_text(tt, [f"torchtitan config for {name}"]))
    notes = ["What does not translate (also in each file where comments are allowed):"]
    for framework, items in (("Megatron-LM", m_notes), ("DeepSpeed", d_notes), ("torchtitan", t_notes)):
        notes += [f"- {framework}: {item}" for item in items] or [f"- {framework}: everything maps"]
    _write(out / "NOTES.md", "\n".join(notes) + "\n")

