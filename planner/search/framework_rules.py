"""What each framework's own job cannot run as costed, beyond what its capability table says.

Two halves, one home for each rule:

- ``layout_rule_problems``: rules that read the layout (its mesh degrees plus at most one of how
  model states are held, or the schedule choice: micro-batching, recomputation, sequence
  parallelism, TP overlap). The search applies them to every mesh, state and schedule choice
  (``planner.search.space``), so ``plan`` never offers a layout its runtime's job refuses.
- ``job_rule_problems``: rules on the model and training alone (precision recipe, LoRA, model
  features), which no layout changes.

``planner.launch.export_problems`` joins both to the capability table's own check; autoplan's own
job (runtime ``torch``) has its rule in ``planner.search.launchable``.
"""

from __future__ import annotations

from costmodels.capabilities import capabilities
from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec

from .launchable import launch_problems

MEGATRON_FP8 = ("fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8", "nvfp4")
"""Recipes Megatron-LM's ``--fp8-recipe`` / ``--fp4-recipe`` name (``precision_export``)."""
TORCHTITAN_FP8 = ("fp8-tensorwise", "fp8-rowwise", "mxfp8")
"""Recipes torchtitan's ``[float8] recipe_name`` / ``[mx] recipe_name`` name (``precision_export``)."""
TORCHTITAN_CLI_VERSIONS = ("v0.3.0",)
"""torchtitan releases whose job is a command line (``--module``/``--config`` of a registered config plus
overrides, ``planner.launch.torchtitan_cli``); earlier ones read the TOML of ``frameworks.torchtitan_config``."""
TORCHTITAN_030_MOE = "torchtitan v0.3.0's MoE configs are qwen3_30b_a3b, deepseek_v3_16b/671b and gpt_oss_20b/120b"
"""Its registered MoE jobs (``models/{qwen3,deepseek_v3,gpt_oss}/config_registry.py``)."""
TORCHTITAN_030_CONFIGS = {(32, 4096, 32, 8, 14336, 128256): "llama3_8b", (80, 8192, 64, 8, 28672, 128256): "llama3_70b"}
"""(layers, hidden, heads, kv heads, FFN hidden, vocabulary) -> the torchtitan 0.3.0 config registered for that
Llama 3 shape whose model spec is the plain bf16 model (``torchtitan/models/llama3/config_registry.py``: the
``model_registry("8B")`` / ``("70B")`` flavors of ``models/llama3/__init__.py``)."""
TORCHTITAN_030_REBUILT = {(126, 16384, 128, 8, 53248, 128256): "405B"}
"""Shapes whose registered 0.3.0 config is not the plain bf16 model -> the flavor the job's own config
registry builds instead (``planner.launch.torchtitan_cli``). ``llama3_405b``'s model spec carries a
``Float8LinearConverter`` (tensorwise, ``filter_fqns=["lm_head"]``), which the command line cannot remove
(``Trainer.Config.model_spec`` is ``tyro.conf.Suppress``ed) and which refuses to build below SM89."""


def _fractional_rope(model: ModelSpec, runtime: str) -> list[str]:
    """Megatron-LM's ``--rotary-base`` and Megatron-DeepSpeed's ``--rotary-position-embeddings-theta``
    are ``type=int`` (their ``arguments.py``)."""
    if model.positions == "rotary" and model.rope_theta != int(model.rope_theta):
        return [f"model.rope_theta = {model.rope_theta:g}: {runtime}'s rotary base is an integer option"]
    return []


def _megatron_job(model: ModelSpec, training: TrainingSpec) -> list[str]:
    out = _fractional_rope(model, "Megatron-LM")
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
    recipe = training.recipe
    if recipe.is_low_precision and recipe.name not in MEGATRON_FP8:
        out.append(f"training.precision: recipe {recipe.name} has no Megatron --fp8-recipe (tensorwise, delayed, "
                   "mxfp8, blockwise)")
    return out


