"""Framework exports of a plan: a DeepSpeed JSON with Megatron-DeepSpeed arguments, a torchtitan TOML
(Megatron-LM's arguments are ``megatron_export``, Megatron-Bridge's overrides ``bridge_export``).

Each exporter writes every option the cost model assumed, field by field, and refuses with
``PlanFileError`` what its framework cannot run as costed (``export_problems``); nothing is
dropped. The option names used are listed below with their source, and a test checks every
emitted name against these lists.
"""

from __future__ import annotations

import json

from costmodels.capabilities import capabilities
from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec

from .export_problems import require_exportable
from .megatron_export import (MEGATRON_OPTIONS, megatron_args, megatron_checkpoint_args,  # noqa: F401
                              megatron_recompute_args, megatron_script, rope_base_text)
from .training_settings import DEFAULT_SETTINGS
from .precision_export import TORCHTITAN_PRECISION_KEYS, torchtitan_precision_sections

DEEPSPEED_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "zero_optimization", "zero_optimization.stage", "zero_optimization.offload_optimizer",
    "zero_optimization.offload_optimizer.device", "bf16", "bf16.enabled", "fp16", "fp16.enabled",
    "optimizer", "optimizer.type", "optimizer.params", "optimizer.params.lr", "optimizer.params.weight_decay",
    "steps_per_print", "zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_scatter", "data_types", "data_types.grad_accum_dtype",
})
"""Keys of the DeepSpeed configuration JSON (deepspeed.ai/docs/config-json: batch size, optimizer,
fp16/bf16, gradient clipping, ZeRO optimizations, data types), dotted for nesting."""

TORCHTITAN_KEYS = frozenset({
    "job.description", "job.dump_folder", "model.name", "model.flavor", "optimizer.name", "optimizer.lr",
    "optimizer.weight_decay", "training.local_batch_size", "training.global_batch_size", "training.seq_len",
    "training.max_norm", "training.steps", "training.mixed_precision_param", "training.mixed_precision_reduce",
    "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
    "parallelism.fsdp_reshard_after_forward", "parallelism.tensor_parallel_degree",
    "parallelism.pipeline_parallel_degree", "parallelism.pipeline_parallel_schedule",
    "parallelism.pipeline_parallel_microbatch_size", "parallelism.pipeline_parallel_layers_per_stage",
    "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
    "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option",
    "parallelism.pipeline_parallel_first_stage_less_layers", "parallelism.pipeline_parallel_last_stage_less_layers",
    "parallelism.module_fqns_per_model_part", "parallelism.expert_tensor_parallel_degree",
    "parallelism.context_parallel_rotate_method", "parallelism.enable_async_tensor_parallel",
    "training.enable_cpu_offload", "compile.enable", "compile.components",
    "checkpoint.enable", "checkpoint.folder", "checkpoint.interval",
    "lr_scheduler.warmup_steps", "lr_scheduler.decay_type", "lr_scheduler.min_lr_factor",
    "metrics.enable_tensorboard", "metrics.save_tb_folder", "metrics.log_freq",
}) | TORCHTITAN_PRECISION_KEYS
"""Fields of pytorch/torchtitan ``torchtitan/config/job_config.py`` (commit 000204a4: Job, Model,
Optimizer, Training, Parallelism, ActivationCheckpoint, Checkpoint), as section.field; the last three are in
``torchtitan/config/configs.py`` (commit b5bcd76c), whose module names per chunk
(``tok_embeddings``, ``layers.<i>``, ``norm``, ``output``) follow
``torchtitan/distributed/pipeline_parallel.py``."""


