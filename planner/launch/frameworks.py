"""Framework exports of a plan: Megatron-LM arguments, a DeepSpeed JSON config, a torchtitan TOML.

Each exporter maps the layout field by field and returns the list of what does not translate
(written next to the files, never dropped silently). The option names used are listed below
with their source, and a test checks every emitted name against these lists.
"""

from __future__ import annotations

import json
import shlex

from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.stage_split import megatron_first_last
from costmodels.training import TrainingSpec

from .precision_export import (MEGATRON_PRECISION_OPTIONS, TORCHTITAN_PRECISION_KEYS, megatron_precision_args,
                               torchtitan_precision_sections)

MEGATRON_OPTIONS = frozenset({
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention",
    "--num-query-groups", "--kv-channels", "--seq-length", "--max-position-embeddings", "--micro-batch-size",
    "--global-batch-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--sequence-parallel", "--context-parallel-size",
    "--expert-model-parallel-size", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--use-distributed-optimizer", "--use-torch-fsdp2", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--bf16", "--fp16", "--fp8-format", "--swiglu", "--normalization",
    "--position-embedding-type", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--add-qkv-bias", "--attention-dropout", "--hidden-dropout", "--optimizer", "--clip-grad",
    "--tokenizer-type", "--vocab-size", "--rotary-base", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--qk-layernorm", "--moe-layer-freq",
    "--moe-shared-expert-intermediate-size", "--mtp-num-layers", "--moe-expert-capacity-factor",
    "--moe-pad-expert-input-to-capacity", "--expert-tensor-parallel-size", "--recompute-modules",
    "--tp-comm-overlap",
}) | MEGATRON_PRECISION_OPTIONS
"""Options of NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (parser groups network size,
regularization, training, mixed precision, distributed, tokenizer, moe) used by the export. The
uneven-pipeline options are in ``_add_distributed_args`` (commit d98e8a64); the MLA options
(``--multi-latent-attention``, ``--q-lora-rank``, ..., ``--v-head-dim``), the MoE options
(``--moe-layer-freq``, ``--moe-shared-expert-intermediate-size``, ``--moe-expert-capacity-factor``,
``--moe-pad-expert-input-to-capacity``, ``--expert-tensor-parallel-size``), ``--mtp-num-layers`` and
``--recompute-modules`` as used in Megatron-LM's DeepSeek-V3 and Qwen3-MoE scripts; uneven first/last stages
with interleaving need ``--num-virtual-stages-per-pipeline-rank``, not
``--num-layers-per-virtual-pipeline-stage`` (``validate_args``' uneven-VPP assertion)."""

DEEPSPEED_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "zero_optimization", "zero_optimization.stage", "zero_optimization.offload_optimizer",
    "zero_optimization.offload_optimizer.device", "bf16", "bf16.enabled", "fp16", "fp16.enabled",
    "optimizer", "optimizer.type", "optimizer.params", "optimizer.params.lr", "optimizer.params.weight_decay",
    "steps_per_print",
})
"""Keys of the DeepSpeed configuration JSON (deepspeed.ai/docs/config-json: batch size, optimizer,
fp16/bf16, gradient clipping, ZeRO optimizations), dotted for nesting."""

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
    "parallelism.module_fqns_per_model_part",
}) | TORCHTITAN_PRECISION_KEYS
"""Fields of pytorch/torchtitan ``torchtitan/config/job_config.py`` (commit 000204a4: Job, Model,
Optimizer, Training, Parallelism, ActivationCheckpoint), as section.field; the last three are in
``torchtitan/config/configs.py`` (commit b5bcd76c), whose module names per chunk
(``tok_embeddings``, ``layers.<i>``, ``norm``, ``lm_head``) follow
``torchtitan/distributed/pipeline_parallel.py``."""


