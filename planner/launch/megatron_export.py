"""Megatron-LM ``pretrain_gpt.py`` arguments for a plan, every costed option written.

Option names and defaults are NVIDIA/Megatron-LM ``megatron/training/arguments.py`` at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (``_add_distributed_args``: ``--overlap-grad-reduce`` and
``--overlap-param-gather`` are store_true, default False; ``validate_args``: ``--overlap-param-gather``
needs ``--overlap-grad-reduce`` and the distributed optimizer or Megatron-FSDP, Megatron-FSDP v1 needs
the distributed optimizer, ``--optimizer-cpu-offload`` needs ``--use-precision-aware-optimizer``);
Megatron-Core fields (``--cpu-offloading-num-layers``, ``--tp-comm-overlap``, ``--recompute-*``) are
generated from ``TransformerConfig`` / ``ModelParallelConfig`` by its ``ArgumentGroupFactory``. The
options each part of the space needs are in ``costmodels.capabilities.MEGATRON``. What cannot be
written as costed is refused by ``export_problems`` before anything is written.
"""

from __future__ import annotations

import json
import shlex

from costmodels.capabilities import capabilities
from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.stage_split import megatron_first_last
from costmodels.training import TrainingSpec

from .export_problems import require_exportable
from .precision_export import MEGATRON_PRECISION_OPTIONS, megatron_precision_args

MEGATRON_OPTIONS = frozenset({
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention",
    "--num-query-groups", "--kv-channels", "--seq-length", "--max-position-embeddings", "--micro-batch-size",
    "--global-batch-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--sequence-parallel", "--context-parallel-size",
    "--expert-model-parallel-size", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--use-distributed-optimizer", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--bf16", "--fp16", "--fp8-format", "--swiglu", "--normalization",
    "--position-embedding-type", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--add-qkv-bias", "--attention-dropout", "--hidden-dropout", "--optimizer", "--clip-grad",
    "--tokenizer-type", "--vocab-size", "--rotary-base", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--qk-layernorm", "--moe-layer-freq",
    "--moe-shared-expert-intermediate-size", "--mtp-num-layers", "--moe-expert-capacity-factor",
    "--moe-pad-expert-input-to-capacity", "--expert-tensor-parallel-size", "--recompute-modules",
    "--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "--cp-comm-type", "--optimizer-cpu-offload", "--optimizer-offload-fraction",
    "--cpu-offloading-num-layers", "--save", "--load", "--save-interval",
    "--attention-backend", "--train-iters", "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters",
    "--lr-warmup-iters", "--weight-decay", "--tensorboard-dir", "--log-interval", "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
}) | MEGATRON_PRECISION_OPTIONS
"""Options of NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (parser groups network size,
regularization, training, mixed precision, distributed, tokenizer, moe) used by the export. The
uneven-pipeline options are in ``_add_distributed_args`` (commit d98e8a64); the MLA options
(``--multi-latent-attention``, ``--q-lora-rank``, ..., ``--v-head-dim``), the MoE options
(``--moe-layer-freq``, ``--moe-shared-expert-intermediate-size``, ``--moe-expert-capacity-factor``,
``--moe-pad-expert-input-to-capacity``, ``--expert-tensor-parallel-size``), ``--mtp-num-layers`` and
``--recompute-modules`` as used in Megatron-LM's DeepSeek-V3 and Qwen3-MoE scripts; the virtual pipeline is
always ``--num-virtual-stages-per-pipeline-rank`` (``validate_args`` refuses
``--num-layers-per-virtual-pipeline-stage`` with uneven first/last stages; one form serves both).
``--save``, ``--load`` and ``--save-interval`` are ``CheckpointConfig``'s ``save``, ``load`` and
``save_interval`` (``megatron/training/config/training_config.py``, commit d98e8a64); the MoE dispatcher
and EP-overlap options are ``TransformerConfig``'s and ``ModelParallelConfig``'s fields
(``costmodels.capabilities.MEGATRON``, ``dispatchers`` and ``ep_comm_overlap``)."""

def megatron_checkpoint_args(every: int) -> list[str]:
    """Save every ``every`` steps (the plan's interval, ``scripts.checkpoint_every``): Megatron-LM's and
    Megatron-DeepSpeed's ``--save-interval`` (deepspeedai/Megatron-DeepSpeed ``megatron/arguments.py`` at
    4efb479d, ``_add_checkpointing_args``). Where it saves and resumes from (``--save``, ``--load``) is
    launch.sh's, in the job directory (``framework_scripts.output_words``)."""
    return ["--save-interval", str(every)]


def rope_base_text(model: ModelSpec) -> str:
    """The rotary base as Megatron's integer options take it (``--rotary-base`` of Megatron-LM and
    ``--rotary-position-embeddings-theta`` of Megatron-DeepSpeed are ``type=int``): ``1000000``, never
    ``1e+06``, which ``int()`` refuses. A fractional base is refused before (``framework_rules``)."""
    assert model.rope_theta == int(model.rope_theta), model.rope_theta
    return str(int(model.rope_theta))