def deepspeed_config(model: ModelSpec, training: TrainingSpec, layout: Layout) -> dict:
    """The DeepSpeed JSON (``deepspeed/runtime/config.py``, ``zero/config.py`` at deepspeedai/DeepSpeed
    edaa7221): batch, ZeRO stage with the communication overlap the cost model counts
    (``overlap_comm``), offload, precision with fp32 gradient accumulation. Degrees are Megatron-DeepSpeed
    arguments (``megatron_deepspeed_args``). Raises ``PlanFileError`` on what it cannot run as costed."""
    require_exportable("deepspeed", model, training, layout)
    L = layout
    zero: dict = {"stage": L.zero_stage, "overlap_comm": True, "contiguous_gradients": True,
                  "reduce_scatter": True}
    if L.optimizer_offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"train_batch_size": training.global_batch_size, "train_micro_batch_size_per_gpu": L.micro_batch_size,
            "gradient_accumulation_steps": L.num_microbatches, "gradient_clipping": 1.0,
            "zero_optimization": zero, "bf16": {"enabled": training.precision == "bf16"},
            "fp16": {"enabled": training.precision == "fp16"},
            "data_types": {"grad_accum_dtype": "fp32"} if training.precision != "fp32" else {},
            "optimizer": {"type": "SGD" if training.optimizer == "sgd" else "AdamW",
                          "params": {"lr": DEFAULT_SETTINGS.lr, "weight_decay": DEFAULT_SETTINGS.weight_decay}},
            "steps_per_print": 10}


def megatron_deepspeed_args(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """deepspeedai/Megatron-DeepSpeed ``pretrain_gpt.py`` arguments (``megatron/arguments.py`` at 4efb479d):
    the model, degrees (``--no-pipeline-parallel`` at pp 1, which ZeRO-2/3 need), recomputation; the
    ZeRO stage and batch are the JSON's (``--deepspeed_config``, added by ``deepspeed.add_config_arguments``)."""
    require_exportable("deepspeed", model, training, layout)
    L = layout
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--ffn-hidden-size", str(model.ffn_hidden_size), "--num-attention-heads", str(model.num_attention_heads),
            "--num-key-value-heads", str(model.num_kv_heads), "--seq-length", str(training.seq_len),
            "--max-position-embeddings", str(max(training.seq_len, model.max_position_embeddings)),
            "--micro-batch-size", str(L.micro_batch_size), "--global-batch-size", str(training.global_batch_size),
            "--tensor-model-parallel-size", str(L.tp), "--pipeline-model-parallel-size", str(L.pp),
            "--normalization", "rmsnorm" if model.norm == "rmsnorm" else "layernorm",
            "--optimizer", "sgd" if training.optimizer == "sgd" else "adam", "--clip-grad", "1.0"]
    # pretrain_gpt.py reads the ZeRO stage from --zero-stage (default 1), not from the JSON: it builds
    # the model inside deepspeed.zero.Init only when args.zero_stage == 3
    args += ["--zero-stage", str(L.zero_stage)]
    # without a tokenizer Megatron-DeepSpeed falls back to GPT-2's 50,257 tokens; NullTokenizer takes the
    # plan's vocabulary (megatron/tokenizer/tokenizer.py, _NullTokenizer(args.vocab_size))
    args += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab_size)]
    args += ["--no-pipeline-parallel"] if L.pp == 1 else []
    args += ["--sequence-parallel"] if L.sequence_parallel else []
    if model.positions == "rotary":
        args += ["--use-rotary-position-embeddings", "--rotary-position-embeddings-theta", rope_base_text(model)]
    args += ["--swiglu"] if model.gated_mlp else []
    args += [] if model.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    args += [] if model.linear_bias else ["--disable-bias-linear"]
    args += [] if model.dropout else ["--attention-dropout", "0", "--hidden-dropout", "0"]
    if model.moe is not None:
        args += ["--num-experts", str(model.moe.num_experts), "--topk", str(model.moe.top_k), "--expert-interval", "1",
                 "--moe-expert-parallel-size", str(L.ep)]
        # the experts are split over tp only with this flag (megatron/model/transformer.py ParallelMLP);
        # the plan costs expert tp = tp
        args += ["--enable-expert-tensor-parallelism"] if L.etp > 1 else []
    args += {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(training.precision, [])
    # the attention the plan costed: fused is FlashAttention-2 (megatron/model/transformer.py
    # FlashSelfAttention); without the flag Megatron-DeepSpeed runs its unfused core, which holds the scores
    args += ["--use-flash-attn-v2"] if training.attention == "fused" else []
    return args + megatron_recompute_args(model, L) + ["--deepspeed"]


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return toml_string(str(value))


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (TOML 1.0, "String"): quote, backslash and control characters
    escaped, other characters kept as UTF-8; a lone surrogate, which UTF-8 cannot hold, becomes U+FFFD."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\uFFFD")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _torchtitan_parallelism(model: ModelSpec, training: TrainingSpec, L: Layout) -> dict:
    """``[parallelism]``: DDP / FSDP / HSDP degrees, tp, pp (schedule, micro-batch, layers per chunk),
    cp with its exchange, ep with its expert tp."""
    hsdp = L.zero_stage > 0 and 0 < L.hsdp_shard_degree < L.dp
    replicate = L.dp if L.zero_stage == 0 else (L.dp // L.hsdp_shard_degree if hsdp else 1)
    parallelism = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": L.dp // replicate,
                   "fsdp_reshard_after_forward": "always" if L.zero_stage == 3 else "never",
                   "tensor_parallel_degree": L.tp, "pipeline_parallel_degree": L.pp,
                   "pipeline_parallel_schedule": TORCHTITAN_SCHEDULES[L.schedule],
                   "pipeline_parallel_microbatch_size": L.micro_batch_size,
                   "context_parallel_degree": L.cp, "expert_parallel_degree": L.ep,
                   "expert_tensor_parallel_degree": L.etp if L.ep > 1 else 1,
                   "context_parallel_rotate_method": "alltoall" if training.context_attention == "ring" else "allgather",
                   "enable_async_tensor_parallel": L.tp_comm_overlap}
    counts = L.chunk_layers(model.num_layers)
    if L.pp > 1 and len(set(counts)) == 1:
        parallelism["pipeline_parallel_layers_per_stage"] = counts[0]
        # torchtitan weighs the embedding and head as one layer each by default, which would add a stage
        parallelism["pipeline_parallel_first_stage_less_layers"] = 0
        parallelism["pipeline_parallel_last_stage_less_layers"] = 0
    elif L.pp > 1:
        parallelism["module_fqns_per_model_part"] = torchtitan_model_parts(counts)
    return parallelism