def _megatron_model(model: ModelSpec) -> tuple[list[str], list[str]]:
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--ffn-hidden-size", str(model.ffn_hidden_size), "--num-attention-heads", str(model.num_attention_heads),
            "--kv-channels", str(model.d_head), "--tokenizer-type", "NullTokenizer",
            "--vocab-size", str(model.vocab_size),
            "--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
            "--position-embedding-type", "rope" if model.positions == "rotary" else "learned_absolute"]
    if model.positions == "rotary":
        args += ["--rotary-base", f"{model.rope_theta:g}"]
    if model.num_kv_heads != model.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
    args += ["--swiglu"] if model.gated_mlp else []
    args += [] if model.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    args += [] if model.linear_bias else ["--disable-bias-linear"]
    args += ["--add-qkv-bias"] if model.qkv_bias and not model.linear_bias else []
    args += [] if model.dropout else ["--attention-dropout", "0", "--hidden-dropout", "0"]
    notes = []
    if model.gated_mlp and model.activation != "silu":
        notes.append("activation: Megatron's --swiglu is SiLU-gated; a gated GELU MLP does not translate")
    args += ["--qk-layernorm"] if model.qk_norm else []
    if model.mla is not None:
        m = model.mla
        args += ["--multi-latent-attention", "--q-lora-rank", str(m.q_lora_rank), "--kv-lora-rank", str(m.kv_lora_rank),
                 "--qk-head-dim", str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim),
                 "--v-head-dim", str(m.v_head_dim)]
    if model.sliding_window:
        notes.append(f"sliding window {model.sliding_window} (every {model.global_layer_period or 'no'} layer "
                     "global): set Megatron's window attention options by hand")
    if model.sandwich_norm:
        notes.append("sandwich norms (after attention and MLP): no Megatron GPT option")
    if model.moe is not None:
        args += _megatron_moe(model, notes)
    if model.num_mtp_layers:
        args += ["--mtp-num-layers", str(model.num_mtp_layers)]
    return args, notes


def _megatron_moe(model: ModelSpec, notes: list[str]) -> list[str]:
    """MoE arguments: experts, top-k, expert FFN, which layers are MoE, shared experts, capacity."""
    moe = model.moe
    assert moe is not None
    args = ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
            "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size)]
    pattern = [int(model.is_moe_layer(i)) for i in range(model.num_layers)]
    if not all(pattern):
        runs, start = [], 0
        for i in range(1, len(pattern) + 1):
            if i == len(pattern) or pattern[i] != pattern[start]:
                runs.append(f"[{pattern[start]}]*{i - start}")
                start = i
        args += ["--moe-layer-freq", "(" + "+".join(runs) + ")"]
    if moe.num_shared_experts:
        args += ["--moe-shared-expert-intermediate-size", str(moe.shared_ffn_hidden_size)]
    if moe.shared_expert_gate:
        notes.append("moe: the shared-expert gate (Qwen2-MoE) is set by hand (--moe-shared-expert-gate where supported)")
    if moe.capacity_factor:
        args += ["--moe-expert-capacity-factor", f"{moe.capacity_factor:g}"]
        args += ["--moe-pad-expert-input-to-capacity"] if moe.pad_to_capacity else []
    return args


