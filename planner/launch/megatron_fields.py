"""Megatron-LM arguments as Megatron-Core config fields, both ways.

Megatron-LM turns its parsed arguments into Megatron-Core's ``TransformerConfig`` (``model``),
``DistributedDataParallelConfig`` (``ddp``) and ``OptimizerConfig`` (``optimizer``) by field name
(``megatron/training/arguments.py`` ``core_transformer_config_from_args``, NVIDIA/Megatron-LM
d98e8a64), renaming a few; Megatron-Bridge's ``ConfigContainer`` holds the same objects
(``cfg.model`` a ``GPTModelProvider``, a ``TransformerConfig``; ``cfg.ddp``; ``cfg.optimizer``;
``cfg.train`` for the batch; ``comm_overlap`` for the TP overlap; ``cfg.checkpoint``, Megatron-LM's
``CheckpointConfig`` (``megatron/training/config/training_config.py``), for ``--save``/``--load``/``--save-interval``; ``src/megatron/bridge/training/config.py``
at NVIDIA-NeMo/Megatron-Bridge 067f987d). ``ARG_FIELDS`` is that mapping for the options the
export writes, so the Bridge overrides are the Megatron arguments renamed, and one reader reads both.
"""

from __future__ import annotations

import json

ARG_FIELDS: dict[str, tuple[str, ...]] = {
    "tensor_model_parallel_size": ("model.tensor_model_parallel_size",),
    "pipeline_model_parallel_size": ("model.pipeline_model_parallel_size",),
    "num_virtual_stages_per_pipeline_rank": ("model.virtual_pipeline_model_parallel_size",),
    "context_parallel_size": ("model.context_parallel_size",),
    "cp_comm_type": ("model.cp_comm_type",),
    "expert_model_parallel_size": ("model.expert_model_parallel_size",),
    "expert_tensor_parallel_size": ("model.expert_tensor_parallel_size",),
    "sequence_parallel": ("model.sequence_parallel",),
    "tp_comm_overlap": ("model.tp_comm_overlap",),
    "decoder_first_pipeline_num_layers": ("model.num_layers_in_first_pipeline_stage",),
    "decoder_last_pipeline_num_layers": ("model.num_layers_in_last_pipeline_stage",),
    "pipeline_model_parallel_layout": ("model.pipeline_model_parallel_layout",),
    "recompute_granularity": ("model.recompute_granularity",),
    "recompute_method": ("model.recompute_method",),
    "recompute_num_layers": ("model.recompute_num_layers",),
    "recompute_modules": ("model.recompute_modules",),
    "cpu_offloading_num_layers": ("model.cpu_offloading_num_layers",),
    "seq_length": ("model.seq_length",),
    "micro_batch_size": ("train.micro_batch_size",),
    "global_batch_size": ("train.global_batch_size",),
    "use_distributed_optimizer": ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"),
    "overlap_grad_reduce": ("ddp.overlap_grad_reduce",),
    "overlap_param_gather": ("ddp.overlap_param_gather",),
    "use_megatron_fsdp": ("ddp.use_megatron_fsdp",),
    "data_parallel_sharding_strategy": ("ddp.data_parallel_sharding_strategy",),
    "optimizer_cpu_offload": ("optimizer.optimizer_cpu_offload",),
    "optimizer_offload_fraction": ("optimizer.optimizer_offload_fraction",),
    "use_precision_aware_optimizer": ("optimizer.use_precision_aware_optimizer",),
    "exp_avg_dtype": ("optimizer.exp_avg_dtype",),
    "exp_avg_sq_dtype": ("optimizer.exp_avg_sq_dtype",),
    "optimizer": ("optimizer.optimizer",),
    "bf16": ("model.bf16", "optimizer.bf16"),
    "fp16": ("model.fp16", "optimizer.fp16"),
    "fp8_format": ("model.fp8",),
    "fp8_recipe": ("model.fp8_recipe",),
    "fp8_param_gather": ("model.fp8_param", "ddp.fp8_param_gather"),
    "fp4_format": ("model.fp4",),
    "fp4_recipe": ("model.fp4_recipe",),
    "fp4_param_gather": ("model.fp4_param",),
    "num_experts": ("model.num_moe_experts",),
    "moe_router_topk": ("model.moe_router_topk",),
    "moe_ffn_hidden_size": ("model.moe_ffn_hidden_size",),
    "save": ("checkpoint.save",),
    "load": ("checkpoint.load",),
    "save_interval": ("checkpoint.save_interval",),
    "train_iters": ("train.train_iters",),
    "lr": ("optimizer.lr",),
    "min_lr": ("optimizer.min_lr",),
    "weight_decay": ("optimizer.weight_decay",),
    "lr_decay_style": ("scheduler.lr_decay_style",),
    "lr_decay_iters": ("scheduler.lr_decay_iters",),
    "lr_warmup_iters": ("scheduler.lr_warmup_iters",),
    "tensorboard_dir": ("logger.tensorboard_dir",),
    "log_interval": ("logger.log_interval",),
}
"""Megatron-LM argument (argparse dest) -> the config fields it sets, as ``section.field``."""

