"""Per-rank memory: model states as ZeRO holds them, activations saved per micro-batch,
communication buffers, and the device memory of a pipeline rank at the schedule's peak."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import activations as act
from . import reserved
from .backward_peak import peak_phase
from .assignment import layer_key, rank_params, recomputed_layers
from .breakdown import StageMemory
from .layout import Layout, local_micro_batch_tokens
from .collectives_tp_overlap import symmetric_workspace_bytes, userbuffer_bytes
from .memo import memoised
from .memory import ShardedParams, held_state_bytes
from .offload import activation_offload_share, host_state_bytes
from .moe_overlap import merged_extra_layers
from .pipeline import (chunks_per_rank, first_chunk_microbatches, head_microbatches, in_flight_microbatches,
                       logits_microbatches)
from .precision import cached_weight_copy_bytes
from .ranks import RankLayers, RankStatic

if TYPE_CHECKING:
    from .context import CostContext as CostModel  # what the terms read; estimate.CostModel adds the verbs


def shard_degrees(cm: "CostModel", layout: Layout) -> tuple[int, int]:
    """ZeRO shard degree for dense states (HSDP group or dp, times cp) and for expert states: the
    replicas of each expert shard, tp · cp · dp / (ep · expert tp) (dense // ep when expert tp = tp)."""
    dense = layout.zero_shard_degree * layout.cp
    return dense, max(1, dense * layout.tp // (layout.ep * layout.etp))


def stepped_params(cm: "CostModel", layout: Layout, params: ShardedParams) -> float:
    """Trainable parameters whose optimizer step this rank runs: its ZeRO shard from stage 1 on."""
    z, z_e = shard_degrees(cm, layout)
    return params.trainable_dense / (z if layout.zero_stage else 1) + \
        params.trainable_expert / (z_e if layout.zero_stage else 1)


def rank_static(cm: "CostModel", layout: Layout, rank: RankLayers) -> RankStatic:
    params = rank_params(cm, layout, rank)
    p, g, o = held_states(cm, layout, params)
    stored, working = rank_activation_parts(cm, layout, rank)
    host = host_state_bytes(stepped_params(cm, layout, params), cm.states) if layout.optimizer_offload else 0.0
    buffer_parts = rank_buffer_parts(cm, layout, rank, params)
    x = activation_shape(cm, layout)
    return RankStatic(params_bytes=p, grads_bytes=g, optimizer_bytes=o, host_bytes=host,
                       buffers_bytes=sum(v for _, v in buffer_parts), buffer_parts=buffer_parts,
                       stored_per_microbatch_bytes=stored, working_bytes=working,
                       received_per_microbatch_bytes=received_saved_bytes(cm, layout, rank),
                       largest_block_bytes=act.largest_block_bytes(cm.model, x, last=rank.last),
                       backward=eager_backward_terms(cm, layout, rank, params, x, g))


def eager_backward_terms(cm: "CostModel", layout: Layout, rank: RankLayers, params: ShardedParams,
                         x: act.ActivationShape, grads_bytes: float):
    """``rank_backward.backward_terms`` under a convention with eager activations, else None (the
    peak is the activations' and the held gradients', ``grads_live_at_peak``)."""
    if not cm.convention.eager_activations:
        return None
    from .rank_backward import backward_terms

    largest = layers_saved_bytes(cm, layout, rank, x)[1]
    recompute = recompute_working_bytes(cm, layout, x, rank.num_moe > 0)
    return backward_terms(cm, layout, rank, params, x=x, grads_bytes=grads_bytes, layer_saved_bytes=largest,
                          recompute_bytes=recompute)


def held_states(cm: "CostModel", layout: Layout, params: ShardedParams) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes; params include a low-precision recipe's cached quantised
    weight copies (``precision.cached_weight_copy_bytes``), made from the held shard under ZeRO-3,
    which replace the 16-bit compute parameters where the ZeRO gather moves them quantised."""
    z, z_e = shard_degrees(cm, layout)
    key = ("held", layout.zero_stage, layout.optimizer_offload, z, z_e, params)  # every input; many layouts share it
    return memoised(cm.params_memo, key, lambda: _held_states(cm, layout, params, z, z_e))


def _held_states(cm: "CostModel", layout: Layout, params: ShardedParams, z: int,
                 z_e: int) -> tuple[float, float, float]:
    p, g, o = held_state_bytes(params, cm.training, cm.convention, zero_stage=layout.zero_stage, shard_degree=z,
                               expert_shard_degree=z_e, offload=layout.optimizer_offload)
    if cm.low_precision_share:
        held = params.dense / z + params.expert / z_e if layout.zero_stage == 3 else params.dense + params.expert
        # the sharded optimizer's parameter gather is where Megatron gathers quantised (--fp8-param-gather)
        quantised = layout.zero_stage > 0 and cm.states.gathered < cm.states.param
        p += cached_weight_copy_bytes(cm.training.recipe, cm.convention, held, cm.low_precision_share,
                                      quantised_params=quantised, compute_bytes=cm.states.param)
    return p, g, o


def stage_memory(cm: "CostModel", layout: Layout, index: int, static: RankStatic) -> StageMemory:
    """Activations at the schedule's peak: in-flight micro-batches × what each leaves stored
    (divided by the chunks a rank holds: one in-flight unit is one chunk's), plus the
    recomputation working set; overhead is what the process holds outside its tensors
    (``overhead_parts``): the CUDA context, NCCL's buffers, GEMM workspaces and the allocator's
    fragmentation, which grows with the live activations and buffers and holds one block of the
    largest transient tensor (``activations.largest_block_bytes``). Under eager activations the
    peak is that of the step's phase that holds the most (``backward_peak.peak_phase``: the loss,
    a layer's backward, the optimizer step or the clip), with the activations and gradients live
    in it."""
    activations = stage_activation_bytes(layout, index, static.stored_per_microbatch_bytes, static.working_bytes,
                                         static.received_per_microbatch_bytes)
    fragmentation = reserved.fragmentation_bytes(activations + static.buffers_bytes, static.largest_block_bytes,
                                                 cm.assumptions.allocator_fragmentation)
    parts = fixed_overhead_parts(cm, layout) + (("fragmentation", fragmentation),)
    live, name = activations, "loss"
    if static.backward is not None:
        held = cm.convention.grads_held(layout.num_microbatches)
        phase = peak_phase(activations_bytes=activations, working_bytes=static.working_bytes,
                           grads_bytes=static.grads_bytes, held=held, terms=static.backward)
        live, grads, name = phase.activations_bytes, phase.grads_bytes, phase.name
    else:
        grads = grads_live_at_peak(cm, layout, static.grads_bytes, activations)
    return StageMemory(params_bytes=static.params_bytes, grads_bytes=grads, grads_freed_bytes=static.grads_bytes - grads,
                       optimizer_bytes=static.optimizer_bytes, activations_bytes=live,
                       buffers_bytes=static.buffers_bytes, overhead_bytes=sum(v for _, v in parts),
                       host_bytes=static.host_bytes, overhead_parts=parts, buffer_parts=static.buffer_parts,
                       schedule_activations_bytes=activations, peak_phase=name)


def grads_live_at_peak(cm: "CostModel", layout: Layout, grads_bytes: float, activations_bytes: float) -> float:
    """Gradient bytes live at the rank's peak. A runtime that frees gradients every step
    (``RuntimeConvention.grads_freed_each_step``) and runs one micro-batch per step reaches the
    peak of its saved activations before any gradient exists; backward then frees each layer's
    saved activations as it allocates that layer's gradients, so the step holds the larger of the
    two, not their sum: A + max(0, G − A) = max(A, G). With more micro-batches the gradients of the
    first are held while the later ones run forward (and in a persistent buffer always): A + G."""
    if cm.convention.grads_held(layout.num_microbatches):
        return grads_bytes
    return max(0.0, grads_bytes - activations_bytes)


def fixed_overhead_parts(cm: "CostModel", layout: Layout) -> tuple[tuple[str, float], ...]:
    """The overhead terms that do not grow with the tensors (``costmodels.reserved``)."""
    hardware = cm.cluster.hardware
    return (("cuda_context", float(hardware.runtime_reserved_bytes)),
            ("nccl_buffers", reserved.nccl_buffer_bytes(layout, cm.assumptions.nccl_channels)),
            ("workspaces", reserved.workspace_bytes(hardware.compute_capability)))


def fixed_overhead_bytes(cm: "CostModel", layout: Layout) -> float:
    """The sum of ``fixed_overhead_parts``."""
    return sum(v for _, v in fixed_overhead_parts(cm, layout))


def stage_activation_bytes(layout: Layout, index: int, stored_bytes: float, working_bytes: float,
                           received_bytes: float) -> float:
    """Activation bytes of pipeline rank ``index`` at the schedule's peak: in-flight chunk-micro-batches
    × what one leaves stored (``stored_bytes`` per micro-batch over the rank's chunks), less its
    receive buffers (``received_bytes`` per micro-batch, counted with the buffers), plus the
    recomputation working set (``rank_activation_parts``, ``received_saved_bytes``)."""
    in_flight = in_flight_microbatches(layout.schedule, layout.pp, index, layout.num_microbatches,
                                       layout.virtual_stages)
    chunks = chunks_per_rank(layout.schedule, layout.virtual_stages)
    received = received_bytes * _receiving_in_flight(layout, index, in_flight, chunks)
    return in_flight * stored_bytes / chunks - received + working_bytes


def _receiving_in_flight(layout: Layout, index: int, in_flight: int, chunks: int) -> float:
    """Micro-batches' worth of receive buffers among the in-flight chunk-micro-batches (the
    buffers are counted as buffers, ``received_saved_bytes``): the average share in_flight/chunks,
    or on rank 0, when the schedule fixes how many in-flight units are its first chunk's
    (``pipeline.first_chunk_microbatches``), the rest spread over its v − 1 receiving chunks."""
    first = first_chunk_microbatches(layout.schedule, layout.pp, index, layout.num_microbatches, in_flight)
    if first is None or chunks < 2:
        return in_flight / chunks
    return (in_flight - first) / (chunks - 1)


def rank_activation_parts(cm: "CostModel", layout: Layout, rank: RankLayers) -> tuple[float, float]:
    """(bytes one micro-batch leaves stored on this rank, recomputation working set).

    With full recomputation of only ``recompute_num_layers`` per stage, that share of layers
    stores its input and the rest store everything (Megatron's 'block' method). With
    ``activation_offload_layers`` that share of layers keeps nothing on the device but the one
    layer reloaded ahead of its backward (``offload.activation_offload_share``). The first
    stage adds its embedding dropout mask (on its first chunk); the last holds its head input and
    fp32 logits (and MTP modules) for the micro-batches in flight on its last chunk
    (``pipeline.head_microbatches``; the logits ``pipeline.logits_microbatches``), counted with the working set, which is at least the eager
    loss (``activations.loss_working_bytes``). Under the EP overlap the working set also holds the
    merged forward's layer beside its partner's backward (``moe_overlap.merged_extra_layers``).
    Memoised, apart from the head's micro-batches in flight (which read the schedule, pp and m): every
    way of holding model states, and every pipeline of the same micro-batch and rank, shares it; v and
    ``recompute_num_layers`` are read only through the count of recomputed layers, its key."""
    key = (layout.micro_batch_size, layout.cp, layout.tp, layout.expert_tp, layout.sequence_parallel,
           layout.recompute, recomputed_layers(cm, layout, rank.num_layers), layout.activation_offload_layers,
           layout.ep_comm_overlap, rank.signature, layout.dp * layout.cp == 1)
    stored, working, head, logits = memoised(cm.activation_memo, key,
                                             lambda: _compute_activation_parts(cm, layout, rank))
    if rank.last:
        working += (head_microbatches(layout.schedule, layout.pp, layout.num_microbatches) * (head - logits)
                    + logits_microbatches(layout.schedule, layout.pp, layout.num_microbatches) * logits)
    return stored, working


def activation_shape(cm: "CostModel", layout: Layout) -> act.ActivationShape:
    """The per-layer activation shape of ``layout``'s dense layers. A convention with
    ``autocast_without_data_parallel`` (FSDP2's job) runs mixed precision by ``torch.autocast``
    when it has no data parallelism (FSDP2's mixed-precision policy otherwise), which changes
    what is saved."""
    key = (layout.micro_batch_size, layout.cp, layout.tp, layout.sequence_parallel, layout.expert_tp,
           layout.tp_comm_overlap, layout.dp * layout.cp == 1)  # what ``layer_key(..., False)`` and autocast read
    shape = cm.shape_memo.get(key)
    if shape is None:
        x = cm.layers.shape(layer_key(cm, layout, False))
        autocast = (cm.convention.autocast_without_data_parallel and cm.training.precision != "fp32"
                    and layout.dp * layout.cp == 1)
        shape = cm.shape_memo[key] = replace(x, autocast=True) if autocast else x
    return shape  # type: ignore[return-value]


def saved_layer_bytes(cm: "CostModel", x: act.ActivationShape, moe_layer: bool, recompute: str) -> float:
    """``activations.layer_bytes`` of the job's model, memoised by its inputs: the search asks it
    for thousands of ranks that share a handful of shapes."""
    key = (x, moe_layer, recompute)
    value = cm.layer_bytes_memo.get(key)
    if value is None:
        value = cm.layer_bytes_memo[key] = act.layer_bytes(cm.model, x, moe_layer=moe_layer, recompute=recompute)
    return value


def layers_saved_bytes(cm: "CostModel", layout: Layout, rank: RankLayers,
                       x: act.ActivationShape | None = None) -> tuple[float, float]:
    """(bytes the rank's layers save for one micro-batch before any offload, the largest layer's);
    ``x``: the layout's ``activation_shape`` where the caller has it."""
    x = x or activation_shape(cm, layout)
    share = recomputed_layers(cm, layout, rank.num_layers) / max(rank.num_layers, 1)
    total = largest = 0.0
    for kind, n in ((False, rank.num_dense), (True, rank.num_moe)):
        if n == 0:
            continue
        mode_bytes = saved_layer_bytes(cm, x, kind, layout.recompute)
        if layout.recompute == "full" and share < 1.0:
            mode_bytes = share * mode_bytes + (1 - share) * saved_layer_bytes(cm, x, kind, "none")
        total += n * mode_bytes
        largest = max(largest, mode_bytes)
    return total, largest


def _compute_activation_parts(cm: "CostModel", layout: Layout,
                              rank: RankLayers) -> tuple[float, float, float, float]:
    """(stored, working set without the head's, the head's bytes, its logits' bytes) of one micro-batch:
    ``rank_activation_parts`` before the head's micro-batches in flight (0 for the head off the last rank)."""
    model = cm.model
    x = activation_shape(cm, layout)
    offloaded = activation_offload_share(layout.activation_offload_layers, rank.num_layers)
    layers, largest = layers_saved_bytes(cm, layout, rank, x)
    stored = (1.0 - offloaded) * layers
    reloaded = largest if offloaded else 0.0
    if rank.first:  # on the first chunk only: in-flight / v of its micro-batches hold it
        stored += act.first_stage_extra_bytes(model, x)
    working = unsaved_working_bytes(cm, layout, rank, x) + reloaded  # one offloaded layer back from the host
    working += merged_extra_layers(layout.ep_comm_overlap) * largest
    if not rank.last:
        return stored, working, 0.0, 0.0
    head = act.last_stage_extra_bytes(model, x) + act.mtp_bytes(model, x, recompute=layout.recompute)
    return stored, working, head, act.last_stage_logits_bytes(model, x)


def unsaved_working_bytes(cm: "CostModel", layout: Layout, rank: RankLayers,
                          x: act.ActivationShape | None = None) -> float:
    """What backward allocates beyond the saved activations, at its largest: one layer's recompute
    (``recompute_working_bytes``) or, on the last rank, the loss's backward
    (``activations.loss_working_bytes``), which runs before any layer's, so the larger of
    the two. Saved-tensor hooks do not see it (``planner.validate.compare``). ``x``: as in
    ``layers_saved_bytes``."""
    x = x or activation_shape(cm, layout)
    working = recompute_working_bytes(cm, layout, x, rank.num_moe > 0)
    return max(working, act.loss_working_bytes(cm.model, x)) if rank.last else working


def recompute_working_bytes(cm: "CostModel", layout: Layout, x: act.ActivationShape, has_moe: bool) -> float:
    """While one layer is recomputed, its full activations (full, op-sac) or its core (selective) are live."""
    if layout.recompute in ("full", "op-sac"):
        return saved_layer_bytes(cm, x, has_moe, "none")
    if layout.recompute == "selective":
        return act.attention_core_bytes(cm.model, x)
    return 0.0


def rank_buffer_bytes(cm: "CostModel", layout: Layout, rank: RankLayers, params: ShardedParams) -> float:
    """The sum of ``rank_buffer_parts``."""
    return sum(v for _, v in rank_buffer_parts(cm, layout, rank, params))


def rank_buffer_parts(cm: "CostModel", layout: Layout, rank: RankLayers,
                      params: ShardedParams) -> tuple[tuple[str, float], ...]:
    """Communication buffers and gathered copies by parallelism, the non-zero ones: data parallel
    (``_data_parallel_buffer_bytes``), the TP buffers (``tp_buffer_bytes``), pipeline send and
    receive buffers (with the convention's ``receive_buffer_per_microbatch`` one receive buffer per
    micro-batch and receiving chunk, as ``torch.distributed.pipelining`` keeps them, plus one send)."""
    B = cm.rates.elem_bytes
    tokens = local_micro_batch_tokens(cm.training, layout)
    block = B * tokens * cm.model.hidden_size
    data = _data_parallel_buffer_bytes(cm, layout, params) if layout.dp * layout.cp > 1 else 0.0
    tensor = tp_buffer_bytes(cm, layout, block) if layout.tp > 1 else 0.0
    if layout.pp > 1 and cm.convention.receive_buffer_per_microbatch:
        received = act.received_input_bytes(cm.model, activation_shape(cm, layout))
        pipeline = (layout.num_microbatches * receiving_chunks(layout, rank) + 1) * received
    elif layout.pp > 1:
        pipeline = 2 * block * (1 / layout.tp if layout.sequence_parallel else 1.0)
    else:
        pipeline = 0.0
    parts = (("data_parallel", data), ("tensor_parallel", tensor), ("pipeline", pipeline))
    return tuple((name, value) for name, value in parts if value)


def tp_buffer_bytes(cm: "CostModel", layout: Layout, block: float) -> float:
    """Tensor-parallel buffers of one rank (tp > 1): the gathered activation block; with
    ``tp_comm_overlap``, Transformer Engine's userbuffers in its place (Megatron), or under DTensor
    tensor parallelism (torch async TP) the block plus the symmetric-memory workspace."""
    if not layout.tp_comm_overlap:
        return block
    if cm.convention.dtensor_tensor_parallel:
        return block + symmetric_workspace_bytes(block, layout.tp)
    return userbuffer_bytes(block)


def received_saved_bytes(cm: "CostModel", layout: Layout, rank: RankLayers) -> float:
    """Of what one micro-batch leaves stored on this rank, the bytes that are its receive
    buffers (``receive_buffer_per_microbatch``; counted with the buffers instead), one per
    receiving chunk."""
    if not cm.convention.receive_buffer_per_microbatch:
        return 0.0
    per_chunk = act.torch_received_input_saved_bytes(cm.model, activation_shape(cm, layout), layout.recompute)
    return receiving_chunks(layout, rank) * per_chunk


def receiving_chunks(layout: Layout, rank: RankLayers) -> int:
    """Model chunks of this rank that receive their input from a previous stage."""
    return 0 if layout.pp == 1 else chunks_per_rank(layout.schedule, layout.virtual_stages) - (1 if rank.first else 0)


def _data_parallel_buffer_bytes(cm: "CostModel", layout: Layout, params: ShardedParams) -> float:
    """Gathered parameter copies and gradient buffers of data parallelism, as the convention's
    ZeRO stage rule holds them.

    Bucketed (Megatron ZeRO 0-2): two gradient buckets. Unsharded parameters (FSDP2's
    ``replicate``): a compute copy of the parameters only with mixed precision (in fp32 it is the
    parameter) and one unsharded gradient beside the all-reduced one. Sharded parameters: two
    layers' gathered copies (the one computing, the one prefetched) when they are freed after
    forward and the pipeline does not defer the reshard, else the compute copy of every
    parameter from forward to backward. Unsharded gradients accumulate for the whole stage when
    reduction waits for the step's end (reduction once per step with several micro-batches, or
    deferred by the pipeline), else one layer's are live."""
    sb = cm.states
    rule = cm.convention.zero(layout.zero_stage)
    biggest = cm.prefix.largest_layer / layout.tp
    if rule.bucket_buffers:
        return min(2 * cm.assumptions.dp_bucket_bytes, sb.grad * (params.dense + params.expert))
    held = params.dense + params.expert
    unsharded_grads = sb.reduced * (params.trainable_dense + params.trainable_expert)
    if rule.sharded_stage == 0:
        return (0.0 if sb.gathered == sb.param else sb.gathered * held) + unsharded_grads
    deferred = layout.pp > 1 and cm.convention.pipeline_defers_gradient_sync
    freed = rule.reshard_after_forward and not deferred
    gathered = 2 * sb.gathered * biggest if freed else sb.gathered * held
    accumulates = deferred or (not rule.reduce_every_microbatch and layout.num_microbatches > 1)
    return gathered + (unsharded_grads if accumulates else sb.reduced * biggest)