TORCHTITAN_TOML_RELEASE = "v0.2.2"
"""The last torchtitan release that reads the TOML of ``torchtitan_config`` (0.3.0 on: ``torchtitan_cli``)."""
TORCHTITAN_LLAMA3_FLAVORS = {(32, 4096, 128256): "8B", (80, 8192, 128256): "70B", (126, 16384, 128256): "405B"}
"""(layers, hidden, vocabulary) of a dense model -> the flavor name torchtitan v0.2.2 registers for that Llama 3 shape
(``torchtitan/models/llama3/__init__.py``, ``llama3_args``: "debugmodel", "8B", "70B", "405B")."""


def torchtitan_flavor(model_name: str, model: ModelSpec) -> str:
    """The ``model.flavor`` to write: torchtitan's own name for a Llama 3 shape it registers, else
    the plan's model name (which a user must then register; the TOML's notes say so)."""
    if model.moe is not None:
        return model_name
    return TORCHTITAN_LLAMA3_FLAVORS.get((model.num_layers, model.hidden_size, model.vocab_size), model_name)


def torchtitan_config(model_name: str, model: ModelSpec, training: TrainingSpec, layout: Layout,
                      seq_len: int) -> tuple[dict, list[str]]:
    """({section: {field: value}}, notes on what the run needs besides it) for torchtitan's
    ``torchtitan.train --job.config_file`` (``torchtitan/config/job_config.py`` of torchtitan v0.2.2, the
    last release that reads a TOML: v0.3.0 takes ``--module/--config`` registry functions instead).
    Raises ``PlanFileError`` for a layout torchtitan cannot run as costed (``export_problems``)."""
    require_exportable("torchtitan", model, training, layout, TORCHTITAN_TOML_RELEASE)
    L = layout
    config = {
        "job": {"description": f"autoplan layout for {model_name}"},  # dump_folder: launch.sh's (output_words)
        "model": {"name": "llama3", "flavor": torchtitan_flavor(model_name, model)},
        "optimizer": {"name": "AdamW", "lr": DEFAULT_SETTINGS.lr, "weight_decay": DEFAULT_SETTINGS.weight_decay},
        "training": {"local_batch_size": L.micro_batch_size * (L.num_microbatches if L.pp > 1 else 1),
                     "global_batch_size": training.global_batch_size, "seq_len": seq_len, "max_norm": 1.0,
                     "steps": DEFAULT_SETTINGS.steps, "mixed_precision_param": "float32" if training.precision == "fp32" else "bfloat16",
                     "mixed_precision_reduce": "float32", "enable_cpu_offload": L.optimizer_offload},
        "parallelism": _torchtitan_parallelism(model, training, L),
        "activation_checkpoint": {"mode": "selective" if L.recompute == "op-sac" else L.recompute,
                                  "selective_ac_option": "op"},
        # async TP is an inductor pass: torchtitan refuses it without compile of the model
        # (torchtitan/distributed/tensor_parallel.py); export_problems asks for a compiled plan then
        "compile": {"enable": training.compiled, "components": ["model", "loss"]},
    }
    sections, notes = torchtitan_precision_sections(model, training, L)
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    if torchtitan_flavor(model_name, model) == model_name:
        notes.append(f"model.flavor {model_name}: torchtitan's llama3 registry must hold a flavor of this name with "
                     f"this architecture ({model.num_layers} layers, hidden {model.hidden_size}); the name alone "
                     "does not define it")
    return config, notes