def megatron_model_args(model: ModelSpec) -> list[str]:
    """The architecture: sizes, attention, norms, positions, MLP, MLA, MoE, MTP."""
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--ffn-hidden-size", str(model.ffn_hidden_size), "--num-attention-heads", str(model.num_attention_heads),
            "--kv-channels", str(model.d_head), "--tokenizer-type", "NullTokenizer",
            "--vocab-size", str(model.vocab_size),
            "--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
            "--position-embedding-type", "rope" if model.positions == "rotary" else "learned_absolute"]
    if model.positions == "rotary":
        args += ["--rotary-base", rope_base_text(model)]
    if model.num_kv_heads != model.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
    args += ["--swiglu"] if model.gated_mlp else []
    args += [] if model.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    args += [] if model.linear_bias else ["--disable-bias-linear"]
    args += ["--add-qkv-bias"] if model.qkv_bias and not model.linear_bias else []
    args += [] if model.dropout else ["--attention-dropout", "0", "--hidden-dropout", "0"]
    args += ["--qk-layernorm"] if model.qk_norm else []
    if model.mla is not None:
        m = model.mla
        args += ["--multi-latent-attention", "--q-lora-rank", str(m.q_lora_rank), "--kv-lora-rank", str(m.kv_lora_rank),
                 "--qk-head-dim", str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim),
                 "--v-head-dim", str(m.v_head_dim)]
    if model.moe is not None:
        args += _megatron_moe(model)
    if model.num_mtp_layers:
        args += ["--mtp-num-layers", str(model.num_mtp_layers)]
    return args


def _megatron_moe(model: ModelSpec) -> list[str]:
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
    if moe.capacity_factor:
        args += ["--moe-expert-capacity-factor", f"{moe.capacity_factor:g}"]
        args += ["--moe-pad-expert-input-to-capacity"] if moe.pad_to_capacity else []
    return args


MEGATRON_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
"""ZeRO stage -> Megatron-FSDP ``--data-parallel-sharding-strategy`` (``capabilities.MEGATRON``)."""


MEGATRON_ATTENTION = {"fused": "flash", "eager": "unfused"}
"""The plan's attention -> Megatron-LM's ``--attention-backend`` (``AttnBackend``: flash, fused, unfused,
local, auto). ``fused`` is costed as FlashAttention (no s x s scores in memory, ``costmodels.activations``):
``flash``; ``eager`` keeps the scores, as Megatron's ``unfused`` (DotProductAttention) does. ``auto``,
the default, would let Transformer Engine choose either."""


def megatron_attention_args(training: TrainingSpec) -> list[str]:
    """The attention kernel the plan costed, by Megatron-LM's ``--attention-backend``."""
    return ["--attention-backend", MEGATRON_ATTENTION[training.attention]]


def megatron_sharding_args(layout: Layout) -> list[str]:
    """ZeRO stage and the data-parallel overlap the cost model counts (``capabilities`` ``dp_overlap``):
    DDP overlaps its gradient reduce; the distributed optimizer and Megatron-FSDP also the gathers."""
    L = layout
    if L.zero_stage == 0:
        return ["--overlap-grad-reduce"]
    args = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if L.zero_stage in MEGATRON_FSDP_STRATEGY:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", MEGATRON_FSDP_STRATEGY[L.zero_stage]]
    return args


def megatron_recompute_args(model: ModelSpec, layout: Layout) -> list[str]:
    """Full recomputation of every layer (uniform, 1 layer a unit) or of the first N per stage
    (block, N), or the attention core (selective; MLA's up-projections with it, as costed)."""
    L = layout
    if L.recompute == "full":
        count = L.recompute_num_layers
        return ["--recompute-granularity", "full", "--recompute-method", "block" if count else "uniform",
                "--recompute-num-layers", str(count or 1)]
    if L.recompute == "selective":
        return ["--recompute-granularity", "selective"] + (
            ["--recompute-modules", "core_attn", "mla_up_proj"] if model.mla is not None else [])
    return []


def megatron_parallel_args(training: TrainingSpec, layout: Layout) -> list[str]:
    """Degrees, context-parallel exchange, sequence parallelism, TP overlap, offloads."""
    L = layout
    args = ["--tensor-model-parallel-size", str(L.tp), "--pipeline-model-parallel-size", str(L.pp),
            "--context-parallel-size", str(L.cp)]
    if L.cp > 1:
        args += ["--cp-comm-type", "p2p" if training.context_attention == "ring" else "allgather"]
    args += ["--sequence-parallel"] if L.sequence_parallel else []
    args += ["--tp-comm-overlap"] if L.tp_comm_overlap else []
    args += ["--expert-model-parallel-size", str(L.ep)] if L.ep > 1 else []
    args += ["--expert-tensor-parallel-size", str(L.expert_tp)] if L.expert_tp else []
    if L.optimizer_offload:
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"]
    if L.activation_offload_layers:
        args += ["--cpu-offloading-num-layers", str(L.activation_offload_layers)]
    return args


