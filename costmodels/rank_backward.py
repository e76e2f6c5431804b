"""One rank's ``backward_peak.BackwardTerms`` from the cost model: what its eager backward holds
beyond the forward's saved activations, and its largest local gradient for the clip."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import activations as act
from . import backward_peak
from .layout import Layout
from .memory import ShardedParams
from .params import embedding_params, output_params
from .ranks import RankLayers

if TYPE_CHECKING:
    from .context import CostContext as CostModel


def backward_terms(cm: "CostModel", layout: Layout, rank: RankLayers, params: ShardedParams, *,
                   x: act.ActivationShape, grads_bytes: float, layer_saved_bytes: float,
                   recompute_bytes: float) -> backward_peak.BackwardTerms:
    """The terms of ``rank``: its gradients split in proportion to its trainable parameter elements
    (one state-bytes rule holds for all of them; under LoRA only the adapters have gradients, spread
    evenly over the layers); the layer transient with the weight-gradient cast where the job runs
    under ``torch.autocast`` (``ActivationShape.autocast``: no data parallelism, so no FSDP2 buffer
    holds the 16-bit gradients) and full training; accumulating when gradients are held."""
    model, lora = cm.model, cm.training.is_lora
    trainable = params.trainable_dense + params.trainable_expert
    per_element = grads_bytes / trainable if trainable and not lora else 0.0
    tied_here = model.tied_embeddings and rank.first and rank.last
    head = output_params(model) + (model.vocab_size * model.hidden_size if tied_here else 0)
    accumulating = cm.convention.grads_held(layout.num_microbatches)
    transient = backward_peak.layer_transient_bytes(model, x, weight_cast=x.autocast and not lora,
                                                    accumulating=accumulating) if rank.num_layers else 0.0
    clip = backward_peak.clip_square_bytes(largest_local_elements(cm, layout, rank)) \
        if cm.convention.clip_squares_gradients and not lora else 0.0
    if lora:
        layer_grads = grads_bytes / rank.num_layers if rank.num_layers else 0.0
    else:
        layer_grads = per_element * cm.prefix.largest_layer / layout.tp if rank.num_layers else 0.0
    return backward_peak.BackwardTerms(
        layer_transient_bytes=transient, layer_saved_bytes=layer_saved_bytes, recompute_bytes=recompute_bytes,
        layer_grads_bytes=layer_grads,
        head_grads_bytes=per_element * head / layout.tp if rank.last else 0.0,
        embedding_grads_bytes=per_element * embedding_params(model) / layout.tp if rank.first and not tied_here else 0.0,
        loss_kept_bytes=act.last_stage_logits_bytes(model, x) if rank.last else 0.0,
        clip_bytes=clip)


def largest_local_elements(cm: "CostModel", layout: Layout, rank: RankLayers) -> float:
    """Elements of the largest single parameter tensor this rank holds, as the torch job shards it:
    tensor parallelism splits every matrix and the vocabulary tables t ways, expert parallelism the
    stacked expert weights [E, f, h] ep ways, and FSDP2 (ZeRO ≥ 1) each tensor's first dimension
    over the dp · cp shard group."""
    model, t = cm.model, layout.tp
    h = model.hidden_size
    sizes = [max(model.ffn_hidden_size, model.q_dim) * h / t] if rank.num_dense else []
    if rank.num_moe and model.moe is not None:
        sizes.append(model.moe.num_experts / layout.ep * model.moe.expert_ffn_hidden_size * h / layout.etp)
    if rank.first or (rank.last and (not model.tied_embeddings or layout.pp > 1)):
        sizes.append(model.vocab_size * h / t)
    shard = layout.zero_shard_degree * layout.cp if layout.zero_stage else 1
    return max(sizes, default=0.0) / shard
