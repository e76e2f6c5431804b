"""``write_job``: turn a plan file into a self-contained job directory.

For the torch runtime: DIR/train.py, DIR/launch.sh, DIR/slurm.sbatch, DIR/plan.json (a copy) and
DIR/runtime/ (the runtime modules and the spec modules they import, so the job runs without autoplan
installed). For megatron, megatron-bridge, torchtitan and deepspeed: that framework's own option
files with launch.sh and slurm.sbatch that run them (``write_framework_job``). Importing this module
does not import torch.
"""

from __future__ import annotations

import ast
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from costmodels.layout import Layout, layout_problems
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec
from autoplan_base.errors import AutoplanError
from planner.search.launchable import launch_problems, runtime_problems
from planner.launch.torchjob import user_model
from planner.plan.plan_file import PlanFile, PlanFileError
from planner.launch.torchjob.tp_styles import parse_style
from profiles.io import write_text_atomic

from . import frameworks, scripts
from .framework_scripts import device_connections, framework_launch_sh, framework_sbatch
from .torchtitan_cli import (JOB_REGISTRY, job_registry, takes_command_line, torchtitan_030_command,
                             torchtitan_030_script)
from .megatron_fields import bridge_override_lines
from .slurm import SlurmOptions
from .training_settings import (DEFAULT_SETTINGS, TrainingSettings, megatron_training_args, require_schedulable,
                                torchtitan_training_sections)

if TYPE_CHECKING:
    from hardware_specs import HardwareSpec

JOB_PACKAGE = "planner.launch.torchjob"
"""The package of the generated job; its module ``main`` is the entry the bundle starts from."""
BUNDLED_PACKAGES = (JOB_PACKAGE, "planner.plan", "costmodels", "hardware_specs", "autoplan_base")
"""Packages whose modules the job may import (the job itself, the plan file, the specs): the bundle
copies the modules it imports from these, under their own dotted names, beside train.py."""


def tp_plan_problems(tp_plan: dict[str, str] | None, layout: Layout) -> list[str]:
    """What is wrong with the plan's ``best.tp_plan`` (from ``autoplan shard --attach``), if anything."""
    if tp_plan is None:
        return []
    if layout.tp == 1:
        return ["best.tp_plan is given but layout.tp = 1, so nothing would apply it; drop it or re-plan with tp > 1"]
    problems = []
    for value in tp_plan.values():
        try:
            parse_style(value)
        except AutoplanError as err:
            problems.append(f"best.{err}")
    return problems


def unsupported(plan: PlanFile) -> list[str]:
    """Parts of the plan's best layout the generated job cannot apply, one sentence each naming the field.

    ``launch_problems`` decides for autoplan's own model (the same rule ``plan --launchable``
    searches with); with ``inputs.module`` (a user's model) its model checks are replaced by
    ``user_model.layout_problems``."""
    inputs, best = plan.inputs, plan.best
    out = tp_plan_problems(best.tp_plan, best.layout)
    if inputs.module is None:
        return out + launch_problems(inputs.model_spec, inputs.training, best.layout)
    out += runtime_problems(inputs.training, best.layout)
    if ":" not in inputs.module:
        out.append(f"inputs.module = {json.dumps(inputs.module)}: expected 'pkg.mod:factory'")
    return out + user_model.layout_problems(best.layout, has_tp_plan=best.tp_plan is not None)


def check_plan(plan: PlanFile) -> tuple[ModelSpec, TrainingSpec, Layout]:
    """Validate a plan for launching; raise ``PlanFileError`` with the first problem."""
    if plan.best is None:
        raise PlanFileError("best: null (no layout fits); there is nothing to launch")
    inputs, layout = plan.inputs, plan.best.layout
    problems = layout_problems(layout, inputs.model_spec, inputs.training, inputs.gpus, inputs.gpus_per_node)
    problems += unsupported(plan)
    if problems:
        raise PlanFileError(problems[0])
    return inputs.model_spec, inputs.training, layout


