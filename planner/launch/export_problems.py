"""``export_problems``: what of a layout a runtime's own job cannot run as it was costed.

The search asks it so that it never offers such a layout for that runtime, and each exporter
raises ``PlanFileError`` with its first line (``require_exportable``), so nothing costed is dropped
or rewritten silently. The runtime's capability table (``costmodels.capabilities``) says which
degrees, ZeRO stages, schedules, recomputation modes and overlaps it runs; the rules here add what
the table does not hold: model features, precision recipes and options whose meaning differs.
"""

from __future__ import annotations

from costmodels.capabilities import RuntimeCapabilities, capabilities
from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec
from planner.plan.plan_file import PlanFileError
from planner.search.launchable import launch_problems

_DEGREE_VALUES = {"tp": lambda L: L.tp > 1, "pp": lambda L: L.pp > 1, "cp": lambda L: L.cp > 1,
                  "ep": lambda L: L.ep > 1, "expert_tp": lambda L: bool(L.expert_tp) and L.expert_tp != L.tp,
                  "virtual_stages": lambda L: L.virtual_stages > 1}
"""Whether a layout uses each degree of ``capabilities.DEGREES``."""

MEGATRON_FP8 = ("fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8", "nvfp4")
"""Recipes Megatron-LM's ``--fp8-recipe`` / ``--fp4-recipe`` name (``precision_export``)."""
TORCHTITAN_FP8 = ("fp8-tensorwise", "fp8-rowwise", "mxfp8")
"""Recipes torchtitan's ``[float8] recipe_name`` / ``[mx] recipe_name`` name (``precision_export``)."""


def _table_problems(table: RuntimeCapabilities, layout: Layout) -> list[str]:
    """What the capability table says the runtime does not run."""
    L, name, out = layout, table.runtime, []
    for degree, used in _DEGREE_VALUES.items():
        if used(L) and not table.has(degree):
            out.append(f"layout.{degree}: {name} ({table.framework}) has no {degree} degree; plan with "
                       f"--runtime {name}, which searches only what it runs")
    stages = [s for s in table.sharding if s.zero_stage == L.zero_stage]
    hsdp = L.zero_stage > 0 and 0 < L.hsdp_shard_degree < L.dp
    if not stages:
        out.append(f"layout.zero_stage = {L.zero_stage}: {name} runs ZeRO stages "
                   f"{', '.join(map(str, table.zero_stages))} only")
    elif L.pp > 1 and not any(s.pipelined for s in stages):
        out.append(f"layout.zero_stage = {L.zero_stage} with pp {L.pp}: {name} runs it only without pipelining "
                   f"({stages[0].option})")
    elif hsdp and not any(s.hsdp for s in stages):
        out.append(f"layout.hsdp_shard_degree = {L.hsdp_shard_degree}: {name} has no hybrid sharding at ZeRO stage "
                   f"{L.zero_stage}")
    if L.pp > 1 and not table.has(L.schedule):
        out.append(f"layout.schedule = {L.schedule}: {name} runs {', '.join(table.names('schedules'))} only")
    if L.recompute not in table.names("recompute"):
        out.append(f"layout.recompute = {L.recompute}: {name} runs {', '.join(table.names('recompute'))} only")
    for overlap, on in (("tp_comm_overlap", L.tp_comm_overlap), ("optimizer_offload", L.optimizer_offload)):
        if on and not table.has(overlap):
            out.append(f"layout.{overlap} = true: {name} has no such option")
    return out


def _megatron_model_problems(model: ModelSpec, training: TrainingSpec) -> list[str]:
    out = []
    if model.gated_mlp and model.activation != "silu":
        out.append(f"model.activation = {model.activation}: Megatron's gated MLP (--swiglu) is SiLU-gated only")
    if model.sliding_window:
        out.append("model.sliding_window: the export does not write Megatron's window attention options")
    if model.sandwich_norm:
        out.append("model.sandwich_norm: Megatron's GPT model has no norms after attention and MLP")
    if model.moe is not None and model.moe.shared_expert_gate:
        out.append("model.moe.shared_expert_gate: not written by the export (Qwen2-MoE's shared-expert gate)")
    if training.is_lora:
        out.append(f"training.lora_rank = {training.lora_rank}: pretrain_gpt.py trains no LoRA adapters")
    return out


