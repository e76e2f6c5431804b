"""torchtitan 0.3.0's job for a plan: the command line its ``torchtitan.train`` parses.

torchtitan 0.3.0 reads no TOML. Its ``ConfigManager`` (``torchtitan/config/manager.py``) requires
``--module`` and ``--config``, which name a function of ``torchtitan/models/<module>/config_registry.py``
returning a ``Trainer.Config`` with the model spec built in (``Trainer.Config.model_spec`` is
suppressed from the command line), then hands the rest to tyro: ``--<section>.<field> VALUE``, booleans
as ``--<section>.<field>`` / ``--<section>.no-<field>``, ``list[str]`` as ``A,B,C``, and the
activation-checkpoint policy as a subcommand (``activation-checkpoint:{none,full,selective}``,
``distributed/activation_checkpoint.py``), which comes last: tyro applies every option after it to the
subcommand. Option names are ``Trainer.Config``'s (``trainer.py``), ``TrainingConfig``,
``ParallelismConfig``, ``CompileConfig`` (``config/configs.py``), ``OptimizersContainer.Config``
(``components/optimizer/optimizer.py``: the registered configs' one AdamW parameter group),
``LRSchedulersContainer.Config``, ``MetricsProcessor.Config`` and ``BaseCheckpointManager.Config``.
"""

from __future__ import annotations

from costmodels.capabilities import capabilities
from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec
from planner.search.framework_rules import (TORCHTITAN_030_CONFIGS, TORCHTITAN_030_REBUILT, TORCHTITAN_CLI_VERSIONS,
                                            llama3_shape)

from .export_problems import require_exportable
from .frameworks import TORCHTITAN_SCHEDULES, torchtitan_model_parts
from .megatron_export import bash_array_lines
from .training_settings import TrainingSettings

AC_SUBCOMMANDS = {"none": "activation-checkpoint:none", "full": "activation-checkpoint:full",
                  "op-sac": "activation-checkpoint:selective"}
"""autoplan's recomputation -> torchtitan 0.3.0's policy subcommand (``SelectiveAC`` is op-level SAC)."""


def takes_command_line(version: str | None) -> bool:
    """Whether torchtitan of release ``version`` (None: the capability table's latest) is configured by
    a command line (0.3.0 on) rather than the TOML of ``frameworks.torchtitan_config``."""
    return (version or capabilities("torchtitan").latest) in TORCHTITAN_CLI_VERSIONS


JOB_REGISTRY = "torchtitan_job"
"""The job's own config registry module (``torchtitan_job.py`` beside launch.sh, on its PYTHONPATH)."""
JOB_REGISTRY_TEXT = '''"""torchtitan 0.3.0 config registry of this autoplan job (launch.sh: --module torchtitan_job
--config llama3_{name}_bf16; torchtitan's ConfigManager imports a --module given as a module path).

torchtitan's own llama3_{name} puts a Float8 converter in its model spec, which its command line cannot
remove. This config is the {flavor} model spec without converters under llama3_70b's trainer config (its
loss, AdamW group, data and checkpoint settings); all the plan sets comes from the command line.
"""

from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_70b


def llama3_{name}_bf16():
    config = llama3_70b()
    config.model_spec = model_registry("{flavor}")
    config.hf_assets_path = "./assets/hf/Llama-3.1-{flavor}"
    return config
'''
"""``torchtitan_job.py`` for a shape of ``TORCHTITAN_030_REBUILT`` (``name``: the flavor in lower case)."""


def registered_config(model: ModelSpec) -> tuple[str, str]:
    """(``--module``, ``--config``) for the plan's Llama 3 shape: a config 0.3.0 registers, or the job's
    own (``job_registry``) where the registered one is not the bf16 model (``framework_rules`` refuses
    other shapes)."""
    if llama3_shape(model) in TORCHTITAN_030_REBUILT:
        return JOB_REGISTRY, f"llama3_{TORCHTITAN_030_REBUILT[llama3_shape(model)].lower()}_bf16"
    return "llama3", TORCHTITAN_030_CONFIGS[llama3_shape(model)]


def job_registry(model: ModelSpec) -> str | None:
    """The text of ``torchtitan_job.py`` the plan's job needs (None: it runs a registered config)."""
    flavor = TORCHTITAN_030_REBUILT.get(llama3_shape(model))
    return None if flavor is None else JOB_REGISTRY_TEXT.format(name=flavor.lower(), flavor=flavor)


def _flag(name: str, on: bool) -> str:
    section, field = name.rsplit(".", 1)
    return f"--{name}" if on else f"--{section}.no-{field}"