BRIDGE_RENAMES = {"model.tp_comm_overlap": "comm_overlap.tp_comm_overlap"}
"""Where Megatron-Bridge sets a field elsewhere (``CommOverlapConfig`` applies it to the model)."""

BRIDGE_FIXED = {"ddp.grad_reduce_in_fp32": False, "mixed_precision.grad_reduce_in_fp32": False,
                "model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "te"}
"""What the megatron-bridge cost convention assumes beside the layout (``costmodels.convention.MEGATRON_BRIDGE``:
the recipes reduce gradients in bf16, and their loss is Transformer Engine's fused cross-entropy,
where Megatron-Core's default ``cross_entropy_fusion_impl`` is ``native``, ``model_parallel_config.py``)."""


BRIDGE_LAYOUT_DEFAULTS: dict[str, object] = {
    "model.virtual_pipeline_model_parallel_size": None, "model.context_parallel_size": 1,
    "model.expert_model_parallel_size": 1, "model.sequence_parallel": False,
    "comm_overlap.tp_comm_overlap": False, "model.num_layers_in_first_pipeline_stage": None,
    "model.num_layers_in_last_pipeline_stage": None, "model.pipeline_model_parallel_layout": None,
    "model.recompute_granularity": None, "model.recompute_method": None, "model.recompute_num_layers": None,
    "model.cpu_offloading": False, "model.cpu_offloading_num_layers": 0,
    "ddp.use_distributed_optimizer": False, "optimizer.use_distributed_optimizer": False,
    "ddp.overlap_grad_reduce": False, "ddp.overlap_param_gather": False, "ddp.use_megatron_fsdp": False,
    "ddp.data_parallel_sharding_strategy": "no_shard", "optimizer.optimizer_cpu_offload": False,
    "model.fp8": None, "model.fp4": None,
}
"""The value each layout field takes when the Megatron-LM arguments leave its option out (its
argparse default, ``megatron/training/arguments.py``; ``data_parallel_sharding_strategy`` and the
cpu-offload pair: Megatron-Core's config defaults). Megatron-LM starts from these; a Bridge recipe
starts from its own (``llama3_70b``'s: the distributed optimizer with param-gather overlap, 5
virtual stages), so the overrides write them out, and the recipe runs the plan's layout, not one
of its fields mixed with the recipe's others."""


def args_to_fields(tokens: list[str]) -> dict[str, object]:
    """``{section.field: value}`` of Megatron-LM argument tokens (the options in ``ARG_FIELDS``;
    flags are True, a list option keeps its list, numbers become int or float)."""
    values: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        dest = tokens[i][2:].replace("-", "_")
        j = i + 1
        while j < len(tokens) and not tokens[j].startswith("--"):
            j += 1
        given = [_number(t) for t in tokens[i + 1:j]]
        value = True if not given else (given[0] if len(given) == 1 and dest != "recompute_modules" else given)
        for field in ARG_FIELDS.get(dest, ()):
            values[field] = value
        i = j
    if "--disable-bias-linear" in tokens:
        values["model.add_bias_linear"] = False  # Megatron-LM: --disable-bias-linear stores add_bias_linear False
    if values.get("model.cpu_offloading_num_layers"):
        values["model.cpu_offloading"] = True  # validate_args sets it from the layer count
    return values


def _number(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def bridge_override_lines(megatron_tokens: list[str]) -> list[str]:
    """Megatron-Bridge ``KEY=VALUE`` overrides (``scripts/training/run_recipe.py``'s trailing overrides on
    the recipe's ``ConfigContainer``) of the Megatron-LM arguments, values as JSON: every layout field,
    at ``BRIDGE_LAYOUT_DEFAULTS`` where the arguments leave it out, plus ``BRIDGE_FIXED``."""
    fields = args_to_fields(megatron_tokens)
    values = BRIDGE_LAYOUT_DEFAULTS | {BRIDGE_RENAMES.get(k, k): v for k, v in fields.items()} | BRIDGE_FIXED
    return [f"{key}={json.dumps(value)}" for key, value in sorted(values.items())]