def _megatron_problems(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """Megatron-LM / Megatron-Bridge: what the Megatron-Core options cannot state as costed."""
    L, out = layout, _megatron_model_problems(model, training)
    recipe = training.recipe
    if recipe.is_low_precision and recipe.name not in MEGATRON_FP8:
        out.append(f"training.precision: recipe {recipe.name} has no Megatron --fp8-recipe (tensorwise, delayed, "
                   "mxfp8, blockwise)")
    if recipe.is_low_precision and recipe.optimizer_moment_bytes == 2 and L.zero_stage != 1:
        out.append("training.precision: bf16 Adam moments need Megatron's distributed optimizer "
                   "(--use-precision-aware-optimizer), i.e. layout.zero_stage = 1")
    if L.recompute == "full" and L.recompute_num_layers and L.virtual_stages > 1:
        out.append("layout.recompute_num_layers with virtual stages: Megatron's block recomputation counts "
                   "layers per virtual chunk, the plan per stage; use 0 (all layers)")
    if L.activation_offload_layers and L.recompute != "none":
        out.append("layout.activation_offload_layers: Megatron-Core's cpu_offloading refuses recomputation")
    if L.optimizer_offload and L.zero_stage != 1:
        out.append("layout.optimizer_offload: --optimizer-cpu-offload needs the distributed optimizer (zero_stage 1)")
    if L.optimizer_offload and recipe.is_low_precision and recipe.name != "fp8-delayed":
        out.append("layout.optimizer_offload: Megatron's optimizer offload with quantised parameter gathers "
                   "needs --fp8-recipe delayed")
    if L.ep > 1 and L.tp > 1 and not L.sequence_parallel:
        out.append("layout.sequence_parallel = false: Megatron requires sequence parallelism with ep and tp > 1")
    if L.zero_stage in (2, 3) and model.tied_embeddings and L.pp > 1:
        out.append("layout.zero_stage: Megatron-FSDP with tied embeddings under pp is not run")
    return out


def _torchtitan_problems(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    L, out, recipe = layout, [], training.recipe
    if L.zero_stage == 0 and L.dp > 1 and L.world_size > L.dp:
        out.append("layout.zero_stage = 0: torchtitan's DDP runs only without other parallelism "
                   "(parallelize.py: 'DDP has not supported > 1D parallelism')")
    if L.ep > 1 and L.etp not in (1, L.tp):
        out.append(f"layout.expert_tp = {L.expert_tp}: torchtitan supports expert tp = tp or 1 only")
    if L.tp > 1 and not L.sequence_parallel:
        out.append("layout.sequence_parallel = false: torchtitan always applies sequence parallelism with tp")
    if L.recompute == "full" and L.recompute_num_layers:
        out.append("layout.recompute_num_layers: torchtitan's full checkpointing wraps every block")
    if L.activation_offload_layers:
        out.append("layout.activation_offload_layers: torchtitan has no activation offload")
    if recipe.is_low_precision and recipe.name not in TORCHTITAN_FP8:
        out.append(f"training.precision: recipe {recipe.name}: torchtitan runs {', '.join(TORCHTITAN_FP8)} only")
    if training.precision == "fp16":
        out.append("training.precision = fp16: torchtitan's mixed_precision_param is bfloat16 or float32")
    if L.tp_comm_overlap and not training.compiled:
        out.append("layout.tp_comm_overlap: torchtitan's async TP needs torch.compile, which changes what is costed; "
                   "plan a compiled job or drop the overlap")
    if training.is_lora:
        out.append(f"training.lora_rank = {training.lora_rank}: torchtitan trains no LoRA adapters")
    if model.mla is not None or model.sliding_window or model.sandwich_norm or model.num_mtp_layers:
        out.append("model: latent attention, sliding windows, sandwich norms and MTP are not in the llama3 "
                   "model torchtitan's config names")
    return out


def _deepspeed_problems(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    L, out = layout, []
    counts = L.chunk_layers(model.num_layers)
    if L.pp > 1 and len(set(counts)) > 1:
        out.append(f"layout.layers_per_chunk = {','.join(map(str, counts))}: Megatron-DeepSpeed splits the "
                   "transformer layers evenly over stages (partition_method type:transformer)")
    if L.activation_offload_layers:
        out.append("layout.activation_offload_layers: Megatron-DeepSpeed has no layer activation offload")
    if training.recipe.is_low_precision:
        out.append(f"training.precision = {training.precision}: the DeepSpeed JSON has no FP8/FP4 switch")
    if training.is_lora:
        out.append(f"training.lora_rank = {training.lora_rank}: Megatron-DeepSpeed trains no LoRA adapters")
    if (model.mla is not None or model.qk_norm or model.sliding_window or model.sandwich_norm
            or model.num_mtp_layers or (model.moe is not None and (model.moe.num_shared_experts
                                                                    or not all(map(model.is_moe_layer,
                                                                                   range(model.num_layers)))))):
        out.append("model: latent attention, q/k norms, sliding windows, sandwich norms, MTP, shared experts and "
                   "dense layers among MoE ones are not Megatron-DeepSpeed GPT options")
    if model.gated_mlp and model.activation != "silu":
        out.append(f"model.activation = {model.activation}: Megatron-DeepSpeed's --swiglu is SiLU-gated only")
    return out


_RULES = {"megatron": _megatron_problems, "megatron-bridge": _megatron_problems,
          "torchtitan": _torchtitan_problems, "deepspeed": _deepspeed_problems}


def export_problems(runtime: str, model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """Every part of ``layout`` (with ``model`` and ``training``) that ``runtime``'s exported job cannot
    run as costed, one sentence each naming the field; empty when the job runs it exactly.
    ``torch`` is autoplan's own job: ``planner.search.launchable.launch_problems``."""
    if runtime == "torch":
        return launch_problems(model, training, layout)
    return _table_problems(capabilities(runtime), layout) + _RULES[runtime](model, training, layout)


def require_exportable(runtime: str, model: ModelSpec, training: TrainingSpec, layout: Layout) -> None:
    """Raise ``PlanFileError`` with the first of ``export_problems``, if any."""
    problems = export_problems(runtime, model, training, layout)
    if problems:
        raise PlanFileError(f"{problems[0]} (the {runtime} job cannot run it as costed)")
