"""``estimate``: memory, step time and traffic of one layout, by pipeline rank.

Per micro-batch, rank i spends t_i = forward + backward (2× forward compute; Narayanan et al.
SC'21) + recomputation + exposed TP/CP/EP communication + ZeRO-3 gathers not hidden behind
compute + pipeline send/recv. The step is m·max_i t_i + bubble (``pipeline.bubble_time_s``) +
the slowest rank's tail: data-parallel gradient reduction not hidden behind the last backward,
parameter all-gather not hidden behind the first forward (ZeRO-1/2), and the optimizer step.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Callable, TypeVar

from . import activations as act
from .breakdown import CostBreakdown, StageMemory
from .compute import DATASHEET, Rates, merge_source
from .flops import logits_gemm, model_flops_per_token
from .layer_costs import LayerCosts, LayerForward, LayerKey
from .job import Job
from .layout import Layout
from .memory import ShardedParams, StateBytes, held_state_bytes, state_bytes
from .params import embedding_params, lora_params_per_layer, output_params
from .pipeline import bubble_time_s, in_flight_microbatches
from .ranks import LayerPrefix, RankLayers, RankStatic, RankTimes

T = TypeVar("T")


def _memoised(memo: dict, key: tuple, compute: Callable[[], T]) -> T:
    """``memo[key]``, computed by ``compute()`` the first time."""
    value = memo.get(key)
    if value is None:
        value = memo[key] = compute()
    return value


class CostModel:
    """The memo of one job's per-term costs; ``estimate`` any layout. Every memo maps inputs to a
    value that depends on nothing else, so no state of one call changes another's result."""

    def __init__(self, job: Job) -> None:
        model, training, cluster, profile = job.model, job.training, job.cluster, job.profile
        assumptions = job.assumptions
        if profile is not None and profile.calibration:
            assumptions = assumptions.with_calibration(profile.calibration)
        self.job = job
        self.model, self.training, self.cluster = model, training, cluster
        self.assumptions = assumptions
        self.rates = Rates(cluster.hardware, training.precision, profile, assumptions)
        self.layers = LayerCosts(model, training, cluster, self.rates, profile, assumptions)
        self.states: StateBytes = state_bytes(training)
        self.capacity_bytes = job.memory_fraction * cluster.hardware.memory_bytes
        self._prefix = LayerPrefix(model)
        self._core_memo: dict[tuple, RankTimes] = {}
        self._ranks_memo: dict[tuple, list[RankLayers]] = {}
        self._groups_memo: dict[tuple, list[tuple[RankLayers, int]]] = {}
        self._params_memo: dict[tuple, ShardedParams] = {}
        self._activation_memo: dict[tuple, tuple[float, float]] = {}

    def estimate(self, layout: Layout) -> CostBreakdown:
        """Memory per rank, step time by term and traffic for ``layout`` (assumed valid).

        Ranks with the same layer counts and ends share their times and state memory; only the
        micro-batches in flight (and so activation memory) differ between them."""
        shared: dict[tuple, tuple[RankTimes, RankStatic]] = {}
        memory, times = [], []
        for index, rank in enumerate(self.rank_layers(layout)):
            if rank.signature not in shared:
                shared[rank.signature] = (self.rank_times(layout, rank), self.rank_static(layout, rank))
            rank_time, static = shared[rank.signature]
            times.append(rank_time)
            memory.append(self._stage_memory(layout, index, static))
        return self._assemble(layout, tuple(memory), times)

    def peak_memory_bytes(self, layout: Layout) -> float:
        """The ``peak_memory_bytes`` that ``estimate`` would report, without costing time."""
        shared: dict[tuple, RankStatic] = {}
        peak = 0.0
        for index, rank in enumerate(self.rank_layers(layout)):
            if rank.signature not in shared:
                shared[rank.signature] = self.rank_static(layout, rank)
            peak = max(peak, self._stage_memory(layout, index, shared[rank.signature]).total_bytes)
        return peak

    def pipeline_lower_bound_s(self, layout: Layout) -> float:
        """m·max_i t_i + bubble without any data-parallel or optimizer time: a lower bound on the
        step time of every layout that differs from ``layout`` only in how model states are held
        (ZeRO stage, HSDP, offload), since those only add time. Used by the search to prune."""
        groups = self.rank_groups(layout)
        per_mb = [self.rank_core_times(layout, rank).per_microbatch_s for rank, _ in groups]
        counts = [n for _, n in groups]
        return layout.num_microbatches * max(per_mb) + bubble_time_s(per_mb, layout.virtual_stages, counts)

    def rank_groups(self, layout: Layout) -> list[tuple[RankLayers, int]]:
        """Ranks of equal signature, one representative each with its count (memoised)."""
        key = (layout.pp, layout.virtual_stages, layout.layers_per_stage)
        return _memoised(self._groups_memo, key, lambda: self._rank_groups(layout))

    def _rank_groups(self, layout: Layout) -> list[tuple[RankLayers, int]]:
        counts: dict[tuple, list] = {}
        for rank in self.rank_layers(layout):
            counts.setdefault(rank.signature, [rank, 0])[1] += 1
        return [(rank, n) for rank, n in counts.values()]

    def model_state_peak_bytes(self, layout: Layout) -> float:
        """Largest params + grads + optimizer bytes over the ranks: a memory lower bound that the
        micro-batch, schedule and recomputation choices cannot lower."""
        peak = 0.0
        for rank, _ in self.rank_groups(layout):
            peak = max(peak, sum(self._held_states(layout, self.rank_params(layout, rank))))
        return peak

    # -- what each rank holds -------------------------------------------------------------
    def rank_layers(self, layout: Layout) -> list[RankLayers]:
        """Chunk c of rank i is model stage c·pp + i (Megatron's interleaved assignment)."""
        key = (layout.pp, layout.virtual_stages, layout.layers_per_stage)
        return _memoised(self._ranks_memo, key, lambda: self._rank_layers(layout))

    def _rank_layers(self, layout: Layout) -> list[RankLayers]:
        counts = layout.stage_layers(self.model.num_layers)
        starts = [0]
        for c in counts:
            starts.append(starts[-1] + c)
        ranks = []
        for i in range(layout.pp):
            chunks = tuple((starts[k], starts[k + 1]) for k in range(i, len(counts), layout.pp))
            moe = sum(self._prefix.moe_layers(a, b) for a, b in chunks)
            dense = sum(b - a for a, b in chunks) - moe
            ranks.append(RankLayers(chunks=chunks, num_dense=dense, num_moe=moe, first=i == 0,
                                    last=i == layout.pp - 1))
        return ranks

    def rank_params(self, layout: Layout, rank: RankLayers) -> ShardedParams:
        """Parameter elements on one rank: layers / tp, experts / (tp·ep), embedding and head."""
        key = (layout.tp, layout.ep, layout.pp, rank)
        return _memoised(self._params_memo, key, lambda: self._rank_params(layout, rank))

    def _rank_params(self, layout: Layout, rank: RankLayers) -> ShardedParams:
        model, tp = self.model, layout.tp
        dense = sum(self._prefix.dense_params(a, b) for a, b in rank.chunks)
        expert = sum(self._prefix.expert_params(a, b) for a, b in rank.chunks)
        if rank.first:
            dense += embedding_params(model)
        if rank.last:
            dense += output_params(model)
            if model.tied_embeddings and layout.pp > 1:
                dense += model.vocab_size * model.hidden_size  # the head keeps its own copy
        lora = 0.0
        if self.training.is_lora:
            lora = rank.num_layers * lora_params_per_layer(model, self.training.lora_rank,
                                                            self.training.lora_targets)
            dense += lora
        return ShardedParams(dense=dense / tp, expert=expert / (tp * layout.ep),
                             trainable_dense=(lora if self.training.is_lora else dense) / tp,
                             trainable_expert=0.0 if self.training.is_lora else expert / (tp * layout.ep))

    # -- memory -----------------------------------------------------------------------------
    def shard_degrees(self, layout: Layout) -> tuple[int, int]:
        """ZeRO shard degree for dense states (HSDP group or dp, times cp) and for expert states."""
        dense = layout.zero_shard_degree * layout.cp
        return dense, max(1, dense // layout.ep)

    def rank_static(self, layout: Layout, rank: RankLayers) -> RankStatic:
        params = self.rank_params(layout, rank)
        p, g, o = self._held_states(layout, params)
        stored, working = self.rank_activation_parts(layout, rank)
        return RankStatic(params_bytes=p, grads_bytes=g, optimizer_bytes=o,
                           buffers_bytes=self.rank_buffer_bytes(layout, rank, params),
                           stored_per_microbatch_bytes=stored, working_bytes=working,
                           received_per_microbatch_bytes=self._received_saved_bytes(layout, rank))

    def _held_states(self, layout: Layout, params: ShardedParams) -> tuple[float, float, float]:
        z, z_e = self.shard_degrees(layout)
        return held_state_bytes(params, self.training, zero_stage=layout.zero_stage, shard_degree=z,
                                expert_shard_degree=z_e, offload=layout.optimizer_offload)

    def _stage_memory(self, layout: Layout, index: int, static: RankStatic) -> StageMemory:
        """Activations at the schedule's peak: in-flight micro-batches × what each leaves stored
        (divided by v: one in-flight unit of the interleaved schedule is one chunk), plus the
        recomputation working set; overhead is the runtime reserve plus allocator fragmentation."""
        in_flight = in_flight_microbatches(layout.schedule, layout.pp, index, layout.num_microbatches,
                                           layout.virtual_stages)
        stored = static.stored_per_microbatch_bytes - static.received_per_microbatch_bytes
        activations = in_flight * stored / layout.virtual_stages + static.working_bytes
        overhead = (self.cluster.hardware.runtime_reserved_bytes
                    + self.assumptions.allocator_fragmentation * (activations + static.buffers_bytes))
        return StageMemory(params_bytes=static.params_bytes, grads_bytes=static.grads_bytes,
                           optimizer_bytes=static.optimizer_bytes, activations_bytes=activations,
                           buffers_bytes=static.buffers_bytes, overhead_bytes=overhead)

    def layer_key(self, layout: Layout, moe: bool) -> LayerKey:
        return LayerKey(moe=moe, b=layout.micro_batch_size, s_local=self.training.seq_len // layout.cp,
                        tp=layout.tp, sp=layout.sequence_parallel, cp=layout.cp, ep=layout.ep if moe else 1)

    def rank_activation_parts(self, layout: Layout, rank: RankLayers) -> tuple[float, float]:
        """(bytes one micro-batch leaves stored on this rank, recomputation working set).

        With full recomputation of only ``recompute_num_layers`` per stage, that share of layers
        stores its input and the rest store everything (Megatron's 'block' method). The first
        stage adds its embedding dropout mask, the last its head input and fp32 logits.
        Memoised: every way of holding model states shares it."""
        key = (layout.micro_batch_size, layout.cp, layout.tp, layout.sequence_parallel, layout.recompute,
               layout.recompute_num_layers, layout.virtual_stages, rank.signature, layout.dp * layout.cp == 1)
        return _memoised(self._activation_memo, key, lambda: self._rank_activation_parts(layout, rank))

    def activation_shape(self, layout: Layout) -> act.ActivationShape:
        """The per-layer activation shape of ``layout``'s dense layers. The torch runtime's job
        runs mixed precision by ``torch.autocast`` when it has no data parallelism (FSDP2's
        mixed-precision policy otherwise), which changes what is saved."""
        x = self.layers.shape(self.layer_key(layout, False))
        autocast = (self.training.runtime == "torch" and self.training.precision != "fp32"
                    and layout.dp * layout.cp == 1)
        return replace(x, autocast=True) if autocast else x

    def _rank_activation_parts(self, layout: Layout, rank: RankLayers) -> tuple[float, float]:
        model = self.model
        x = self.activation_shape(layout)
        share = self._recomputed_layers(layout, rank.num_layers) / max(rank.num_layers, 1)
        stored = 0.0
        for kind, n in ((False, rank.num_dense), (True, rank.num_moe)):
            if n == 0:
                continue
            mode_bytes = act.layer_bytes(model, x, moe_layer=kind, recompute=layout.recompute)
            if layout.recompute == "full" and share < 1.0:
                mode_bytes = share * mode_bytes + (1 - share) * act.layer_bytes(model, x, moe_layer=kind,
                                                                                recompute="none")
            stored += n * mode_bytes
        v = layout.virtual_stages
        if rank.first:
            stored += v * act.first_stage_extra_bytes(model, x)
        if rank.last:
            stored += v * act.last_stage_extra_bytes(model, x)
        return stored, self.recompute_working_bytes(layout, x, rank.num_moe > 0)

    def recompute_working_bytes(self, layout: Layout, x: act.ActivationShape, has_moe: bool) -> float:
        """While one layer is recomputed, its full activations (full) or its core (selective) are live."""
        if layout.recompute == "full":
            return act.layer_bytes(self.model, x, moe_layer=has_moe, recompute="none")
        if layout.recompute == "selective":
            return act.attention_core_bytes(self.model, x)
        return 0.0

    def rank_buffer_bytes(self, layout: Layout, rank: RankLayers, params: ShardedParams) -> float:
        """Communication buffers and gathered copies: data parallel (``_data_parallel_buffer_bytes``),
        one gathered TP activation, pipeline send and receive buffers (under the torch runtime one
        receive buffer per micro-batch and receiving chunk, kept by ``torch.distributed.pipelining``,
        plus one send)."""
        B = self.rates.elem_bytes
        tokens = layout.micro_batch_size * self.training.seq_len // layout.cp
        block = B * tokens * self.model.hidden_size
        buffers = self._data_parallel_buffer_bytes(layout, params) if layout.dp * layout.cp > 1 else 0.0
        if layout.tp > 1:
            buffers += block
        if layout.pp > 1 and self.training.runtime == "torch":
            received = act.received_input_bytes(self.model, self.activation_shape(layout))
            buffers += (layout.num_microbatches * self._receiving_chunks(layout, rank) + 1) * received
        elif layout.pp > 1:
            buffers += 2 * block * (1 / layout.tp if layout.sequence_parallel else 1.0)
        return buffers

    def _received_saved_bytes(self, layout: Layout, rank: RankLayers) -> float:
        """Of what one micro-batch leaves stored on this rank, the bytes that are its receive
        buffers (torch runtime; counted with the buffers instead), one per receiving chunk."""
        if self.training.runtime != "torch":
            return 0.0
        per_chunk = act.torch_received_input_saved_bytes(self.model, self.activation_shape(layout), layout.recompute)
        return self._receiving_chunks(layout, rank) * per_chunk

    @staticmethod
    def _receiving_chunks(layout: Layout, rank: RankLayers) -> int:
        """Model chunks of this rank that receive their input from a previous stage."""
        return 0 if layout.pp == 1 else layout.virtual_stages - (1 if rank.first else 0)

    def _data_parallel_buffer_bytes(self, layout: Layout, params: ShardedParams) -> float:
        """Megatron runtime: ZeRO-3 keeps two layers' gathered params (the one computing, the one
        prefetched) and one layer's unsharded grads; ZeRO 0-2 two gradient buckets.

        Torch runtime (FSDP2 as launched): ZeRO-0 (``replicate``) keeps a compute copy of the
        parameters only with mixed precision (in fp32 it is the parameter) and one unsharded
        gradient beside the all-reduced one. ZeRO-1/2 keep the gathered compute copy of every
        parameter from forward to backward, and so does ZeRO-3 under pipelining, which stops the
        reshard after backward; else ZeRO-3 holds two layers' worth. Unsharded fp32 gradients
        accumulate for the whole stage when reduction waits for the step's end (ZeRO-1 with
        several micro-batches, or any stage under pipelining), else one layer's are live."""
        sb = self.states
        biggest = self._prefix.largest_layer / layout.tp
        if self.training.runtime != "torch":
            if layout.zero_stage == 3:
                return (2 * sb.gathered + sb.reduced) * biggest
            return min(2 * self.assumptions.dp_bucket_bytes, sb.grad * (params.dense + params.expert))
        held = params.dense + params.expert
        unsharded_grads = sb.reduced * (params.trainable_dense + params.trainable_expert)
        if layout.zero_stage == 0:
            return (0.0 if sb.gathered == sb.param else sb.gathered * held) + unsharded_grads
        pipelined = layout.pp > 1
        gathered = 2 * sb.gathered * biggest if layout.zero_stage == 3 and not pipelined else sb.gathered * held
        accumulates = pipelined or (layout.zero_stage == 1 and layout.num_microbatches > 1)
        return gathered + (unsharded_grads if accumulates else sb.reduced * biggest)

    # -- time ---------------------------------------------------------------------------------
    def rank_core_times(self, layout: Layout, rank: RankLayers) -> RankTimes:
        """Per-micro-batch times of one rank: everything but data-parallel sync and the optimizer,
        which depend on how model states are held. Memoised: many layouts share it."""
        key = (layout.tp, layout.cp, layout.ep, layout.dp, layout.pp, layout.virtual_stages,
               layout.micro_batch_size, layout.num_microbatches, layout.recompute, layout.recompute_num_layers,
               layout.sequence_parallel, rank.signature)
        return _memoised(self._core_memo, key, lambda: self._rank_core_times(layout, rank))

    def _rank_core_times(self, layout: Layout, rank: RankLayers) -> RankTimes:
        t = RankTimes()
        share = self._recomputed_layers(layout, rank.num_layers) / max(rank.num_layers, 1)
        for kind, n in ((False, rank.num_dense), (True, rank.num_moe)):
            if n == 0:
                continue
            f = self.layers.forward(self.layer_key(layout, kind))
            for term, source in f.sources.items():
                merge_source(t.sources, term, source)
            self._add_layers(t, f, layout, n)
            self._add_recompute(t, f, layout, n * share)
            if layout.recompute == "selective":
                t.recompute_s += n * (f.attention_core_s + f.attention_core_memory_s)
        self._add_ends(t, layout, rank)
        t.compute_s = t.fwd_compute_s + t.bwd_compute_s
        self._add_pipeline(t, layout)
        return t

    def rank_times(self, layout: Layout, rank: RankLayers) -> RankTimes:
        """All times of one rank: the core plus data-parallel sync and the optimizer step."""
        core = self.rank_core_times(layout, rank)
        t = replace(core, comm_bytes=Counter(core.comm_bytes), sources=dict(core.sources))
        params = self.rank_params(layout, rank)
        self._add_data_parallel(t, layout, params, rank)
        self._add_optimizer(t, layout, params)
        return t

    def _recomputed_layers(self, layout: Layout, n: int) -> int:
        if layout.recompute != "full":
            return 0
        if layout.recompute_num_layers == 0:
            return n
        return min(layout.recompute_num_layers * layout.virtual_stages, n)

    def _add_layers(self, t: RankTimes, f: LayerForward, layout: Layout, n: float) -> None:
        """Forward + backward of ``n`` layers: backward is 2× forward compute (input and weight
        gradients); LoRA's frozen weights need only the input gradient, 1× forward GEMMs.
        Backward repeats the forward's TP/EP collectives and moves K, V and their gradients in CP."""
        bwd_gemm = (1.0 if self.training.is_lora else 2.0) * f.gemm_s
        t.fwd_compute_s += n * f.compute_s
        t.bwd_compute_s += n * (bwd_gemm + 2 * (f.attention_core_s + f.memory_s + f.host_s))
        t.tp_s += n * 2 * f.tp_s
        t.cp_s += n * (f.cp_s + max(0.0, 2 * f.cp_total_s - 2 * f.attention_core_s))
        t.ep_s += n * 2 * f.ep_s
        for name, sent in f.comm_bytes.items():
            t.comm_bytes[name] += n * (3 if name.startswith("cp") else 2) * sent * layout.num_microbatches

    def _add_recompute(self, t: RankTimes, f: LayerForward, layout: Layout, n: float) -> None:
        """Full recomputation reruns ``n`` layers' forward, their TP/CP/EP communication included."""
        if n == 0:
            return
        t.recompute_s += n * f.compute_s
        t.tp_s += n * f.tp_s
        t.cp_s += n * f.cp_s
        t.ep_s += n * f.ep_s
        for name, sent in f.comm_bytes.items():
            t.comm_bytes[name] += n * sent * layout.num_microbatches

    def _add_ends(self, t: RankTimes, layout: Layout, rank: RankLayers) -> None:
        """Embedding lookup (vocab-parallel: one all-reduce or reduce-scatter) and the output
        projection with an fp32 cross-entropy over b·s·V/t logits (read and written 3 times)."""
        model, B = self.model, self.rates.elem_bytes
        tokens = layout.micro_batch_size * self.training.seq_len // layout.cp
        if rank.first:
            t.fwd_compute_s += self.rates.memory_time_s(2 * B * tokens * model.hidden_size)
            if layout.tp > 1:
                op = "reduce_scatter" if layout.sequence_parallel else "all_reduce"
                seconds, sent, source = self.layers.collective(op, B * tokens * model.hidden_size, layout.tp, 1)
                merge_source(t.sources, "tp_comm", source)
                t.tp_s += seconds
                t.comm_bytes[f"tp_{op}"] += sent * layout.num_microbatches
        if rank.last:
            head, source = self.rates.gemm_time_and_source(logits_gemm(model, tokens, layout.tp))
            merge_source(t.sources, "compute", source)
            loss = self.rates.memory_time_s(3 * 4 * tokens * model.vocab_size / layout.tp)
            t.fwd_compute_s += head + loss
            t.bwd_compute_s += 2 * head + loss

    def _add_pipeline(self, t: RankTimes, layout: Layout) -> None:
        """Each chunk receives its input and sends its output once forward and once backward."""
        if layout.pp == 1:
            return
        tokens = layout.micro_batch_size * self.training.seq_len // layout.cp
        size = self.rates.elem_bytes * tokens * self.model.hidden_size
        if layout.sequence_parallel:
            size /= layout.tp
        stride = layout.tp * layout.cp * layout.dp
        seconds, sent, source = self.layers.collective("send_recv", size, 2, stride)
        merge_source(t.sources, "pp_comm", source)
        t.pp_s += 2 * layout.virtual_stages * seconds
        t.comm_bytes["pp_send_recv"] += 2 * layout.virtual_stages * sent * layout.num_microbatches

    def _add_data_parallel(self, t: RankTimes, layout: Layout, params: ShardedParams, rank: RankLayers) -> None:
        """Gradient reduction and parameter gathers over the dp·cp group (expert grads over dp·cp/ep).

        ZeRO 0: one all-reduce per step. ZeRO 1/2: reduce-scatter + all-gather per step (2Ψ, as
        all-reduce). ZeRO-3: all-gather in forward and backward and reduce-scatter per micro-batch
        (3Ψ per micro-batch; ZeRO paper Sec. 7). HSDP adds an all-reduce of 1/N_shard across replicas.
        Under the torch runtime the counts are FSDP2's as launched (``_fsdp2_sync``). Each is issued
        in pieces that each pay the latency: gradient buckets for ZeRO 0-2 (PyTorch DDP, Megatron),
        one piece per FSDP unit (each block, plus the root) for ZeRO-3 and, under the torch runtime
        (``fully_shard`` per block for every stage >= 1), for ZeRO-1/2 too.
        """
        z, _ = self.shard_degrees(layout)
        group = layout.dp * layout.cp
        if group == 1:
            return
        sb, m = self.states, layout.num_microbatches
        torch_runtime = self.training.runtime == "torch"
        grads = sb.reduced * (params.trainable_dense + params.trainable_expert)
        weights = sb.gathered * (params.dense + params.expert) if layout.zero_stage == 3 else \
            sb.gathered * (params.trainable_dense + params.trainable_expert)
        shard = z if layout.zero_stage else group
        per_unit = layout.zero_stage == 3 or (layout.zero_stage >= 1 and torch_runtime)
        pieces = rank.num_layers + 1 if per_unit else max(1, math.ceil(grads / self.assumptions.dp_bucket_bytes))
        if torch_runtime:
            gathers_per_mb, reduce_per_mb = _fsdp2_sync(layout)
        else:
            gathers_per_mb, reduce_per_mb = (2, True) if layout.zero_stage == 3 else (0, False)
        if layout.zero_stage == 0:
            reduce_s, sent = self._in_pieces(t, "all_reduce", grads, group, layout.tp, pieces)
            t.comm_bytes["dp_all_reduce"] += sent
            gather_s = 0.0
        else:
            reduce_s, rs_sent = self._in_pieces(t, "reduce_scatter", grads, shard, layout.tp, pieces)
            gather_s, ag_sent = self._in_pieces(t, "all_gather", weights, shard, layout.tp, pieces)
            t.comm_bytes["dp_reduce_scatter"] += rs_sent * (m if reduce_per_mb else 1)
            t.comm_bytes["dp_all_gather"] += ag_sent * (gathers_per_mb * m if gathers_per_mb else 1)
        replicas = group // shard
        if layout.zero_stage and replicas > 1:
            ar_s, ar_sent = self._in_pieces(t, "all_reduce", grads / shard, replicas, layout.tp * shard, pieces)
            each_mb = torch_runtime and reduce_per_mb  # FSDP2's HSDP all-reduces after every reduce-scatter
            if each_mb:
                t.dp_mb_s += ar_s
            else:
                t.dp_tail_s += ar_s
            t.comm_bytes["dp_all_reduce"] += ar_sent * (m if each_mb else 1)
        overlap = self.assumptions.overlap_fraction
        fwd_mb = gather_s if gathers_per_mb else 0.0
        bwd_mb = (gather_s if gathers_per_mb == 2 else 0.0) + (reduce_s if reduce_per_mb else 0.0)
        t.dp_mb_s += max(0.0, fwd_mb - overlap * t.fwd_compute_s) + max(0.0, bwd_mb - overlap * t.bwd_compute_s)
        if not gathers_per_mb:
            t.dp_tail_s += max(0.0, gather_s - overlap * t.fwd_compute_s)
        if not reduce_per_mb:
            t.dp_tail_s += max(0.0, reduce_s - overlap * t.bwd_compute_s)

    def _in_pieces(self, t: RankTimes, op: str, size_bytes: float, degree: int, stride: int,
                   pieces: int) -> tuple[float, float]:
        """(seconds, bytes sent) of ``op`` over ``size_bytes`` issued as ``pieces`` equal collectives;
        the rate's source goes to ``t.sources['dp_comm']``."""
        seconds, sent, source = self.layers.collective(op, size_bytes / pieces, degree, stride)
        if degree > 1:
            merge_source(t.sources, "dp_comm", source)
        return pieces * seconds, pieces * sent

    def _add_optimizer(self, t: RankTimes, layout: Layout, params: ShardedParams) -> None:
        """Optimizer step on this rank's shard: memory-bound, reading and writing the K bytes of
        states per parameter, reading the gradient and writing the 16-bit copy. With offload, the
        gradient goes to the host and the parameter comes back over the host link, and the step
        runs on the host (ZeRO-Offload, Ren et al. 2021), not overlapped."""
        sb = self.states
        z, z_e = self.shard_degrees(layout)
        stepped = params.trainable_dense / (z if layout.zero_stage else 1) + \
            params.trainable_expert / (z_e if layout.zero_stage else 1)
        moved = (2 * sb.optimizer + sb.grad + sb.param) * stepped
        if not layout.optimizer_offload:
            t.optimizer_s += self.rates.memory_time_s(moved)
            return
        node = self.cluster.node
        t.offload_s += (sb.grad + sb.param) * stepped / node.host_link_bandwidth_bytes_per_s
        t.offload_s += 2 * sb.optimizer * stepped / node.host_memory_bandwidth_bytes_per_s

    # -- totals -------------------------------------------------------------------------------
    def _assemble(self, layout: Layout, memory: tuple[StageMemory, ...], times: list[RankTimes]) -> CostBreakdown:
        m = layout.num_microbatches
        per_mb = [t.per_microbatch_s for t in times]
        crit = times[max(range(len(times)), key=per_mb.__getitem__)]
        tail = times[max(range(len(times)), key=lambda i: times[i].tail_s)]
        model_flops = model_flops_per_token(self.model, self.training.seq_len, self.training.is_lora) \
            * self.training.tokens_per_step
        return CostBreakdown(
            layout=layout, stages=memory, memory_capacity_bytes=self.capacity_bytes,
            compute_s=m * crit.compute_s, recompute_s=m * crit.recompute_s, tp_comm_s=m * crit.tp_s,
            cp_comm_s=m * crit.cp_s, ep_comm_s=m * crit.ep_s,
            dp_comm_s=m * crit.dp_mb_s + tail.dp_tail_s, pp_comm_s=m * crit.pp_s,
            bubble_s=bubble_time_s(per_mb, layout.virtual_stages), optimizer_s=tail.optimizer_s,
            offload_s=tail.offload_s, overhead_s=self.assumptions.step_overhead_s,
            comm_bytes_per_gpu=dict(crit.comm_bytes),
            model_flops_per_step=model_flops,
            hardware_flops_per_step=model_flops + self._recompute_flops(layout),
            tokens_per_step=self.training.tokens_per_step, num_gpus=layout.world_size,
            peak_flops_per_gpu=self.rates.peak, sources=self._sources(layout, times),
        )

    def _recompute_flops(self, layout: Layout) -> float:
        """Extra FLOPs of recomputation over the whole step: full reruns the forward of the
        recomputed layers (2N + 4·L·(a·d)·s per token, a third of the model FLOPs); selective reruns
        the attention core (4·L·(a·d)·s per token)."""
        tokens, s, model = self.training.tokens_per_step, self.training.seq_len, self.model
        attention = 4.0 * model.num_layers * model.q_dim * s * tokens
        if layout.recompute == "selective":
            return attention
        if layout.recompute != "full":
            return 0.0
        share = 1.0 if layout.recompute_num_layers == 0 else \
            min(1.0, layout.recompute_num_layers * layout.num_stages / model.num_layers)
        forward = model_flops_per_token(self.model, s, self.training.is_lora) / 3 * tokens
        return share * forward

    def _sources(self, layout: Layout, times: list[RankTimes]) -> dict[str, str]:
        """Where each term's rate came from, over every rank of this layout: a term is ``profile``
        if any rate it used was measured. Communication terms only for axes of degree > 1."""
        merged: dict[str, str] = {}
        for t in times:
            for term, source in t.sources.items():
                merge_source(merged, term, source)
        sources = {"compute": merged.get("compute", DATASHEET), "attention": merged.get("attention", DATASHEET),
                   "memory_bound": self.rates.memory_bound_source}
        degrees = {"tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "dp": layout.dp * layout.cp, "pp": layout.pp}
        sources.update({term: merged[term] for term in sorted(merged)
                        if term.endswith("_comm") and degrees.get(term[:-len("_comm")], 1) > 1})
        return sources

def estimate(job: Job, layout: Layout, memo: CostModel | None = None) -> CostBreakdown:
    """Memory per rank, step time by term and traffic of ``layout`` (assumed valid,
    ``layout.check_layout``) for ``job``. ``memo`` (``CostModel(job)``) keeps the per-term values
    of earlier calls, keyed by their inputs, so a search that costs many layouts of one job pays
    for each term once; the result does not depend on it."""
    return (memo if memo is not None else CostModel(job)).estimate(layout)


def _fsdp2_sync(layout: Layout) -> tuple[int, bool]:
    """(parameter all-gathers per micro-batch, 0 = one per step; whether gradients are reduced
    after every micro-batch) for the launcher's FSDP2 mapping (``planner/runtime/parallel.py``).

    ZeRO-1 stays gathered and reduces once, after the last micro-batch. ZeRO-2 keeps parameters
    gathered through forward (``reshard_after_forward=False``) but FSDP2 reshards after each
    backward, so it gathers and reduce-scatters every micro-batch; ZeRO-3 also gathers again for
    backward. With pp > 1 ``torch.distributed.pipelining`` turns gradient sync and the reshard
    after backward off for every micro-batch and reduces once at the end of the step
    (``PipelineStage.backward_maybe_with_nosync``, ``perform_reduce_grad``): ZeRO-2 then gathers
    once per step and ZeRO-3 twice per micro-batch, both reducing once."""
    pipelined = layout.pp > 1
    if layout.zero_stage == 3:
        return 2, not pipelined
    if layout.zero_stage == 2 and not pipelined:
        return 1, True
    return 0, False