def _pipeline(model: ModelSpec, L: Layout) -> list[str]:
    """The pipeline split: layers per stage with the embedding and head weighed as no layer (torchtitan
    weighs each as one by default, which would add a stage), or each chunk's modules; 0.3.0's llama3
    names its head ``lm_head`` (``models/llama3/__init__.py``)."""
    if L.pp == 1:
        return []
    counts = L.chunk_layers(model.num_layers)
    out = ["--parallelism.pipeline_parallel_schedule", TORCHTITAN_SCHEDULES[L.schedule],
           "--parallelism.pipeline_parallel_microbatch_size", str(L.micro_batch_size)]
    if len(set(counts)) == 1:
        return out + ["--parallelism.pipeline_parallel_layers_per_stage", str(counts[0]),
                      "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
                      "--parallelism.pipeline_parallel_last_stage_less_layers", "0"]
    parts = torchtitan_model_parts(counts, head="lm_head")
    return out + ["--parallelism.module_fqns_per_model_part", *(",".join(part) for part in parts)]


def _parallelism(model: ModelSpec, L: Layout) -> list[str]:
    """DDP / FSDP / HSDP degrees, tp with sequence parallelism, pp, cp, ep."""
    hsdp = L.zero_stage > 0 and 0 < L.hsdp_shard_degree < L.dp
    replicate = L.dp if L.zero_stage == 0 else (L.dp // L.hsdp_shard_degree if hsdp else 1)
    values = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": L.dp // replicate,
              "fsdp_reshard_after_forward": "always" if L.zero_stage == 3 else "never",
              "tensor_parallel_degree": L.tp, "pipeline_parallel_degree": L.pp,
              "context_parallel_degree": L.cp, "expert_parallel_degree": L.ep}
    out = [token for key, value in values.items() for token in (f"--parallelism.{key}", str(value))]
    return out + [_flag("parallelism.enable-sequence-parallel", True)] + _pipeline(model, L)


def _training(training: TrainingSpec, L: Layout, settings: TrainingSettings) -> list[str]:
    local = L.micro_batch_size * (L.num_microbatches if L.pp > 1 else 1)
    values = {"local_batch_size": local, "global_batch_size": training.global_batch_size,
              "seq_len": training.seq_len, "max_norm": 1.0, "steps": settings.steps,
              "mixed_precision_param": "float32" if training.precision == "fp32" else "bfloat16",
              "mixed_precision_reduce": "float32"}
    out = [token for key, value in values.items() for token in (f"--training.{key}", str(value))]
    out.append(_flag("training.enable-cpu-offload", L.optimizer_offload))
    if L.pp > 1:  # Trainer.Config refuses CUDA graphs with pipeline parallelism
        out.append(_flag("training.disable-cuda-graphs", True))
    return out


def _schedule_and_logs(settings: TrainingSettings, checkpoint_every: int) -> list[str]:
    """Learning rate of the one AdamW group, warm-up and cosine decay, TensorBoard, checkpoints."""
    s, group = settings, "--optimizer.param-groups.0.optimizer-kwargs"
    return [f"{group}.lr", repr(s.lr), f"{group}.weight-decay", repr(s.weight_decay),
            "--lr-scheduler.warmup-steps", str(min(s.warmup_steps, s.steps)), "--lr-scheduler.decay-type", "cosine",
            "--lr-scheduler.min-lr-factor", repr(s.min_lr_ratio),
            _flag("metrics.enable-tensorboard", True), "--metrics.save-tb-folder", s.log_dir,
            "--metrics.log-freq", str(s.log_interval),
            _flag("checkpoint.enable", True), "--checkpoint.folder", "checkpoint",
            "--checkpoint.interval", str(checkpoint_every)]


def torchtitan_030_command(model: ModelSpec, training: TrainingSpec, layout: Layout, settings: TrainingSettings,
                           checkpoint_every: int) -> tuple[list[str], list[str]]:
    """(options, activation-checkpoint subcommand) of ``torchtitan.train`` for the plan. Raises
    ``PlanFileError`` for what torchtitan 0.3.0 cannot run as costed (``export_problems``)."""
    require_exportable("torchtitan", model, training, layout, "v0.3.0")
    L = layout
    # async TP is an inductor pass: CompileConfig refuses it without compile of the model
    compile_ = [_flag("compile.enable", training.compiled), "--compile.components", "model,loss",
                _flag("compile.enable-async-tensor-parallel", L.tp_comm_overlap)]
    module, config = registered_config(model)
    options = ["--module", module, "--config", config,  # --dump_folder is launch.sh's (output_words)
               *_training(training, L, settings), *_parallelism(model, L), *compile_,
               *_schedule_and_logs(settings, checkpoint_every)]
    return options, [AC_SUBCOMMANDS[L.recompute]]


def torchtitan_030_script(options: list[str], subcommand: list[str], header: list[str]) -> str:
    """torchtitan_args.sh: the options and the subcommand as two bash arrays, which launch.sh passes
    with its own arguments between them."""
    lines = ["# " + line.replace("\n", " ") for line in header]
    lines += bash_array_lines("TORCHTITAN_ARGS", options) + bash_array_lines("TORCHTITAN_AC", subcommand)
    return "\n".join(lines) + "\n"