def torchtitan_checkpoint(every: int) -> dict:
    """``[checkpoint]``: save every ``every`` steps (the plan's interval, ``scripts.checkpoint_every``) under
    ``job.dump_folder``/``folder``, from which torchtitan also resumes (``Checkpoint`` of
    ``torchtitan/config/job_config.py`` in torchtitan v0.2.2: ``enable`` default False, ``interval`` 500)."""
    return {"enable": True, "folder": "checkpoint", "interval": every}


TORCHTITAN_SCHEDULES = {f.name: f.option.removeprefix("parallelism.pipeline_parallel_schedule=")
                        for f in capabilities("torchtitan").schedules}
"""autoplan's schedules torchtitan runs -> its ``parallelism.pipeline_parallel_schedule`` (torch's
``get_schedule_class`` names; torchtitan places ZBVZeroBubble and DualPipeV stages in a V itself, two
per rank), read from the capability table; ``export_problems`` refuses the others (zb-h1, dualpipe)."""


def torchtitan_model_parts(counts: tuple[int, ...], head: str = "output") -> list[list[str]]:
    """Module names of each model chunk, in model order: the embedding on the first, the final norm
    and output head on the last (torchtitan's ``module_fqns_per_model_part``; torchtitan v0.2.2's llama3
    ``Transformer`` names them ``tok_embeddings``, ``layers``, ``norm`` and ``output``, v0.3.0's calls
    the head ``lm_head``)."""
    parts, start = [], 0
    for n in counts:
        parts.append([f"layers.{j}" for j in range(start, start + n)])
        start += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", head]
    return parts


def toml_text(config: dict, header: list[str]) -> str:
    """Write a two-level {section: {key: scalar}} dict as TOML."""
    lines = [f"# {json.dumps(line)}" for line in header]
    for section, values in config.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"