def megatron_args(model: ModelSpec, training: TrainingSpec, layout: Layout, seq_len: int) -> tuple[list[str], list[str]]:
    """(argument tokens, untranslated notes) for Megatron-LM's pretrain_gpt.py."""
    args, notes = _megatron_model(model)
    L = layout
    args += ["--seq-length", str(seq_len), "--max-position-embeddings", str(max(seq_len, model.max_position_embeddings)),
             "--micro-batch-size", str(L.micro_batch_size), "--global-batch-size", str(training.global_batch_size),
             "--tensor-model-parallel-size", str(L.tp), "--pipeline-model-parallel-size", str(L.pp),
             "--context-parallel-size", str(L.cp), "--optimizer", "sgd" if training.optimizer == "sgd" else "adam",
             "--clip-grad", "1.0"]
    args += _megatron_stage_args(model, L)
    if L.sequence_parallel:
        args += ["--sequence-parallel"]
    if L.tp_comm_overlap:
        args += ["--tp-comm-overlap"]
        notes.append("tp_comm_overlap: --tp-comm-overlap needs Transformer Engine (userbuffers) and "
                     "CUDA_DEVICE_MAX_CONNECTIONS=1; its default userbuffer config is used")
    if L.ep > 1:
        args += ["--expert-model-parallel-size", str(L.ep)]
    if L.expert_tp:
        args += ["--expert-tensor-parallel-size", str(L.expert_tp)]
    if L.zero_stage in (1, 2):
        args += ["--use-distributed-optimizer"]
        notes.append(f"zero_stage {L.zero_stage}: Megatron's distributed optimizer shards optimizer states "
                     "and reduce-scatters gradients (ZeRO-1/2 behaviour)")
    if L.zero_stage == 3 and L.pp > 1:
        args += ["--use-distributed-optimizer"]
        notes.append(f"zero_stage 3 with pp {L.pp}: Megatron-LM documents that --use-torch-fsdp2 does not work "
                     "with pipeline parallelism (use_torch_fsdp2 in its training config), so the distributed "
                     "optimizer (ZeRO-1/2) is written: parameters are not sharded, memory differs from the plan")
    elif L.zero_stage == 3:
        args += ["--use-torch-fsdp2"]
    if L.recompute == "full":
        count = L.recompute_num_layers
        args += ["--recompute-granularity", "full", "--recompute-method", "block" if count else "uniform",
                 "--recompute-num-layers", str(count or 1)]
    elif L.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
        if model.mla is not None:  # the cost model recomputes MLA's up-projections with the core
            args += ["--recompute-modules", "core_attn", "mla_up_proj"]
    elif L.recompute == "op-sac":
        notes.append("recompute op-sac: Megatron-LM has no op-level selective checkpointing; no recompute "
                     "argument is written (memory differs from the plan: --recompute-granularity full keeps less)")
    precision_args, precision_notes = megatron_precision_args(training, L)
    args += precision_args
    notes += precision_notes
    if L.pp > 1 and L.schedule in MEGATRON_SCHEDULE_NOTES:
        notes.append(f"schedule {L.schedule}: {MEGATRON_SCHEDULE_NOTES[L.schedule]}")
    if L.hsdp_shard_degree and L.hsdp_shard_degree < L.dp:
        notes.append(f"hsdp_shard_degree {L.hsdp_shard_degree}: no Megatron equivalent; states shard over all dp")
    if L.optimizer_offload:
        notes.append("optimizer_offload: use --optimizer-cpu-offload (Megatron-Core >= 0.10) by hand")
    return args, notes


_NO_ZB = "upstream Megatron-LM has no zero-bubble schedule and runs "
_FORK = " (sail-sg/zero-bubble-pipeline-parallelism, a Megatron-LM fork, takes "
_NO_DUALPIPE = ("Megatron-LM has no DualPipe schedule; the layers are exported for its looped placement. For MoE "
                "the nearest upstream option is --overlap-moe-expert-parallel-comm --delay-wgrad-compute "
                "(EP all-to-all hidden in a merged 1F1B step)")
MEGATRON_SCHEDULE_NOTES = {
    "gpipe": "Megatron runs 1F1B (same bubble, less activation memory)",
    "zb-h1": _NO_ZB + "1F1B with these arguments" + _FORK + "--enable-zero-bubble)",
    "interleaved-zb": _NO_ZB + "interleaved 1F1B with these arguments",
    "zb-v": _NO_ZB + "interleaved 1F1B with v = 2 here, looped, not in a V" + _FORK + "--zero-bubble-v-schedule)",
    "dualpipe-v": _NO_DUALPIPE,
    "dualpipe": _NO_DUALPIPE + "; DualPipe's second parameter copy has no equivalent",
}
"""What Megatron-LM does with each schedule it cannot run as planned (flags checked in NVIDIA/Megatron-LM
and the sail-sg fork's README)."""


def _megatron_stage_args(model: ModelSpec, L: Layout) -> list[str]:
    """Layers per chunk as Megatron states them: equal chunks by ``--num-layers-per-virtual-pipeline-stage``,
    Megatron's uneven form by the first/last-stage options, any other split by a layout string
    (``E`` embedding, ``t`` a decoder layer, ``L`` the loss, ``|`` between chunks in model order)."""
    counts = L.chunk_layers(model.num_layers)
    if L.pp == 1:
        return []
    if len(set(counts)) == 1:
        return ["--num-layers-per-virtual-pipeline-stage", str(counts[0])] if L.virtual_stages > 1 else []
    ends = megatron_first_last(counts, L.pp, L.virtual_stages)
    if ends is not None:
        args = ["--decoder-first-pipeline-num-layers", str(ends[0]), "--decoder-last-pipeline-num-layers", str(ends[1])]
        return args + (["--num-virtual-stages-per-pipeline-rank", str(L.virtual_stages)] if L.virtual_stages > 1 else [])
    chunks = "|".join(f"t*{n}" for n in counts)
    return ["--pipeline-model-parallel-layout", f"E{chunks}L"]