def _megatron_layout(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """Megatron-LM / Megatron-Bridge: what the Megatron-Core options cannot state as costed."""
    L, out, recipe = layout, [], training.recipe
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
    return out + _megatron_moe_comm(model, training, L)


def _megatron_moe_comm(model: ModelSpec, training: TrainingSpec, L: Layout) -> list[str]:
    """What Megatron-Core's ``TransformerConfig.__post_init__`` refuses of the EP overlap and the flex
    dispatcher (``megatron/core/transformer/transformer_config.py``, NVIDIA/Megatron-LM d98e8a64)."""
    out = []
    if L.ep_comm_overlap and L.recompute == "full":
        out.append("layout.ep_comm_overlap with recompute full: Megatron-Core asserts 'disable full recomputation "
                   "when enabling overlap_moe_expert_parallel_comm'")
    if L.ep_comm_overlap and training.precision == "fp32":
        out.append("layout.ep_comm_overlap with fp32: Megatron-Core runs the EP overlap with a bf16 or fp16 model only")
    if L.moe_dispatcher == "deepep" and model.moe is not None and model.moe.pad_to_capacity:
        out.append("layout.moe_dispatcher = deepep: the flex dispatcher's DeepEP backend does not support "
                   "moe_pad_expert_input_to_capacity")
    return out


def _torchtitan_job(model: ModelSpec, training: TrainingSpec) -> list[str]:
    out, recipe = [], training.recipe
    if recipe.is_low_precision and recipe.name not in TORCHTITAN_FP8:
        out.append(f"training.precision: recipe {recipe.name}: torchtitan runs {', '.join(TORCHTITAN_FP8)} only")
    if training.precision == "fp16":
        out.append("training.precision = fp16: torchtitan's mixed_precision_param is bfloat16 or float32")
    if training.is_lora:
        out.append(f"training.lora_rank = {training.lora_rank}: torchtitan trains no LoRA adapters")
    if training.attention == "eager":
        out.append("training.attention = eager: torchtitan's llama3 attends through SDPA or FlexAttention, "
                   "never materialising the scores as costed")
    out += _torchtitan_llama3(model)
    return out


def llama3_shape(model: ModelSpec) -> tuple[int, ...]:
    """The key of ``TORCHTITAN_030_CONFIGS``: (layers, hidden, heads, kv heads, FFN hidden, vocabulary)."""
    return (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
            model.ffn_hidden_size, model.vocab_size)


def _torchtitan_030_job(model: ModelSpec, training: TrainingSpec) -> list[str]:
    """What torchtitan 0.3.0's command line cannot state: the model is a registered config's shape,
    and a low-precision converter sits in a config's model spec, not in an option."""
    out = []
    if training.recipe.is_low_precision:
        out.append(f"training.precision = {training.precision}: torchtitan v0.3.0 sets FP8/MX converters in a "
                   "registered config's model spec, which its command line cannot change")
    shape = llama3_shape(model)
    if shape not in TORCHTITAN_030_CONFIGS and shape not in TORCHTITAN_030_REBUILT:
        out.append(f"model: torchtitan v0.3.0 registers no llama3 config of this shape ({model.num_layers} layers, "
                   f"hidden {model.hidden_size}; it has llama3_8b, llama3_70b and llama3_405b)")
    return out


def _torchtitan_llama3(model: ModelSpec) -> list[str]:
    """What torchtitan v0.2.2's ``llama3`` model (the one the exported TOML names: ``model/args.py``
    ``TransformerModelArgs``, ``model/model.py``) cannot be: it is dense, RMSNorm, rotary, SiLU-gated,
    without biases or q/k norms, with head dim = dim / n_heads and an untied output head."""
    parts = [what for what, off in (
        ("mixture-of-experts layers", model.moe is not None), ("LayerNorm", model.norm != "rmsnorm"),
        ("learned positions", model.positions != "rotary"), ("linear biases", model.linear_bias or model.qkv_bias),
        ("a non-gated or non-SiLU MLP", not model.gated_mlp or model.activation != "silu"),
        ("q/k norms", model.qk_norm), ("tied embeddings", model.tied_embeddings),
        (f"head dim {model.d_head} apart from hidden / heads", model.d_head * model.num_attention_heads
         != model.hidden_size),
        ("latent attention", model.mla is not None), ("sliding windows", bool(model.sliding_window)),
        ("sandwich norms", model.sandwich_norm), ("multi-token prediction", bool(model.num_mtp_layers))) if off]
    if not parts:
        return []
    moe = f" ({TORCHTITAN_030_MOE}: other architectures, not exported)" if model.moe is not None else ""
    return [f"model: torchtitan's llama3, the model its job names, has no {', '.join(parts)} ({model.name}){moe}"]


def _torchtitan_030_layout(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """torchtitan 0.3.0 has no ``context_parallel_rotate_method``: its llama3 configs attend with
    FlexAttention, whose cp wrapper all-gathers K/V (``distributed/context_parallel/api.py``)."""
    if layout.cp > 1 and training.context_attention == "ring":
        return [f"layout.cp = {layout.cp} with ring attention: torchtitan v0.3.0's llama3 all-gathers K/V across "
                "the cp ranks; plan with --cp-attention all_gather"]
    return []


def _torchtitan_layout(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    L, out = layout, []
    if L.zero_stage == 0 and L.dp > 1 and L.world_size > L.dp:
        out.append("layout.zero_stage = 0: torchtitan's DDP runs only without other parallelism "
                   "(parallelize.py: 'DDP has not supported > 1D parallelism')")
    if L.zero_stage == 0 and L.cp > 1:
        out.append(f"layout.zero_stage = 0 with cp {L.cp}: torchtitan shards with FSDP over the cp ranks whenever "
                   "cp > 1 (distributed/parallel_dims.py: fsdp_enabled is dp_shard > 1 or cp > 1)")
    if L.ep > 1 and L.etp not in (1, L.tp):
        out.append(f"layout.expert_tp = {L.expert_tp}: torchtitan supports expert tp = tp or 1 only")
    if L.tp > 1 and not L.sequence_parallel:
        out.append("layout.sequence_parallel = false: torchtitan always applies sequence parallelism with tp")
    if L.recompute == "full" and L.recompute_num_layers:
        out.append("layout.recompute_num_layers: torchtitan's full checkpointing wraps every block")
    if L.activation_offload_layers:
        out.append("layout.activation_offload_layers: torchtitan has no activation offload")
    if L.tp_comm_overlap and not training.compiled:
        out.append("layout.tp_comm_overlap: torchtitan's async TP needs torch.compile, which changes what is costed; "
                   "plan a compiled job or drop the overlap")
    return out


def _deepspeed_job(model: ModelSpec, training: TrainingSpec) -> list[str]:
    out = _fractional_rope(model, "Megatron-DeepSpeed")
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


def _deepspeed_layout(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    L, out = layout, []
    counts = L.chunk_layers(model.num_layers)
    if L.pp > 1 and len(set(counts)) > 1:
        out.append(f"layout.layers_per_chunk = {','.join(map(str, counts))}: Megatron-DeepSpeed splits the "
                   "transformer layers evenly over stages (partition_method type:transformer)")
    if L.activation_offload_layers:
        out.append("layout.activation_offload_layers: Megatron-DeepSpeed has no layer activation offload")
    return out


_JOB_RULES = {"megatron": _megatron_job, "megatron-bridge": _megatron_job, "torchtitan": _torchtitan_job,
              "deepspeed": _deepspeed_job}
_LAYOUT_RULES = {"megatron": _megatron_layout, "megatron-bridge": _megatron_layout, "torchtitan": _torchtitan_layout,
                 "deepspeed": _deepspeed_layout, "torch": launch_problems}
SCHEDULE_READS: dict[str, tuple[str, ...]] = {
    "megatron": ("recompute", "virtual_stages", "sequence_parallel", "ep_comm_overlap"),
    "megatron-bridge": ("recompute", "virtual_stages", "sequence_parallel", "ep_comm_overlap"),
    "torchtitan": ("recompute", "sequence_parallel", "tp_comm_overlap"),
    "deepspeed": ("virtual_stages", "layers_per_chunk"),
    "torch": ("num_microbatches", "recompute", "schedule", "tp_comm_overlap"),
}
"""The schedule-choice fields (``planner.search.space.ScheduleChoice``) each runtime's layout rule
reads: two choices of one mesh and state that agree on these get the same answer, so the search asks
the rule once per value of them (``planner.search.schedule_rules``). ``tests/test_schedule_rules.py``
changes every other field and checks that no answer moves."""
MESH_READS: dict[str, tuple[str, ...]] = {
    "megatron": ("tp", "pp", "ep", "moe_dispatcher"),
    "megatron-bridge": ("tp", "pp", "ep", "moe_dispatcher"),
    "torchtitan": ("dp", "tp", "pp", "cp", "ep"),
    "deepspeed": ("pp",),
    "torch": ("dp", "tp", "pp", "cp", "ep"),
}
"""The mesh fields (``planner.search.space.MeshChoice``) each runtime's layout rule reads: two meshes
that agree on these, with one state and one schedule choice, get the same answer, so the search keeps
one set of answers for them (``planner.search.schedule_rules.SharedRuleChecks``).
``tests/test_schedule_rules.py`` changes every other mesh field and checks that no answer moves."""


_RELEASE_JOB_RULES = {("torchtitan", "v0.3.0"): _torchtitan_030_job}
_RELEASE_LAYOUT_RULES = {("torchtitan", "v0.3.0"): _torchtitan_030_layout}
"""Rules of one release's job on top of its runtime's (``version`` None: the capability table's latest)."""


def _release(runtime: str, version: str | None) -> tuple[str, str]:
    """(runtime, release) with ``version`` None read as the capability table's latest."""
    if runtime not in _JOB_RULES:
        return runtime, ""
    return runtime, version or capabilities(runtime).latest


def job_rule_problems(runtime: str, model: ModelSpec, training: TrainingSpec, version: str | None = None) -> list[str]:
    """What ``runtime``'s job (of release ``version``, None: the latest) cannot run of ``model`` and
    ``training`` at any layout, one sentence each naming the field (the torch job's are inside
    ``launch_problems``)."""
    rule, release = _JOB_RULES.get(runtime), _RELEASE_JOB_RULES.get(_release(runtime, version))
    return (rule(model, training) if rule else []) + (release(model, training) if release else [])


RUNTIME_ORDER = ("megatron", "megatron-bridge", "torchtitan", "deepspeed", "torch")
"""The runtimes a refusal may point to, in the order it names them (``costmodels.capabilities``)."""


def _torch_job(model: ModelSpec, training: TrainingSpec) -> list[str]:
    """What autoplan's own job cannot run at any layout (``launchable.runtime_problems``, ``model_problems``)."""
    out = []
    if training.recipe.is_low_precision:
        out.append(f"training.precision = {training.precision}: the generated job applies no low-precision recipe")
    if model.num_mtp_layers:
        out.append("model.num_mtp_layers: the generated job builds no multi-token prediction modules")
    return out


def runtimes_that_run(model: ModelSpec, training: TrainingSpec) -> tuple[str, ...]:
    """The runtimes whose job can run ``model`` with ``training`` at some layout (no job rule refuses it)."""
    rules = {**_JOB_RULES, "torch": _torch_job}
    return tuple(r for r in RUNTIME_ORDER if not rules[r](model, training))


def runtime_refusal(runtime: str, model: ModelSpec, training: TrainingSpec, version: str | None = None) -> str | None:
    """One line saying why ``runtime``'s job (of release ``version``, None: the latest) cannot run
    ``model`` with ``training`` at any layout and which runtime can (None when it can): what ``plan``
    refuses before searching, so that no layout it offers is refused by ``launch`` for the model or
    training alone. Another release of the same runtime that runs it is named too."""
    problems = job_rule_problems(runtime, model, training, version) if runtime != "torch" else \
        _torch_job(model, training)
    if not problems:
        return None
    others = [f"--runtime {r}" for r in runtimes_that_run(model, training) if r != runtime]
    if runtime in _JOB_RULES:
        table = capabilities(runtime)
        others += [f"--runtime {runtime} --runtime-version {v}" for v in reversed(table.versions)
                   if v != (version or table.latest) and not job_rule_problems(runtime, model, training, v)][:1]
    fix = f"plan with {' or '.join(others)}" if others else "no runtime autoplan knows runs it"
    return f"--runtime {runtime}{'' if version is None else ' --runtime-version ' + version} cannot run this job: " \
           f"{problems[0]}; {fix}"


def layout_rule_problems(runtime: str, model: ModelSpec, training: TrainingSpec, layout: Layout,
                         version: str | None = None) -> list[str]:
    """What ``runtime``'s job (of release ``version``, None: the latest) cannot run of ``layout`` as
    costed, beyond its capability table, one sentence each naming the field; for ``torch`` every rule
    of ``launch_problems``."""
    release = _RELEASE_LAYOUT_RULES.get(_release(runtime, version))
    return _LAYOUT_RULES[runtime](model, training, layout) + (release(model, training, layout) if release else [])
