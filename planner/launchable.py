"""``launch_problems``: the one rule for what the job ``autoplan launch`` writes can apply.

``plan --launchable`` filters the search space with it (``planner.space``) and ``launch`` refuses
a plan with it (``planner.emit.job``), so the two cannot disagree. Each rule reads the mesh
degrees plus at most one of: how model states are held (offload), or the micro-batch count.
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
    if L.optimizer_offload:
        out.append("layout.optimizer_offload: optimizer offload is not applied by the generated job; "
                   + _or_evaluate("without --offload"))
    if L.pp > 1 and L.num_microbatches < L.pp:
        out.append(f"layout.num_microbatches = {L.num_microbatches}: torch.distributed.pipelining's schedules need "
                   f"at least pp = {L.pp} micro-batches; " + _or_evaluate("--micro-batch 1"))
    if training.lora_rank:
        out.append(f"training.lora_rank = {training.lora_rank}: LoRA is not applied by the generated job")
    return out


def model_problems(model: ModelSpec, layout: Layout) -> list[str]:
    """What the generated job cannot apply to autoplan's own model of ``model``."""
    L, out = layout, []
    if model.tied_embeddings and L.pp > 1:
        out.append(f"layout.pp = {L.pp}: {model.name} ties input and output embeddings, which separate pipeline "
                   "stages cannot share; " + _or_evaluate("--pp 1"))
    if model.tied_embeddings and L.tp > 1:
        out.append(f"layout.tp = {L.tp}: tied embeddings are not split by the generated job; " + _or_evaluate("--tp 1"))
    if model.num_kv_heads % L.tp:
        out.append(f"layout.tp = {L.tp} does not divide the {model.num_kv_heads} key/value heads; pick a divisor")
    return out


def launch_problems(model: ModelSpec, training: TrainingSpec, layout: Layout) -> list[str]:
    """Every part of ``layout`` the generated job cannot apply to autoplan's own ``model``."""
    return runtime_problems(training, layout) + model_problems(model, layout)