def megatron_script(args: list[str], notes: list[str]) -> str:
    """A sourceable bash file defining MEGATRON_ARGS (every token shell-quoted)."""
    lines = ["#!/usr/bin/env bash", "# Megatron-LM arguments for this plan: torchrun ... pretrain_gpt.py \"${MEGATRON_ARGS[@]}\"",
             "# Add data, tokenizer, learning-rate and checkpoint arguments of your own."]
    lines += [f"# not translated: {json.dumps(note)}" for note in notes]
    pairs = []
    for token in args:
        if token.startswith("--") or not pairs:
            pairs.append([token])
        else:
            pairs[-1].append(token)
    lines.append("MEGATRON_ARGS=(")
    lines += ["  " + " ".join(shlex.quote(t) for t in pair) for pair in pairs]
    lines.append(")")
    return "\n".join(lines) + "\n"


def deepspeed_config(training: TrainingSpec, layout: Layout) -> tuple[dict, list[str]]:
    """(DeepSpeed config dict, untranslated notes). DeepSpeed takes tp/pp in code, not in JSON."""
    L = layout
    zero: dict = {"stage": L.zero_stage}
    if L.optimizer_offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    config = {"train_batch_size": training.global_batch_size, "train_micro_batch_size_per_gpu": L.micro_batch_size,
              "gradient_accumulation_steps": L.num_microbatches, "gradient_clipping": 1.0,
              "zero_optimization": zero, "bf16": {"enabled": training.precision not in ("fp16", "fp32")},
              "fp16": {"enabled": training.precision == "fp16"},
              "optimizer": {"type": "SGD" if training.optimizer == "sgd" else "AdamW",
                            "params": {"lr": 3e-4, "weight_decay": 0.1}},
              "steps_per_print": 10}
    notes = []
    if L.pp > 1 and L.zero_stage >= 2:
        zero["stage"] = 1
        notes.append(f"zero_stage {L.zero_stage} with pp {L.pp}: DeepSpeed's PipelineEngine asserts "
                     "zero_optimization_stage() < 2 (ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                     "parallelism), so stage 1 is written: gradients and parameters are not sharded")
    if L.tp > 1 or L.pp > 1 or L.cp > 1 or L.ep > 1:
        notes.append(f"tp {L.tp}, pp {L.pp}, cp {L.cp}, ep {L.ep}: DeepSpeed sets these in code "
                     "(PipelineModule(num_stages=...), an mpu / AutoTP), not in the JSON")
    if L.recompute != "none":
        notes.append(f"recompute {L.recompute}: call deepspeed.checkpointing.checkpoint in the model's blocks")
    if L.hsdp_shard_degree and L.hsdp_shard_degree < L.dp:
        notes.append("hsdp_shard_degree: closest is ZeRO++ hpZ (zero_hpz_partition_size), set by hand")
    if training.recipe.is_low_precision:
        moments = ", and no bf16 Adam moments (fp32 kept)" if training.recipe.optimizer_moment_bytes == 2 else ""
        notes.append(f"precision {training.recipe.name}: DeepSpeed JSON has no FP8/FP4 switch (Transformer "
                     f"Engine, in code){moments}; bf16 set")
    return config, notes


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