def megatron_args(model: ModelSpec, training: TrainingSpec, layout: Layout, seq_len: int) -> tuple[list[str], list[str]]:
    """(argument tokens, notes on what the run needs besides them) for Megatron-LM's pretrain_gpt.py.
    Raises ``PlanFileError`` for a layout Megatron cannot run as costed (``export_problems``)."""
    require_exportable("megatron", model, training, layout)
    L = layout
    args = megatron_model_args(model)
    args += ["--seq-length", str(seq_len), "--max-position-embeddings", str(max(seq_len, model.max_position_embeddings)),
             "--micro-batch-size", str(L.micro_batch_size), "--global-batch-size", str(training.global_batch_size),
             "--optimizer", "sgd" if training.optimizer == "sgd" else "adam", "--clip-grad", "1.0"]
    args += megatron_attention_args(training)
    args += megatron_parallel_args(training, L) + _megatron_stage_args(model, L)
    args += megatron_sharding_args(L) + megatron_recompute_args(model, L) + megatron_moe_comm_args(model, L)
    precision_args, notes = megatron_precision_args(training, L)
    args += precision_args
    if L.optimizer_offload and "--use-precision-aware-optimizer" not in args:
        args += ["--use-precision-aware-optimizer"]  # validate_args: the offload's hybrid optimizer needs it
    if L.tp_comm_overlap:
        notes.append("--tp-comm-overlap needs Transformer Engine (userbuffers) and CUDA_DEVICE_MAX_CONNECTIONS=1 "
                     "(launch.sh sets it)")
    if L.ep_comm_overlap:
        notes.append("--overlap-moe-expert-parallel-comm runs forward and backward on two streams: launch.sh sets "
                     "CUDA_DEVICE_MAX_CONNECTIONS above 1; --delay-wgrad-compute with --overlap-grad-reduce needs "
                     "Transformer Engine 2.8 or newer")
    if L.moe_dispatcher != "alltoall":
        notes.append(f"the flex dispatcher's {L.moe_dispatcher} backend needs the DeepEP package "
                     "(deepseek-ai/DeepEP; HybridEP: its hybrid-ep branch) built for this GPU")
    return args, notes


def megatron_moe_comm_args(model: ModelSpec, L: Layout) -> list[str]:
    """A MoE model's token dispatcher as costed, and the EP overlap when on: the options of
    ``costmodels.capabilities.MEGATRON`` (Megatron-Core's default dispatcher is allgather, which the
    cost model never assumes, so the all-to-all is written out too)."""
    if model.moe is None:
        return []
    table = capabilities("megatron")
    dispatcher = table.feature(L.moe_dispatcher)
    assert dispatcher is not None, L.moe_dispatcher
    args = dispatcher.option.split()
    overlap = table.feature("ep_comm_overlap")
    if L.ep_comm_overlap and overlap is not None:
        args += overlap.option.split()
    return args


def _megatron_stage_args(model: ModelSpec, L: Layout) -> list[str]:
    """Layers per chunk as Megatron states them: the virtual stages per rank, then Megatron's uneven
    form by the first/last-stage options, or any other split by a layout string (``E`` embedding,
    ``t`` a decoder layer, ``L`` the loss, ``|`` between chunks in model order), which carries the
    virtual stages itself."""
    counts = L.chunk_layers(model.num_layers)
    if L.pp == 1:
        return []
    virtual = ["--num-virtual-stages-per-pipeline-rank", str(L.virtual_stages)] if L.virtual_stages > 1 else []
    if len(set(counts)) == 1:
        return virtual
    ends = megatron_first_last(counts, L.pp, L.virtual_stages)
    if ends is not None:
        return ["--decoder-first-pipeline-num-layers", str(ends[0]),
                "--decoder-last-pipeline-num-layers", str(ends[1])] + virtual
    chunks = "|".join(f"t*{n}" for n in counts)
    return ["--pipeline-model-parallel-layout", f"E{chunks}L"]


def megatron_script(args: list[str], notes: list[str]) -> str:
    """A sourceable bash file defining MEGATRON_ARGS (every token shell-quoted)."""
    lines = ["#!/usr/bin/env bash", "# Megatron-LM arguments for this plan, as costed: launch.sh runs",
             "# torchrun ... \"$MEGATRON_LM/pretrain_gpt.py\" \"${MEGATRON_ARGS[@]}\" plus data/checkpoint arguments."]
    lines += [f"# note: {json.dumps(note)}" for note in notes]
    return "\n".join(lines + bash_array_lines("MEGATRON_ARGS", args)) + "\n"


def bash_array_lines(name: str, tokens: list[str]) -> list[str]:
    """``NAME=(`` ... ``)``: each option with the values that follow it on one line, shell-quoted."""
    groups: list[list[str]] = []
    for token in tokens:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return [f"{name}=(", *("  " + " ".join(shlex.quote(t) for t in group) for group in groups), ")"]
