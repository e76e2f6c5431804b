"""Layer-to-rank assignment: which layers each pipeline rank holds, and its parameter elements.

Chunk c of rank i is model stage c·pp + i (Megatron-LM's interleaved assignment, Narayanan et al.
SC'21 Sec. 2.2); the V schedules and DualPipe place chunks as ``stage_split.rank_chunks`` says.
Each chunk holds ``Layout.chunk_layers`` consecutive layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .layer_costs import LayerKey
from .layout import Layout, local_seq_len
from .memo import memoised
from .memory import ShardedParams
from .params import embedding_params, lora_params_per_layer_per_rank, mtp_expert_params, mtp_params, output_params
from .ranks import RankLayers
from .stage_split import V_SCHEDULES, rank_chunks

if TYPE_CHECKING:
    from .context import CostContext as CostModel  # what the terms read; estimate.CostModel adds the verbs


def rank_groups(cm: "CostModel", layout: Layout) -> list[tuple[RankLayers, int]]:
    """Ranks of equal signature, one representative each with its count (memoised)."""
    key = (placement(layout), layout.pp, layout.virtual_stages, layout.layers_per_chunk)
    return memoised(cm.groups_memo, key, lambda: _count_rank_groups(cm, layout))


def _count_rank_groups(cm: "CostModel", layout: Layout) -> list[tuple[RankLayers, int]]:
    counts: dict[tuple, list] = {}
    for rank in rank_layers(cm, layout):
        counts.setdefault(rank.signature, [rank, 0])[1] += 1
    return [(rank, n) for rank, n in counts.values()]


def rank_layers(cm: "CostModel", layout: Layout) -> list[RankLayers]:
    """The layers of each rank's chunks (``stage_split.rank_chunks``)."""
    key = (placement(layout), layout.pp, layout.virtual_stages, layout.layers_per_chunk)
    return memoised(cm.ranks_memo, key, lambda: _assign_rank_layers(cm, layout))


def _assign_rank_layers(cm: "CostModel", layout: Layout) -> list[RankLayers]:
    counts = layout.chunk_layers(cm.model.num_layers)
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    ranks = []
    for held in rank_chunks(layout.schedule, layout.pp, layout.virtual_stages):
        chunks = tuple((starts[k], starts[k + 1]) for k in held)
        moe = sum(cm.prefix.moe_layers(a, b) for a, b in chunks)
        dense = sum(b - a for a, b in chunks) - moe
        ranks.append(RankLayers(chunks=chunks, num_dense=dense, num_moe=moe, first=0 in held,
                                last=len(counts) - 1 in held))
    return ranks


def placement(layout: Layout) -> str:
    """How chunks sit on ranks: ``loop``, ``v`` or ``dualpipe`` (the memo key of an assignment)."""
    return schedule_placement(layout.schedule)


def schedule_placement(schedule: str) -> str:
    """``placement`` of a layout with this schedule."""
    if schedule in V_SCHEDULES:
        return "v"
    return "dualpipe" if schedule == "dualpipe" else "loop"


def rank_params(cm: "CostModel", layout: Layout, rank: RankLayers) -> ShardedParams:
    """Parameter elements on one rank: layers / tp, experts / (expert tp · ep), embedding and head."""
    key = (layout.tp, layout.ep, layout.expert_tp, layout.pp, rank)
    return memoised(cm.params_memo, key, lambda: _count_rank_params(cm, layout, rank))


def _count_rank_params(cm: "CostModel", layout: Layout, rank: RankLayers) -> ShardedParams:
    model, tp = cm.model, layout.tp
    dense = sum(cm.prefix.dense_params(a, b) for a, b in rank.chunks)
    expert = sum(cm.prefix.expert_params(a, b) for a, b in rank.chunks)
    if rank.first:
        dense += embedding_params(model)
    if rank.last:
        dense += output_params(model) + mtp_params(model) - mtp_expert_params(model)  # MTP follows the last layer
        expert += mtp_expert_params(model)
        if model.tied_embeddings and layout.pp > 1:
            dense += model.vocab_size * model.hidden_size  # the head keeps its own copy
    lora = 0.0  # adapters on this tensor-parallel rank
    if cm.training.is_lora:
        lora = rank.num_layers * lora_params_per_layer_per_rank(model, cm.training.lora_rank,
                                                                cm.training.lora_targets, tp)
    etp = layout.etp
    return ShardedParams(dense=dense / tp + lora, expert=expert / (etp * layout.ep),
                         trainable_dense=lora if cm.training.is_lora else dense / tp,
                         trainable_expert=0.0 if cm.training.is_lora else expert / (etp * layout.ep))


def layer_key(cm: "CostModel", layout: Layout, moe: bool) -> LayerKey:
    return LayerKey(moe=moe, b=layout.micro_batch_size, s_local=local_seq_len(cm.training, layout),
                    tp=layout.tp, sp=layout.sequence_parallel, cp=layout.cp, ep=layout.ep if moe else 1,
                    etp=layout.expert_tp if cm.model.moe is not None else 0,
                    tp_overlap=layout.tp_comm_overlap and layout.sequence_parallel and layout.tp > 1,
                    dispatcher=layout.moe_dispatcher if moe else "alltoall")


def recomputed_layers(cm: "CostModel", layout: Layout, n: int) -> int:
    if layout.recompute != "full":
        return 0
    if layout.recompute_num_layers == 0:
        return n
    return min(layout.recompute_num_layers * layout.virtual_stages, n)