def torchtitan_config(model_name: str, model: ModelSpec, training: TrainingSpec, layout: Layout,
                      seq_len: int) -> tuple[dict, list[str]]:
    """({section: {field: value}}, untranslated notes) for torchtitan's train.py --job.config_file."""
    L = layout
    hsdp = L.zero_stage > 0 and 0 < L.hsdp_shard_degree < L.dp
    replicate = L.dp if L.zero_stage == 0 else (L.dp // L.hsdp_shard_degree if hsdp else 1)
    parallelism = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": L.dp // replicate,
                   "fsdp_reshard_after_forward": "always" if L.zero_stage == 3 else "never",
                   "tensor_parallel_degree": L.tp, "pipeline_parallel_degree": L.pp,
                   "pipeline_parallel_schedule": TORCHTITAN_SCHEDULES[L.schedule],
                   "pipeline_parallel_microbatch_size": L.micro_batch_size,
                   "context_parallel_degree": L.cp, "expert_parallel_degree": L.ep}
    counts = L.chunk_layers(model.num_layers)
    if L.pp > 1 and len(set(counts)) == 1:
        parallelism["pipeline_parallel_layers_per_stage"] = counts[0]
        # torchtitan weighs the embedding and head as one layer each by default, which would add a stage
        parallelism["pipeline_parallel_first_stage_less_layers"] = 0
        parallelism["pipeline_parallel_last_stage_less_layers"] = 0
    elif L.pp > 1:
        parallelism["module_fqns_per_model_part"] = torchtitan_model_parts(counts)
    config = {
        "job": {"description": f"autoplan layout for {model_name}", "dump_folder": "./outputs"},
        "model": {"name": "llama3", "flavor": model_name},
        "optimizer": {"name": "AdamW", "lr": 3e-4, "weight_decay": 0.1},
        "training": {"local_batch_size": L.micro_batch_size * (L.num_microbatches if L.pp > 1 else 1),
                     "global_batch_size": training.global_batch_size, "seq_len": seq_len, "max_norm": 1.0,
                     "steps": 1000, "mixed_precision_param": "float32" if training.precision == "fp32" else "bfloat16",
                     "mixed_precision_reduce": "float32"},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": "selective" if L.recompute == "op-sac" else L.recompute,
                                  "selective_ac_option": "op"},
    }
    sections, precision_notes = torchtitan_precision_sections(model, training, L)
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    if L.tp_comm_overlap:
        # async TP is a torch.compile (inductor micro-pipeline TP) pass: torchtitan refuses it without
        # compile.enable and "model" in compile.components (torchtitan/distributed/tensor_parallel.py)
        parallelism["enable_async_tensor_parallel"] = True
        config.setdefault("compile", {}).update({"enable": True, "components": ["model", "loss"]})
    notes = precision_notes + [f"model.flavor: register a torchtitan flavor with this architecture ({model.num_layers} layers, "
             f"hidden {model.hidden_size}); the name alone does not define it"]
    if L.tp > 1 and not L.sequence_parallel:
        notes.append("sequence_parallel false: torchtitan always applies sequence parallel with TP")
    if L.zero_stage in (1, 2):
        notes.append(f"zero_stage {L.zero_stage}: torchtitan shards parameters too (FSDP2); "
                     "reshard_after_forward 'never' is the closest")
    if L.optimizer_offload:
        notes.append("optimizer_offload: training.enable_cpu_offload offloads parameters and gradients too")
    if L.recompute == "selective":
        notes.append("recompute selective: torchtitan's selective mode is op-level checkpointing (every other "
                     "matmul output kept), which keeps more than the attention-core recomputation planned; "
                     "plan with --recompute op-sac to cost what torchtitan runs")
    if L.schedule == "dualpipe":
        notes.append("schedule dualpipe: not in torch.distributed.pipelining (2.13); 1F1B set. DualPipeV, "
                     "the single-copy variant, is 'DualPipeV'")
    if L.schedule == "zb-h1":
        notes.append("schedule zb-h1: torch's InterleavedZeroBubble with one stage per rank; torchtitan builds "
                     "pipeline_parallel_layers_per_stage so that each rank holds one")
    return config, notes


TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                        "zb-h1": "InterleavedZeroBubble", "interleaved-zb": "InterleavedZeroBubble",
                        "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV", "dualpipe": "1F1B"}
"""torchtitan's ``parallelism.pipeline_parallel_schedule``: torch's ``get_schedule_class`` names (torchtitan
places ZBVZeroBubble and DualPipeV stages in a V itself, two per rank)."""


def torchtitan_model_parts(counts: tuple[int, ...]) -> list[list[str]]:
    """Module names of each model chunk, in model order: the embedding on the first, the final norm
    and output head on the last (torchtitan's ``module_fqns_per_model_part``)."""
    parts, start = [], 0
    for n in counts:
        parts.append([f"layers.{j}" for j in range(start, start + n)])
        start += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts


def toml_text(config: dict, header: list[str]) -> str:
    """Write a two-level {section: {key: scalar}} dict as TOML."""
    lines = [f"# {json.dumps(line)}" for line in header]
    for section, values in config.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"