def _source_root() -> Path:
    return Path(__file__).resolve().parent.parent.parent


def _bundled_package(module: str) -> tuple[str, str] | None:
    """(package, module name) of an absolute import the bundle follows, or None."""
    for package in BUNDLED_PACKAGES:
        if module == package:
            return package, "__init__"
        if module.startswith(package + "."):
            return package, module[len(package) + 1:].split(".")[0]
    return None


def bundle_modules() -> dict[str, tuple[str, ...]]:
    """{package: module names} the generated job needs: ``planner.launch.torchjob``'s entry module
    ``main`` and every module it imports (relative imports, and absolute ones into
    ``BUNDLED_PACKAGES``), followed transitively, read from the source with ``ast`` (nothing is
    imported)."""
    root = _source_root()
    found: dict[str, set[str]] = {}
    todo = [(JOB_PACKAGE, "main"), (JOB_PACKAGE, "__init__")]
    while todo:
        package, name = todo.pop()
        if name in found.setdefault(package, set()):
            continue
        found[package].add(name)
        path = root.joinpath(*package.split("."), f"{name}.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [a.name for a in node.names] if node.module is None else [node.module.split(".")[0]]
                todo += [(package, t) for t in targets]
            elif isinstance(node, ast.ImportFrom) and node.module and _bundled_package(node.module):
                todo.append(_bundled_package(node.module))
    return {package: tuple(sorted(names)) for package, names in sorted(found.items())}


def _copy_runtime(out: Path) -> None:
    """Copy the bundle into ``out/runtime/<package path>/``; a package's ``__init__`` is copied only
    for the job's own package, every other package (and each parent) gets a one-line stub, so
    importing a bundled module never runs a package's imports the job does not need."""
    runtime, root = out / "runtime", _source_root()
    for package, modules in bundle_modules().items():
        parts = package.split(".")
        for depth in range(1, len(parts) + 1):
            folder = runtime.joinpath(*parts[:depth])
            folder.mkdir(parents=True, exist_ok=True)
            if not (depth == len(parts) and package == JOB_PACKAGE):
                (folder / "__init__.py").write_text('"""Copied by autoplan launch."""\n', encoding="utf-8")
        for name in modules:
            if name != "__init__" or package == JOB_PACKAGE:
                shutil.copyfile(root.joinpath(*parts, f"{name}.py"), runtime.joinpath(*parts, f"{name}.py"))


def write_job_file(path: Path, text: str, executable: bool = False) -> None:
    try:
        write_text_atomic(path, text, executable=executable)
    except OSError as err:
        raise AutoplanError(f"--out: cannot write {path} ({err.strerror})") from None


def model_name(plan: PlanFile) -> str:
    """The model's own name (``model_spec.name``: a preset's, or a Hugging Face config directory's last
    part), which names the job; ``inputs.model`` may be a path (``/tmp/nu/mistral-nemo``)."""
    return plan.inputs.model_spec.name or plan.inputs.model


def job_summary(plan: PlanFile, layout: Layout) -> str:
    """One line for the headers of launch.sh, slurm.sbatch and the manifest: the model, the hardware,
    every degree the layout uses as the plan names it (``Layout.degree_labels``), ZeRO, schedule, recompute."""
    L, inputs, tp_plan = layout, plan.inputs, plan.best.tp_plan
    model = f"user model {inputs.module}" if inputs.module is not None else f"model {inputs.model}"
    tp_text = f" ({len(tp_plan)}-entry tp_plan)" if tp_plan is not None else ""
    return (f"{model} on {inputs.hardware}: {' '.join(L.degree_labels())}{tp_text} "
            f"zero {L.zero_stage} schedule {L.schedule} recompute {L.recompute}")


def _device(hardware: str) -> "HardwareSpec | None":
    """The plan's device, or None when its hardware file is no longer here."""
    from hardware_specs import load_node

    try:
        return load_node(hardware).hardware
    except AutoplanError:
        return None


def _compute_capability(hardware: str) -> float:
    """The plan's hardware's CUDA compute capability (0: not given, or the file is no longer here)."""
    device = _device(hardware)
    return device.compute_capability if device is not None else 0.0


def runs_on_gpus(hardware: str) -> bool:
    """Whether the plan's hardware is an accelerator (a hardware file no longer here: assume so)."""
    device = _device(hardware)
    return device is None or device.device_type != "cpu"


def write_job(plan: PlanFile, out: str | Path, *, python: str | None = None,
              slurm: SlurmOptions = SlurmOptions(), settings: TrainingSettings | None = None) -> list[Path]:
    """Write the job of the plan's runtime (``training.runtime``) for ``plan``; returns the files written.
    torch: autoplan's own torchrun job; megatron, megatron-bridge, torchtitan, deepspeed: that
    framework's options with its run scripts (``write_framework_job``). A user model (``inputs.module``)
    only the torch job can build, whatever the runtime it was costed for. Refuses, with one line naming
    the field, a layout the runtime cannot run as costed."""
    if plan.best is not None and plan.inputs.training.runtime != "torch" and plan.inputs.module is None:
        return write_framework_job(plan, out, slurm, settings or DEFAULT_SETTINGS)
    if settings is not None:
        raise AutoplanError("--steps, --lr, --warmup-steps, --min-lr-ratio: the torch job takes them when it runs "
                            "(launch.sh --steps N ...); they set framework jobs' options")
    model, training, layout = check_plan(plan)
    out = Path(out)
    name = model_name(plan)
    summary = job_summary(plan, layout)
    _copy_runtime(out)
    write_job_file(out / "plan.json", plan.to_json())
    write_job_file(out / "train.py", scripts.TRAIN_PY)
    user = plan.inputs.module
    write_job_file(out / "launch.sh", scripts.launch_sh(world_size=layout.world_size, summary=summary,
                                                python=python or sys.executable, user_module=user,
                                                every=scripts.checkpoint_every(plan.best.predicted)), executable=True)
    per_node = plan.inputs.gpus_per_node
    write_job_file(out / "slurm.sbatch", scripts.slurm_sbatch(world_size=layout.world_size, gpus_per_node=per_node,
                                                       name=name, summary=summary, slurm=slurm,
                                                       on_gpus=runs_on_gpus(plan.inputs.hardware),
                                                       gpus_per_nvlink_domain=layout.gpus_per_nvlink_domain))
    return sorted(p for p in out.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def framework_files(runtime: str, name: str, model: ModelSpec, training: TrainingSpec, layout: Layout,
                    checkpoint_every: int = scripts.DEFAULT_CHECKPOINT_EVERY,
                    settings: TrainingSettings = DEFAULT_SETTINGS, version: str | None = None) -> dict[str, str]:
    """{file name: text} of the framework's own option files for ``runtime`` of release ``version``
    (None: its latest), saving a checkpoint every ``checkpoint_every`` steps and training as
    ``settings`` say (named in each file's header). Refuses a warm-up the runtime's scheduler would
    stop on (``require_schedulable``)."""
    require_schedulable(settings, runtime)
    saves = frameworks.megatron_checkpoint_args(checkpoint_every) + megatron_training_args(settings)
    args, notes = frameworks.megatron_args(model, training, layout, training.seq_len) \
        if runtime in ("megatron", "megatron-bridge") else ([], [])
    notes = [settings.summary(), *notes]
    if runtime == "megatron":
        return {"megatron_args.sh": frameworks.megatron_script(args + saves, notes)}
    if runtime == "megatron-bridge":
        header = ["# Megatron-Bridge ConfigContainer overrides for this plan (run_recipe.py KEY=VALUE), as costed;",
                  "# the recipe (RECIPE) gives the architecture, which must be the plan's model.",
                  f"# {settings.summary()}"]
        return {"bridge_overrides.txt": "\n".join(header + bridge_override_lines(args + saves)) + "\n"}
    if runtime == "torchtitan" and takes_command_line(version):
        options, subcommand = torchtitan_030_command(model, training, layout, settings, checkpoint_every)
        header = [f"torchtitan v0.3.0 command line for {name} (torchtitan.train options, then the "
                  "activation-checkpoint subcommand)", settings.summary()]
        registry = job_registry(model)
        return {"torchtitan_args.sh": torchtitan_030_script(options, subcommand, header),
                **({f"{JOB_REGISTRY}.py": registry} if registry else {})}
    if runtime == "torchtitan":
        config, notes = frameworks.torchtitan_config(name, model, training, layout, training.seq_len)
        config["checkpoint"] = frameworks.torchtitan_checkpoint(checkpoint_every)
        for section, values in torchtitan_training_sections(settings).items():
            config.setdefault(section, {}).update(values)
        return {"torchtitan.toml": frameworks.toml_text(config, [f"torchtitan config for {name}", settings.summary(),
                                                                 *notes])}
    ds = frameworks.deepspeed_config(model, training, layout)
    ds["optimizer"]["params"]["lr"] = settings.lr
    ds_args = frameworks.megatron_deepspeed_args(model, training, layout) + saves
    return {"deepspeed.json": json.dumps(ds, indent=2, sort_keys=True, allow_nan=False) + "\n",
            "megatron_deepspeed_args.sh": frameworks.megatron_script(ds_args, [settings.summary()]).replace(
                "MEGATRON_ARGS", "MEGATRON_DS_ARGS")}


def write_framework_job(plan: PlanFile, out: str | Path, slurm: SlurmOptions = SlurmOptions(),
                        settings: TrainingSettings = DEFAULT_SETTINGS) -> list[Path]:
    """plan.json, the framework's option files, launch.sh and slurm.sbatch for a plan whose runtime is
    megatron, megatron-bridge, torchtitan or deepspeed."""
    if plan.best is None:
        raise PlanFileError("best: null (no layout fits); there is nothing to launch")
    inputs, layout = plan.inputs, plan.best.layout
    runtime = inputs.training.runtime
    problems = layout_problems(layout, inputs.model_spec, inputs.training, inputs.gpus, inputs.gpus_per_node)
    if inputs.module is not None:
        problems.append(f"inputs.module: the plan trains a user model, which {runtime}'s options cannot name; "
                        "plan it with --runtime torch")
    if problems:
        raise PlanFileError(problems[0])
    files = framework_files(runtime, model_name(plan), inputs.model_spec, inputs.training, layout,
                            scripts.checkpoint_every(plan.best.predicted), settings, inputs.runtime_version)
    out = Path(out)
    per_node = min(inputs.gpus_per_node, layout.world_size)
    nodes = layout.world_size // per_node
    write_job_file(out / "plan.json", plan.to_json())
    for file, text in files.items():
        write_job_file(out / file, text)
    connections = device_connections(ep_comm_overlap=layout.ep_comm_overlap,
                                     flex_dispatcher=layout.moe_dispatcher != "alltoall",
                                     compute_capability=_compute_capability(inputs.hardware))
    launch = framework_launch_sh(runtime, nodes=nodes, gpus_per_node=per_node, summary=job_summary(plan, layout),
                                 max_connections=connections, log_dir=settings.log_dir,
                                 command_line=runtime == "torchtitan" and takes_command_line(inputs.runtime_version))
    write_job_file(out / "launch.sh", launch, executable=True)
    write_job_file(out / "slurm.sbatch", framework_sbatch(nodes=nodes, gpus_per_node=per_node, name=model_name(plan),
                                                          slurm=slurm,
                                                          gpus_per_nvlink_domain=layout.gpus_per_nvlink_domain))
    return sorted(p for p in out.rglob("*") if p.is_file())
