"""``launch_problems``: the one rule for what the job ``autoplan launch`` writes can apply.

``plan --launchable`` filters the search space with it (``planner.search.space``) and ``launch`` refuses
a plan with it (``planner.launch.job``), so the two cannot disagree. Each rule reads the mesh
degrees plus at most one of: how model states are held, or the micro-batch count. Lifted by
issue 13: optimizer offload (FSDP2 ``CPUOffloadPolicy``), LoRA, tied embeddings under tp and pp.
"""

from __future__ import annotations

from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec

REPLAN = "re-plan with 'autoplan plan ... --launchable'"
"""The fix every refusal names: ``plan --launchable`` searches only what the job applies."""


def _or_evaluate(option: str) -> str:
    """The fix, with the ``evaluate`` option that costs a layout without the refused part."""
    return f"{REPLAN}, or cost a layout with 'autoplan evaluate ... {option}'"


def runtime_problems(training: TrainingSpec, layout: Layout) -> list[str]:
    """What the generated job applies to no model at all, one sentence each naming the field."""
    L, out = layout, []
    if L.cp > 1 and training.seq_len % (2 * L.cp):
        out.append(f"layout.cp = {L.cp}: the job splits each sequence into 2 x cp = {2 * L.cp} load-balanced "
                   f"chunks, which seq-len {training.seq_len} does not divide; pick a seq-len divisible by "
                   f"{2 * L.cp}, or " + _or_evaluate(f"--cp {L.cp // 2 or 1}"))
    if L.ep > 1 and 0 < L.hsdp_shard_degree < L.dp:
        out.append(f"layout.hsdp_shard_degree = {L.hsdp_shard_degree}: the job shards experts over all their "
                   f"data-parallel ranks, not in HSDP groups, with ep = {L.ep}; " + _or_evaluate("--ep 1"))
    if L.expert_tp and L.expert_tp != L.tp:
        out.append(f"layout.expert_tp = {L.expert_tp}: expert tensor parallelism apart from tp is not applied by the "
                   "generated job; " + _or_evaluate("without --expert-tp"))
    if L.pp > 1 and L.num_microbatches < L.pp:
        out.append(f"layout.num_microbatches = {L.num_microbatches}: torch.distributed.pipelining's schedules need "
                   f"at least pp = {L.pp} micro-batches; " + _or_evaluate("--micro-batch 1"))
    if L.activation_offload_layers:
        out.append(f"layout.activation_offload_layers = {L.activation_offload_layers}: activation offload is costed, "
                   "not applied by the generated job; " + _or_evaluate("--activation-offload-layers 0"))
    if L.recompute == "op-sac":
        out.append("layout.recompute = op-sac: torchtitan's op-level selective checkpointing is costed and "
                   "exported (torchtitan), not applied by the generated job; " + _or_evaluate("--recompute full"))
    if L.schedule == "dualpipe" and L.pp > 1:
        out.append("layout.schedule = dualpipe: torch.distributed.pipelining (2.13) has no DualPipe schedule, "
                   "so the generated job cannot run it; " + _or_evaluate("--schedule dualpipe-v --virtual-stages 2"))
    if L.tp_comm_overlap:
        out.append("layout.tp_comm_overlap = true: the generated job does not apply TP overlap (async TP needs CUDA symmetric "
                   "memory and torch.compile); " + _or_evaluate("--no-tp-comm-overlap")
                   + ", or plan with --runtime megatron or torchtitan, whose jobs enable it")
    if training.recipe.is_low_precision:
        out.append(f"training.precision = {training.precision} ({training.recipe.name}): low-precision recipes are "
                   "planned and exported (Megatron-LM, torchtitan), not applied by the generated job (their GEMMs "
                   "need Hopper or Blackwell GPUs with Transformer Engine or torchao); plan with --precision bf16 "
                   "to launch it here, or with --runtime megatron or torchtitan, whose jobs run them")
    return out


def model_problems(model: ModelSpec, layout: Layout) -> list[str]:
    """What the generated job cannot apply to autoplan's own model of ``model``."""
    L, out = layout, []
    if L.tp > 1 and (model.mla is not None or model.qk_norm or model.sandwich_norm):
        parts = [n for n, on in (("latent attention", model.mla is not None), ("q/k norms", model.qk_norm),
                                 ("sandwich norms", model.sandwich_norm)) if on]
        out.append(f"layout.tp = {L.tp}: {' and '.join(parts)} are not tensor-parallel in the generated job; "
                   + _or_evaluate("--tp 1"))
    if model.num_mtp_layers:
        out.append(f"model.num_mtp_layers = {model.num_mtp_layers}: multi-token prediction modules are not built by "
                   "the generated job; cost it with 'autoplan evaluate'")
    if model.num_kv_heads % L.tp:
        out.append(f"layout.tp = {L.tp} does not divide the {model.num_kv_heads} key/value heads; pick a divisor")
    return out


def launch_problems(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """Every part of ``layout`` the generated job cannot apply to autoplan's own ``model``."""
    return runtime_problems(training, layout) + model_problems(model, layout)
