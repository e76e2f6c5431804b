"""Per-rank time: per-micro-batch compute, recomputation and exposed communication, and the
per-step data-parallel sync and optimizer step.

Per micro-batch, rank i spends t_i = forward + backward (2× forward compute; Narayanan et al.
SC'21) + recomputation + exposed TP/CP/EP communication + ZeRO-3 gathers not hidden behind
compute + pipeline send/recv.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from .assignment import layer_key, rank_params, recomputed_layers
from .compute import merge_source
from .flops import Gemm, logits_gemm
from .layer_costs import LayerForward, issue_bound_s
from .layout import Layout, local_micro_batch_tokens
from .memo import memoised
from .memory import ShardedParams
from .overlap import exposed_comm_s
from .offload import (activation_offload_exposed_s, activation_offload_share, cpu_adam_time_s,
                      host_copy_time_s)
from .op_sac import recomputed_gemm_share
from .pipeline import chunks_per_rank
from .rank_memory import layers_saved_bytes, shard_degrees, stepped_params
from .ranks import RankLayers, RankTimes

if TYPE_CHECKING:
    from .context import CostContext as CostModel  # what the terms read; estimate.CostModel adds the verbs


def rank_core_times(cm: "CostModel", layout: Layout, rank: RankLayers) -> RankTimes:
    """Per-micro-batch times of one rank: everything but data-parallel sync and the optimizer,
    which depend on how model states are held. Memoised: many layouts share it."""
    key = (layout.schedule == "dualpipe", layout.tp, layout.cp, layout.ep, layout.dp, layout.pp, layout.virtual_stages,
           layout.micro_batch_size, layout.num_microbatches, layout.recompute, layout.recompute_num_layers,
           layout.sequence_parallel, layout.tp_comm_overlap, rank.signature)
    return memoised(cm.core_memo, key, lambda: _compute_core_times(cm, layout, rank))


def _compute_core_times(cm: "CostModel", layout: Layout, rank: RankLayers) -> RankTimes:
    t = RankTimes()
    share = recomputed_layers(cm, layout, rank.num_layers) / max(rank.num_layers, 1)
    for kind, n in ((False, rank.num_dense), (True, rank.num_moe)):
        if n == 0:
            continue
        f = cm.layers.forward(layer_key(cm, layout, kind))
        for term, source in f.sources.items():
            merge_source(t.sources, term, source)
        add_layer_kind(cm, t, f, layout, n, share)
    add_ends(cm, t, layout, rank)
    t.compute_s = t.fwd_compute_s + t.bwd_compute_s
    add_pipeline(cm, t, layout)
    return one_direction(t) if layout.schedule == "dualpipe" else t


def one_direction(t: RankTimes) -> RankTimes:
    """DualPipe: a rank holds two chunks, one per direction, and each micro-batch crosses one of them
    (DeepSeek-V3 report, Sec. 3.2.1), so a micro-batch costs half of what both chunks cost."""
    halved = {name: getattr(t, name) / 2 for name in ("compute_s", "fwd_compute_s", "bwd_compute_s", "weight_grad_s",
                                                       "fwd_comm_s", "recompute_s", "tp_s", "cp_s", "ep_s", "pp_s")}
    return replace(t, **halved, comm_bytes=Counter({k: v / 2 for k, v in t.comm_bytes.items()}))


def add_layer_kind(cm: "CostModel", t: RankTimes, f: LayerForward, layout: Layout, n: float, share: float) -> None:
    """``n`` layers of one kind: forward, backward, and the ``share`` of them fully recomputed."""
    _add_layers(cm, t, f, layout, n)
    _add_recompute(cm, t, f, layout, n * share)
    if layout.recompute == "selective" and cm.training.attention != "fused":
        # a fused core stores no scores, so selective recomputation has nothing to redo
        t.recompute_s += n * (f.attention_core_s + f.attention_core_memory_s)
    if layout.recompute == "selective":
        t.recompute_s += n * f.mla_up_s  # MLA up-projections (activations.mla_block_bytes)
    if layout.recompute == "op-sac":
        _add_op_sac_recompute(cm, t, f, layout, n)


def _add_op_sac_recompute(cm: "CostModel", t: RankTimes, f: LayerForward, layout: Layout, n: float) -> None:
    """Op SAC (``costmodels.op_sac``) reruns in backward the GEMMs whose outputs it did not keep
    (``op_sac.recomputed_gemm_share`` of the layer's GEMM time), every memory-bound kernel and cast,
    and with sequence parallelism the two input all-gathers (half the forward's TP collectives;
    the reduce-scatters' outputs are kept); not the attention core, whose output is kept. A MoE or
    MLA model keeps everything (``activations.layer_bytes``), so nothing is rerun."""
    if cm.model.mla is not None or cm.model.moe is not None:
        return
    t.recompute_s += n * (recomputed_gemm_share(cm.model) * f.gemm_s + f.memory_s + f.cast_s)
    if layout.sequence_parallel:
        t.tp_s += n * f.tp_s / 2


def rank_times(cm: "CostModel", layout: Layout, rank: RankLayers) -> RankTimes:
    """All times of one rank: the core plus data-parallel sync and the optimizer step."""
    core = rank_core_times(cm, layout, rank)
    t = replace(core, comm_bytes=Counter(core.comm_bytes), sources=dict(core.sources))
    params = rank_params(cm, layout, rank)
    add_data_parallel(cm, t, layout, params, rank)
    add_grad_copy(cm, t, params)
    add_optimizer(cm, t, layout, params)
    _add_activation_offload(cm, t, layout, rank)
    return t


def _add_activation_offload(cm: "CostModel", t: RankTimes, layout: Layout, rank: RankLayers) -> None:
    """Activation offload (``Layout.activation_offload_layers``): each micro-batch copies the
    offloaded layers' saved bytes to the host during its forward and back during its backward over
    the host link; what the copies do not hide behind that pass's compute is exposed
    (``offload.activation_offload_exposed_s``), once per micro-batch."""
    if not layout.activation_offload_layers:
        return
    layers, _ = layers_saved_bytes(cm, layout, rank)
    moved = activation_offload_share(layout.activation_offload_layers, rank.num_layers) * layers
    link = cm.cluster.node.host_link_bandwidth_bytes_per_s
    per_microbatch = (activation_offload_exposed_s(moved, link, t.fwd_compute_s)
                      + activation_offload_exposed_s(moved, link, t.bwd_compute_s))
    t.offload_s += layout.num_microbatches * per_microbatch


def add_grad_copy(cm: "CostModel", t: RankTimes, params: ShardedParams) -> None:
    """A runtime that keeps 16-bit gradients beside the fp32 accumulation
    (``RuntimeConvention.keeps_16bit_grads``) adds them into it after every micro-batch's backward
    and zeroes them: read 16-bit, read and write fp32, write 16-bit zeros, 2 + 4 + 4 + 2 = 12 bytes
    per trainable parameter, memory-bound (DeepSpeed pipeline engine: ``update_hp_grads`` after
    each backward pass, ``runtime/pipe/engine.py``). It follows the data-parallel term, whose
    traffic cannot hide behind it: the reduction starts after the last copy."""
    sb = cm.states
    low = sb.grad - sb.reduced
    if not cm.convention.keeps_16bit_grads or low <= 0:
        return
    moved = (2 * low + 2 * sb.reduced) * (params.trainable_dense + params.trainable_expert)
    seconds = cm.rates.memory_time_s(moved)
    t.bwd_compute_s += seconds
    t.compute_s += seconds


def _add_layers(cm: "CostModel", t: RankTimes, f: LayerForward, layout: Layout, n: float) -> None:
    """Forward + backward of ``n`` layers: backward runs each GEMM's input- and weight-gradient
    GEMMs at their own shapes (``LayerForward.gemm_dgrad_s``, ``gemm_wgrad_s``; LoRA's frozen
    weights need only the input gradient); a low-precision recipe adds the output-gradient casts
    (``LayerForward.cast_bwd_s``).
    Backward repeats the forward's TP/EP collectives; CP's backward is ``LayerForward.cp_bwd_s``
    (ring: K, V and their gradients; all-gather: the gradients' reduce-scatter)."""
    weight_grad = f.gemm_wgrad_s
    t.fwd_compute_s += n * f.compute_s
    device_bwd_s = f.gemm_dgrad_s + weight_grad + f.attention_core_bwd_s + 2 * f.memory_s + f.cast_bwd_s
    t.bwd_compute_s += n * issue_bound_s(device_bwd_s, cm.assumptions.backward_host_ratio * f.host_s, f.host_runs_ahead)
    t.weight_grad_s += n * weight_grad
    t.fwd_comm_s += n * (f.tp_s + f.cp_s + f.ep_s)
    t.tp_s += n * 2 * f.tp_s
    t.cp_s += n * (f.cp_s + f.cp_bwd_s)
    t.ep_s += n * 2 * f.ep_s
    for name in [*f.comm_bytes, *(k for k in f.bwd_comm_bytes if k not in f.comm_bytes)]:
        sent = f.comm_bytes.get(name, 0.0)
        sent += f.bwd_comm_bytes.get(name, sent)
        t.comm_bytes[name] += n * sent * layout.num_microbatches


def _add_recompute(cm: "CostModel", t: RankTimes, f: LayerForward, layout: Layout, n: float) -> None:
    """Full recomputation reruns ``n`` layers' forward, their TP/CP/EP communication included."""
    if n == 0:
        return
    t.recompute_s += n * f.compute_s
    t.tp_s += n * f.tp_s
    t.cp_s += n * f.cp_s
    t.ep_s += n * f.ep_s
    for name, sent in f.comm_bytes.items():
        t.comm_bytes[name] += n * sent * layout.num_microbatches


def add_ends(cm: "CostModel", t: RankTimes, layout: Layout, rank: RankLayers) -> None:
    """Embedding lookup (vocab-parallel: one all-reduce or reduce-scatter) and the output
    projection with an fp32 cross-entropy over b·s·V/t logits (read and written 3 times)."""
    model, B = cm.model, cm.rates.elem_bytes
    tokens = local_micro_batch_tokens(cm.training, layout)
    if rank.first:
        t.fwd_compute_s += cm.rates.memory_time_s(2 * B * tokens * model.hidden_size)
        if layout.tp > 1:
            op = "reduce_scatter" if layout.sequence_parallel else "all_reduce"
            seconds, sent, source = cm.layers.collective(op, B * tokens * model.hidden_size, layout.tp, 1)
            merge_source(t.sources, "tp_comm", source)
            t.tp_s += seconds
            t.fwd_comm_s += seconds
            t.comm_bytes[f"tp_{op}"] += sent * layout.num_microbatches
    if rank.last:
        logits = logits_gemm(model, tokens, layout.tp)
        head, source = cm.rates.gemm_time_and_source(logits, high_precision=True)
        head_dgrad, head_wgrad, _ = cm.rates.backward_time_and_source(logits, high_precision=True)
        head_wgrad = 0.0 if cm.training.is_lora else head_wgrad
        merge_source(t.sources, "compute", source)
        loss = cm.rates.memory_time_s(3 * 4 * tokens * model.vocab_size / layout.tp)
        heads = 1 + model.num_mtp_layers  # each MTP module predicts through the shared head
        t.fwd_compute_s += heads * (head + loss)
        t.bwd_compute_s += heads * (head_dgrad + head_wgrad + loss)
        t.weight_grad_s += heads * head_wgrad
        if model.num_mtp_layers:
            _add_mtp_blocks(cm, t, layout, tokens)


def _add_mtp_blocks(cm: "CostModel", t: RankTimes, layout: Layout, tokens: int) -> None:
    """The MTP modules' blocks and 2h -> h projections on the last stage (DeepSeek-V3 Sec. 2.2),
    forward and backward like any layer of their kind."""
    model = cm.model
    f = cm.layers.forward(layer_key(cm, layout, model.is_moe_layer(model.num_layers - 1)))
    _add_layers(cm, t, f, layout, model.num_mtp_layers)
    proj = Gemm(m=tokens, n=model.hidden_size // layout.tp, k=2 * model.hidden_size)
    seconds, _ = cm.rates.gemm_time_and_source(proj)
    dgrad_s, wgrad_s, _ = cm.rates.backward_time_and_source(proj)
    wgrad_s = 0.0 if cm.training.is_lora else wgrad_s
    t.fwd_compute_s += model.num_mtp_layers * seconds
    t.bwd_compute_s += model.num_mtp_layers * (dgrad_s + wgrad_s)
    t.weight_grad_s += model.num_mtp_layers * wgrad_s


def add_pipeline(cm: "CostModel", t: RankTimes, layout: Layout) -> None:
    """Each chunk receives its input and sends its output once forward and once backward."""
    if layout.pp == 1:
        return
    tokens = local_micro_batch_tokens(cm.training, layout)
    size = cm.rates.elem_bytes * tokens * cm.model.hidden_size
    if layout.sequence_parallel:
        size /= layout.tp
    stride = layout.tp * layout.cp * layout.dp
    seconds, sent, source = cm.layers.collective("send_recv", size, 2, stride)
    merge_source(t.sources, "pp_comm", source)
    chunks = chunks_per_rank(layout.schedule, layout.virtual_stages)
    t.pp_s += 2 * chunks * seconds
    t.fwd_comm_s += chunks * seconds
    t.comm_bytes["pp_send_recv"] += 2 * chunks * sent * layout.num_microbatches


def add_data_parallel(cm: "CostModel", t: RankTimes, layout: Layout, params: ShardedParams, rank: RankLayers) -> None:
    """Gradient reduction and parameter gathers over the dp·cp group (expert grads over dp·cp/ep).

    ZeRO 0: one all-reduce per step. ZeRO 1/2: reduce-scatter + all-gather per step (2Ψ, as
    all-reduce). ZeRO-3: all-gather in forward and backward and reduce-scatter per micro-batch
    (3Ψ per micro-batch; ZeRO paper Sec. 7). HSDP adds an all-reduce of 1/N_shard across replicas.
    Those are Megatron's counts; the convention's ``dp_sync`` gives each runtime's (FSDP2's as
    launched, ``costmodels/runtimes.py``). Each is issued in pieces that each pay the
    latency: gradient buckets (PyTorch DDP, Megatron ZeRO 0-2) or one piece per FSDP unit (each
    block, plus the root), as the convention's ZeRO stage rule says.
    """
    z, _ = shard_degrees(cm, layout)
    group = layout.dp * layout.cp
    if group == 1:
        return
    sb, m = cm.states, layout.num_microbatches
    grads = sb.reduced * (params.trainable_dense + params.trainable_expert)
    weights = sb.gathered * (params.dense + params.expert) if layout.zero_stage == 3 else \
        sb.gathered * (params.trainable_dense + params.trainable_expert)
    shard = z if layout.zero_stage else group
    bucketed = cm.convention.zero(layout.zero_stage).bucketed
    pieces = max(1, math.ceil(grads / cm.assumptions.dp_bucket_bytes)) if bucketed else rank.num_layers + 1
    gathers_per_mb, reduce_per_mb = cm.convention.dp_sync(layout.zero_stage, layout.pp)
    if layout.zero_stage == 0:
        reduce_s, sent = _in_pieces(cm, t, "all_reduce", grads, group, layout.tp, pieces)
        t.comm_bytes["dp_all_reduce"] += sent
        gather_s = 0.0
    else:
        reduce_s, rs_sent = _in_pieces(cm, t, "reduce_scatter", grads, shard, layout.tp, pieces)
        gather_s, ag_sent = _in_pieces(cm, t, "all_gather", weights, shard, layout.tp, pieces)
        t.comm_bytes["dp_reduce_scatter"] += rs_sent * (m if reduce_per_mb else 1)
        t.comm_bytes["dp_all_gather"] += ag_sent * (gathers_per_mb * m if gathers_per_mb else 1)
    replicas = group // shard
    if layout.zero_stage and replicas > 1:
        ar_s, ar_sent = _in_pieces(cm, t, "all_reduce", grads / shard, replicas, layout.tp * shard, pieces)
        each_mb = cm.convention.hsdp_all_reduce_each_reduce_scatter and reduce_per_mb
        if each_mb:
            t.dp_mb_s += ar_s
        else:
            t.dp_tail_s += ar_s
        t.comm_bytes["dp_all_reduce"] += ar_sent * (m if each_mb else 1)
    a = cm.assumptions
    fwd_mb = gather_s if gathers_per_mb else 0.0
    bwd_mb = (gather_s if gathers_per_mb == 2 else 0.0) + (reduce_s if reduce_per_mb else 0.0)
    t.dp_mb_s += exposed_comm_s(fwd_mb, t.fwd_compute_s, pieces, a) + exposed_comm_s(bwd_mb, t.bwd_compute_s, pieces, a)
    # once-per-step traffic hides behind one micro-batch's compute, unless the runtime's pipeline
    # issues it after the drain (convention.pipeline_overlaps_dp_sync): then no compute is left to hide it
    hides = layout.pp == 1 or cm.convention.pipeline_overlaps_dp_sync
    if not gathers_per_mb:
        t.dp_tail_s += exposed_comm_s(gather_s, t.fwd_compute_s if hides else 0.0, pieces, a)
    if not reduce_per_mb:
        t.dp_tail_s += exposed_comm_s(reduce_s, t.bwd_compute_s if hides else 0.0, pieces, a)
    if layout.zero_stage and cm.convention.gather_copy_kernels:
        _add_sharded_copies(cm, t, sharded_copy_bytes(weights, grads, cm.rates.elem_bytes, sb.reduced),
                            gathers_per_mb, reduce_per_mb)


def sharded_copy_bytes(gathered_bytes: float, reduced_bytes: float, compute_elem_bytes: int,
                       reduce_elem_bytes: int) -> tuple[float, float]:
    """(bytes moved by one all-gather's copy-out, by one reduce-scatter's copy-in) on one rank.

    Copy-out reads the all-gather output and writes the unsharded parameters: 2 x the gathered
    bytes. Copy-in reads the unsharded gradients (``compute_elem_bytes`` each) and writes the
    reduce-scatter input in the reduce dtype: (B_c + B_r) / B_r x the reduced bytes (FSDP2's
    ``foreach_all_gather_copy_out`` and ``foreach_reduce_scatter_copy_in``; torchtitan reduces in
    fp32: 2 + 4 = 6 bytes per gradient). The shard-sized copy-in before a gather and the
    copy-out after a reduce-scatter move 1/N of that and are left out.
    """
    return 2 * gathered_bytes, reduced_bytes * (compute_elem_bytes + reduce_elem_bytes) / reduce_elem_bytes


def _add_sharded_copies(cm: "CostModel", t: RankTimes, copies: tuple[float, float], gathers_per_mb: int,
                        reduce_per_mb: bool) -> None:
    """The copy kernels of ``sharded_copy_bytes`` at HBM bandwidth, in the data-parallel term they
    serve: per micro-batch for collectives issued every micro-batch (two gathers under
    ``reshard_after_forward``), in the step's tail for those issued once per step. They run on
    the device beside the compute, so nothing hides them."""
    gather_s, reduce_s = (cm.rates.memory_time_s(b) for b in copies)
    t.dp_mb_s += gathers_per_mb * gather_s + (reduce_s if reduce_per_mb else 0.0)
    t.dp_tail_s += (0.0 if gathers_per_mb else gather_s) + (0.0 if reduce_per_mb else reduce_s)


def _in_pieces(cm: "CostModel", t: RankTimes, op: str, size_bytes: float, degree: int, stride: int,
               pieces: int) -> tuple[float, float]:
    """(seconds, bytes sent) of ``op`` over ``size_bytes`` issued as ``pieces`` equal collectives;
    the rate's source goes to ``t.sources['dp_comm']``."""
    seconds, sent, source = cm.layers.collective(op, size_bytes / pieces, degree, stride)
    if degree > 1:
        merge_source(t.sources, "dp_comm", source)
    return pieces * seconds, pieces * sent


def add_optimizer(cm: "CostModel", t: RankTimes, layout: Layout, params: ShardedParams) -> None:
    """Optimizer step on this rank's shard: memory-bound, reading and writing the K bytes of
    states per parameter, reading the (reduced) gradient and writing the 16-bit copy. With offload, the
    gradient goes to the host and the parameter comes back over the host link, and the step
    runs on the host CPU at CPU-Adam's rate (``offload``; ZeRO-Offload, Ren et al. 2021), not
    overlapped. Before it, gradient clipping by global norm (``clipping_bytes``)."""
    sb = cm.states
    stepped = stepped_params(cm, layout, params)
    if not layout.optimizer_offload:
        t.optimizer_s += cm.rates.memory_time_s((2 * sb.optimizer + sb.reduced + sb.param) * stepped)  # reads the reduced gradient
        t.optimizer_s += cm.rates.memory_time_s(clipping_bytes(sb.reduced, stepped))
        return
    node = cm.cluster.node
    link = node.host_link_bandwidth_bytes_per_s
    if cm.convention.offload_holds_all_states:
        t.offload_s += _fsdp2_host_link_bytes(cm, layout, params, stepped) / link
    else:
        t.offload_s += host_copy_time_s(stepped, sb, link)
    t.offload_s += cpu_adam_time_s(stepped, node.host_memory_bandwidth_bytes_per_s)


def clipping_bytes(grad_bytes_per_param: float, stepped_params: float) -> float:
    """HBM bytes of clipping this rank's gradient shard to a global norm: one read for the norm,
    one read and one write to scale it (PyTorch ``clip_grad_norm_``: a foreach norm, then a foreach
    multiply by min(1, max_norm / norm); Megatron's ``clip_grad_by_total_norm_fp32`` the same with
    multi-tensor kernels). Every framework autoplan exports clips at norm 1.0 by default."""
    return 3 * grad_bytes_per_param * stepped_params


def _fsdp2_host_link_bytes(cm: "CostModel", layout: Layout, params: ShardedParams, stepped: float) -> float:
    """Bytes over the host link per step under FSDP2's ``CPUOffloadPolicy``
    (``offload_holds_all_states``): every all-gather first copies the parameter shard host-to-device,
    every reduce-scatter copies the gradient shard back, so the counts are the convention's gathers
    and reductions per step (``dp_sync``), frozen shards gathered too. (ZeRO-Offload's split,
    each gradient down once and each parameter up once, is ``offload.host_copy_time_s``.)"""
    sb, m = cm.states, layout.num_microbatches
    z, z_e = shard_degrees(cm, layout)
    held = params.dense / (z if layout.zero_stage else 1) + params.expert / (z_e if layout.zero_stage else 1)
    gathers_per_mb, reduce_per_mb = cm.convention.dp_sync(layout.zero_stage, layout.pp)
    gathers = gathers_per_mb * m if gathers_per_mb else 1
    reduces = m if reduce_per_mb else 1
    return gathers * sb.param * held + reduces * sb.reduced * stepped

